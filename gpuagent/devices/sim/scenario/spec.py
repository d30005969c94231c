"""The model of a scenario: the frozen specs the simulated NVML runs from, and their defaults.

What a scenario file says, checked and with every default filled in: the driver, each GPU (its model, MIG
layout and curves), each process, each fault, and the Kubernetes pods those processes belong to (read by
``gpuagent demo``, not by the simulator). The simulator reads only these; the file's syntax and its checks
stay in the loader and the builder. ``stable_digest`` derives a GPU's identities (UUID, serial)
from the scenario's seed, so that a scenario names the same GPUs on every run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.devices.sim.curves import Curve, UtilCurve
from gpuagent.devices.sim.models import MIB, GpuModel, MigProfile

FAKE_PID_BASE = 4_200_000  # above Linux's largest pid_max (4194304): never a real process
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
MPS_LIMIT_VARIABLES = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
DEFAULT_PROCESS_MEMORY = 300 * MIB
DEFAULT_DRIVER_VERSION = "550.90.07"
DEFAULT_CUDA_VERSION = 12040


@dataclass(frozen=True)
class DriverSpec:
    version: str = DEFAULT_DRIVER_VERSION
    nvml_version: str = "12." + DEFAULT_DRIVER_VERSION
    cuda_version: int = DEFAULT_CUDA_VERSION
    latency_ms: Mapping[str, float] = field(default_factory=dict)  # function name or "default" -> ms
    mps_utilization: str = "per_client"  # where MPS clients' per-process utilization samples go: or "server"


@dataclass(frozen=True)
class MigInstanceSpec:
    id: int  # GPU-instance ID
    profile: MigProfile


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: GpuModel
    name: str
    serial: str | None
    memory_bytes: int
    reserved_bytes: int
    power_limit_w: float
    pci_bus_id: str | None
    utilization: Curve | None
    memory_util: Curve | None
    encoder_util: Curve | None
    decoder_util: Curve | None
    power_w: Curve | None
    temperature: Curve | None
    mig_enabled: bool
    mig_instances: tuple[MigInstanceSpec, ...]
    not_supported: frozenset[str]
    nvlink_down: frozenset[int]
    where: str  # "gpus[1]": the entry this GPU came from
    numa_node: int | None = None  # None: the default, GPUs split evenly over two sockets
    compute_mode: str = "default"

    def instance(self, gi: int) -> MigInstanceSpec | None:
        for inst in self.mig_instances:
            if inst.id == gi:
                return inst
        return None


@dataclass(frozen=True)
class MpsSpec:
    """An MPS client's limits (None: not set in its environment)."""

    active_thread_percentage: float | None = None
    pinned_memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class ProcessSpec:
    index: int
    pid: int
    real: bool  # a real PID: listed only while it runs
    name: str
    gpu: int
    mig_instance: int | None
    type: str  # compute | graphics | both | mps_server | mps_client
    memory: Curve
    sm_util: UtilCurve
    mem_util: Curve | None
    start: float
    stop: float | None
    mps: MpsSpec | None = None  # an mps_client's limits
    environ: Mapping[str, str] = field(default_factory=dict)  # the simulated environment of a made-up PID


@dataclass(frozen=True)
class GpuLost:
    gpu: int
    at: float


@dataclass(frozen=True)
class XidFault:
    gpu: int
    at: float
    code: int
    gpu_instance: int | None = None
    count: int = 1
    interval: float = 0.0


@dataclass(frozen=True)
class EccFault:
    gpu: int
    at: float
    count: int
    double_bit: bool


@dataclass(frozen=True)
class RowRemapFailure:
    """From ``at`` the GPU's row remapper reports a failure (no spare row left)."""

    gpu: int
    at: float


@dataclass(frozen=True)
class NvlinkDownFault:
    """From ``at`` these NVLink links of the GPU answer disabled."""

    gpu: int
    at: float
    links: tuple[int, ...]


@dataclass(frozen=True)
class PcieReplayFault:
    gpu: int
    at: float
    count: int


@dataclass(frozen=True)
class HangFault:
    function: str | None  # None: any function
    gpu: int | None  # None: any GPU (and calls without a GPU)
    at: float
    seconds: float


@dataclass(frozen=True)
class InitFailure:
    until: float
    error: int  # NVML_ERROR_* code


Fault = (GpuLost | XidFault | EccFault | PcieReplayFault | HangFault | InitFailure | RowRemapFailure
         | NvlinkDownFault)


@dataclass(frozen=True)
class PodDeviceSpec:
    """A device the kubelet allocated: a whole GPU, a replica of one (``replica``) or a MIG device."""

    gpu: int
    replica: int | None = None
    mig_instance: int | None = None  # the GPU-instance ID


@dataclass(frozen=True)
class PodContainerSpec:
    name: str
    pids: tuple[int, ...]  # the PIDs of the scenario's processes running in it
    devices: tuple[PodDeviceSpec, ...]


@dataclass(frozen=True)
class PodSpec:
    """A Kubernetes pod of the simulated node (``gpuagent demo`` serves it; the NVML simulator does not
    read it). ``owner_kind``/``owner_name``: the top of its controller chain, None for a bare pod."""

    namespace: str
    name: str
    uid: str
    owner_kind: str | None
    owner_name: str | None
    qos: str
    annotations: Mapping[str, str]
    containers: tuple[PodContainerSpec, ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    hostname: str
    seed: str
    driver: DriverSpec
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...]
    faults: tuple[Fault, ...]
    source: str = "<scenario>"
    description: str = ""
    pods: tuple[PodSpec, ...] = ()

    @property
    def init_failure(self) -> InitFailure | None:
        for f in self.faults:
            if isinstance(f, InitFailure):
                return f
        return None


def stable_digest(*parts: object) -> bytes:
    """A deterministic digest of ``parts`` (UUIDs, serials)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
