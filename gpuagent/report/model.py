"""The report's rows: usage per pod, per namespace, per other workload, and in total, with costs, and the
efficiency timeline (immutable; no I/O).

Quantities stay in the counters' base units (GPU-seconds, byte-seconds, joules) so sums are exact; the
properties give the units people read (GPU-hours, GiB-hours, kWh). ``None`` means "no such counter in
Prometheus for this row", never 0.

Every figure a row shows adds up on the row, or the row says why not (:meth:`Usage.notes`, one reason per
code in :data:`NOTES`, the same in every format): busy time on a GPU the row was not allocated (a stray) is
busy but not efficiency, and is shown apart (``busy_elsewhere_gpu_hours``); efficiency is taken over the
allocated time whose busy time is known (MIG without GPM has none); and a replica holder can use more of
its GPU than the 1/N it was allocated, so its efficiency can pass 100 %.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuagent.prom import queries as q
from gpuagent.prom.plan import Key
from gpuagent.prom.prices import Prices
from gpuagent.prom.timerange import TimeRange

SECONDS_PER_HOUR = 3600.0
BYTES_PER_GIB = float(1024**3)
JOULES_PER_KWH = 3.6e6


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


@dataclass(frozen=True)
class Usage:
    allocated_gpu_seconds: float | None = None
    busy_gpu_seconds: float | None = None
    idle_gpu_seconds: float | None = None  # allocated GPU-seconds under the agent's idle threshold
    memory_byte_seconds: float | None = None
    energy_joules: float | None = None
    cost: float | None = None
    # allocated GPU-seconds of the GPUs whose busy time is known: efficiency's denominator (a MIG instance
    # without GPM has no busy figure, and must not count as idle)
    busy_known_allocated_gpu_seconds: float | None = None
    # busy GPU-seconds on the GPUs it was allocated: efficiency's numerator. A process on a GPU its pod was
    # not given (a stray) is busy there, in busy_gpu_seconds, but that is not the allocation put to use
    # (it made the demo's notebook 130 % efficient)
    allocated_busy_gpu_seconds: float | None = None
    # busy GPU-seconds on GPUs it was not allocated (a stray's): busy_gpu_seconds less the line above, summed
    # apart so that it is exactly 0 where there is none
    busy_elsewhere_gpu_seconds: float | None = None

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{name: _add(getattr(self, name), getattr(other, name)) for name in USAGE_FIELDS})

    @property
    def allocated_gpu_hours(self) -> float | None:
        return None if self.allocated_gpu_seconds is None else self.allocated_gpu_seconds / SECONDS_PER_HOUR

    @property
    def busy_gpu_hours(self) -> float | None:
        return None if self.busy_gpu_seconds is None else self.busy_gpu_seconds / SECONDS_PER_HOUR

    @property
    def busy_elsewhere_gpu_hours(self) -> float | None:
        s = self.busy_elsewhere_gpu_seconds
        return None if s is None else s / SECONDS_PER_HOUR

    @property
    def idle_gpu_hours(self) -> float | None:
        return None if self.idle_gpu_seconds is None else self.idle_gpu_seconds / SECONDS_PER_HOUR

    @property
    def memory_gib_hours(self) -> float | None:
        if self.memory_byte_seconds is None:
            return None
        return self.memory_byte_seconds / BYTES_PER_GIB / SECONDS_PER_HOUR

    @property
    def energy_kwh(self) -> float | None:
        return None if self.energy_joules is None else self.energy_joules / JOULES_PER_KWH

    @property
    def efficiency_ratio(self) -> float | None:
        """Busy over allocated GPU-time (0-1), of the GPUs whose busy time is known; None without any."""
        if not self.busy_known_allocated_gpu_seconds or self.allocated_busy_gpu_seconds is None:
            return None
        return self.allocated_busy_gpu_seconds / self.busy_known_allocated_gpu_seconds

    def figures(self) -> dict[str, float | None]:
        """The reported figures, by their names in CSV and JSON."""
        return {name: getattr(self, name) for name in FIGURES}

    def notes(self) -> tuple[str, ...]:
        """Why the row's figures do not add up as busy / allocated = efficiency <= 100 % (codes of
        :data:`NOTES`, in its order); () when they do."""
        found = []
        if self.busy_elsewhere_gpu_seconds:
            found.append(BUSY_ELSEWHERE)
        efficiency = self.efficiency_ratio
        if efficiency is not None:
            known, allocated = self.busy_known_allocated_gpu_seconds or 0.0, self.allocated_gpu_seconds or 0.0
            if known < allocated * (1 - 1e-9):
                found.append(BUSY_UNKNOWN)
            if efficiency > OVER_FULL_RATIO:
                found.append(OVER_SHARE)
        return tuple(found)


USAGE_FIELDS = ("allocated_gpu_seconds", "busy_gpu_seconds", "idle_gpu_seconds", "memory_byte_seconds",
                "energy_joules", "cost", "busy_known_allocated_gpu_seconds", "allocated_busy_gpu_seconds",
                "busy_elsewhere_gpu_seconds")
# What the outputs show, in their column order.
FIGURES = ("allocated_gpu_hours", "busy_gpu_hours", "busy_elsewhere_gpu_hours", "efficiency_ratio",
           "idle_gpu_hours", "memory_gib_hours", "energy_kwh", "cost")

# Why a row's efficiency is not its GPU-h busy / allocated, or is over 100 %: each reason's code (CSV, JSON)
# and its sentence (under a table, in the page, in the JSON's legend), numbered in this order.
BUSY_ELSEWHERE, BUSY_UNKNOWN, OVER_SHARE = "busy_elsewhere", "busy_unknown", "over_share"
NOTES = {
    BUSY_ELSEWHERE: "GPU-h busy elsewhere (on GPUs not allocated to it: a stray process) count in GPU-h "
                    "busy, not in efficiency: efficiency = (busy - busy elsewhere) / allocated",
    BUSY_UNKNOWN: "efficiency over the allocated GPU-hours whose busy time is known (a MIG instance without "
                  "GPM has none), not over all of them",
    OVER_SHARE: "over 100 %: it used more of its GPUs than it was allocated (a time-slicing or MPS replica "
                "is allocated 1/N of a GPU and may use more while its neighbours leave room)",
}
OVER_FULL_RATIO = 1.0005  # an efficiency shown over 100.0 %


@dataclass(frozen=True)
class PodRow:
    namespace: str
    pod: str
    usage: Usage
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class NamespaceRow:
    namespace: str
    usage: Usage
    pods: int


@dataclass(frozen=True)
class WorkloadRow:
    """A GPU user outside Kubernetes: ``workload_kind`` is e.g. systemd_service, user, docker, slurm_job."""

    workload_kind: str
    workload: str
    usage: Usage
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class TimelinePoint:
    """GPU-seconds over the step ending at ``time_unix``."""

    time_unix: float
    busy_gpu_seconds: float
    allocated_gpu_seconds: float

    @property
    def efficiency_ratio(self) -> float | None:
        return self.busy_gpu_seconds / self.allocated_gpu_seconds if self.allocated_gpu_seconds > 0 else None


@dataclass(frozen=True)
class Timeline:
    step_seconds: float
    cluster: tuple[TimelinePoint, ...] = ()  # pods and other workloads together
    namespaces: Mapping[str, tuple[TimelinePoint, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    prometheus_url: str
    time_range: TimeRange
    chunk_seconds: float
    queries: int
    namespaces: tuple[NamespaceRow, ...]
    pods: tuple[PodRow, ...]
    workloads: tuple[WorkloadRow, ...]
    total: Usage
    timeline: Timeline
    prices: Prices
    selector: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def has_cost(self) -> bool:
        return self.prices.any

    def notes(self) -> dict[str, str]:
        """The sentences of the reasons any row gives (:meth:`Usage.notes`), by code, in NOTES' order."""
        rows = (*self.namespaces, *self.pods, *self.workloads)
        found = {code for usage in (*(r.usage for r in rows), self.total) for code in usage.notes()}
        return {code: text for code, text in NOTES.items() if code in found}

    @property
    def has_busy_elsewhere(self) -> bool:
        """Some row was busy on a GPU it was not allocated (the total sums every row)."""
        return bool(self.total.busy_elsewhere_gpu_seconds)

    def top_idle_pods(self, count: int = 10) -> tuple[PodRow, ...]:
        """Pods with the most idle GPU-hours, most first (those with none left out)."""
        idle = [row for row in self.pods if row.usage.idle_gpu_seconds]
        idle.sort(key=lambda r: (-(r.usage.idle_gpu_seconds or 0.0), r.namespace, r.pod))
        return tuple(idle[:count])


def total_of(usages: Iterable[Usage]) -> Usage:
    total = Usage()
    for usage in usages:
        total = total + usage
    return total


# -- building it from query results -------------------------------------------------------------------------

def priced(usage: Usage, model: str | None, prices: Prices) -> Usage:
    """``usage`` of one GPU (of ``model``) with its cost: allocated GPU-hours at the model's price plus
    energy at the kWh price. None when a price it needs is missing (a partial cost would mislead)."""
    if not prices.any:
        return usage
    cost = 0.0
    if prices.prices_gpu_hours:
        gpu_hour = prices.gpu_hour(model)
        if gpu_hour is None:
            return usage
        cost += (usage.allocated_gpu_hours or 0.0) * gpu_hour
    if prices.kwh is not None:
        cost += (usage.energy_kwh or 0.0) * prices.kwh
    return dataclasses.replace(usage, cost=cost)


def usage_of(quantities: Mapping[str, float]) -> Usage:
    """A Usage from ``{quantity: base units}`` (queries.QUANTITIES names)."""
    allocated, busy = quantities.get(q.ALLOCATED), quantities.get(q.BUSY)
    return Usage(allocated, busy, quantities.get(q.IDLE), quantities.get(q.MEMORY), quantities.get(q.ENERGY),
                 busy_known_allocated_gpu_seconds=None if busy is None else allocated,
                 allocated_busy_gpu_seconds=None if busy is None else (busy if allocated else 0.0),
                 busy_elsewhere_gpu_seconds=None if busy is None else (0.0 if allocated else busy))


Rows = dict[tuple[str, str], Usage]


def build_rows(per_gpu: Mapping[Key, Mapping[str, float]], models: Mapping[str, str],
               prices: Prices) -> tuple[Rows, dict[tuple[str, str], set[str]], set[str]]:
    """Per (group, name): usage summed over its GPUs, each priced at its model; the models seen; and the
    models (or ``unknown``) that had no GPU-hour price."""
    usage: dict[tuple[str, str], Usage] = {}
    seen: dict[tuple[str, str], set[str]] = {}
    unpriced: set[str] = set()
    for (group, name, uuid), quantities in sorted(per_gpu.items()):
        model = models.get(uuid)
        gpu = priced(usage_of(quantities), model, prices)
        if prices.prices_gpu_hours and gpu.cost is None:
            unpriced.add(model or "unknown")
        usage[(group, name)] = usage.get((group, name), Usage()) + gpu
        if model:
            seen.setdefault((group, name), set()).add(model)
    # A row with an unpriced GPU has no cost at all: set it back to None after the sum.
    for (group, name, uuid) in per_gpu:
        if prices.prices_gpu_hours and prices.gpu_hour(models.get(uuid)) is None:
            usage[(group, name)] = dataclasses.replace(usage[(group, name)], cost=None)
    return usage, seen, unpriced


def by_allocated(rows: Iterable[tuple[tuple[str, ...], Usage]]) -> list[tuple[tuple[str, ...], Usage]]:
    """Most allocated GPU-time first, then by name."""
    return sorted(rows, key=lambda item: (-(item[1].allocated_gpu_seconds or 0.0), item[0]))
