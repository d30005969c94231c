"""Every text a fit reason says: why a GPU cannot take a request, and why a node cannot.

Two kinds, as ``hints.fit`` finds them: a GPU no request of a kind can use whatever its size (unhealthy,
MIG on or off, held exclusively: the ``*_static`` functions, asked once per node by ``hints.nodeindex``),
and a GPU the request's sizes rule out (``size_reason``, with the ``why`` code the fit found: written only
when someone reads it, since the extender's fast path needs one GPU's reason at most). Then the node's own
(``node_reason``), and the reason a node gets when judging it raised (``unjudgeable``).

The texts name what the hints say (tenant names, health, MIG profiles) as they are: whoever shows them
escapes them for the sink (the extender's ``_reason``: ``untrusted.shown``).
"""

from __future__ import annotations

from gpuagent.hints.fitrequest import FitRequest
from gpuagent.snapshot.hints import GpuHints, MigProfileHint

# Why a GPU the request's sizes rule out cannot take it: the fit's codes, ``size_reason``'s texts.
SHARE_SHORT, NO_SHARE_LEFT, MEMORY_SHORT, NO_INSTANCE, INSTANCE_MEMORY_SHORT = range(5)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def unusable(gpu: GpuHints) -> str | None:
    """Why no request of any kind fits this GPU (unhealthy, stale); None: it may."""
    if gpu.health != "ok":
        return f"unhealthy ({gpu.health})"
    if gpu.stale:
        return "its last read did not finish in time: its figures are stale"
    return None


def not_whole_gpu(gpu: GpuHints) -> str | None:
    """Why no request for (a share of) the whole GPU fits it, shared or exclusive; None: it may."""
    if (reason := unusable(gpu)) is not None:
        return reason
    if gpu.mig_enabled:
        return "MIG is enabled: only a mig_profile request fits it"
    if gpu.compute_mode == "prohibited":
        return "compute mode is prohibited"
    return None


def shared_static(gpu: GpuHints) -> str | None:
    """Why no shared (time-sliced/MPS) request, of any size, fits this GPU; None: its sizes decide."""
    if (reason := not_whole_gpu(gpu)) is not None:
        return reason
    if gpu.sharing_mode == "exclusive":
        holder = gpu.tenants[0].name if gpu.tenants else "a tenant"
        return f"held exclusively by {holder}"
    if gpu.compute_mode == "exclusive_process" and gpu.sharing_mode != "mps" and gpu.tenants:
        return "compute mode is exclusive_process and a process holds it"
    return None


def exclusive_static(gpu: GpuHints) -> str | None:
    """Why no exclusive request fits this GPU; None: its free memory decides."""
    if (reason := not_whole_gpu(gpu)) is not None:
        return reason
    if gpu.tenants:
        names = ", ".join(t.name for t in gpu.tenants[:3]) + (", ..." if len(gpu.tenants) > 3 else "")
        return f"not free for exclusive use: {len(gpu.tenants)} tenant(s) ({names})"
    return None


def mig_static(gpu: GpuHints) -> str | None:
    """Why no MIG request fits this GPU; None: its free profiles decide."""
    if (reason := unusable(gpu)) is not None:
        return reason
    if not gpu.mig_enabled:
        return "MIG is not enabled"
    return None


def whole_gpu_size_reason(why: int, figure: float | None, request: FitRequest) -> str:
    """Why a whole-GPU request's sizes rule a GPU out, from the one figure the reason quotes (``figure``:
    the GPU's schedulable share for ``SHARE_SHORT``, its free memory for ``MEMORY_SHORT``, else unread):
    the extender's columns word a state's reason from their figures alone."""
    if why == SHARE_SHORT:
        return f"needs a {request.share or 0.0:.0%} share of SM time, {figure:.0%} schedulable"
    if why == NO_SHARE_LEFT:
        return "no schedulable SM time left"
    return f"needs {_gib(request.memory_bytes or 0)} of memory, {_gib(figure)} free"  # type: ignore[arg-type]


def size_reason(gpu: GpuHints, why: int, request: FitRequest, instance: MigProfileHint | None) -> str:
    """Why ``request``'s sizes rule ``gpu`` out (``why``: one of the codes above; ``instance``: the GPU's
    hint of the requested MIG profile, for ``INSTANCE_MEMORY_SHORT``)."""
    if why == SHARE_SHORT:
        return whole_gpu_size_reason(why, gpu.schedulable_share_ratio, request)
    if why in (NO_SHARE_LEFT, MEMORY_SHORT):
        return whole_gpu_size_reason(why, gpu.memory_free_bytes, request)
    memory = request.memory_bytes or 0
    profile = request.mig_profile
    if why == NO_INSTANCE or instance is None:
        free = ", ".join(
            f"{h.profile} x{len(h.idle_instances) + h.creatable_count}" for h in gpu.free_mig_profiles
        )
        return f"no free {profile} instance and no room for one" + (f" (free: {free})" if free else "")
    return f"a {profile} instance has {_gib(instance.memory_bytes or 0)} of memory, needs {_gib(memory)}"


def node_reason(request: FitRequest, available: int, gpu_count: int) -> str:
    """Why the node cannot take the request: it has no GPUs, or fewer GPUs (instances) can take it than
    it asks for."""
    if not gpu_count:
        return "no GPUs"
    unit = "MIG instances" if request.mig_profile else "GPUs"
    return f"needs {request.gpus} {unit}, {available} can take it"


def unjudgeable(exc: BaseException) -> str:
    """The reason a node gets when judging it raised: the exception's type only (its text may carry the
    node's data; the log has it)."""
    return f"its GPU state could not be judged ({type(exc).__name__})"
