"""Asks Prometheus for a report's figures and builds the :class:`~gpuagent.report.model.Report`.

Queries, in order: for each subject (pods; other workloads unless namespaces are picked), each counter and
each chunk of the range, the counter's ``increase`` over the chunk at the chunk's end, per (group, name,
UUID), summed over chunks; the GPU models (``gpuagent_gpu_info`` by UUID); and the busy and allocated
GPU-seconds per step for the efficiency timeline, in range queries of at most ``MAX_POINTS`` points
(the plan and its shared steps: ``gpuagent.prom.plan``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuagent.prom import queries as q
from gpuagent.prom.client import PrometheusClient
from gpuagent.prom.empty import why_empty
from gpuagent.prom.plan import Key, Plan, models_step, run_plan, step_windows, total_step
from gpuagent.prom.prices import Prices
from gpuagent.prom.progress import Progress
from gpuagent.prom.timerange import TimeRange, chunks, format_duration, format_time
from gpuagent.report.model import (
    NamespaceRow,
    PodRow,
    Report,
    Timeline,
    TimelinePoint,
    Usage,
    WorkloadRow,
    build_rows,
    by_allocated,
    total_of,
)


@dataclass(frozen=True)
class Request:
    time_range: TimeRange
    step_seconds: float
    chunk_seconds: float
    matchers: tuple[str, ...] = ()  # --selector, applied to every series read
    namespaces: tuple[str, ...] = ()  # only these (and no other workloads)
    prices: Prices = field(default_factory=Prices)


def collect(client: PrometheusClient, request: Request, progress: Progress) -> Report:
    pieces = chunks(request.time_range, request.chunk_seconds)
    subjects, matchers = q.subjects_and_matchers(request.matchers, request.namespaces)
    timeline_windows = step_windows(request.time_range, request.step_seconds)

    plan: Plan = []
    per_gpu: dict[str, dict[Key, dict[str, float]]] = {s.kind: defaultdict(dict) for s in subjects}
    models: dict[str, str] = {}
    steps: dict[str, dict[str, dict[float, float]]] = {}  # quantity -> group ("": workloads) -> time -> value

    def when(piece: TimeRange) -> str:
        return f"{format_time(piece.start_unix)} .. {format_time(piece.end_unix)}" if len(pieces) > 1 else ""

    for subject in subjects:
        for quantity in q.QUANTITIES:
            for piece in pieces:
                expr = q.total_query(subject, quantity, piece.seconds, matchers[subject.kind])
                plan.append((f"{subject.counter(quantity)} {when(piece)}",
                             total_step(client, expr, piece, subject, quantity, per_gpu[subject.kind])))
    for piece in pieces:  # the GPU models, shown per pod and used by per-model prices
        plan.append((f"{q.GPU_INFO} {when(piece)}",
                     models_step(client, q.models_query(piece.seconds, request.matchers), piece, models)))
    for subject in subjects:
        for quantity in (q.BUSY, q.ALLOCATED):
            expr = q.timeline_query(subject, quantity, request.step_seconds, matchers[subject.kind])
            for first, last in timeline_windows:
                plan.append((f"{subject.counter(quantity)} every {format_duration(request.step_seconds)} "
                             f"{format_time(first)} .. {format_time(last)}",
                             _steps(client, expr, first, last, request.step_seconds, subject,
                                    steps.setdefault(quantity, defaultdict(dict)))))

    run_plan(plan, progress)
    return _report(client, request, len(plan), per_gpu, models, steps, timeline_windows)


def _steps(client: PrometheusClient, expr: str, first: float, last: float, step_seconds: float,
           subject: q.Subject, into: dict[str, dict[float, float]]) -> Callable[[], None]:
    def run() -> None:
        for series in client.query_range(expr, first, last, step_seconds):
            group = series.labels.get(subject.group_label, "") if subject is q.PODS else ""
            for t, value in series.points:
                if not math.isnan(value):
                    into[group][round(t, 3)] = into[group].get(round(t, 3), 0.0) + value
    return run


def _report(client: PrometheusClient, request: Request, queries: int,
            per_gpu: dict[str, dict[Key, dict[str, float]]], models: dict[str, str],
            steps: dict[str, dict[str, dict[float, float]]], windows: list[tuple[float, float]]) -> Report:
    prices = request.prices
    warnings: list[str] = []
    pods_usage, pod_models, unpriced = build_rows(per_gpu.get(q.PODS.kind, {}), models, prices)
    work_usage, work_models, unpriced_work = build_rows(per_gpu.get(q.WORKLOADS.kind, {}), models, prices)
    unpriced |= unpriced_work

    pods = tuple(PodRow(ns, pod, usage, tuple(sorted(pod_models.get((ns, pod), ()))))
                 for (ns, pod), usage in by_allocated(pods_usage.items()))
    workloads = tuple(WorkloadRow(kind, name, usage, tuple(sorted(work_models.get((kind, name), ()))))
                      for (kind, name), usage in by_allocated(work_usage.items()))
    namespace_usage: dict[str, Usage] = {}
    pod_counts: dict[str, int] = defaultdict(int)
    for row in pods:
        namespace_usage[row.namespace] = namespace_usage.get(row.namespace, Usage()) + row.usage
        pod_counts[row.namespace] += 1
    namespaces = tuple(NamespaceRow(ns, usage, pod_counts[ns])
                       for (ns,), usage in by_allocated(((ns,), u) for ns, u in namespace_usage.items()))
    total = total_of([*pods_usage.values(), *work_usage.values()])
    if prices.any and any(u.cost is None for u in [*pods_usage.values(), *work_usage.values()]):
        total = dataclasses.replace(total, cost=None)

    if not pods and not workloads:
        warnings.append(why_empty(client, request.time_range, request.matchers, request.namespaces,
                                  "no accounting series", q.PODS.counter(q.ALLOCATED)))
    if unpriced:
        warnings.append(f"no GPU-hour price for GPU model(s) {', '.join(sorted(unpriced))}: their pods have "
                        f"no cost (add them to the price file, or a default)")
    if not windows:
        warnings.append(f"no efficiency timeline: the range is shorter than the step "
                        f"({format_duration(request.step_seconds)}; set --step)")
    selector = ", ".join(request.matchers)
    return Report(client.base_url, request.time_range, request.chunk_seconds, queries, namespaces, pods,
                  workloads, total, _timeline(steps, windows, request.step_seconds), prices, selector,
                  tuple(warnings))


def _timeline(steps: dict[str, dict[str, dict[float, float]]], windows: list[tuple[float, float]],
              step_seconds: float) -> Timeline:
    times = sorted({t for by_group in steps.values() for values in by_group.values() for t in values})
    if not windows:
        return Timeline(step_seconds)
    busy, allocated = steps.get(q.BUSY, {}), steps.get(q.ALLOCATED, {})
    groups = sorted(set(busy) | set(allocated))

    def points(group: str | None) -> tuple[TimelinePoint, ...]:
        chosen = groups if group is None else [group]
        return tuple(TimelinePoint(t, sum(busy.get(g, {}).get(t, 0.0) for g in chosen),
                                   sum(allocated.get(g, {}).get(t, 0.0) for g in chosen)) for t in times)

    return Timeline(step_seconds, points(None), {g: points(g) for g in groups if g})
