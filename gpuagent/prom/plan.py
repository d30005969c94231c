"""The query plan of the commands that read the accounting counters: a list of queries run in order, each
announced on the progress line, and the steps that fill the totals per GPU and the GPUs' models from them.

``gpuagent report`` and ``gpuagent recommend`` build their plans from these steps (and steps of their own),
so both read the same counters the same way: each chunk's ``increase`` at the chunk's end, summed per
(group, name, UUID); range queries in windows of at most ``MAX_POINTS`` points.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpuagent.prom import queries as q
from gpuagent.prom.client import PrometheusClient
from gpuagent.prom.progress import Progress
from gpuagent.prom.timerange import TimeRange

MAX_POINTS = 500  # points per range query (Prometheus refuses more than 11,000)

# (group, name, UUID) -> quantity -> base units; group/name: namespace/pod or workload_kind/workload
Key = tuple[str, str, str]

Plan = list[tuple[str, Callable[[], None]]]  # (what is asked, for the progress line; the query)


def run_plan(plan: Plan, progress: Progress) -> None:
    """Every query of ``plan`` in order, each announced on ``progress``."""
    progress.start(len(plan))
    for what, run in plan:
        progress.step(what)
        run()
    progress.finish()


def total_step(client: PrometheusClient, expr: str, piece: TimeRange, subject: q.Subject, quantity: str,
               into: dict[Key, dict[str, float]]) -> Callable[[], None]:
    """The query adding ``expr`` at the piece's end to ``into[(group, name, UUID)][quantity]``."""
    def run() -> None:
        for sample in client.query(expr, piece.end_unix):
            if math.isnan(sample.value):
                continue
            key = (sample.labels.get(subject.group_label, ""), sample.labels.get(subject.name_label, ""),
                   sample.labels.get(q.UUID_LABEL, ""))
            into[key][quantity] = into[key].get(quantity, 0.0) + sample.value
    return run


def models_step(client: PrometheusClient, expr: str, piece: TimeRange,
                into: dict[str, str]) -> Callable[[], None]:
    """The query filling ``into[UUID] = model`` from ``q.models_query`` at the piece's end."""
    def run() -> None:
        for sample in client.query(expr, piece.end_unix):
            uuid, model = sample.labels.get(q.UUID_LABEL), sample.labels.get(q.MODEL_LABEL)
            if uuid and model:
                into[uuid] = model
    return run


def step_windows(time_range: TimeRange, step_seconds: float) -> list[tuple[float, float]]:
    """(first, last) evaluation times of each range query: points at start + k * step, k >= 1 (each the
    increase over the step before it), up to the end, ``MAX_POINTS`` per query."""
    count = math.floor(round(time_range.seconds / step_seconds, 9))
    times = [round(time_range.start_unix + k * step_seconds, 3) for k in range(1, count + 1)]
    return [(times[i], times[min(i + MAX_POINTS, len(times)) - 1]) for i in range(0, len(times), MAX_POINTS)]
