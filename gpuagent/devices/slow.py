"""What a GPU's slow poll reads: its static info, its MIG layout, and its health counters.

Some of a GPU's facts change rarely or never: name, serial, PCI address, power limit, MIG mode and layout,
NVLink peers, NUMA node, compute mode, the MIG profiles and how many more of each can be created. Others
move slowly and are only worth reading on the same cadence: the ECC and retired-page counters (one batched
field-value call) and the remapped rows. Reading them every poll would hold the driver's lock for figures
that do not change (``docs/nvml-cost.md``), so the reader reads them at start, at every slow poll
(``slow_poll_interval``), and the samples in between carry them. A change of MIG mode makes the guard
forget what it learned was unsupported, since that changes with the mode (GPU utilization, for one).

A :class:`SlowReader` belongs to one GPU and is only ever used from that GPU's worker thread.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from gpuagent.devices.fields import SLOW_FIELDS, FieldBatch
from gpuagent.devices.guard import NvmlGuard
from gpuagent.snapshot.gpu import EccCounts, GpuInfo, MigProfileCapacity, RemappedRows
from gpuagent.untrusted import label_value

MIB = 1024 * 1024
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)


def text(value: Any) -> str:
    """A string from the driver as the snapshot holds it: pynvml returns str for most strings but bytes
    inside some structs. This is where every driver string (GPU name, UUID, serial, PCI bus ID, driver and
    NVML versions, MIG names) enters, so it is made a safe label value here, once: a control character in
    a name would reach label values, the API, logs and ``top`` raw (``gpuagent.untrusted.label_value``)."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace").rstrip("\x00")
    return label_value(str(value))


def optional_text(value: Any) -> str | None:
    """A string NVML may leave empty: None then."""
    return text(value) if value else None


def memory_info(guard: NvmlGuard, handle: Any, scope: int) -> Any:
    """The memory struct, v2 (with "reserved") where the driver has it, else v1."""
    memory = guard.call("nvmlDeviceGetMemoryInfo", handle, guard.nvml.nvmlMemory_v2, scope=scope)
    if memory is None:  # drivers before the v2 struct: no "reserved"
        memory = guard.call("nvmlDeviceGetMemoryInfo", handle, scope=scope)
    return memory


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A MIG device as enumerated on the slow cadence."""

    handle: Any
    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile: str
    slice_fraction: float


class SlowReader:
    """One GPU's slow-poll figures: ``read_info`` (info and MIG layout), then ``read_health`` (ECC, rows)."""

    def __init__(self, guard: NvmlGuard, index: int, handle: Any, *, sys_root: str = "/sys") -> None:
        self.guard = guard
        self.nvml = guard.nvml
        self.index = index
        self.handle = handle
        self._sys_root = sys_root
        self._slow_fields = FieldBatch(self.nvml, SLOW_FIELDS)
        self.info: GpuInfo | None = None
        self.migs: tuple[MigSlot, ...] = ()
        self.ecc: EccCounts | None = None
        self.remapped: RemappedRows | None = None

    def read_info(self) -> GpuInfo:
        """The static info and, with MIG on, the MIG devices (``migs``)."""
        g, h, nvml, s = self.guard, self.handle, self.nvml, self.index
        uuid = text(g.call("nvmlDeviceGetUUID", h, scope=s) or "")
        pci = g.call("nvmlDeviceGetPciInfo", h, scope=s)
        memory = memory_info(g, h, s)
        limit_mw = g.call("nvmlDeviceGetEnforcedPowerLimit", h, scope=s)
        if limit_mw is None:
            limit_mw = g.call("nvmlDeviceGetPowerManagementLimit", h, scope=s)
        mig_mode = g.call("nvmlDeviceGetMigMode", h, scope=s)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        peers, down = self._nvlink_peers()
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
            nvlink_peers=peers,
            nvlink_links_down=down,
            gpm_supported=bool(support is not None and support.isSupportedDevice),
            numa_node=self._numa_node(bus_id),
            compute_mode=_COMPUTE_MODES.get(mode) if mode is not None else None,
            mig_profiles=self._mig_profiles() if mig_enabled else (),
        )
        self.info = info
        self.migs = self._enumerate_migs() if mig_enabled else ()
        return info

    def _nvlink_peers(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The PCI bus ids of active links' peers, and the links down (only where some link is up)."""
        g, nvml = self.guard, self.nvml
        peers: list[str] = []
        down: list[int] = []
        up = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = g.call(
                "nvmlDeviceGetNvLinkState", self.handle, link, scope=self.index,
                absent_on=(nvml.NVML_ERROR_INVALID_ARGUMENT,),
            )
            if state is None:
                break  # unsupported, or past the last link
            if state != nvml.NVML_FEATURE_ENABLED:
                down.append(link)
                continue
            up += 1
            remote = g.call("nvmlDeviceGetNvLinkRemotePciInfo", self.handle, link, scope=self.index)
            if remote is not None:
                bus = text(remote.busId)
                if bus not in peers:
                    peers.append(bus)
        return tuple(peers), tuple(down) if up else ()

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

    def _enumerate_migs(self) -> tuple[MigSlot, ...]:
        g, nvml = self.guard, self.nvml
        count = g.call("nvmlDeviceGetMaxMigDeviceCount", self.handle, scope=self.index) or 0
        slots: list[MigSlot] = []
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
                MigSlot(
                    handle=handle,
                    gpu_instance_id=gi,
                    compute_instance_id=g.call("nvmlDeviceGetComputeInstanceId", handle, scope=scope),
                    uuid=text(g.call("nvmlDeviceGetUUID", handle, scope=scope) or ""),
                    profile=_mig_profile(name, attrs),
                    slice_fraction=slices / count if count else 0.0,
                )
            )
        return tuple(slots)

    def read_health(self) -> None:
        """ECC and retired pages (batched field values) into ``ecc``, remapped rows into ``remapped``."""
        g, s = self.guard, self.index
        values = self._slow_fields.read(g, self.handle, s)
        if values:
            pending = values.pop("retired_pages_pending", None)
            self.ecc = EccCounts(
                **{k: int(v) for k, v in values.items()},
                retired_pages_pending=bool(pending) if pending is not None else None,
            )
        else:
            self.ecc = None
        rows = g.call("nvmlDeviceGetRemappedRows", self.handle, scope=s)
        self.remapped = (
            RemappedRows(rows[0], rows[1], pending=bool(rows[2]), failed=bool(rows[3])) if rows else None
        )


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
