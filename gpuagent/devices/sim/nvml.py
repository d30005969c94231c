"""``SimulatedNvml``: a drop-in test double of the ``pynvml`` module, driven by a scenario.

Fidelity to pynvml is the point: the agent's backend runs the same code on this object as on the real
module. So:

- every function the backend uses is a method with pynvml's name and positional signature, returning
  pynvml's types (its ctypes structs, ``str`` for strings, lists where pynvml returns lists, "friendly
  objects" for process lists; ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint`` as pynvml does);
- every other attribute comes from the real ``pynvml`` through ``__getattr__``: constants, struct classes,
  the ``NVMLError`` classes (``except nvml.NVMLError_GpuIsLost`` works the same on both); a pynvml
  *function* this class does not implement raises ``NVML_ERROR_FUNCTION_NOT_FOUND`` when called, like a
  symbol missing from an old driver;
- errors are ``pynvml.NVMLError(code)`` (pynvml picks the subclass); calls before ``nvmlInit`` raise
  UNINITIALIZED; ``nvmlInit``/``nvmlShutdown`` are reference counted;
- device handles (MIG ones too) and event sets are real ``c_nvmlDevice_t``/``c_nvmlEventSet_t`` pointers
  to small buffers the simulator owns, and each call returns a fresh pointer object, as pynvml does (so
  ``h1 == h2`` is False for two lookups of one GPU, exactly like on a real driver; compare addresses with
  ``ctypes.cast(h, c_void_p).value``). ``nvmlEventSetWait`` returns a real ``c_nvmlEventData_t`` whose
  ``device`` is such a handle; GPM samples are real ``c_nvmlGpmSample_t`` pointers.

Scenario time ``t`` is ``clock() - t0`` with ``t0`` taken at construction; tests pass a fake clock.
Thread-safe: one lock guards the shared state and is never held while a call blocks (a hang, an event
wait, injected latency).

Sim-only extensions (not in pynvml; keep them few): ``hostname`` (the scenario's node name),
``scenario``, ``process_name(pid)`` (the scenario's name of a process), ``release_hangs()`` (wake every
call blocked by a ``hang`` fault now) and ``call_counts()`` (calls per function name, for tests that check
the backend's call discipline).
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuagent.devices.sim.cpu import CpuMeter
from gpuagent.devices.sim.curves import FollowCpu
from gpuagent.devices.sim.mig import profile_by_index, remaining_capacity
from gpuagent.devices.sim.models import MIB, unsupported_names
from gpuagent.devices.sim.node import GpuView, Integrals, Node, ProcView
from gpuagent.devices.sim.scenario import (
    EccFault,
    GpuSpec,
    HangFault,
    MigInstanceSpec,
    Scenario,
    XidFault,
    stable_digest,
)

NVMLError = pynvml.NVMLError
NO_INSTANCE = 0xFFFFFFFF
SAMPLE_PERIOD_US = 166_667  # the driver's per-process utilization sampling period (1/6 s)
ENCODER_PERIOD_US = 167_000
_DEFAULT_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# Functions that answer on a MIG device handle; anything else answers NOT_SUPPORTED there.
_MIG_CALLS = frozenset({
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetAttributes",
    "nvmlDeviceGetAttributes_v2", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMinorNumber",
})


def _error(code: int) -> pynvml.NVMLError:
    return NVMLError(code)


def _driver_functions() -> frozenset[str]:
    """pynvml functions that reach the driver (directly or through another such function)."""
    names = {
        n: set(inspect.unwrap(f).__code__.co_names) for n, f in vars(pynvml).items() if inspect.isfunction(f)
    }
    seeds = {"_nvmlGetFunctionPointer", "_LoadNvmlLibrary"}
    driver = seeds | {n for n, used in names.items() if used & seeds}
    changed = True
    while changed:
        changed = False
        for n, used in names.items():
            if n not in driver and used & driver:
                driver.add(n)
                changed = True
    return frozenset(driver)


DRIVER_FUNCTIONS = _driver_functions()


@dataclass
class _HandleInfo:
    gpu: GpuSpec
    instance: MigInstanceSpec | None
    buffer: Any


@dataclass
class _EventSet:
    buffer: Any
    registrations: dict[int, tuple[int, float]] = field(default_factory=dict)  # gpu -> (mask, since t)
    cursor: int = 0
    freed: bool = False
    wake: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, order=True)
class _Event:
    t: float
    seq: int
    gpu: int
    type: int
    data: int
    gpu_instance: int | None


@dataclass
class _Hang:
    spec: HangFault
    ends: float | None = None  # time.monotonic() when it ends; None until first hit
    done: bool = False
    released: threading.Event = field(default_factory=threading.Event)


@dataclass
class _GpmSample:
    buffer: Any
    gpu: int | None = None
    gpu_instance: int | None = None
    acc: Integrals | None = None


class SimulatedNvml:
    """The simulated ``pynvml`` module of one scenario. See the module docstring."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.hostname = scenario.hostname
        self._clock = clock
        self._sleep = sleep
        self._t0 = clock()
        self._epoch = time.time()
        self._lock = threading.RLock()
        self._init_count = 0
        self._calls: Counter[str] = Counter()
        windows = {
            p.pid: p.sm_util.queue_seconds for p in scenario.processes if isinstance(p.sm_util, FollowCpu)
        }
        self._cpu = CpuMeter(windows)
        self._node = Node(scenario, self._cpu)
        self._unsupported = [unsupported_names(g.model) | g.not_supported for g in scenario.gpus]
        self._unsupported_fields = [
            frozenset(getattr(pynvml, n) for n in names if n.startswith("NVML_FI_") and hasattr(pynvml, n))
            for names in self._unsupported
        ]
        self._names = {p.pid: p.name for p in scenario.processes}
        # handles: one buffer per GPU and per MIG instance, keyed by its address
        self._handles: dict[int, _HandleInfo] = {}
        self._gpu_addr: list[int] = []
        self._mig_addr: dict[tuple[int, int], int] = {}
        for g in scenario.gpus:
            self._gpu_addr.append(self._new_handle(g, None))
            for inst in g.mig_instances:
                self._mig_addr[(g.index, inst.id)] = self._new_handle(g, inst)
        self._uuids = {self._uuid(g, None): g.index for g in scenario.gpus}
        self._mig_uuids = {
            self._uuid(g, inst): (g.index, inst.id) for g in scenario.gpus for inst in g.mig_instances
        }
        self._events = self._build_events(scenario)
        self._event_sets: dict[int, _EventSet] = {}
        self._hangs = [_Hang(f) for f in scenario.faults if isinstance(f, HangFault)]
        self._gpm: dict[int, _GpmSample] = {}

    # -- sim-only extensions -----------------------------------------------------------------------

    def process_name(self, pid: int) -> str | None:
        """The scenario's name of process ``pid`` (sim-only: NVML has no process names)."""
        return self._names.get(pid)

    def release_hangs(self) -> None:
        """Wake every call blocked by a ``hang`` fault now, and end those hangs (sim-only)."""
        with self._lock:
            for h in self._hangs:
                if h.ends is not None and not h.done:
                    h.done = True
                    h.released.set()

    def call_counts(self) -> dict[str, int]:
        """Calls per pynvml function name since construction (sim-only)."""
        with self._lock:
            return dict(self._calls)

    # -- module-like attribute access --------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = getattr(pynvml, name)
        except AttributeError:
            raise AttributeError(f"pynvml has no attribute {name!r}") from None
        if name in DRIVER_FUNCTIONS:
            return self._missing(name)
        return value

    def _missing(self, name: str) -> Callable[..., Any]:
        def missing(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._calls[name] += 1
                initialized = self._init_count > 0
            code = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND if initialized else pynvml.NVML_ERROR_UNINITIALIZED
            raise _error(code)

        missing.__name__ = missing.__qualname__ = name
        return missing

    # -- call plumbing -----------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() - self._t0

    def _unix_us(self, t: float) -> int:
        return int((self._epoch + t) * 1_000_000)

    def _new_handle(self, gpu: GpuSpec, inst: MigInstanceSpec | None) -> int:
        buf = (ctypes.c_byte * 8)()
        addr = ctypes.addressof(buf)
        self._handles[addr] = _HandleInfo(gpu, inst, buf)
        return addr

    def _handle(self, addr: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(addr), pynvml.c_nvmlDevice_t)

    def _node_call(self, name: str | None = None) -> float:
        """Prologue of a call without a device: count, init check, hang, latency. Returns ``t``."""
        name = name or sys._getframe(1).f_code.co_name
        with self._lock:
            self._calls[name] += 1
            if self._init_count <= 0:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        self._block(name, None)
        return self._now()

    def _device(self, handle: Any, name: str | None = None) -> tuple[GpuSpec, MigInstanceSpec | None, float]:
        """Prologue of a device call: count, init, handle, hang, latency, lost GPU, MIG, NOT_SUPPORTED."""
        name = name or sys._getframe(1).f_code.co_name
        with self._lock:
            self._calls[name] += 1
            if self._init_count <= 0:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        info = self._resolve(handle)
        self._block(name, info.gpu.index)
        t = self._now()
        if self._node.is_lost(info.gpu.index, t):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if info.instance is not None and name not in _MIG_CALLS:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in self._unsupported[info.gpu.index]:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return info.gpu, info.instance, t

    def _resolve(self, handle: Any) -> _HandleInfo:
        if not isinstance(handle, pynvml.c_nvmlDevice_t):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = self._handles.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if info is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return info

    def _block(self, name: str, gpu: int | None) -> None:
        """Injected latency and ``hang`` faults; never holds the lock while waiting."""
        latency = self.scenario.driver.latency_ms
        if latency:
            ms = latency.get(name, latency.get("default", 0.0))
            if ms > 0:
                time.sleep(ms / 1000.0)
        if not self._hangs:
            return
        t = self._now()
        hang: _Hang | None = None
        with self._lock:
            for h in self._hangs:
                s = h.spec
                if h.done or t < s.at or s.function not in (None, name) or s.gpu not in (None, gpu):
                    continue
                if h.ends is None:
                    h.ends = time.monotonic() + s.seconds
                hang = h
                break
        if hang is None:
            return
        assert hang.ends is not None
        remaining = hang.ends - time.monotonic()
        if remaining > 0:
            hang.released.wait(remaining)
        with self._lock:
            hang.done = True

    def _view(self, gpu: GpuSpec, t: float) -> GpuView:
        return self._node.view(gpu.index, t)

    # -- init and system ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._init("nvmlInit")

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._init("nvmlInitWithFlags")

    def _init(self, name: str) -> None:
        with self._lock:
            self._calls[name] += 1
        self._block(name, None)
        failure = self.scenario.init_failure
        if failure is not None and self._now() < failure.until:
            raise _error(failure.error)
        with self._lock:
            self._init_count += 1
            first = self._init_count == 1
        if first:
            self._cpu.start()

    def nvmlShutdown(self) -> None:
        self._node_call()
        with self._lock:
            self._init_count -= 1
            last = self._init_count == 0
        if last:
            self._cpu.stop()

    def nvmlErrorString(self, result: Any) -> str:
        return pynvml.NVMLError._errcode_to_string.get(result, "Unknown Error")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._node_call()
        return self.scenario.driver.version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._node_call()
        return self.scenario.driver.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._node_call()
        return self.scenario.driver.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._node_call()
        return self.scenario.driver.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._node_call()
        return len(self.scenario.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: Any) -> Any:
        self._node_call()
        if not isinstance(index, int) or not 0 <= index < len(self.scenario.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(self._gpu_addr[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Any:
        self._node_call()
        if isinstance(uuid, bytes):
            uuid = uuid.decode(errors="replace")
        if uuid in self._uuids:
            return self._handle(self._gpu_addr[self._uuids[uuid]])
        if uuid in self._mig_uuids:
            return self._handle(self._mig_addr[self._mig_uuids[uuid]])
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: Any) -> Any:
        self._node_call()
        if isinstance(pciBusId, bytes):
            pciBusId = pciBusId.decode(errors="replace")
        wanted = _parse_bus_id(pciBusId)
        for g in self.scenario.gpus:
            if wanted is not None and _parse_bus_id(self._bus_id(g)) == wanted:
                return self._handle(self._gpu_addr[g.index])
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    # -- static device information -----------------------------------------------------------------

    def _uuid(self, g: GpuSpec, inst: MigInstanceSpec | None) -> str:
        s = self.scenario
        if inst is None:
            d = stable_digest(s.seed, s.hostname, "gpu", g.index).hex()
            return f"GPU-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"
        d = stable_digest(s.seed, s.hostname, "mig", g.index, inst.id, 0).hex()
        return f"MIG-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"

    def _bus_id(self, g: GpuSpec) -> str:
        if g.pci_bus_id is not None:
            parsed = _parse_bus_id(g.pci_bus_id)
            assert parsed is not None
            domain, bus, dev, fn = parsed
        else:
            domain, bus, dev, fn = g.index // len(_DEFAULT_BUSES), _DEFAULT_BUSES[g.index % 8], 0, 0
        return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"

    def _pci_info(self, g: GpuSpec) -> Any:
        bus_id = self._bus_id(g)
        domain, bus, dev, _ = _parse_bus_id(bus_id) or (0, 0, 0, 0)
        info = pynvml.nvmlPciInfo_t()
        info.busIdLegacy = f"{domain:04X}{bus_id[8:]}".encode()
        info.busId = bus_id.encode()
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = g.model.pci_device_id
        info.pciSubSystemId = g.model.pci_subsystem_id
        return info

    def nvmlDeviceGetIndex(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return g.index

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        g, inst, _ = self._device(handle)
        return self._uuid(g, inst)

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        g, inst, _ = self._device(handle)
        return g.name if inst is None else f"{g.name} MIG {inst.profile.name}"

    def nvmlDeviceGetSerial(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        if g.serial is not None:
            return g.serial
        digest = stable_digest(self.scenario.seed, self.scenario.hostname, "serial", g.index)
        digits = int.from_bytes(digest[:8], "big")
        return f"1{digits % 10**12:012d}"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return self._pci_info(g)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return self._pci_info(g)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return g.index

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return tuple(g.model.compute_capability)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return int(g.power_limit_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return int(g.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return int(g.model.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return [int(g.model.power_min_limit_w * 1000), int(g.model.power_limit_w * 1000)]

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: Any) -> Any:
        g, _, _ = self._device(handle)
        m = g.model
        values = {
            pynvml.NVML_CLOCK_GRAPHICS: m.max_sm_clock_mhz, pynvml.NVML_CLOCK_SM: m.max_sm_clock_mhz,
            pynvml.NVML_CLOCK_MEM: m.max_mem_clock_mhz,
            pynvml.NVML_CLOCK_VIDEO: int(m.max_sm_clock_mhz * 0.9),
        }
        if type not in values:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return values[type]

    # -- MIG -----------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        return g.model.max_mig_devices if g.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: Any) -> Any:
        g, _, _ = self._device(device)
        limit = g.model.max_mig_devices if g.mig_enabled else 0
        if not isinstance(index, int) or not 0 <= index < limit:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(g.mig_instances):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._handle(self._mig_addr[(g.index, g.mig_instances[index].id)])

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        g, inst, _ = self._device(migDevice)
        if inst is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(self._gpu_addr[g.index])

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        if inst is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return inst.id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        if inst is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        return ctypes.c_uint(1 if inst is not None else 0)  # pynvml returns the c_uint, not its value

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        return self._attributes(device, "nvmlDeviceGetAttributes")

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        return self._attributes(device, "nvmlDeviceGetAttributes_v2")

    def _attributes(self, device: Any, name: str) -> Any:
        g, inst, _ = self._device(device, name)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if inst is None:
            slices = g.model.mig_slices if g.model.mig else 1
            attrs.multiprocessorCount = g.model.sm_count
            attrs.memorySizeMB = g.memory_bytes // MIB
        else:
            slices = inst.profile.slices
            attrs.multiprocessorCount = inst.profile.sm_count
            attrs.memorySizeMB = inst.profile.memory_bytes // MIB
        attrs.gpuInstanceSliceCount = slices
        attrs.computeInstanceSliceCount = slices
        attrs.sharedCopyEngineCount = max(1, slices)
        attrs.sharedDecoderCount = slices // 2 if inst is not None else 5
        attrs.sharedEncoderCount = 0
        attrs.sharedJpegCount = 1 if inst is None or slices >= 7 else 0
        attrs.sharedOfaCount = 1 if inst is None or slices >= 7 else 0
        return attrs

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: Any, version: Any = 2) -> Any:
        g, _, _ = self._device(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        if not isinstance(profile, int) or not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = profile_by_index(g.model, profile)
        if spec is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        else:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id = profile
        info.isP2pSupported = 0
        info.sliceCount = spec.slices
        info.instanceCount = len(spec.placements)
        info.multiprocessorCount = spec.sm_count
        info.copyEngineCount = max(1, spec.slices)
        info.decoderCount = spec.slices // 2
        info.memorySizeMB = spec.memory_bytes // MIB
        if version == 2:
            info.name = f"MIG {spec.name}".encode()
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: Any) -> Any:
        g, _, _ = self._device(device)
        if not g.mig_enabled:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = profile_by_index(g.model, profileId) if isinstance(profileId, int) else None
        if spec is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return remaining_capacity(g.model, ((i.profile, i.id) for i in g.mig_instances), spec)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        if g.numa_node is not None:
            return g.numa_node
        return g.index * 2 // max(1, len(self.scenario.gpus))  # two sockets, half the GPUs on each

    def nvmlDeviceGetComputeMode(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return {"default": pynvml.NVML_COMPUTEMODE_DEFAULT, "prohibited": pynvml.NVML_COMPUTEMODE_PROHIBITED,
                "exclusive_process": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS}[g.compute_mode]

    # -- NVLink and GPM support --------------------------------------------------------------------

    def _link(self, g: GpuSpec, link: Any) -> tuple[bool, int | None]:
        if not isinstance(link, int) or not 0 <= link < g.model.nvlink_links:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        peers = self._node.peers[g.index]
        if not peers or link in g.nvlink_down:
            return False, None
        return True, peers[link % len(peers)]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: Any) -> Any:
        g, _, _ = self._device(device)
        up, _ = self._link(g, link)
        return pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: Any) -> Any:
        g, _, _ = self._device(device)
        up, peer = self._link(g, link)
        if not up or peer is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._pci_info(self.scenario.gpus[peer])

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if g.model.gpm else 0
        return support

    # -- every poll ----------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        if g.mig_enabled:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        v = self._view(g, t)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = round(v.activity)
        util.memory = round(v.mem_util)
        return util

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        return [round(self._view(g, t).encoder_util), ENCODER_PERIOD_US]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        return [round(self._view(g, t).decoder_util), ENCODER_PERIOD_US]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g, inst, t = self._device(handle)
        if version and version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        v = self._view(g, t)
        if inst is None:
            total, reserved, used = g.memory_bytes, g.reserved_bytes, v.memory_used
        else:
            total, reserved = inst.profile.memory_bytes, 0
            used = v.instance_memory_used.get(inst.id, 0)
        free = max(0, total - reserved - used)
        if not version:
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.free, mem.used = total, free, total - free
            return mem
        mem2 = pynvml.c_nvmlMemory_v2_t()
        mem2.version = version
        mem2.total, mem2.reserved, mem2.free, mem2.used = total, reserved, free, used
        return mem2

    def nvmlDeviceGetClockInfo(self, handle: Any, type: Any) -> Any:
        g, _, t = self._device(handle)
        v = self._view(g, t)
        values = {
            pynvml.NVML_CLOCK_GRAPHICS: v.sm_clock_mhz, pynvml.NVML_CLOCK_SM: v.sm_clock_mhz,
            pynvml.NVML_CLOCK_MEM: v.mem_clock_mhz, pynvml.NVML_CLOCK_VIDEO: int(v.sm_clock_mhz * 0.9),
        }
        if type not in values:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return values[type]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any) -> Any:
        g, _, t = self._device(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._view(g, t).temp_c)

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        temp = self._view(g, t).temp_c
        return int(min(100, max(30, (temp - 30) * 1.6)))

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        return 0 if self._view(g, t).activity > 0 else 8

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        return int(self._view(g, t).power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        with self._lock:
            return int(self._node.advance(g.index, t).energy_mj)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        return self._node.pcie_replays(g.index, t)

    def _reasons(self, handle: Any, name: str) -> int:
        g, _, t = self._device(handle, name)
        throttle = self._view(g, t).throttle
        bits = 0
        if "idle" in throttle:
            bits |= pynvml.nvmlClocksEventReasonGpuIdle
        if "power" in throttle:
            bits |= pynvml.nvmlClocksEventReasonSwPowerCap
        if "sw_thermal" in throttle:
            bits |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
        if "hw_thermal" in throttle:
            bits |= pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown
        return bits

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> Any:
        return self._reasons(handle, "nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> Any:
        return self._reasons(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")

    # -- field values ------------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Any) -> Any:
        g, _, t = self._device(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            try:
                (values[i].fieldId, values[i].scopeId) = field_id
            except TypeError:
                values[i].fieldId = field_id
        with self._lock:
            acc = self._node.advance(g.index, t)
        v = self._view(g, t)
        stamp = self._unix_us(t)
        unsupported = self._unsupported_fields[g.index]
        for fv in values:
            fv.timestamp = stamp
            fv.latencyUsec = 0
            answer = None if fv.fieldId in unsupported else self._field(g, v, acc, t, fv.fieldId, fv.scopeId)
            if answer is None:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            value_type, value = answer
            fv.nvmlReturn = pynvml.NVML_SUCCESS
            fv.valueType = value_type
            if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                fv.value.uiVal = int(value)
            elif value_type == pynvml.NVML_VALUE_TYPE_DOUBLE:
                fv.value.dVal = float(value)
            else:
                fv.value.ullVal = int(value)
        return values

    def _field(self, g: GpuSpec, v: GpuView, acc: Integrals, t: float, fid: int,
               scope: int) -> tuple[int, float] | None:
        """(valueType, value) of field ``fid`` or None when not supported."""
        p, m = pynvml, g.model
        uint, ull = p.NVML_VALUE_TYPE_UNSIGNED_INT, p.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        power_fields = {
            p.NVML_FI_DEV_POWER_INSTANT: v.power_w * 1000, p.NVML_FI_DEV_POWER_AVERAGE: v.power_w * 1000,
            p.NVML_FI_DEV_POWER_CURRENT_LIMIT: g.power_limit_w * 1000,
            p.NVML_FI_DEV_POWER_DEFAULT_LIMIT: m.power_limit_w * 1000,
            p.NVML_FI_DEV_POWER_MIN_LIMIT: m.power_min_limit_w * 1000,
            p.NVML_FI_DEV_POWER_MAX_LIMIT: m.power_limit_w * 1000,
        }
        if fid in power_fields:
            return (uint, power_fields[fid]) if scope == 0 else None
        sbe, dbe = self._node.ecc_counts(g.index, t)
        kib = 1024.0
        nvl_tx, nvl_rx = acc.nvlink_tx_bytes / kib, acc.nvlink_rx_bytes / kib
        table: dict[int, tuple[int, float]] = {
            p.NVML_FI_DEV_MEMORY_TEMP: (uint, round(v.memory_temp_c)),
            p.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ull, acc.energy_mj),
            p.NVML_FI_DEV_ENERGY: (ull, acc.energy_mj),
            p.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, self._node.pcie_replays(g.index, t)),
            p.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (ull, acc.pcie_tx_bytes),
            p.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (ull, acc.pcie_rx_bytes),
            p.NVML_FI_DEV_NVLINK_LINK_COUNT: (uint, m.nvlink_links),
            p.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL: (ull, nvl_tx + nvl_rx),
            p.NVML_FI_DEV_NVLINK_BANDWIDTH_C1_TOTAL: (ull, (nvl_tx + nvl_rx) * 1.06),
            p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (ull, nvl_tx),
            p.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (ull, nvl_rx),
            p.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: (ull, nvl_tx * 1.06),
            p.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: (ull, nvl_rx * 1.06),
            p.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ull, sbe),
            p.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ull, dbe),
            p.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ull, sbe),
            p.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ull, dbe),
            p.NVML_FI_DEV_RETIRED_SBE: (ull, 0),
            p.NVML_FI_DEV_RETIRED_DBE: (ull, dbe),
            p.NVML_FI_DEV_RETIRED_PENDING: (uint, 1 if dbe else 0),
            p.NVML_FI_DEV_REMAPPED_COR: (uint, 0),
            p.NVML_FI_DEV_REMAPPED_UNC: (uint, dbe),
            p.NVML_FI_DEV_REMAPPED_PENDING: (uint, 1 if dbe else 0),
            p.NVML_FI_DEV_REMAPPED_FAILURE: (uint, 0),
        }
        return table.get(fid)

    # -- health counters ---------------------------------------------------------------------------

    def nvmlDeviceGetRemappedRows(self, device: Any) -> Any:
        g, _, t = self._device(device)
        _, dbe = self._node.ecc_counts(g.index, t)
        return (0, dbe, 1 if dbe else 0, 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: Any, counterType: Any) -> Any:
        g, _, t = self._device(handle)
        kinds = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        if errorType not in kinds:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counterType not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sbe, dbe = self._node.ecc_counts(g.index, t)
        return dbe if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else sbe

    def nvmlDeviceGetEccMode(self, handle: Any) -> Any:
        self._device(handle)
        return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]

    # -- processes ---------------------------------------------------------------------------------

    def _running(self, handle: Any, kinds: tuple[str, ...], name: str) -> list[Any]:
        g, inst, t = self._device(handle, name)
        out = []
        for pv in self._node.procs(g.index, t):
            spec = pv.spec
            if spec.type not in kinds or (inst is not None and spec.mig_instance != inst.id):
                continue
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid = spec.pid
            info.usedGpuMemory = pv.memory_bytes
            if g.mig_enabled:
                info.gpuInstanceId, info.computeInstanceId = spec.mig_instance, 0
            else:
                info.gpuInstanceId = info.computeInstanceId = NO_INSTANCE
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any:
        return self._running(handle, ("compute", "both"), "nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> Any:
        return self._running(handle, ("compute", "both"), "nvmlDeviceGetComputeRunningProcesses_v3")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Any:
        return self._running(handle, ("graphics", "both"), "nvmlDeviceGetGraphicsRunningProcesses")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> Any:
        return self._running(handle, ("graphics", "both"), "nvmlDeviceGetGraphicsRunningProcesses_v3")

    def _utilization_samples(self, handle: Any, since: int, name: str) -> tuple[int, list[ProcView]]:
        g, _, t = self._device(handle, name)
        if g.mig_enabled:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        tick = int(max(t, 0.0) * 1_000_000) // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        stamp = int(self._epoch * 1_000_000) + tick
        if stamp <= since:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        busy = [pv for pv in self._node.procs(g.index, t) if round(pv.sm_util) > 0 or round(pv.mem_util) > 0]
        if not busy:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return stamp, busy

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: Any) -> Any:
        stamp, busy = self._utilization_samples(handle, timeStamp, "nvmlDeviceGetProcessUtilization")
        samples = (pynvml.c_nvmlProcessUtilizationSample_t * len(busy))()
        for s, pv in zip(samples, busy, strict=True):
            s.pid, s.timeStamp = pv.spec.pid, stamp
            s.smUtil, s.memUtil, s.encUtil, s.decUtil = round(pv.sm_util), round(pv.mem_util), 0, 0
        return samples[0:len(busy)]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: Any) -> Any:
        stamp, busy = self._utilization_samples(handle, timeStamp, "nvmlDeviceGetProcessesUtilizationInfo")
        samples = (pynvml.c_nvmlProcessUtilizationInfo_v1_t * len(busy))()
        for s, pv in zip(samples, busy, strict=True):
            s.pid, s.timeStamp = pv.spec.pid, stamp
            s.smUtil, s.memUtil = round(pv.sm_util), round(pv.mem_util)
        return samples[0:len(busy)]

    # -- GPM -----------------------------------------------------------------------------------------

    def nvmlGpmSampleAlloc(self) -> Any:
        self._node_call()
        buf = (ctypes.c_byte * 16)()
        with self._lock:
            self._gpm[ctypes.addressof(buf)] = _GpmSample(buf)
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def _sample(self, sample: Any) -> _GpmSample:
        try:
            addr = ctypes.cast(sample, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            addr = None
        found = self._gpm.get(addr or 0)
        if found is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlGpmSampleFree(self, gpmSample: Any) -> Any:
        self._node_call()
        with self._lock:
            s = self._sample(gpmSample)
            del self._gpm[ctypes.addressof(s.buffer)]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        g, _, t = self._device(device)
        with self._lock:
            s = self._sample(gpmSample)
            s.gpu, s.gpu_instance, s.acc = g.index, None, self._node.advance(g.index, t)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: Any, gpmSample: Any) -> Any:
        g, _, t = self._device(device)
        if not g.mig_enabled or g.instance(gpuInstanceId) is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            s = self._sample(gpmSample)
            s.gpu, s.gpu_instance, s.acc = g.index, gpuInstanceId, self._node.advance(g.index, t)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._node_call()
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if metricsGet.numMetrics > pynvml.NVML_GPM_METRIC_MAX:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            s1, s2 = self._sample(metricsGet.sample1), self._sample(metricsGet.sample2)
        if s1.acc is None or s2.acc is None or (s1.gpu, s1.gpu_instance) != (s2.gpu, s2.gpu_instance):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert s1.gpu is not None
        g = self.scenario.gpus[s1.gpu]
        if self._node.is_lost(g.index, self._now()):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        rates = self._gpm_rates(g, s1.gpu_instance, s1.acc, s2.acc)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            value = rates.get(metric.metricId)
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                metric.value = 0.0
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = value
        return metricsGet

    def _gpm_rates(self, g: GpuSpec, gi: int | None, a1: Integrals, a2: Integrals) -> dict[int, float]:
        dt = a2.t - a1.t
        if dt < 0:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if dt == 0:  # two samples at one instant (a frozen fake clock): the instantaneous figures
            v = self._node.view(g.index, a2.t)
            util = v.activity if gi is None else v.instance_util.get(gi, 0.0)
            mem = v.mem_util if gi is None else v.instance_mem_util.get(gi, 0.0)
            tx, rx, ntx, nrx = v.pcie_tx_bps, v.pcie_rx_bps, v.nvlink_tx_bps, v.nvlink_rx_bps
        else:
            if gi is None:
                util, mem = (a2.util_s - a1.util_s) / dt, (a2.mem_util_s - a1.mem_util_s) / dt
            else:
                util = (a2.instance_util_s.get(gi, 0.0) - a1.instance_util_s.get(gi, 0.0)) / dt
                mem = (a2.instance_mem_util_s.get(gi, 0.0) - a1.instance_mem_util_s.get(gi, 0.0)) / dt
            tx, rx = (a2.pcie_tx_bytes - a1.pcie_tx_bytes) / dt, (a2.pcie_rx_bytes - a1.pcie_rx_bytes) / dt
            ntx = (a2.nvlink_tx_bytes - a1.nvlink_tx_bytes) / dt
            nrx = (a2.nvlink_rx_bytes - a1.nvlink_rx_bytes) / dt
        if gi is not None:
            inst = g.instance(gi)
            share = inst.profile.slices / g.model.mig_slices if inst is not None else 0.0
            tx, rx = tx * share, rx * share
        p = pynvml
        rates = {
            p.NVML_GPM_METRIC_GRAPHICS_UTIL: util,
            p.NVML_GPM_METRIC_SM_UTIL: util * 0.9,
            p.NVML_GPM_METRIC_SM_OCCUPANCY: util * 0.55,
            p.NVML_GPM_METRIC_INTEGER_UTIL: util * 0.12,
            p.NVML_GPM_METRIC_ANY_TENSOR_UTIL: util * 0.45,
            p.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: util * 0.02,
            p.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: util * 0.4,
            p.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: util * 0.03,
            p.NVML_GPM_METRIC_DRAM_BW_UTIL: mem,
            p.NVML_GPM_METRIC_FP64_UTIL: util * 0.03,
            p.NVML_GPM_METRIC_FP32_UTIL: util * 0.3,
            p.NVML_GPM_METRIC_FP16_UTIL: util * 0.12,
            p.NVML_GPM_METRIC_PCIE_TX_PER_SEC: tx / MIB,
            p.NVML_GPM_METRIC_PCIE_RX_PER_SEC: rx / MIB,
        }
        if g.model.nvlink_links and gi is None:
            rates[p.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = ntx / MIB
            rates[p.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = nrx / MIB
        return rates

    # -- events (XID) --------------------------------------------------------------------------------

    @staticmethod
    def _build_events(scenario: Scenario) -> list[_Event]:
        events: list[_Event] = []
        seq = 0
        for f in scenario.faults:
            if isinstance(f, XidFault):
                for k in range(f.count):
                    events.append(_Event(f.at + k * f.interval, seq, f.gpu,
                                         pynvml.nvmlEventTypeXidCriticalError, f.code, f.gpu_instance))
                    seq += 1
            elif isinstance(f, EccFault):
                kind = (pynvml.nvmlEventTypeDoubleBitEccError if f.double_bit
                        else pynvml.nvmlEventTypeSingleBitEccError)
                events.append(_Event(f.at, seq, f.gpu, kind, 0, None))
                seq += 1
        events.sort()
        return events

    def _supported_events(self, g: GpuSpec) -> int:
        mask = pynvml.nvmlEventTypeXidCriticalError
        if g.model.ecc:
            mask |= pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
        return mask

    def _event_set(self, event_set: Any) -> _EventSet:
        try:
            addr = ctypes.cast(event_set, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            addr = None
        es = self._event_sets.get(addr or 0)
        if es is None or es.freed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return es

    def nvmlEventSetCreate(self) -> Any:
        self._node_call()
        buf = (ctypes.c_byte * 8)()
        with self._lock:
            self._event_sets[ctypes.addressof(buf)] = _EventSet(buf)
        return ctypes.cast(buf, pynvml.c_nvmlEventSet_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return self._supported_events(g)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: Any, eventSet: Any) -> Any:
        g, _, t = self._device(handle)
        if eventTypes & ~self._supported_events(g):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es = self._event_set(eventSet)
            mask, since = es.registrations.get(g.index, (0, t))
            es.registrations[g.index] = (mask | eventTypes, since)

    def nvmlEventSetFree(self, eventSet: Any) -> Any:
        self._node_call()
        with self._lock:
            es = self._event_set(eventSet)
            es.freed = True
            es.wake.set()

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: Any) -> Any:
        return self._wait(eventSet, timeoutms, "nvmlEventSetWait")

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: Any) -> Any:
        return self._wait(eventSet, timeoutms, "nvmlEventSetWait_v2")

    def _wait(self, event_set: Any, timeout_ms: int, name: str) -> Any:
        t = self._node_call(name)
        deadline = t + max(0, timeout_ms) / 1000.0
        while True:
            with self._lock:
                es = self._event_set(event_set)
                t = self._now()
                event, next_t = self._next_event(es, t)
            if event is not None:
                return self._event_data(event)
            remaining = deadline - t
            if remaining <= 0:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            delay = remaining if next_t is None else min(remaining, max(next_t - t, 0.0))
            if self._sleep is not None:
                self._sleep(delay)
            else:
                es.wake.wait(delay)
            if es.freed:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            if self._now() <= t:  # a clock that does not move while we wait: do not spin
                raise _error(pynvml.NVML_ERROR_TIMEOUT)

    def _next_event(self, es: _EventSet, t: float) -> tuple[_Event | None, float | None]:
        """The next due event registered in ``es`` (consumed), else the time of the next event."""
        events = self._events
        i = es.cursor
        while i < len(events) and events[i].t <= t:
            e = events[i]
            i += 1
            reg = es.registrations.get(e.gpu)
            if reg is not None and reg[0] & e.type and e.t >= reg[1]:
                es.cursor = i
                return e, None
        es.cursor = i
        return None, events[i].t if i < len(events) else None

    def _event_data(self, e: _Event) -> Any:
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handle(self._gpu_addr[e.gpu])
        data.eventType = e.type
        data.eventData = e.data
        if e.gpu_instance is None:
            data.gpuInstanceId = data.computeInstanceId = NO_INSTANCE
        else:
            data.gpuInstanceId, data.computeInstanceId = e.gpu_instance, 0
        return data


def _parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of ``0000:18:00.0`` or ``00000000:18:00.0``."""
    try:
        domain, bus, rest = text.strip().split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None
