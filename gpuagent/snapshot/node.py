"""One poll of the whole node: :class:`NodeSnapshot`, which holds every other part of the model, and the
agent's account of the poll itself (each source's status, NVML call costs and errors, poll durations).
The agent assembles a :class:`NodeSnapshot` each poll from the sources' and consumers' parts; it is the one
object every consumer is handed. It imports every domain module and none of them imports it, which keeps the
model's dependencies one-way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from gpuagent.frozen import faster_inits
from gpuagent.snapshot.accounting import AccountingState
from gpuagent.snapshot.enforcement import EnforcementState
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.health import HealthState
from gpuagent.snapshot.hints import NodeHints, PublishState
from gpuagent.snapshot.network import NetworkState
from gpuagent.snapshot.pods import DraDevice, DraTaint, PodUse


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


# A weak reference slot (Python 3.11+): the exporter remembers the snapshot it last rendered without keeping
# it alive past the next poll.
_WEAKREF_SLOT: dict[str, Any] = {"weakref_slot": True} if sys.version_info >= (3, 11) else {}


@dataclass(frozen=True, slots=True, **_WEAKREF_SLOT)
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
    network: NetworkState | None = None  # node links, RDMA ports, pods' network namespaces (None: source off)
    accounting: AccountingState | None = None  # per-workload GPU-seconds, memory, energy, idle (None: off)
    hints: NodeHints | None = None  # capacity and load figures for schedulers
    dra: tuple[DraDevice, ...] = ()  # devices of pods' ResourceClaims (DRA) and the GPUs they map to
    dra_taints: tuple[DraTaint, ...] = ()  # the DRA drivers' device taints (ResourceSlices), on their GPUs
    health: HealthState | None = None  # faults classified, node conditions, quarantine (None: health off)
    publish: PublishState | None = None  # the GPUNodeState's writes (None: not published)

    @property
    def stale(self) -> bool:
        return any(g.stale for g in self.gpus)


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
