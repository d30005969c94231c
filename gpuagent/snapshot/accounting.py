"""Per-workload GPU accounting as of the last poll: GPU-seconds held and busy, memory byte-seconds,
energy split among tenants, idle workloads, and the time no workload was charged.
``accounting/`` integrates these poll by poll into :class:`AccountingState`; the exporter renders its
counters and ``/v1/state`` shows it. Workloads and GPUs are named by value, so it refers to no other part of
the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class WorkloadGpuUsage:
    """One workload's accounting on one GPU or MIG instance, integrated poll by poll from the snapshots.

    ``level`` is "pod", "container" (one container of a pod) or "workload" (off Kubernetes: ``kind`` is the
    workload's kind, e.g. "systemd_service", "slurm_job"). Counters are monotonic while the agent runs; a
    workload that ended keeps them (``ended_at_unix`` set) for the retention window, then it is dropped.
    ``allocated_gpus`` is what it holds now: 1 for a whole GPU, a MIG slice's fraction, 1/N for one of N
    time-slicing replicas (0 once it ended). The gauges (``efficiency_ratio``, ``idle_seconds``) are kept for
    pods and workloads, not containers.
    """

    level: str
    kind: str
    name: str
    namespace: str | None
    container: str | None
    gpu_uuid: str
    gpu_index: int
    gpu_instance_id: int | None
    mig_profile: str | None
    allocated_gpu_seconds_total: float
    busy_gpu_seconds_total: float | None  # None: its SM use was never known (MIG without GPM)
    memory_byte_seconds_total: float
    energy_joules_total: float | None  # None: the GPU has no energy counter
    idle_allocated_gpu_seconds_total: float  # allocated while its SM use was under the idle threshold
    allocated_gpus: float = 0.0
    efficiency_ratio: float | None = None  # busy / allocated over the efficiency window, 0-1
    idle_seconds: float = 0.0  # length of the current idle episode; 0 when busy or not holding the GPU
    ended_at_unix: float | None = None  # when it was last seen; None while it runs
    # GPUs held x time since AccountingState.day_started_at_unix (00:00 UTC, or the agent's start if later)
    allocated_gpu_seconds_today: float = 0.0


@dataclass(frozen=True, slots=True)
class IdleWorkload:
    """A workload holding a GPU with SM use under the idle threshold for at least the idle window."""

    kind: str  # "pod" or the workload's kind
    name: str
    namespace: str | None
    pod_uid: str | None
    gpu_uuid: str
    gpu_index: int
    gpu_instance_id: int | None
    allocated_gpus: float
    idle_since_unix: float
    idle_seconds: float


@dataclass(frozen=True, slots=True)
class GpuAccounting:
    """Per GPU: the energy split among its tenants since the agent started, and time not accounted."""

    gpu_uuid: str
    gpu_index: int
    energy_joules_total: float | None  # the GPU's counter deltas integrated; None: no energy counter
    energy_unattributed_joules_total: float | None  # the part no workload was there to take
    gap_seconds_total: float  # polls too far apart, or the GPU stale or unhealthy: counted nowhere


@dataclass(frozen=True, slots=True)
class AccountingState:
    """Per-workload GPU-seconds, memory, energy and idle detection, as of the last poll."""

    idle: tuple[IdleWorkload, ...] = ()  # flagged now: the short list to look at first
    usage: tuple[WorkloadGpuUsage, ...] = ()
    gpus: tuple[GpuAccounting, ...] = ()
    idle_threshold_ratio: float = 0.05
    idle_window_seconds: float = 1800.0
    efficiency_window_seconds: float = 3600.0
    retention_seconds: float = 300.0
    events_total: Mapping[str, int] = field(default_factory=dict)  # idle Event outcome -> count
    day_started_at_unix: float | None = None  # what "today" counts from: 00:00 UTC, or the agent's first poll


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
