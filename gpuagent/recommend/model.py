"""What ``gpuagent recommend`` knows and says: each workload's history, its recommendation, what that saves,
and the packing of the node pool (immutable; no I/O).

Ratios are 0-1 and per device (one GPU, MIG instance or replica the workload holds); memory is in bytes per
device; GPU time in GPU-seconds (a MIG slice counts its fraction, as the accounting counters do). ``None``
means "not known from Prometheus", never 0.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.prom.prices import Prices
from gpuagent.prom.timerange import TimeRange

GIB = 1024**3
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_WEEK = 7 * 86400.0


@dataclass(frozen=True, order=True)
class WorkloadKey:
    """Who a recommendation is for. Pods: ``namespace`` and their owner's ``kind`` and ``name``; elsewhere
    ``namespace`` is "" and ``kind`` the workload kind (``systemd_service``, ``slurm_job``, ...).

    ``source``: where the grouping came from: ``api_server`` (``gpuagent_pod_info``'s owner),
    ``owner_name`` (the owner above the one the agents could read, from its name: a Deployment from its
    ReplicaSet's), ``pod_name`` (the pod name without its generated suffix, when the agents had no API
    server), ``unit`` (not a pod: a systemd unit, container or Slurm job)."""

    namespace: str
    kind: str
    name: str
    source: str = "api_server"

    @property
    def is_pod(self) -> bool:
        return self.source != "unit"

    def __str__(self) -> str:
        if not self.is_pod:
            return f"{self.kind}/{self.name}"
        kind = self.kind or "~"  # "~": grouped by name, kind unknown
        return f"{self.namespace}/{kind}/{self.name}"


@dataclass(frozen=True)
class Distribution:
    """Percentiles of samples (0-1 ratios or bytes) and the peak; ``samples`` is how many were read."""

    p50: float
    p95: float
    p99: float
    max: float
    samples: int
    chosen: float  # the --percentile asked for (p99 by default), for the recommendation

    def as_dict(self) -> dict[str, float | int]:
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99, "max": self.max, "samples": self.samples}


@dataclass(frozen=True)
class Strays:
    """A workload's use of GPUs its pods were not allocated (the agents' ``gpuagent_pod_gpu_unallocated_use``,
    or busy time on a GPU with no allocated time): left out of its SM and memory figures, its busy time and
    its size, and shown apart. Its memory still counts toward the pod's ``gpuagent.io/gpu-memory`` limit,
    as the memory ladder counts it."""

    gpus: int  # the GPUs it strayed onto
    busy_gpu_seconds: float | None  # its busy time there
    sm_peak: float | None  # the largest SM use of a pod on one of them (0-1)
    memory_peak_bytes: float | None  # the most memory one pod held on them at once (their peaks added)


@dataclass(frozen=True)
class WorkloadStats:
    """A workload's history over the range, its pods pooled."""

    key: WorkloadKey
    pods: tuple[str, ...]
    containers: tuple[str, ...]  # names of its containers that use GPUs (for patches)
    gpu_model: str | None  # the model it held most
    gpus_held: float  # the most GPUs it held at once (MIG slices as fractions)
    devices: int  # the most devices it held at once (replicas x GPUs each)
    device_size: float  # one device, in GPUs (1 whole, 2/7 a 2g MIG slice, 1/N a time-slicing replica)
    devices_per_pod: int
    allocated_gpu_seconds: float
    busy_gpu_seconds: float | None  # on the GPUs allocated to it (a stray's: in strays)
    idle_gpu_seconds: float | None
    sm: Distribution | None  # SM use of its busiest allocated device while it ran processes (0-1)
    memory: Distribution | None  # GPU memory used on its fullest allocated device (bytes)
    memory_limit_bytes: float | None  # its gpuagent.io/gpu-memory limit (the largest seen)
    memory_capacity_bytes: float | None  # what one device holds: the limit, the MIG instance or the GPU
    gpu_memory_bytes: float | None  # a whole GPU of its model
    share_limit_ratio: float | None  # its gpuagent.io/gpu-share (the largest seen)
    mig_profile: str | None  # the MIG profile it ran on, if any
    throttled_seconds: float  # frozen by the time-slice controller
    ladder_restarts: int  # times the memory ladder terminated or evicted it
    seen_seconds: float  # time it held GPUs, in sampling steps
    days_seen: int  # 24-hour periods of the range in which it held GPUs
    # the most GPU memory one of its pods used on every GPU at once, strays included: what the memory
    # ladder holds to the pod's gpuagent.io/gpu-memory limit (bytes)
    memory_all_gpus_bytes: float | None = None
    strays: Strays | None = None  # GPUs it used without being allocated them; None: none seen

    @property
    def idle_ratio(self) -> float | None:
        """Allocated time under the agents' idle threshold over allocated time."""
        if self.idle_gpu_seconds is None or self.allocated_gpu_seconds <= 0:
            return None
        return min(1.0, self.idle_gpu_seconds / self.allocated_gpu_seconds)

    @property
    def throttled_ratio(self) -> float:
        """Time frozen over the time it held GPUs."""
        return min(1.0, self.throttled_seconds / self.seen_seconds) if self.seen_seconds > 0 else 0.0

    @property
    def mean_sm_ratio(self) -> float | None:
        if self.busy_gpu_seconds is None or self.allocated_gpu_seconds <= 0:
            return None
        return self.busy_gpu_seconds / self.allocated_gpu_seconds


class Action(str, enum.Enum):
    KEEP = "keep"
    RELEASE = "release"
    SHARE = "share"
    MIG = "mig"
    MPS = "mps"
    NEEDS_MORE = "needs_more"
    INSUFFICIENT = "insufficient_history"

    @property
    def resizes(self) -> bool:
        """A smaller standing allocation (what the packing and the savings count as a change of size)."""
        return self in (Action.SHARE, Action.MIG, Action.MPS)


@dataclass(frozen=True)
class Recommendation:
    action: Action
    reason: str  # in words, with the figures behind it
    size: float | None = None  # GPUs one device takes after the change (share, MPS, MIG)
    share_ratio: float | None = None  # gpuagent.io/gpu-share (SHARE, or NEEDS_MORE raising it)
    # the GPU memory it gets: gpuagent.io/gpu-memory (SHARE, MPS, NEEDS_MORE raising it), or its MIG
    # instance's
    memory_bytes: int | None = None
    mig_profile: str | None = None  # MIG, or NEEDS_MORE moving to a larger instance
    mig_slices: tuple[int, int, int, int] | None = None  # (compute, memory, of compute, of memory) slices
    mps_thread_percent: int | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)  # pod template annotations to set
    env: Mapping[str, str] = field(default_factory=dict)  # container environment to set (MPS)
    resources: Mapping[str, int | None] = field(default_factory=dict)  # container limits (None: removed)

    @property
    def short(self) -> str:
        """A few words for a table cell: ``share 25% 11Gi``, ``MIG 2g.20gb``, ``release``."""
        if self.action is Action.SHARE:
            return f"share {percent_text(self.share_ratio)} {memory_text(self.memory_bytes)}"
        if self.action is Action.MPS:
            return f"MPS {self.mps_thread_percent}% {memory_text(self.memory_bytes)}"
        if self.action is Action.MIG:
            return f"MIG {self.mig_profile}"
        if self.action is Action.NEEDS_MORE:
            more = [f"share {percent_text(self.share_ratio)}" if self.share_ratio else "",
                    memory_text(self.memory_bytes) if self.memory_bytes else "",
                    f"MIG {self.mig_profile}" if self.mig_profile else ""]
            return " ".join(["needs more", *(m for m in more if m)])
        return self.action.value.replace("_", " ")


@dataclass(frozen=True)
class Savings:
    """GPU-hours a week now and after the change (the range's figures scaled to a week), and the cost
    freed at the model's GPU-hour price (None without one)."""

    current_gpu_hours_week: float
    recommended_gpu_hours_week: float
    cost_saved_week: float | None = None

    @property
    def saved_gpu_hours_week(self) -> float:
        return self.current_gpu_hours_week - self.recommended_gpu_hours_week


@dataclass(frozen=True)
class Row:
    stats: WorkloadStats
    recommendation: Recommendation
    savings: Savings


@dataclass(frozen=True)
class PoolPacking:
    """The GPUs of one model the workloads hold now, and what the recommended packing needs: whole GPUs,
    and GPUs shared by time-slicing, by MPS, or cut into MIG instances (first-fit decreasing)."""

    gpu_model: str
    gpus_now: int
    whole: int = 0
    shared: int = 0
    mps: int = 0
    mig: int = 0
    released: int = 0  # workloads released: they take GPUs only while busy, not counted

    @property
    def gpus_after(self) -> int:
        return self.whole + self.shared + self.mps + self.mig


@dataclass(frozen=True)
class Options:
    """How conservative the recommendations are (``gpuagent recommend``'s policy flags)."""

    headroom: float = 0.2  # added to the chosen percentile of SM and to the peak of memory
    percentile: float = 99.0  # of SM use, sized for
    sharing: str = "auto"  # auto | share | mps | mig
    release_idle: float = 0.8  # idle this much of its allocated time: release
    near_limit: float = 0.9  # peak memory at this much of what a device holds: needs more
    throttled: float = 0.05  # frozen this much of its time: needs more
    keep_above: float = 0.75  # needing this much of a GPU or more: keep it whole
    min_history_seconds: float = 86400.0  # less held time than this: too little history
    steady_ratio: float = 1.5  # p-chosen <= this x p50 (+5 points): steady, MPS suits it


@dataclass(frozen=True)
class Totals:
    workloads: int
    current_gpu_hours_week: float
    recommended_gpu_hours_week: float
    cost_saved_week: float | None

    @property
    def saved_gpu_hours_week(self) -> float:
        return self.current_gpu_hours_week - self.recommended_gpu_hours_week


@dataclass(frozen=True)
class Recommendations:
    prometheus_url: str
    time_range: TimeRange
    step_seconds: float
    options: Options
    rows: tuple[Row, ...]
    totals: Totals
    packing: tuple[PoolPacking, ...]
    prices: Prices
    selector: str = ""
    queries: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def has_cost(self) -> bool:
        return self.prices.prices_gpu_hours


def percent_text(ratio: float | None) -> str:
    """``25%`` (whole percents where exact)."""
    if ratio is None:
        return "-"
    value = round(ratio * 100, 1)
    return f"{value:g}%"


def gib_text(size: float | None) -> str:
    """A measured size people read: ``9.0 GiB``, ``15.6 GiB``."""
    return "-" if size is None else f"{size / GIB:.1f} GiB"


def memory_text(size: float | None) -> str:
    """A Kubernetes quantity people read: ``11Gi``, ``768Mi``."""
    if size is None:
        return "-"
    if size >= GIB and size % GIB == 0:
        return f"{int(size // GIB)}Gi"
    return f"{round(size / 2**20)}Mi"
