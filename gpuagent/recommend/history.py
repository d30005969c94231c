"""From what the queries found per pod to each workload's history: pods grouped by workload, their
samples pooled into distributions, their GPU time added up (pure functions; no I/O).

Samples are read every step: a pod's SM use and memory at that instant (its busiest and fullest device),
how many GPUs and devices it held over the step. A workload's distributions pool its pods' samples (three
replicas give three samples a step); what it held at once is the most devices its pods held at the same
instant, each of the size its devices usually have (the median over the steps).
Percentiles interpolate linearly between the nearest samples; the peak is the largest value any scrape
saw (``max_over_time`` over each step), never only the samples.

What a pod did on a GPU it was not allocated (a stray) stays apart: its samples are not read (the queries
leave them out), its busy time is not the workload's (busy on a GPU with no allocated time, as ``gpuagent
report`` counts efficiency), and :class:`~gpuagent.recommend.model.Strays` says what it was. Its memory
still counts in ``memory_all_gpus_bytes``, since the memory ladder counts it against the pod's limit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuagent.migprofiles import mig_model
from gpuagent.recommend.model import Distribution, Strays, WorkloadKey, WorkloadStats

DAY = 86400.0

# Devices come in few sizes: a whole GPU, a MIG slice (k/7 or k/8 of one: at most 4/7 short of whole), a
# time-slicing replica (1/N: at most 1/2). A size is measured as a rate of allocated seconds over a short
# window, which the scrapes' timing moves by a few percent (a counter read 1.5 s after the last, by an agent
# counting every 0.5 s); so a median over this is a whole GPU.
WHOLE_ABOVE = 0.9


@dataclass
class PodHistory:
    """One pod (or one workload outside Kubernetes) as the queries found it; times are Unix seconds."""

    sm: dict[float, float] = field(default_factory=dict)  # time -> its busiest device's SM use (0-1)
    sm_peak: float | None = None
    memory: dict[float, float] = field(default_factory=dict)  # time -> its fullest device's bytes
    memory_peak: float | None = None
    held: dict[float, float] = field(default_factory=dict)  # time -> GPUs held over the step before
    devices: dict[float, float] = field(default_factory=dict)  # time -> devices held over the step before
    totals: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))  # UUID -> figures
    memory_limit: float | None = None
    share_limit: float | None = None
    ladder_restarts: float = 0.0
    owners: set[tuple[str, str]] = field(default_factory=set)  # (owner_kind, owner_name) seen
    containers: set[str] = field(default_factory=set)
    mig_profiles: set[str] = field(default_factory=set)
    all_gpus_memory_peak: float | None = None  # its memory on every GPU it used, strays included, added up
    stray_sm_peak: dict[str, float] = field(default_factory=dict)  # UUID of a GPU not allocated -> peak
    stray_memory_peak: dict[str, float] = field(default_factory=dict)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ascending ``ordered`` (not empty), interpolated linearly between
    the nearest ranks (what numpy's default does)."""
    if not ordered:
        raise ValueError("percentile of no samples")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Iterable[float], peak: float | None, chosen: float) -> Distribution | None:
    """p50/p95/p99, the ``chosen`` percentile and the max of ``values`` (the max at least ``peak``)."""
    ordered = sorted(values)
    if not ordered:
        return None
    top = ordered[-1] if peak is None else max(ordered[-1], peak)
    return Distribution(p50=percentile(ordered, 50), p95=percentile(ordered, 95), p99=percentile(ordered, 99),
                        max=top, samples=len(ordered), chosen=percentile(ordered, chosen))


def _max(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _sum_at_times(series: Iterable[Mapping[float, float]]) -> dict[float, float]:
    total: dict[float, float] = defaultdict(float)
    for points in series:
        for t, value in points.items():
            total[t] += value
    return total


def build_stats(key: WorkloadKey, pods: Mapping[str, PodHistory], models: Mapping[str, str],
                gpu_memory: Mapping[str, float], start_unix: float, step_seconds: float,
                chosen_percentile: float) -> WorkloadStats:
    """The workload's history from its pods'. ``models``: GPU UUID -> model name; ``gpu_memory``: model ->
    bytes of one GPU."""
    histories = list(pods.values())
    allocated_by_model: dict[str, float] = defaultdict(float)
    allocated = 0.0
    busy: float | None = None
    idle: float | None = None
    throttled = 0.0
    stray_busy: float | None = None
    stray_gpus: set[str] = set()
    for history in histories:
        stray_gpus.update(history.stray_sm_peak, history.stray_memory_peak)
        for uuid, figures in history.totals.items():
            alloc = figures.get("allocated_seconds", 0.0)
            allocated += alloc
            allocated_by_model[models.get(uuid, "")] += alloc
            if "busy_seconds" in figures and alloc > 0:
                busy = (busy or 0.0) + figures["busy_seconds"]
            elif figures.get("busy_seconds", 0.0) > 0:  # busy on a GPU it was not allocated: a stray
                stray_busy = (stray_busy or 0.0) + figures["busy_seconds"]
                stray_gpus.add(uuid)
            if "idle_allocated_seconds" in figures:
                idle = (idle or 0.0) + figures["idle_allocated_seconds"]
            throttled += figures.get("throttled_seconds", 0.0)
    model = max(allocated_by_model, key=lambda m: (allocated_by_model[m], m)) if allocated_by_model else ""

    held = _sum_at_times(h.held for h in histories)
    devices = _sum_at_times(h.devices for h in histories)
    seen = sorted(t for t, gpus in held.items() if gpus > 0)
    devices_held = max(devices.values(), default=0.0)
    # one device's size in GPUs (1 whole, 2/7 a MIG slice, 1/N a replica): the median over its pods' steps
    # of GPUs over devices held (steps where a pod starts or stops, held for part of the step, do not move it)
    sizes = sorted(h.held[t] / h.devices[t] for h in histories for t, gpus in h.held.items()
                   if gpus > 0 and h.devices.get(t))
    device_size = min(1.0, percentile(sizes, 50)) if sizes else 1.0
    if device_size >= WHOLE_ABOVE:  # a whole GPU read through the rates' jitter (see WHOLE_ABOVE)
        device_size = 1.0
    # the most GPUs held at once: devices (a count, exact) at that size; a rate's maximum would carry the
    # scrapes' jitter (a counter read 1.5 s after the last, by an agent that counts every 0.5 s)
    gpus_held = round(devices_held) * device_size
    per_pod = [max(h.devices.values(), default=0.0) for h in histories]

    mig_profiles = sorted(set().union(*(h.mig_profiles for h in histories)))
    gpu_bytes = gpu_memory.get(model)
    limit = _max(h.memory_limit for h in histories)
    capacity = _capacity(model, mig_profiles, gpu_bytes, limit)
    return WorkloadStats(
        key=key, pods=tuple(sorted(pods)),
        containers=tuple(sorted(set().union(*(h.containers for h in histories)))),
        gpu_model=model or None, gpus_held=round(gpus_held, 3),
        devices=max(1, round(devices_held)) if seen else 0,
        device_size=round(device_size, 3), devices_per_pod=max(1, round(max(per_pod, default=1.0))),
        allocated_gpu_seconds=allocated, busy_gpu_seconds=busy, idle_gpu_seconds=idle,
        sm=distribution((v for h in histories for v in h.sm.values()), _max(h.sm_peak for h in histories),
                        chosen_percentile),
        memory=distribution((v for h in histories for v in h.memory.values()),
                            _max(h.memory_peak for h in histories), chosen_percentile),
        memory_limit_bytes=limit, memory_capacity_bytes=capacity, gpu_memory_bytes=gpu_bytes,
        share_limit_ratio=_max(h.share_limit for h in histories),
        mig_profile=mig_profiles[0] if len(mig_profiles) == 1 else None,
        throttled_seconds=throttled, ladder_restarts=round(sum(h.ladder_restarts for h in histories)),
        seen_seconds=len(seen) * step_seconds,
        days_seen=len({math.floor((t - step_seconds / 2 - start_unix) / DAY) for t in seen}),
        memory_all_gpus_bytes=_max(h.all_gpus_memory_peak for h in histories),
        strays=Strays(
            gpus=len(stray_gpus), busy_gpu_seconds=stray_busy,
            sm_peak=_max(v for h in histories for v in h.stray_sm_peak.values()),
            memory_peak_bytes=_max(sum(h.stray_memory_peak.values()) if h.stray_memory_peak else None
                                   for h in histories),
        ) if stray_gpus else None,
    )


def _capacity(model: str, mig_profiles: Sequence[str], gpu_bytes: float | None,
              limit: float | None) -> float | None:
    """What one device holds: the smallest of its memory limit, its MIG instance, the whole GPU."""
    sizes = [limit, gpu_bytes]
    table = mig_model(model)
    if table is not None and len(mig_profiles) == 1:
        profile = table.profile(mig_profiles[0])
        sizes.append(profile.memory_bytes if profile is not None else None)
    return min((s for s in sizes if s), default=None)
