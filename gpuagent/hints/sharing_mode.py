"""The sharing mode to recommend for a request on one node: exclusive, a MIG instance or time-slicing.

It follows the adaptive-sharing idea of KubeGPU (Yeh et al.): a request that needs most of a GPU (a whole
GPU, or half or more of its time or memory) gets a GPU of its own; a small one is time-sliced onto a lightly
loaded GPU when there is one (co-location costs little there), else isolated in the smallest MIG instance
that holds it, else given a free GPU. Only ``score_node`` (``/v1/hints/score``) recommends; the extender's
fast path does not ask.
"""

from __future__ import annotations

from typing import Any

from gpuagent.hints.fit import EPSILON
from gpuagent.hints.fitrequest import FitRequest
from gpuagent.hints.nodeindex import MIG_SLICES
from gpuagent.snapshot.hints import GpuHints

MODES = ("exclusive", "mig", "time_sliced")
LIGHT_LOAD_RATIO = 0.7  # a GPU's long-average SM use plus the request's share below this co-locates well
NOMINAL_SHARE = 0.1  # the share a request without one is counted as when judging co-location
BIG_REQUEST_RATIO = 0.5  # a share, or part of a GPU's memory, from which a request gets a GPU of its own


def recommend(gpus: tuple[GpuHints, ...], request: FitRequest) -> dict[str, Any]:
    """The mode that suits ``request`` on these GPUs (``NodeIndex.gpus``: figures in range) now, as the
    ``recommended_mode``, ``recommended_mig_profile`` and ``recommendation`` fields of a ``FitResult``."""
    if request.mig_profile is not None:
        return {"recommended_mode": "mig", "recommended_mig_profile": request.mig_profile,
                "recommendation": "a MIG instance was asked for"}
    if request.exclusive:
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None,
                "recommendation": "an exclusive GPU was asked for"}
    healthy = [g for g in gpus if g.health == "ok" and not g.stale]
    gpu_memory = max((g.memory_total_bytes or 0 for g in healthy), default=0)
    memory = request.memory_bytes or 0
    share = request.share
    big = share is None and request.memory_bytes is None
    big = big or (share is not None and share >= BIG_REQUEST_RATIO)
    big = big or (gpu_memory > 0 and memory >= BIG_REQUEST_RATIO * gpu_memory)
    free_gpu = any(not g.mig_enabled and not g.tenants for g in healthy)
    if big:
        why = "it needs most of a GPU: sharing would slow it and its neighbours"
        if request.share is None and request.memory_bytes is None:
            why = "it asks for whole GPUs (no share or memory given)"
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None, "recommendation": why}
    wanted = share or 0.0
    for gpu in healthy:
        if gpu.mig_enabled or gpu.sharing_mode == "exclusive" or not gpu.tenants:
            continue
        long = gpu.sm_util_long_ratio if gpu.sm_util_long_ratio is not None else gpu.sm_util_ratio
        if long is None or memory > gpu.memory_free_bytes or gpu.schedulable_share_ratio < wanted:
            continue
        if long + max(wanted, NOMINAL_SHARE) <= LIGHT_LOAD_RATIO:
            return {"recommended_mode": "time_sliced", "recommended_mig_profile": None,
                    "recommendation": f"GPU {gpu.index} is lightly loaded ({long:.0%} SM over the long "
                                      "window): time-slicing onto it costs little"}
    profile = _smallest_profile(healthy, memory, wanted)
    if profile is not None:
        return {"recommended_mode": "mig", "recommended_mig_profile": profile,
                "recommendation": f"no lightly loaded shared GPU: {profile} isolates a request this small"}
    if free_gpu:
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None,
                "recommendation": "no lightly loaded shared GPU and no MIG instance holds it: a free GPU"}
    return {"recommended_mode": "time_sliced", "recommended_mig_profile": None,
            "recommendation": "nothing better is free now: time-slicing with a share limit"}


def _smallest_profile(gpus: list[GpuHints], memory: int, share: float) -> str | None:
    best: tuple[int, int, str] | None = None
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        for hint in gpu.free_mig_profiles:
            if not (hint.idle_instances or hint.creatable_count):
                continue
            if hint.memory_bytes is not None and hint.memory_bytes < memory:
                continue
            if hint.slice_count / MIG_SLICES + EPSILON < share:
                continue
            key = (hint.slice_count, hint.memory_bytes or 0, hint.profile)
            if best is None or key < best:
                best = key
    return best[2] if best else None
