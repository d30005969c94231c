"""One GPU as NVML reads it: its static info, every tier's readings, health, XID, ECC, GPM profiling, MIG.
``devices/`` produces these each poll (:class:`GpuSample`, with :class:`GpuInfo` refreshed on the slow tier);
the exporter renders them and every other consumer reads them for capacity, load and faults. Its processes
are :mod:`.processes`' samples.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.frozen import faster_inits
from gpuagent.snapshot.processes import ProcessSample


class Health(str, enum.Enum):
    """Health of one GPU as the poller last saw it."""

    OK = "ok"
    LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: fallen off the bus, needs a reset
    UNRESPONSIVE = "unresponsive"  # an NVML call on it hung past its timeout
    ERROR = "error"  # the per-GPU read failed for another reason


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
class MigProfileCapacity:
    """A GPU-instance profile a MIG-enabled GPU supports and how many more of it can be created now."""

    profile: str  # e.g. "1g.10gb"
    profile_id: int  # NVML's GPU-instance profile id
    slice_count: int
    memory_bytes: int | None
    remaining_count: int  # nvmlDeviceGetGpuInstanceRemainingCapacity


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
    # NVLink links answering "disabled" on a GPU whose other links are up (a GPU with none up has no NVLink
    # in use, and reports nothing here)
    nvlink_links_down: tuple[int, ...] = ()
    gpm_supported: bool = False
    numa_node: int | None = None  # the CPU NUMA node it is attached to; None: unknown or not NUMA
    compute_mode: str | None = None  # "default", "exclusive_process", "prohibited"; None: unsupported
    mig_profiles: tuple[MigProfileCapacity, ...] = ()  # MIG-enabled GPUs: profiles and remaining capacity


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
    energy_joules_total: float | None = None  # read every energy_interval; the last reading in between
    energy_read_at_unix: float | None = None  # when energy_joules_total was read
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
    # The processes' utilization figures are NVML's averages over one read's window: from the previous read
    # (``process_util_window_seconds`` before) to ``process_util_read_at_unix``. A read happens every poll
    # where the share controller acts, every ``process_utilization_interval`` elsewhere; between reads the
    # figures are the last read's, and a process new since then has none (None). Both None on MIG, before
    # the first read, and (window) at the first read, which covers whatever the driver's buffer held.
    process_util_read_at_unix: float | None = None
    process_util_window_seconds: float | None = None


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
