"""Asks Prometheus for every workload's history and builds the :class:`Recommendations`.

The queries (``queries.py``) run in one plan with the runner and progress line ``gpuagent report`` uses too
(``gpuagent.prom.plan``): totals and facts per chunk of the range, samples in range queries of at most
``MAX_POINTS`` steps. Their answers fill a :class:`~gpuagent.recommend.history.PodHistory` per pod (or
other workload); pods are grouped into workloads (``workloads.py``), and each workload gets its statistics,
recommendation, savings; the pool its packing.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuagent.prom import queries as q
from gpuagent.prom.client import PrometheusClient
from gpuagent.prom.empty import why_empty
from gpuagent.prom.plan import Key, Plan, models_step, run_plan, step_windows, total_step
from gpuagent.prom.prices import Prices
from gpuagent.prom.progress import Progress
from gpuagent.prom.timerange import TimeRange, chunks, format_duration, format_time
from gpuagent.recommend import queries as rq
from gpuagent.recommend.history import PodHistory, build_stats
from gpuagent.recommend.model import Options, Recommendations, Row, WorkloadKey
from gpuagent.recommend.packing import pack
from gpuagent.recommend.rules import recommend
from gpuagent.recommend.savings import savings, totals
from gpuagent.recommend.workloads import group_by_workload, pod_workload, unit_workload

_UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

HistoryKey = tuple[str, str, str]  # (subject kind, group, name)


@dataclass(frozen=True)
class Request:
    time_range: TimeRange
    step_seconds: float
    chunk_seconds: float
    matchers: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    prices: Prices = field(default_factory=Prices)
    options: Options = field(default_factory=Options)


class _Found:
    """What the queries found, filled in as they run."""

    def __init__(self) -> None:
        self.histories: dict[HistoryKey, PodHistory] = defaultdict(PodHistory)
        self.per_gpu: dict[str, dict[Key, dict[str, float]]] = {q.PODS.kind: defaultdict(dict),
                                                                  q.WORKLOADS.kind: defaultdict(dict)}
        self.models: dict[str, str] = {}
        self.gpu_memory: dict[str, float] = {}  # UUID -> bytes

    def history(self, subject: q.Subject, labels: Mapping[str, str]) -> PodHistory:
        return self.histories[(subject.kind, labels.get(subject.group_label, ""),
                               labels.get(subject.name_label, ""))]


def collect(client: PrometheusClient, request: Request, progress: Progress) -> Recommendations:
    found = _Found()
    plan = _plan(client, request, found)
    run_plan(plan, progress)
    return _recommendations(client, request, found, len(plan))


def _plan(client: PrometheusClient, request: Request, found: _Found) -> Plan:
    pieces = chunks(request.time_range, request.chunk_seconds)
    subjects, matchers = q.subjects_and_matchers(request.matchers, request.namespaces)
    plan: Plan = []

    def when(piece: TimeRange) -> str:
        return f" {format_time(piece.start_unix)} .. {format_time(piece.end_unix)}" if len(pieces) > 1 else ""

    for subject in subjects:
        quantities = (*rq.TOTALS, rq.THROTTLED) if subject is q.PODS else rq.TOTALS
        for quantity in quantities:
            for piece in pieces:
                expr = q.total_query(subject, quantity, piece.seconds, matchers[subject.kind])
                plan.append((f"{subject.counter(quantity)}{when(piece)}",
                             total_step(client, expr, piece, subject, quantity, found.per_gpu[subject.kind])))
    pods = matchers[q.PODS.kind]
    for piece in pieces:
        span = piece.seconds
        plan.append((f"{q.GPU_INFO}{when(piece)}",
                     models_step(client, q.models_query(span, request.matchers), piece, found.models)))
        memory = rq.gpu_memory_query(span, request.matchers)
        plan.append((f"{rq.GPU_MEMORY}{when(piece)}", _instant(client, memory, piece, _gpu_memory(found))))
        facts: list[tuple[str, str, Callable[[Mapping[str, str], float], None]]] = [
            (rq.POD_INFO, rq.pod_info_query(span, pods), _owner(found)),
            ("containers", rq.containers_query(span, pods), _container(found)),
            (rq.MEMORY_LIMIT, rq.limit_query(rq.MEMORY_LIMIT, span, pods), _limit(found, "memory_limit")),
            (rq.SHARE_LIMIT, rq.limit_query(rq.SHARE_LIMIT, span, pods), _limit(found, "share_limit")),
            (rq.LADDER_STAGE, rq.ladder_query(span, pods), _ladder(found)),
            ("pod memory on all its GPUs", rq.all_gpus_memory_query(span, request.step_seconds, pods),
             _all_gpus_memory(found)),
            ("stray SM peaks", rq.stray_query(rq.SM, span, request.step_seconds, pods),
             _stray(found, "stray_sm_peak")),
            ("stray memory peaks", rq.stray_query(rq.MEMORY, span, request.step_seconds, pods),
             _stray(found, "stray_memory_peak")),
        ]
        facts += [(f"{subject.kind} MIG profiles",
                   rq.mig_profiles_query(subject, span, matchers[subject.kind]), _mig_profile(found, subject))
                  for subject in subjects]
        for what, expr, into in facts:
            plan.append((f"{what}{when(piece)}", _instant(client, expr, piece, into)))

    step = request.step_seconds
    for subject in subjects:
        chosen = matchers[subject.kind]
        series = [
            (f"{subject.kind} SM use", rq.use_query(subject, rq.SM, chosen), _samples(found, subject, "sm")),
            (f"{subject.kind} SM peaks", rq.use_query(subject, rq.SM, chosen, step),
             _peak(found, subject, "sm_peak")),
            (f"{subject.kind} memory", rq.use_query(subject, rq.MEMORY, chosen),
             _samples(found, subject, "memory")),
            (f"{subject.kind} memory peaks", rq.use_query(subject, rq.MEMORY, chosen, step),
             _peak(found, subject, "memory_peak")),
            (f"{subject.kind} GPUs held", rq.held_query(subject, chosen, 2 * step, devices=False),
             _samples(found, subject, "held")),
            (f"{subject.kind} devices held", rq.held_query(subject, chosen, 2 * step, devices=True),
             _samples(found, subject, "devices")),
        ]
        for first, last in step_windows(request.time_range, step):
            for what, expr, into in series:
                span_text = f"{format_time(first)} .. {format_time(last)}"
                plan.append((f"{what} every {format_duration(step)} {span_text}",
                             _range(client, expr, first, last, step, into)))
    return plan


# -- what each answer fills in ------------------------------------------------------------------------------

Sink = Callable[[Mapping[str, str], float], None]
PointsSink = Callable[[Mapping[str, str], tuple[tuple[float, float], ...]], None]


def _instant(client: PrometheusClient, expr: str, piece: TimeRange, into: Sink) -> Callable[[], None]:
    def run() -> None:
        for sample in client.query(expr, piece.end_unix):
            if not math.isnan(sample.value):
                into(sample.labels, sample.value)
    return run


def _range(client: PrometheusClient, expr: str, first: float, last: float, step: float,
           into: PointsSink) -> Callable[[], None]:
    def run() -> None:
        for series in client.query_range(expr, first, last, step):
            into(series.labels, series.points)
    return run


def _gpu_memory(found: _Found) -> Sink:
    def into(labels: Mapping[str, str], value: float) -> None:
        uuid = labels.get(q.UUID_LABEL)
        if uuid:
            found.gpu_memory[uuid] = max(value, found.gpu_memory.get(uuid, 0.0))
    return into


def _owner(found: _Found) -> Sink:
    def into(labels: Mapping[str, str], _: float) -> None:
        found.history(q.PODS, labels).owners.add((labels.get(rq.OWNER_KIND_LABEL, ""),
                                                  labels.get(rq.OWNER_NAME_LABEL, "")))
    return into


def _container(found: _Found) -> Sink:
    def into(labels: Mapping[str, str], _: float) -> None:
        if labels.get(rq.CONTAINER_LABEL):
            found.history(q.PODS, labels).containers.add(labels[rq.CONTAINER_LABEL])
    return into


def _limit(found: _Found, name: str) -> Sink:
    def into(labels: Mapping[str, str], value: float) -> None:
        history = found.history(q.PODS, labels)
        now = getattr(history, name)
        setattr(history, name, value if now is None else max(now, value))
    return into


def _ladder(found: _Found) -> Sink:
    def into(labels: Mapping[str, str], value: float) -> None:
        found.history(q.PODS, labels).ladder_restarts += max(0.0, value)
    return into


def _all_gpus_memory(found: _Found) -> Sink:
    def into(labels: Mapping[str, str], value: float) -> None:
        history = found.history(q.PODS, labels)
        now = history.all_gpus_memory_peak
        history.all_gpus_memory_peak = value if now is None else max(now, value)
    return into


def _stray(found: _Found, name: str) -> Sink:
    def into(labels: Mapping[str, str], value: float) -> None:
        uuid = labels.get(q.UUID_LABEL)
        if uuid:
            peaks: dict[str, float] = getattr(found.history(q.PODS, labels), name)
            peaks[uuid] = max(value, peaks.get(uuid, value))
    return into


def _mig_profile(found: _Found, subject: q.Subject) -> Sink:
    def into(labels: Mapping[str, str], _: float) -> None:
        if labels.get(rq.MIG_PROFILE_LABEL):
            found.history(subject, labels).mig_profiles.add(labels[rq.MIG_PROFILE_LABEL])
    return into


def _samples(found: _Found, subject: q.Subject, name: str) -> PointsSink:
    def into(labels: Mapping[str, str], points: tuple[tuple[float, float], ...]) -> None:
        target: dict[float, float] = getattr(found.history(subject, labels), name)
        for t, value in points:
            if not math.isnan(value):
                target[round(t, 3)] = value
    return into


def _peak(found: _Found, subject: q.Subject, name: str) -> PointsSink:
    def into(labels: Mapping[str, str], points: tuple[tuple[float, float], ...]) -> None:
        values = [v for _, v in points if not math.isnan(v)]
        if values:
            history = found.history(subject, labels)
            now = getattr(history, name)
            setattr(history, name, max(values) if now is None else max(now, *values))
    return into


# -- from the answers to the recommendations -----------------------------------------------------------------


def _recommendations(client: PrometheusClient, request: Request, found: _Found,
                     queries: int) -> Recommendations:
    for kind, per_gpu in found.per_gpu.items():
        for (group, name, uuid), figures in per_gpu.items():
            found.histories[(kind, group, name)].totals[uuid].update(figures)
    gpu_memory: dict[str, float] = {}
    for uuid, size in found.gpu_memory.items():
        model = found.models.get(uuid)
        if model:
            gpu_memory[model] = max(size, gpu_memory.get(model, 0.0))

    keyed: list[tuple[str, WorkloadKey, PodHistory]] = []
    for (kind, group, name), history in found.histories.items():
        if not history.totals and not history.held:
            continue  # facts about a pod without GPU time in the range (a limit set, no use)
        if kind == q.PODS.kind:
            key = (WorkloadKey(group, "Pod", name, "pod_name") if _UID_RE.match(name) and not history.owners
                   else pod_workload(group, name, history.owners))
        else:
            key = unit_workload(group, name)
        keyed.append((name, key, history))
    grouped = group_by_workload(keyed)

    options, span = request.options, request.time_range
    rows = []
    for key, pods in grouped.items():
        stats = build_stats(key, pods, found.models, gpu_memory, span.start_unix, request.step_seconds,
                            options.percentile)
        rec = recommend(stats, options)
        rows.append(Row(stats, rec, savings(stats, rec, span.seconds, request.prices)))
    rows.sort(key=lambda r: (-r.savings.saved_gpu_hours_week, -r.savings.current_gpu_hours_week, r.stats.key))
    return Recommendations(
        client.base_url, span, request.step_seconds, options, tuple(rows),
        totals(rows, request.prices.prices_gpu_hours), pack(rows), request.prices,
        ", ".join(request.matchers), queries, tuple(_warnings(client, request, rows)))


def _warnings(client: PrometheusClient, request: Request, rows: list[Row]) -> list[str]:
    warnings = []
    if not rows:
        warnings.append(why_empty(client, request.time_range, request.matchers, request.namespaces,
                                  "no GPU workloads", q.PODS.counter(q.ALLOCATED)))
    by_name = sorted(str(r.stats.key) for r in rows if r.stats.key.source == "pod_name")
    if by_name:
        warnings.append(f"{len(by_name)} workload(s) grouped by pod name, their owners unknown (agents "
                        f"without the API server, or older ones): {', '.join(by_name[:5])}"
                        f"{', ...' if len(by_name) > 5 else ''}")
    if request.prices.prices_gpu_hours:
        unpriced = sorted({r.stats.gpu_model or "unknown" for r in rows if r.savings.cost_saved_week is None})
        if unpriced:
            warnings.append(f"no GPU-hour price for GPU model(s) {', '.join(unpriced)}: their workloads "
                            f"have no cost (add them to the price file, or a default)")
    if not step_windows(request.time_range, request.step_seconds):
        warnings.append(f"the range is shorter than the step ({format_duration(request.step_seconds)}): no "
                        f"samples; set --step")
    return warnings
