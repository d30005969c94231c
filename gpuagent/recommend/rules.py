"""What a workload should ask for, from its history, with the reason in words (pure; no I/O).

In order, the first that applies:

1. **too little history**: it held GPUs for less than ``min_history`` of the range: no guess.
2. **needs more**: the memory ladder terminated or evicted it; or its memory on all its GPUs (strays
   included: the figure the ladder compares with the limit) reached ``near_limit`` (90 %) of its
   ``gpuagent.io/gpu-memory`` limit; or its memory peak reached ``near_limit`` of what one device holds
   (its limit, its MIG instance, its GPU); or
   the time-slice controller froze it ``throttled`` (5 %) of its time. The new limit: memory at peak plus
   headroom, a share at its limit plus headroom scaled up by the time it was held back.
3. **release**: idle (under the agents' idle threshold) ``release_idle`` (80 %) of its allocated time: it
   should give the GPU back between uses (scale to zero, cull idle notebooks).
4. **keep**: it needs ``keep_above`` (75 %) of a GPU or more: its chosen SM percentile plus headroom, or
   its memory peak plus headroom over the GPU's memory.
5. Otherwise, smaller: with ``sharing`` auto, the smallest **MIG** profile of its GPU model whose compute
   (slices / all slices) and memory hold its chosen SM percentile and memory peak plus headroom (hard
   isolation, where the model has MIG); else **MPS** with an active-thread percentage when its use is
   steady (the chosen percentile within ``steady_ratio`` of the median, plus 5 points), since MPS runs its
   kernels beside the others' rather than in turns; else a time-slicing **share**
   (``gpuagent.io/gpu-share``) with ``gpuagent.io/gpu-memory``. A size that is not smaller than what it
   holds now keeps it.

Never below an observed peak of memory: memory is always sized from the peak, never a percentile. Shares
and thread percentages round up to 5 points, memory up to whole GiB (256 MiB steps under 4 GiB). SM use is
NVML's: the time kernels ran, which stands for the share of the GPU a workload needs when its kernels
would take the same time on a slice (the usual approximation; a MIG slice with fewer SMs runs a wide
kernel longer).
"""

from __future__ import annotations

import math

from gpuagent.migprofiles import MigModel, MigProfile, mig_model
from gpuagent.prom.timerange import format_duration
from gpuagent.recommend.model import (
    GIB,
    Action,
    Options,
    Recommendation,
    WorkloadStats,
    gib_text,
    memory_text,
    percent_text,
)

SHARE_STEP = 0.05
MIB = 1024**2
SHARE_ANNOTATION = "gpuagent.io/gpu-share"
MEMORY_ANNOTATION = "gpuagent.io/gpu-memory"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARINGS = ("auto", "share", "mps", "mig")


def round_share(ratio: float) -> float:
    """Up to the next 5 points, at least 5 %, at most 100 %."""
    return min(1.0, max(SHARE_STEP, math.ceil(round(ratio / SHARE_STEP, 9)) * SHARE_STEP))


def round_memory(size: float) -> int:
    """Up to whole GiB (256 MiB steps under 4 GiB), at least 256 MiB."""
    step = GIB if size >= 4 * GIB else 256 * MIB
    return max(256 * MIB, math.ceil(round(size / step, 9)) * step)


def recommend(stats: WorkloadStats, options: Options) -> Recommendation:
    if options.sharing not in SHARINGS:
        raise ValueError(f"sharing: expected one of {', '.join(SHARINGS)}, got {options.sharing!r}")
    if stats.seen_seconds < options.min_history_seconds:
        return Recommendation(Action.INSUFFICIENT, (
            f"too little history: it held GPUs for {format_duration(stats.seen_seconds)} on "
            f"{stats.days_seen} day(s) of the range ({format_duration(options.min_history_seconds)} needed); "
            f"no recommendation"))
    more = _needs_more(stats, options)
    if more is not None:
        return more
    idle = stats.idle_ratio
    if idle is not None and idle >= options.release_idle:
        return _release(stats, idle)
    if stats.sm is None:
        mean = stats.mean_sm_ratio
        used = f"; it used {percent_text(mean)} of its GPU time on average" if mean is not None else ""
        return Recommendation(Action.KEEP, f"no per-process SM figures (NVML has none on MIG){used}: "
                                           f"nothing to size a smaller allocation by")
    return _smaller(stats, options)


def _headroom(options: Options) -> str:
    return f"+{percent_text(options.headroom)} headroom"


def _pct_name(options: Options) -> str:
    return f"p{options.percentile:g}"


def _needs_more(stats: WorkloadStats, options: Options) -> Recommendation | None:
    peak = stats.memory.max if stats.memory is not None else None
    capacity = stats.memory_capacity_bytes
    grown = round_memory(peak * (1 + options.headroom)) if peak is not None else None
    reasons: list[str] = []
    memory_bytes: int | None = None
    mig_profile: str | None = None
    if stats.ladder_restarts:
        reasons.append(f"the memory ladder terminated or evicted it {stats.ladder_restarts} time(s)")
    over_limit = _over_its_limit(stats, options)
    if over_limit is not None:
        reasons.append(over_limit)
        grown = round_memory(max(stats.memory_all_gpus_bytes or 0.0, peak or 0.0) * (1 + options.headroom))
    if (peak is not None and capacity and peak >= options.near_limit * capacity
            and not (over_limit and capacity == stats.memory_limit_bytes)):
        reasons.append(f"its memory peak {gib_text(peak)} is {percent_text(peak / capacity)} of the "
                       f"{gib_text(capacity)} one device holds")
    if reasons and grown is not None:
        limit_binds = over_limit is not None or (
            stats.memory_limit_bytes is not None and stats.memory_limit_bytes == capacity)
        if stats.mig_profile and not limit_binds:
            larger = _larger_mig(stats, grown)
            mig_profile = larger.name if larger else None
            reasons.append(f"move it to MIG {larger.name}" if larger else "no larger MIG profile holds it: "
                           "give it a whole GPU")
        elif stats.gpu_memory_bytes and grown > stats.gpu_memory_bytes and not limit_binds:
            reasons.append(f"it needs {memory_text(grown)} ({_headroom(options)}): a GPU with more memory")
        else:
            memory_bytes = grown
            reasons.append(f"raise {MEMORY_ANNOTATION} to {memory_text(grown)} (peak {_headroom(options)})")
            strays = stats.strays
            if over_limit and peak is not None and strays is not None and strays.memory_peak_bytes:
                reasons.append(f"or keep it on the GPU(s) allocated to it, its peak there {gib_text(peak)}")
    share: float | None = None
    throttled = stats.throttled_ratio
    if throttled >= options.throttled:
        current = stats.share_limit_ratio
        if current is not None:
            share = round_share(current * (1 + options.headroom) / max(0.05, 1 - throttled))
            reasons.append(f"it was held back (frozen) {percent_text(throttled)} of its time at "
                           f"{SHARE_ANNOTATION} {percent_text(current)}: raise it to {percent_text(share)}")
        else:
            reasons.append(f"it was held back (frozen) {percent_text(throttled)} of its time: give it a "
                           f"larger share")
    if not reasons:
        return None
    annotations = {}
    if share is not None:
        annotations[SHARE_ANNOTATION] = percent_text(share)
    if memory_bytes is not None:
        annotations[MEMORY_ANNOTATION] = memory_text(memory_bytes)
    resources = _mig_resources(stats, mig_profile) if mig_profile else {}
    return Recommendation(Action.NEEDS_MORE, "needs more: " + "; ".join(reasons), share_ratio=share,
                          memory_bytes=memory_bytes, mig_profile=mig_profile, annotations=annotations,
                          resources=resources)


def _over_its_limit(stats: WorkloadStats, options: Options) -> str | None:
    """Why its memory on all its GPUs, strays included, reached ``near_limit`` of its gpu-memory limit,
    or None. The memory ladder compares that figure with the limit, and acts above it: a workload it
    stopped there is never "keep" on its other figures (``gpuagent top`` shows the ladder's stage)."""
    limit, used = stats.memory_limit_bytes, stats.memory_all_gpus_bytes
    if not limit or used is None or used < options.near_limit * limit:
        return None
    strays = stats.strays
    apart = ""
    if strays is not None and strays.memory_peak_bytes:
        apart = (f", {gib_text(strays.memory_peak_bytes)} of it on {strays.gpus} GPU(s) not allocated to "
                 f"it")
    return (f"its GPU memory on all its GPUs peaked at {gib_text(used)}{apart}: "
            f"{percent_text(used / limit)} of its {MEMORY_ANNOTATION} limit {gib_text(limit)}, "
            f"{'over which' if used > limit else 'just under where'} the memory ladder stops it")


def _larger_mig(stats: WorkloadStats, memory: float) -> MigProfile | None:
    table = mig_model(stats.gpu_model)
    if table is None or stats.mig_profile is None:
        return None
    now = table.profile(stats.mig_profile)
    return next((p for p in table.profiles
                 if p.memory_bytes >= memory and (now is None or p.slices >= now.slices)), None)


def _release(stats: WorkloadStats, idle: float) -> Recommendation:
    busy = ""
    if stats.sm is not None:
        busy = f"; while it ran it used p99 {percent_text(stats.sm.p99)} SM and at most " \
               f"{gib_text(stats.memory.max if stats.memory else None)}"
    return Recommendation(Action.RELEASE, (
        f"idle {percent_text(idle)} of the time it held {_gpus(stats)}: release it when idle "
        f"(scale to zero, cull idle notebooks) instead of holding it{busy}"), size=0.0)


def _gpus(stats: WorkloadStats) -> str:
    held = stats.gpus_held
    return "its GPU" if held <= 1 else f"its {held:g} GPUs"


def _smaller(stats: WorkloadStats, options: Options) -> Recommendation:
    assert stats.sm is not None
    sm_need = min(1.0, stats.sm.chosen * (1 + options.headroom))
    peak = stats.memory.max if stats.memory is not None else 0.0
    memory = round_memory(peak * (1 + options.headroom))
    gpu_bytes = stats.gpu_memory_bytes
    memory_share = memory / gpu_bytes if gpu_bytes else 0.0
    used = (f"{_pct_name(options)} SM {percent_text(stats.sm.chosen)}, memory peak {gib_text(peak)}"
            f" ({_headroom(options)}: {percent_text(sm_need)} SM, {memory_text(memory)})")
    if max(sm_need, memory_share) >= options.keep_above:
        them = "it" if stats.devices_per_pod <= 1 else "them"
        return Recommendation(Action.KEEP, f"{used}: it needs {percent_text(options.keep_above)} of a GPU or "
                                           f"more; keep {them} whole")
    table = mig_model(stats.gpu_model)
    notes = []
    if options.sharing in ("auto", "mig"):
        profile = _smallest_mig(table, sm_need, peak * (1 + options.headroom)) if table else None
        if profile is not None and table is not None:
            return _checked(stats, _mig(stats, table, profile, used))
        if options.sharing == "mig":
            notes.append(f"no MIG profile table for {stats.gpu_model or 'an unknown model'}" if table is None
                         else "no MIG profile smaller than the whole GPU holds it")
    steady = stats.sm.chosen <= options.steady_ratio * stats.sm.p50 + 0.05
    if options.sharing == "mps" or (options.sharing == "auto" and steady):
        threads = round(round_share(sm_need) * 100)
        size = max(threads / 100, memory_share)
        why = "MPS"
        if options.sharing == "auto":
            why = "steady use: MPS runs its kernels beside its neighbours'"
        return _checked(stats, Recommendation(
            Action.MPS, f"{used}; {why}, at {threads}% of the SMs and {memory_text(memory)} pinned"
            + "".join(f" ({n})" for n in notes),
            size=size, memory_bytes=memory, mps_thread_percent=threads,
            annotations={MEMORY_ANNOTATION: memory_text(memory)},
            env={MPS_THREADS_ENV: str(threads),
                 MPS_MEMORY_ENV: ",".join(f"{i}={memory // MIB}M" for i in range(stats.devices_per_pod))}))
    share = round_share(sm_need)
    why = "bursty use: a time-slicing share lends it the idle time of its neighbours" if (
        options.sharing == "auto") else "a time-slicing share"
    return _checked(stats, Recommendation(
        Action.SHARE, f"{used}; {why}: {SHARE_ANNOTATION} {percent_text(share)}, {MEMORY_ANNOTATION} "
                      f"{memory_text(memory)}" + "".join(f" ({n})" for n in notes),
        size=max(share, memory_share), share_ratio=share, memory_bytes=memory,
        annotations={SHARE_ANNOTATION: percent_text(share), MEMORY_ANNOTATION: memory_text(memory)}))


def _smallest_mig(table: MigModel, sm_need: float, memory_need: float) -> MigProfile | None:
    """The smallest profile short of the whole GPU whose compute and memory hold the need."""
    for profile in table.profiles:
        if profile.slices >= table.slices:
            return None
        if profile.slices / table.slices >= sm_need - 1e-9 and profile.memory_bytes >= memory_need:
            return profile
    return None


def _mig(stats: WorkloadStats, table: MigModel, profile: MigProfile, used: str) -> Recommendation:
    return Recommendation(
        Action.MIG, f"{used}; MIG {profile.name} holds it ({profile.slices}/{table.slices} of the compute, "
                    f"{gib_text(profile.memory_bytes)}), isolated from its neighbours",
        size=profile.slices / table.slices, mig_profile=profile.name, memory_bytes=profile.memory_bytes,
        mig_slices=(profile.slices, profile.memory_slices, table.slices, table.memory_slices),
        resources=_mig_resources(stats, profile.name))


def _mig_resources(stats: WorkloadStats, profile: str) -> dict[str, int | None]:
    """The container limits for ``profile``: its MIG resource instead of whole GPUs (or another profile)."""
    resources: dict[str, int | None] = {GPU_RESOURCE: None}
    if stats.mig_profile and stats.mig_profile != profile:
        resources[MIG_RESOURCE_PREFIX + stats.mig_profile] = None
    resources[MIG_RESOURCE_PREFIX + profile] = stats.devices_per_pod
    return resources


def _checked(stats: WorkloadStats, smaller: Recommendation) -> Recommendation:
    """``smaller``, unless it takes no less than what the workload holds now."""
    if smaller.size is not None and smaller.size >= stats.device_size - 1e-3:
        return Recommendation(Action.KEEP, f"{smaller.reason.split(';')[0]}; what it holds now "
                                           f"({stats.device_size:g} GPU a device) is no larger than "
                                           f"{smaller.short}")
    return smaller
