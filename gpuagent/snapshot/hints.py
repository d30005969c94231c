"""Capacity and load of a node's GPUs as schedulers see them: per GPU its tenants, MIG instances and free
profiles, per node the totals and the network's summary; and what became of publishing them.
``hints.engine`` builds :class:`NodeHints` from a snapshot each poll; ``/v1/hints``, the extender, the
cluster view and the metrics read it, and ``hints.publisher`` reports its writes of the node's
``GPUNodeState`` as :class:`PublishState`. Its fields are plain values (health as a string, tenants by
name): a scheduler's view never holds the samples it was made from, so it imports no other model module.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class TenantHint:
    """One tenant of a GPU as hints show it: who it is, what it was promised and what it uses."""

    name: str  # "namespace/pod" for a pod, else the workload's name ("unknown" for unattributed processes)
    kind: str  # "pod", or a Workload kind ("systemd_service", "slurm_job", ..., "unknown")
    share_ratio: float | None  # its SM-time share limit (0-1); None: no limit
    memory_limit_bytes: int | None  # None: no limit; the smaller of its gpu-memory limit and its MPS limit
    memory_used_bytes: int
    sm_util_ratio: float | None  # measured share of SM time now (0-1); None on MIG (no per-process figure)
    allocated: bool = False  # the kubelet allocated it this GPU (else it only runs processes on it)
    replicas: int = 0  # time-slicing replicas (``GPU-…::n``) it holds; 0: the whole GPU or no allocation
    mig_instance: str | None = None  # the MIG device UUID it holds or runs in, None outside MIG
    mps_active_thread_ratio: float | None = None  # its MPS clients' SM cap here (0-1); None: not all capped
    mps_memory_limit_bytes: int | None = None  # its MPS clients' memory limits here; None: not all limited


@dataclass(frozen=True, slots=True)
class MigInstanceHint:
    """One existing MIG GPU instance and whether it can be given to a new tenant as it is."""

    uuid: str
    profile: str
    gpu_instance_id: int
    slice_ratio: float  # the instance's part of the GPU's compute slices (0-1)
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    tenants: tuple[str, ...] = ()  # TenantHint names holding or using it
    idle: bool = False  # nobody holds it and no process runs in it


@dataclass(frozen=True, slots=True)
class MigProfileHint:
    """A MIG profile a GPU can still offer: idle instances of it, or room to create more."""

    profile: str  # e.g. "1g.10gb"
    slice_count: int
    memory_bytes: int | None
    creatable_count: int  # instances NVML says can still be created (GPU-instance remaining capacity)
    idle_instances: tuple[str, ...] = ()  # UUIDs of existing idle instances of this profile


@dataclass(frozen=True, slots=True)
class GpuHints:
    """What a scheduler needs to know about one GPU; ratios are 0-1, memory in bytes."""

    uuid: str
    index: int
    model: str
    # a Health value ("ok", "lost", "unresponsive", "error"), or the severity of a fault the health
    # classification found on a GPU that answers ("degraded", "fatal"): anything but "ok" is not offered
    health: str
    pci_bus_id: str
    numa_node: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_allocated_bytes: int  # sum of its tenants' memory limits
    memory_free_bytes: int  # what a new tenant can count on: neither used nor promised (0 when unhealthy)
    sm_util_ratio: float | None  # this poll
    sm_util_short_ratio: float | None  # exponentially weighted, short time constant (NodeHints says which)
    sm_util_long_ratio: float | None  # exponentially weighted, long time constant
    schedulable_share_ratio: float  # SM time neither promised to nor taken by tenants (0 when unhealthy)
    sharing_mode: str  # "none" (no tenant), "exclusive", "time_sliced", "mps" or "mig"
    compute_mode: str | None = None  # "default", "exclusive_process", "prohibited"; None: unknown
    mig_enabled: bool = False
    tenants: tuple[TenantHint, ...] = ()
    mig_instances: tuple[MigInstanceHint, ...] = ()
    free_mig_profiles: tuple[MigProfileHint, ...] = ()  # profiles with an idle instance or room for one
    nvlink_peers: tuple[str, ...] = ()  # UUIDs (PCI bus ids when not on this node) of active NVLink peers
    stale: bool = False  # its last read did not finish in time
    fault: str | None = None  # the reason of its worst fault (gpuagent.health), e.g. "RowRemapPending"


@dataclass(frozen=True, slots=True)
class LinkHint:
    """One link the network source reports (its ``network_links`` globs choose which)."""

    name: str
    kind: str
    oper_state: str
    speed_bits_per_second: int | None
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class PodNetworkHint:
    """One pod's traffic, read from its network namespace."""

    pod: str
    namespace: str | None
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class NetworkHints:
    """The node's network, summarised for placement (None-safe: absent when the source is off)."""

    links_up: int  # physical and InfiniBand links that are up
    fastest_link_bits_per_second: int | None
    rx_bytes_per_second: float  # over those links
    tx_bytes_per_second: float
    rdma_ports_active: int
    rdma_rate_bits_per_second: int  # sum over active RDMA ports
    links: tuple[LinkHint, ...] = ()  # every link reported, node and virtual alike
    pods: tuple[PodNetworkHint, ...] = ()  # what each pod's network namespace carries


@dataclass(frozen=True, slots=True)
class NodeHints:
    """Capacity and load of a node's GPUs for schedulers (``/v1/hints``, the extender, metrics)."""

    hostname: str
    taken_at_unix: float  # the snapshot the figures come from: how fresh they are
    gpus: tuple[GpuHints, ...] = ()
    gpu_count: int = 0
    healthy_gpu_count: int = 0
    free_gpu_count: int = 0  # healthy, not MIG, no tenant
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0  # sum of the GPUs' memory_free_bytes
    schedulable_share_gpus: float = 0.0  # sum of the GPUs' schedulable_share_ratio, in GPUs
    stale: bool = False  # some GPU's figures are from an earlier poll
    short_window_seconds: float = 10.0  # time constants of the SM utilization averages
    long_window_seconds: float = 300.0
    network: NetworkHints | None = None


@dataclass(frozen=True, slots=True)
class PublishState:
    """The node's ``GPUNodeState`` for the extender's cluster view (``hints.publisher``): what became of
    the writes, and the last that worked."""

    writes_total: tuple[tuple[str, int], ...] = ()  # (outcome, count): written, failed, unreachable, ...
    last_write_unix: float | None = None  # when the API server last took a write (None: never yet)
    object_bytes: int = 0  # the size of the last object written


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
