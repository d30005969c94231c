"""The simulated NVML's core: its state, the prologue every call goes through, and what pynvml gives for free.

A call counts itself, checks ``nvmlInit``, resolves its device handle, waits out injected latency and
``hang`` faults (never holding the lock), and answers GPU_IS_LOST, NOT_SUPPORTED on MIG handles and the
scenario's ``not_supported`` functions before it looks at anything else. Attributes this class does not
define come from the real ``pynvml``; a driver function among them raises FUNCTION_NOT_FOUND.
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
from gpuagent.devices.sim.models import MIB, unsupported_names
from gpuagent.devices.sim.node import GpuView, Node
from gpuagent.devices.sim.scenario import (
    GpuSpec,
    HangFault,
    MigInstanceSpec,
    ProcessSpec,
    Scenario,
    stable_digest,
)

NVMLError = pynvml.NVMLError
NO_INSTANCE = 0xFFFFFFFF
SAMPLE_PERIOD_US = 166_667  # the driver's per-process utilization sampling period (1/6 s)
ENCODER_PERIOD_US = 167_000
_DEFAULT_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# Functions that answer on a MIG device handle; anything else answers NOT_SUPPORTED there.
MIG_CALLS = frozenset({
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetAttributes",
    "nvmlDeviceGetAttributes_v2", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMinorNumber",
})


def nvml_error(code: int) -> pynvml.NVMLError:
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
class _Hang:
    spec: HangFault
    ends: float | None = None  # time.monotonic() when it ends; None until first hit
    done: bool = False
    released: threading.Event = field(default_factory=threading.Event)


class SimCore:
    """State and call plumbing shared by every group of calls; ``SimulatedNvml`` is this plus the groups
    (each a subclass of this one, mixed in)."""

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
        self._hangs = [_Hang(f) for f in scenario.faults if isinstance(f, HangFault)]
        self._environs = {p.pid: self._render_environ(p) for p in scenario.processes
                          if not p.real and (p.environ or p.mps)}


    # -- sim-only extensions -----------------------------------------------------------------------

    def process_name(self, pid: int) -> str | None:
        """The scenario's name of process ``pid`` (sim-only: NVML has no process names)."""
        return self._names.get(pid)

    def process_environ(self, pid: int) -> bytes | None:
        """The simulated environment of made-up PID ``pid`` as ``/proc/PID/environ`` holds it (``NAME=value``
        entries, each ended by a NUL), sim-only; None when the scenario gives it none. Real PIDs have their
        own, in /proc."""
        return self._environs.get(pid)

    def _render_environ(self, p: ProcessSpec) -> bytes:
        """``environ:`` as given, and an MPS client's ``mps:`` limits as the two variables MPS reads: the
        memory limit keyed by the UUID of the client's device (MIG instance or GPU), in MiB."""
        environ = dict(p.environ)
        if p.mps is not None and p.mps.active_thread_percentage is not None:
            environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{p.mps.active_thread_percentage:g}"
        if p.mps is not None and p.mps.pinned_memory_limit_bytes is not None:
            gpu = self.scenario.gpus[p.gpu]
            device = self._uuid(gpu, gpu.instance(p.mig_instance) if p.mig_instance is not None else None)
            mib = p.mps.pinned_memory_limit_bytes // MIB
            environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{device}={mib}M"
        return b"".join(f"{name}={value}".encode() + b"\0" for name, value in environ.items())

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
            raise nvml_error(code)

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
                raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        self._block(name, None)
        return self._now()

    def _device(self, handle: Any, name: str | None = None) -> tuple[GpuSpec, MigInstanceSpec | None, float]:
        """Prologue of a device call: count, init, handle, hang, latency, lost GPU, MIG, NOT_SUPPORTED."""
        name = name or sys._getframe(1).f_code.co_name
        with self._lock:
            self._calls[name] += 1
            if self._init_count <= 0:
                raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        info = self._resolve(handle)
        self._block(name, info.gpu.index)
        t = self._now()
        if self._node.is_lost(info.gpu.index, t):
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if info.instance is not None and name not in MIG_CALLS:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in self._unsupported[info.gpu.index]:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return info.gpu, info.instance, t

    def _resolve(self, handle: Any) -> _HandleInfo:
        if not isinstance(handle, pynvml.c_nvmlDevice_t):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = self._handles.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if info is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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


    # -- identities: UUIDs and PCI addresses ---------------------------------------------------------

    def _uuid(self, g: GpuSpec, inst: MigInstanceSpec | None) -> str:
        s = self.scenario
        if inst is None:
            d = stable_digest(s.seed, s.hostname, "gpu", g.index).hex()
            return f"GPU-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"
        d = stable_digest(s.seed, s.hostname, "mig", g.index, inst.id, 0).hex()
        return f"MIG-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"

    def _bus_id(self, g: GpuSpec) -> str:
        if g.pci_bus_id is not None:
            parsed = parse_bus_id(g.pci_bus_id)
            assert parsed is not None
            domain, bus, dev, fn = parsed
        else:
            domain, bus, dev, fn = g.index // len(_DEFAULT_BUSES), _DEFAULT_BUSES[g.index % 8], 0, 0
        return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"

    def _pci_info(self, g: GpuSpec) -> Any:
        bus_id = self._bus_id(g)
        domain, bus, dev, _ = parse_bus_id(bus_id) or (0, 0, 0, 0)
        info = pynvml.nvmlPciInfo_t()
        info.busIdLegacy = f"{domain:04X}{bus_id[8:]}".encode()
        info.busId = bus_id.encode()
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = g.model.pci_device_id
        info.pciSubSystemId = g.model.pci_subsystem_id
        return info


def parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of ``0000:18:00.0`` or ``00000000:18:00.0``."""
    try:
        domain, bus, rest = text.strip().split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None
