"""The one place that reads NVML: a pynvml-shaped module in, frozen ``GpuSample``s out.

The module is the real ``pynvml`` or the simulated one (``devices/sim``); this code cannot tell them
apart. Every call goes through :class:`~gpuagent.devices.guard.NvmlGuard`. Reads are tiered so the
driver lock is held briefly (DESIGN.md, "Do no harm"):

- every poll: utilization, memory, the SM clock, temperature, the instant power (one field value),
  clock-event reasons, each process list once;
- per-process utilization (with its timestamp cursor, ``procutil``): every poll where the share controller
  acts on the GPU, every ``process_utilization_interval`` (10 s) elsewhere (about 2 ms a read on an H100);
- every ``detail_interval`` (10 s, ``details``): the memory and graphics clocks, encoder and decoder
  utilization, and the batched counters (PCIe, NVLink, replays, memory temperature);
- every ``energy_interval`` (30 s): the energy counter (about 3 ms a read on an H100);
- every ``profiling_interval`` (10 s): a GPM sample and the profiling metrics since the last (1.7 ms); a
  new GPU or MIG instance takes its first pair at once (``devices/gpm.py``), so the first poll has them;
- every slow poll: static info (name, serial, PCI, power limit, MIG mode and layout, NVLink peers, NUMA
  node, compute mode, the MIG profiles and how many more of each can be created), ECC and retired pages
  (batched field values), remapped rows.

Costs, and why each figure sits on its tier: ``docs/nvml-cost.md``.

A :class:`GpuReader` belongs to one GPU and is only ever used from that GPU's worker thread.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuagent.devices.cadence import Cadence
from gpuagent.devices.details import MHZ, DetailReader
from gpuagent.devices.fields import (
    ENERGY_FIELDS,
    FAST_FIELDS,
    SLOW_FIELDS,
    decode_field_values,
    field_ids,
)
from gpuagent.devices.gpm import GpmSampler
from gpuagent.devices.guard import GpuLostError, NvmlGuard
from gpuagent.devices.mps import MPS_LIST, ClientUtilization, is_mps_daemon, process_kind
from gpuagent.devices.procutil import ProcessUtilization
from gpuagent.snapshot import (
    MPS_CLIENT,
    EccCounts,
    GpuInfo,
    GpuSample,
    MigProfileCapacity,
    MigSample,
    ProcessSample,
    ProfilingSample,
    RemappedRows,
    XidRecord,
)

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process on a GPU without MIG
MIB = 1024 * 1024
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)

ProcessNames = Callable[[int], str]


def text(value: Any) -> str:
    """pynvml returns str for most strings but bytes inside some structs."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


@dataclass(frozen=True, slots=True)
class _MigSlot:
    """A MIG device as enumerated on the slow cadence."""

    handle: Any
    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile: str
    slice_fraction: float


class GpuReader:
    """Reads one GPU. Not thread-safe by design: one reader, one worker thread."""

    def __init__(
        self,
        guard: NvmlGuard,
        index: int,
        handle: Any,
        *,
        process_names: ProcessNames,
        clock: Callable[[], float] = time.time,
        sys_root: str = "/sys",
        energy_interval: float = 30.0,
        profiling_interval: float = 10.0,
        process_utilization_interval: float = 10.0,
        detail_interval: float = 10.0,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.guard = guard
        self._sleep = sleep  # GPM's first pair waits on this (the reader's own thread)
        self.profiling_interval = profiling_interval
        self._energy = Cadence(energy_interval)
        self._energy_joules: float | None = None
        self._energy_read_at: float | None = None  # wall time of the last energy read
        self._sys_root = sys_root
        self.nvml = guard.nvml
        self.index = index
        self.handle = handle
        self._names = process_names
        self._clock = clock
        self.info: GpuInfo | None = None
        self._migs: tuple[_MigSlot, ...] = ()
        self._ecc: EccCounts | None = None
        self._remapped: RemappedRows | None = None
        self.process_utilization = ProcessUtilization(
            guard, handle, index, interval=process_utilization_interval, clock=clock)
        self._details = DetailReader(guard, handle, index, interval=detail_interval, clock=clock)
        self._mps_clients = ClientUtilization()  # whether this driver samples MPS clients (devices/mps.py)
        self._gpm: GpmSampler | None = None
        self._mig_gpm: dict[int, GpmSampler] = {}
        self._fast_ids = field_ids(self.nvml, FAST_FIELDS)
        self._slow_ids = field_ids(self.nvml, SLOW_FIELDS)
        self._energy_ids = field_ids(self.nvml, ENERGY_FIELDS)

    # -- slow tier ---------------------------------------------------------------------------------

    def refresh_static(self) -> GpuInfo:
        """Static info, MIG layout, ECC and remapped rows. Runs at start and every slow poll."""
        g, h, nvml, s = self.guard, self.handle, self.nvml, self.index
        uuid = text(g.call("nvmlDeviceGetUUID", h, scope=s) or "")
        pci = g.call("nvmlDeviceGetPciInfo", h, scope=s)
        memory = self._memory_info(h)
        limit_mw = g.call("nvmlDeviceGetEnforcedPowerLimit", h, scope=s)
        if limit_mw is None:
            limit_mw = g.call("nvmlDeviceGetPowerManagementLimit", h, scope=s)
        mig_mode = g.call("nvmlDeviceGetMigMode", h, scope=s)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        if self.info is not None and self.info.mig_enabled != mig_enabled:
            g.forget(s)  # what is unsupported changes with MIG mode (e.g. GPU utilization)
        support = g.call("nvmlGpmQueryDeviceSupport", h, scope=s)
        bus_id = text(pci.busId) if pci is not None else ""
        mode = g.call("nvmlDeviceGetComputeMode", h, scope=s)
        info = GpuInfo(
            index=self.index,
            uuid=uuid,
            name=text(g.call("nvmlDeviceGetName", h, scope=s) or ""),
            serial=optional_text(g.call("nvmlDeviceGetSerial", h, scope=s)),
            pci_bus_id=bus_id,
            minor_number=g.call("nvmlDeviceGetMinorNumber", h, scope=s),
            memory_total_bytes=memory.total if memory is not None else None,
            power_limit_watts=limit_mw / 1000.0 if limit_mw is not None else None,
            mig_enabled=mig_enabled,
            nvlink_peers=self._nvlink_peers(),
            gpm_supported=bool(support is not None and support.isSupportedDevice),
            numa_node=self._numa_node(bus_id),
            compute_mode=_COMPUTE_MODES.get(mode) if mode is not None else None,
            mig_profiles=self._mig_profiles() if mig_enabled else (),
        )
        self.info = info
        self._migs = self._enumerate_migs() if mig_enabled else ()
        self._refresh_samplers()
        self._read_health_counters()
        return info

    def _nvlink_peers(self) -> tuple[str, ...]:
        g, nvml = self.guard, self.nvml
        peers: list[str] = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = g.call(
                "nvmlDeviceGetNvLinkState", self.handle, link, scope=self.index,
                absent_on=(nvml.NVML_ERROR_INVALID_ARGUMENT,),
            )
            if state is None:
                break  # unsupported, or past the last link
            if state != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = g.call("nvmlDeviceGetNvLinkRemotePciInfo", self.handle, link, scope=self.index)
            if remote is not None:
                bus = text(remote.busId)
                if bus not in peers:
                    peers.append(bus)
        return tuple(peers)

    def _numa_node(self, bus_id: str) -> int | None:
        """NVML's answer (drivers from 545), else the PCI device's ``numa_node`` in sysfs; -1 means none."""
        node = self.guard.call("nvmlDeviceGetNumaNodeId", self.handle, scope=self.index)
        if node is None and bus_id:
            node = read_numa_node(self._sys_root, bus_id)
        return node if node is not None and node >= 0 else None

    def _mig_profiles(self) -> tuple[MigProfileCapacity, ...]:
        """Every GPU-instance profile the GPU supports, with how many more of it can be created now."""
        g, nvml = self.guard, self.nvml
        out: list[MigProfileCapacity] = []
        for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = g.call(
                "nvmlDeviceGetGpuInstanceProfileInfo", self.handle, index, scope=self.index,
                absent_on=(nvml.NVML_ERROR_INVALID_ARGUMENT, nvml.NVML_ERROR_NOT_FOUND),
            )
            if info is None or any(p.profile_id == info.id for p in out):
                continue
            remaining = g.call(
                "nvmlDeviceGetGpuInstanceRemainingCapacity", self.handle, info.id, scope=self.index
            )
            if remaining is None:
                continue
            memory_mb = int(info.memorySizeMB)
            out.append(MigProfileCapacity(
                profile=_mig_profile(text(getattr(info, "name", b"")), info),
                profile_id=int(info.id),
                slice_count=int(info.sliceCount),
                memory_bytes=memory_mb * MIB if memory_mb else None,
                remaining_count=int(remaining),
            ))
        return tuple(out)

    def _enumerate_migs(self) -> tuple[_MigSlot, ...]:
        g, nvml = self.guard, self.nvml
        count = g.call("nvmlDeviceGetMaxMigDeviceCount", self.handle, scope=self.index) or 0
        slots: list[_MigSlot] = []
        for i in range(count):
            handle = g.call(
                "nvmlDeviceGetMigDeviceHandleByIndex", self.handle, i, scope=self.index,
                absent_on=(nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT),
            )
            if handle is None:
                continue
            scope = (self.index, "mig", i)
            gi = g.call("nvmlDeviceGetGpuInstanceId", handle, scope=scope)
            if gi is None:
                continue
            attrs = g.call("nvmlDeviceGetAttributes", handle, scope=scope)
            slices = attrs.gpuInstanceSliceCount if attrs is not None else 0
            name = text(g.call("nvmlDeviceGetName", handle, scope=scope) or "")
            slots.append(
                _MigSlot(
                    handle=handle,
                    gpu_instance_id=gi,
                    compute_instance_id=g.call("nvmlDeviceGetComputeInstanceId", handle, scope=scope),
                    uuid=text(g.call("nvmlDeviceGetUUID", handle, scope=scope) or ""),
                    profile=_mig_profile(name, attrs),
                    slice_fraction=slices / count if count else 0.0,
                )
            )
        return tuple(slots)

    def _refresh_samplers(self) -> None:
        info = self.info
        if info is None or not info.gpm_supported:
            self._close_samplers()
            return
        if info.mig_enabled:
            if self._gpm is not None:
                self._gpm.close()
                self._gpm = None
            wanted = {m.gpu_instance_id for m in self._migs}
            for gi in set(self._mig_gpm) - wanted:
                self._mig_gpm.pop(gi).close()
            for gi in wanted - set(self._mig_gpm):
                self._mig_gpm[gi] = GpmSampler(self.guard, self.handle, (self.index, "gpm", gi), gi,
                                               interval=self.profiling_interval, clock=self._clock,
                                               sleep=self._sleep)
        else:
            for sampler in self._mig_gpm.values():
                sampler.close()
            self._mig_gpm.clear()
            if self._gpm is None:
                self._gpm = GpmSampler(self.guard, self.handle, self.index,
                                       interval=self.profiling_interval, clock=self._clock, sleep=self._sleep)
        for sampler in (self._gpm, *self._mig_gpm.values()):  # new ones take their first sample now
            if sampler is not None:
                sampler.prime()

    def _read_health_counters(self) -> None:
        g, s = self.guard, self.index
        values = decode_field_values(
            self.nvml, SLOW_FIELDS, g.call("nvmlDeviceGetFieldValues", self.handle, self._slow_ids, scope=s)
        )
        if values:
            pending = values.pop("retired_pages_pending", None)
            self._ecc = EccCounts(
                **{k: int(v) for k, v in values.items()},
                retired_pages_pending=bool(pending) if pending is not None else None,
            )
        else:
            self._ecc = None
        rows = g.call("nvmlDeviceGetRemappedRows", self.handle, scope=s)
        self._remapped = (
            RemappedRows(rows[0], rows[1], pending=bool(rows[2]), failed=bool(rows[3])) if rows else None
        )

    # -- every poll --------------------------------------------------------------------------------

    def read(self, *, slow_due: bool, xid: XidRecord) -> GpuSample:
        """One poll of this GPU. Raises GpuLostError / NvmlUnavailableError from the guard."""
        if self.handle is None:  # nvmlDeviceGetHandleByIndex failed at start
            raise GpuLostError(self.index, "nvmlDeviceGetHandleByIndex")
        if slow_due or self.info is None:
            self.refresh_static()
        info = self.info
        assert info is not None
        g, h, nvml, s = self.guard, self.handle, self.nvml, self.index
        util = g.call("nvmlDeviceGetUtilizationRates", h, scope=s)
        memory = self._memory_info(h)
        fields = decode_field_values(
            nvml, FAST_FIELDS, g.call("nvmlDeviceGetFieldValues", h, self._fast_ids, scope=s)
        )
        if "power_watts" not in fields:
            milliwatts = g.call("nvmlDeviceGetPowerUsage", h, scope=s)
            if milliwatts is not None:
                fields["power_watts"] = milliwatts / 1000.0
        processes = self._processes()
        self._read_energy()
        procutil = self.process_utilization
        return GpuSample(
            info=info,
            sampled_at_unix=self._clock(),
            energy_joules_total=self._energy_joules,
            energy_read_at_unix=self._energy_read_at,
            gpu_util_percent=_float(util.gpu) if util is not None else None,
            memory_copy_util_percent=_float(util.memory) if util is not None else None,
            memory_used_bytes=memory.used if memory is not None else None,
            memory_free_bytes=memory.free if memory is not None else None,
            memory_reserved_bytes=getattr(memory, "reserved", None) if memory is not None else None,
            sm_clock_hz=_hz(g.call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, scope=s)),
            temperature_celsius=_float(
                g.call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU, scope=s)
            ),
            clock_event_reasons=g.call("nvmlDeviceGetCurrentClocksEventReasons", h, scope=s),
            ecc=self._ecc,
            remapped_rows=self._remapped,
            xid=xid,
            profiling=self._gpm.sample() if self._gpm is not None else None,
            processes=processes,
            migs=self._read_migs(processes) if info.mig_enabled else (),
            process_util_read_at_unix=None if info.mig_enabled else procutil.read_at,
            process_util_window_seconds=None if info.mig_enabled else procutil.window_seconds,
            **self._details.read(),
            **fields,
        )

    def _read_energy(self) -> None:
        """The energy counter, when ``energy_interval`` has passed since the last read (every poll when that
        is at most the poll interval). In between, samples carry the last reading and its time
        (``energy_read_at_unix``); a failed read is tried again the next poll."""
        now = self._clock()
        if self._energy_read_at is not None and not self._energy.due(now):
            return
        self._energy.mark(now)
        values = decode_field_values(
            self.nvml, ENERGY_FIELDS,
            self.guard.call("nvmlDeviceGetFieldValues", self.handle, self._energy_ids, scope=self.index),
        )
        self._energy_joules = values.get("energy_joules_total")
        self._energy_read_at = now if self._energy_joules is not None else None

    def _memory_info(self, handle: Any) -> Any:
        g, scope = self.guard, self.index
        memory = g.call("nvmlDeviceGetMemoryInfo", handle, self.nvml.nvmlMemory_v2, scope=scope)
        if memory is None:  # drivers before the v2 struct: no "reserved"
            memory = g.call("nvmlDeviceGetMemoryInfo", handle, scope=scope)
        return memory

    def _processes(self) -> tuple[ProcessSample, ...]:
        """Both process lists once each (and the MPS clients' where an MPS server runs), joined with the
        per-process utilization of the last read (``procutil``: every poll where the share controller acts,
        every ``process_utilization_interval`` elsewhere)."""
        g, h, s = self.guard, self.handle, self.index
        found: dict[int, tuple[str, Any]] = {}
        for kind, function in (
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ):
            for proc in g.call(function, h, scope=s) or ():
                previous = found.get(proc.pid)
                if previous is None or _memory(proc) > _memory(previous[1]):
                    found[proc.pid] = (kind, proc)
        if any(is_mps_daemon(self._names(pid)) for pid in found):
            for proc in g.call(MPS_LIST, h, scope=s) or ():
                found[proc.pid] = (MPS_CLIENT, proc)
        per_process_util = not (self.info and self.info.mig_enabled)  # NVML has none on MIG
        if per_process_util:
            self.process_utilization.update(found)
        out = []
        for pid, (kind, proc) in sorted(found.items()):
            gi = getattr(proc, "gpuInstanceId", NO_INSTANCE)
            sm, mem = self.process_utilization.figures(pid) if per_process_util else (None, None)
            out.append(
                ProcessSample(
                    pid=pid,
                    comm=self._names(pid),
                    kind=process_kind(kind, self._names(pid)),
                    used_memory_bytes=proc.usedGpuMemory,
                    sm_util_percent=sm,
                    memory_util_percent=mem,
                    gpu_instance_id=None if gi in (None, NO_INSTANCE) else gi,
                )
            )
        return self._mps_clients.settle(tuple(out), self.process_utilization.sampled)

    def _read_migs(self, processes: tuple[ProcessSample, ...]) -> tuple[MigSample, ...]:
        out = []
        for slot in self._migs:
            memory = self.guard.call("nvmlDeviceGetMemoryInfo", slot.handle, scope=(self.index, "mig"))
            sampler = self._mig_gpm.get(slot.gpu_instance_id)
            profiling: ProfilingSample | None = sampler.sample() if sampler is not None else None
            out.append(
                MigSample(
                    gpu_instance_id=slot.gpu_instance_id,
                    compute_instance_id=slot.compute_instance_id,
                    uuid=slot.uuid,
                    profile=slot.profile,
                    slice_fraction=slot.slice_fraction,
                    memory_total_bytes=memory.total if memory is not None else None,
                    memory_used_bytes=memory.used if memory is not None else None,
                    memory_free_bytes=memory.free if memory is not None else None,
                    processes=tuple(p for p in processes if p.gpu_instance_id == slot.gpu_instance_id),
                    profiling=profiling,
                )
            )
        return tuple(out)

    def close(self) -> None:
        self._close_samplers()

    def _close_samplers(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None
        for sampler in self._mig_gpm.values():
            sampler.close()
        self._mig_gpm.clear()


def _mig_profile(name: str, attrs: Any) -> str:
    """A profile name ("1g.10gb") from NVML's name, else from a device's attributes or a profile's info."""
    match = _MIG_PROFILE.search(name)
    if match:
        return match.group(1).lower()
    if attrs is not None:
        slices = getattr(attrs, "gpuInstanceSliceCount", None) or getattr(attrs, "sliceCount", 0)
        return f"{slices}g.{round(attrs.memorySizeMB / 1024)}gb"
    return "unknown"


def read_numa_node(sys_root: str, bus_id: str) -> int | None:
    """``/sys/bus/pci/devices/<domain:bus:dev.fn>/numa_node`` of an NVML bus id ("00000000:18:00.0")."""
    domain, _, rest = bus_id.lower().partition(":")
    path = os.path.join(sys_root, "bus", "pci", "devices", f"{domain[-4:]:0>4}:{rest}", "numa_node")
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def optional_text(value: Any) -> str | None:
    """A string NVML may leave empty: None then."""
    return text(value) if value else None


def _memory(proc: Any) -> int:
    return proc.usedGpuMemory or 0


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _hz(mhz: Any) -> float | None:
    return float(mhz) * MHZ if mhz is not None else None

