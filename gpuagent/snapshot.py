"""The model: immutable, typed snapshots of a node's GPUs.

Sources (``devices/``, later ``pods/`` and ``network/``) produce these; every consumer (exporter, API,
enforcer, hints) reads only these. Field names carry their unit. ``None`` always means "not supported or
not known" and must never be rendered as 0.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Health(str, enum.Enum):
    """Health of one GPU as the poller last saw it."""

    OK = "ok"
    LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: fallen off the bus, needs a reset
    UNRESPONSIVE = "unresponsive"  # an NVML call on it hung past its timeout
    ERROR = "error"  # the per-GPU read failed for another reason


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


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process using a GPU (or a MIG instance of it)."""

    pid: int
    comm: str  # process name from /proc/PID/comm, "" when it exited before we looked
    kind: str  # "compute" or "graphics"
    used_memory_bytes: int | None
    sm_util_percent: float | None  # None on MIG (NVML has no per-process utilization there)
    memory_util_percent: float | None
    gpu_instance_id: int | None = None  # the MIG GPU instance it runs in, None when not MIG
    workload: Workload | None = None  # set by the pods source; None before attribution, or PID vanished


@dataclass(frozen=True, slots=True)
class ProfilingSample:
    """DCGM-style profiling counters from NVML's GPM API (Hopper and later); ratios are 0-1."""

    graphics_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    fp64_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp16_active_ratio: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class EccCounts:
    sbe_volatile_total: int | None = None
    dbe_volatile_total: int | None = None
    sbe_aggregate_total: int | None = None
    dbe_aggregate_total: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True, slots=True)
class XidRecord:
    """XID errors of one GPU, as counted by the event-set watcher since the agent started."""

    last_code: int | None = None  # the last XID seen inside the recent window, None when none
    last_seen_unix: float | None = None
    totals: Mapping[int, int] = field(default_factory=dict)  # xid code -> count since start
    recent: Mapping[int, int] = field(default_factory=dict)  # xid code -> count inside the window


@dataclass(frozen=True, slots=True)
class MigSample:
    """One MIG GPU instance (with its compute instance) of a MIG-enabled GPU."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile: str  # e.g. "1g.10gb", as dcgm-exporter's GPU_I_PROFILE label
    slice_fraction: float  # this instance's share of the GPU's compute slices (e.g. 1/7)
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    processes: tuple[ProcessSample, ...] = ()
    profiling: ProfilingSample | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What does not change between polls (refreshed on a slow cadence)."""

    index: int
    uuid: str
    name: str
    serial: str | None
    pci_bus_id: str
    minor_number: int | None
    memory_total_bytes: int | None
    power_limit_watts: float | None
    mig_enabled: bool
    nvlink_peers: tuple[str, ...] = ()  # PCI bus ids of the NVLink peers of active links
    gpm_supported: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One poll of one GPU."""

    info: GpuInfo
    sampled_at_unix: float
    health: Health = Health.OK
    health_detail: str = ""
    stale: bool = False  # the last read did not finish in time; values are from an earlier poll
    gpu_util_percent: float | None = None
    memory_copy_util_percent: float | None = None
    encoder_util_percent: float | None = None
    decoder_util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    graphics_clock_hz: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    energy_joules_total: float | None = None
    pcie_replay_total: int | None = None
    pcie_tx_bytes_total: int | None = None
    pcie_rx_bytes_total: int | None = None
    nvlink_bandwidth_total: int | None = None
    clock_event_reasons: int | None = None  # NVML clocks-event (throttle) reason bitmask
    ecc: EccCounts | None = None
    remapped_rows: RemappedRows | None = None
    xid: XidRecord = field(default_factory=XidRecord)
    profiling: ProfilingSample | None = None
    # Every process on this GPU, MIG or not (each carries its gpu_instance_id); MigSample.processes
    # repeats the subset of one instance for convenience: iterate one or the other, never both.
    processes: tuple[ProcessSample, ...] = ()
    migs: tuple[MigSample, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerUse:
    """One container of a pod: what the kubelet allocated it and what its processes use."""

    name: str
    allocated_devices: tuple[str, ...] = ()  # device ids as allocated (GPU-…, GPU-…::n replicas, MIG-…)
    pids: tuple[int, ...] = ()
    gpu_memory_used_bytes: int = 0
    sm_util_percent: float | None = None  # sum over its processes; None when NVML reports none (MIG)


@dataclass(frozen=True, slots=True)
class PodUse:
    """A pod holding or using GPUs on this node: allocation (kubelet) next to use (NVML)."""

    name: str  # the pod name, or its UID when only the cgroup is known
    namespace: str | None = None
    uid: str | None = None
    qos: str | None = None
    names_from: str = "cgroup"
    containers: tuple[ContainerUse, ...] = ()
    allocated_gpus: tuple[str, ...] = ()  # UUIDs of the GPUs allocated (a MIG device counts its parent)
    used_gpus: tuple[str, ...] = ()  # UUIDs of the GPUs its processes run on
    gpu_memory_used_bytes: int = 0
    sm_util_percent: float | None = None
    process_count: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)  # gpuagent.io/* only (the API server's)

    @property
    def unallocated_use(self) -> tuple[str, ...]:
        """GPUs used without being allocated: a pod that bypassed the device plugin."""
        return tuple(g for g in self.used_gpus if g not in self.allocated_gpus)


@dataclass(frozen=True, slots=True)
class ShareState:
    """One pod's time-slice share on one GPU, as the enforcer last decided it. Ratios are 0-1."""

    pod: str
    namespace: str | None
    gpu_uuid: str
    gpu_index: int
    limit_ratio: float | None  # the pod's share of the GPU's SM time; None: no limit
    achieved_ratio: float  # its measured SM use over the controller's window
    frozen_ratio: float  # the part of each period its cgroups are frozen (0: not throttled)
    throttled_seconds_total: float  # time spent frozen since the agent started
    priority: int = 0


@dataclass(frozen=True, slots=True)
class MemoryState:
    """One pod's GPU memory against its limit, and where it stands on the escalation ladder."""

    pod: str
    namespace: str | None
    limit_bytes: int | None
    used_bytes: int
    stage: str  # "ok" | "warned" | "terminating" | "killed" | "evicted"
    over_since_unix: float | None = None


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """An annotation that could not be used: the pod falls back to the node default, and we say so."""

    pod: str
    namespace: str | None
    annotation: str
    value: str
    message: str


@dataclass(frozen=True, slots=True)
class EnforcementState:
    """What the enforcer decided at the last poll; in audit mode, what it would have done."""

    mode: str  # "off" | "audit" | "enforce"
    shares: tuple[ShareState, ...] = ()
    memory: tuple[MemoryState, ...] = ()
    actions_total: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (action, outcome) -> count
    problems: tuple[PolicyProblem, ...] = ()
    frozen_cgroups: int = 0


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """How one source fared in its last run (node_exporter's collector success/duration)."""

    name: str
    ok: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True, slots=True)
class NvmlCallStats:
    """Time spent in one NVML function since start (a summary: sum and count)."""

    function: str
    calls_total: int
    seconds_total: float


@dataclass(frozen=True, slots=True)
class NvmlErrorCount:
    function: str
    code: str  # e.g. "GPU_IS_LOST", "TIMEOUT"
    count: int


@dataclass(frozen=True, slots=True)
class PollHistogram:
    """Cumulative histogram of poll durations since start (Prometheus semantics: counts per upper bound)."""

    upper_bounds: tuple[float, ...] = ()
    cumulative_counts: tuple[int, ...] = ()  # one per upper bound, cumulative; +Inf is ``count``
    sum_seconds: float = 0.0
    count: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything the agent knows about its node at one instant."""

    hostname: str
    backend: str  # "nvml" or "sim"
    taken_at_unix: float
    taken_at_monotonic: float
    poll_duration_seconds: float
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    sources: tuple[SourceStatus, ...] = ()
    nvml_calls: tuple[NvmlCallStats, ...] = ()
    nvml_errors: tuple[NvmlErrorCount, ...] = ()
    pods: tuple[PodUse, ...] = ()  # empty off Kubernetes (workloads are then on each ProcessSample)
    enforcement: EnforcementState | None = None  # None when enforcement is off
    polls_total: int = 0
    poll_histogram: PollHistogram = field(default_factory=PollHistogram)
    poll_interval_seconds: float = 1.0

    @property
    def stale(self) -> bool:
        return any(g.stale for g in self.gpus)


def to_jsonable(value: Any) -> Any:
    """A snapshot (or any part of it) as plain JSON types, enums by value, mappings with string keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def allocation_view(snapshot: NodeSnapshot) -> dict[str, Any]:
    """Pod -> GPUs and GPU -> pods, allocated (kubelet) next to used (NVML), for ``/v1/state``."""
    gpus: dict[str, dict[str, Any]] = {
        g.info.uuid: {
            "index": g.info.index,
            "allocated_to": [],
            "used_by": [],
            "memory_used_bytes": g.memory_used_bytes,
            "memory_total_bytes": g.info.memory_total_bytes,
        }
        for g in snapshot.gpus
    }
    pods: dict[str, dict[str, Any]] = {}
    for pod in snapshot.pods:
        key = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
        pods[key] = {
            "uid": pod.uid,
            "names_from": pod.names_from,
            "allocated_gpus": list(pod.allocated_gpus),
            "used_gpus": list(pod.used_gpus),
            "unallocated_use": list(pod.unallocated_use),
            "gpu_memory_used_bytes": pod.gpu_memory_used_bytes,
            "sm_util_percent": pod.sm_util_percent,
            "process_count": pod.process_count,
            "containers": {c.name: list(c.allocated_devices) for c in pod.containers},
        }
        for uuid in pod.allocated_gpus:
            if uuid in gpus:
                gpus[uuid]["allocated_to"].append(key)
        for uuid in pod.used_gpus:
            if uuid in gpus:
                gpus[uuid]["used_by"].append(key)
    return {"pods": pods, "gpus": gpus}
