"""Who uses a GPU: one process's sample, the workload it belongs to, and its MPS limits.
A process is the unit every decision starts from: the pods source attributes it to a :class:`Workload` and
reads an MPS client's :class:`MpsLimits`, and the enforcer, accounting and hints count its use through
:func:`sm_share_ratio` and :func:`combined_mps_limits`. It is apart from :mod:`.gpu` because the enforcer,
its policies and the MPS readers deal in processes and never in a GPU's readings; a GPU sample holds its
processes, so :mod:`.gpu` imports this module, never the other way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class Workload:
    """Who a process belongs to: a Kubernetes pod's container, or what it is on a plain host.

    ``kind`` is "pod" on a kubelet node; elsewhere "systemd_service", "user_session", "docker", "podman",
    "slurm_job", "host" or "unknown", with ``name`` the unit, container or job. For a pod, ``name`` is the
    pod name when known, else its UID, and ``names_from`` says which source supplied the names:
    "api_server", "pod_resources" (joined through the GPUs it was allocated) or "cgroup" (UID only).
    """

    kind: str
    name: str
    namespace: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    qos: str | None = None
    cgroup: str = ""
    names_from: str = "cgroup"
    # Where the process's cgroup can be frozen: its v2 path and its v1 freezer path, as /proc/PID/cgroup
    # names them (either may be None). On some hybrid hosts the v2 line names the runtime's own service:
    # the enforcer only acts on a path that passes its safety rules.
    cgroup_v2: str | None = None
    cgroup_freezer: str | None = None


MPS_CLIENT = "mps_client"  # ProcessSample.kind of an MPS client (nvmlDeviceGetMPSComputeRunningProcesses_v3)


MPS_SERVER = "mps_server"  # ProcessSample.kind of the MPS server (or control daemon): infrastructure


@dataclass(frozen=True, slots=True)
class MpsLimits:
    """An MPS client's limits on the GPU (or MIG instance) it runs on, from its environment.

    ``None`` in a field: the variable is not set there, so the client's environment does not limit it (the
    MPS control daemon may still apply a default of its own, which no environment shows).
    """

    active_thread_percent: float | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: share of the SMs, 0-100
    pinned_memory_limit_bytes: int | None = None  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for this device


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process using a GPU (or a MIG instance of it)."""

    pid: int
    comm: str  # process name from /proc/PID/comm, "" when it exited before we looked
    kind: str  # "compute", "graphics", MPS_CLIENT or MPS_SERVER (infrastructure: nobody's tenant)
    used_memory_bytes: int | None
    # Mean over the GPU's last per-process read window (GpuSample.process_util_*); None on MIG (NVML has no
    # per-process utilization there) and for a process that appeared after the last read.
    sm_util_percent: float | None
    memory_util_percent: float | None
    gpu_instance_id: int | None = None  # the MIG GPU instance it runs in, None when not MIG
    workload: Workload | None = None  # set by the pods source; None before attribution, or PID vanished
    # An MPS client's limits on this device, set by the pods source from its environment; None: not an MPS
    # client, or its environment could not be read (unknown, which is not "unlimited").
    mps: MpsLimits | None = None


def combined_mps_limits(processes: Iterable[ProcessSample]) -> MpsLimits | None:
    """The MPS limits of one workload's processes on one GPU (or MIG instance), added up: MPS holds each
    client to its own limits, so a workload of two 30 % clients may use 60 % of the SMs. A field is None
    when any of the processes is not held to it (not an MPS client, or a client without that variable);
    the whole is None when none of them is an MPS client with known limits."""
    threads: float | None = 0.0
    memory: int | None = 0
    clients = 0
    for process in processes:
        limits = process.mps if process.kind == MPS_CLIENT else None
        if limits is None:
            threads = memory = None
            continue
        clients += 1
        threads = None if threads is None or limits.active_thread_percent is None else (
            threads + limits.active_thread_percent)
        memory = None if memory is None or limits.pinned_memory_limit_bytes is None else (
            memory + limits.pinned_memory_limit_bytes)
    if not clients:
        return None
    return MpsLimits(None if threads is None else min(100.0, threads), memory)


def sm_share_ratio(process: ProcessSample) -> float | None:
    """A process's share of its GPU's SM time (0-1) as decisions count it: NVML's per-process utilization,
    the fraction of time its kernels ran, taken as the whole GPU; for an MPS client held to a fraction of
    the SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) that fraction of it, since it keeps at most that many
    SMs busy while it runs. None when NVML gives no per-process figure (MIG, some MPS drivers)."""
    if process.sm_util_percent is None:
        return None
    ratio = min(1.0, process.sm_util_percent / 100.0)
    limits = process.mps if process.kind == MPS_CLIENT else None
    if limits is not None and limits.active_thread_percent is not None:
        ratio *= limits.active_thread_percent / 100.0
    return ratio


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
