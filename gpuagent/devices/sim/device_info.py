"""The simulated NVML's system and static device calls: init, versions, handles, identity, limits, NVLink."""

from __future__ import annotations

from typing import Any

import pynvml

from gpuagent.devices.sim.core import SimCore, nvml_error, parse_bus_id
from gpuagent.devices.sim.scenario import (
    GpuSpec,
    stable_digest,
)


class DeviceInfoCalls(SimCore):
    """``nvmlInit``, the system versions, handle lookups, and what a GPU is (name, serial, PCI, power limits,
    NUMA node, compute mode, NVLink peers, GPM support)."""

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
            raise nvml_error(failure.error)
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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(self._gpu_addr[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Any:
        self._node_call()
        if isinstance(uuid, bytes):
            uuid = uuid.decode(errors="replace")
        if uuid in self._uuids:
            return self._handle(self._gpu_addr[self._uuids[uuid]])
        if uuid in self._mig_uuids:
            return self._handle(self._mig_addr[self._mig_uuids[uuid]])
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: Any) -> Any:
        self._node_call()
        if isinstance(pciBusId, bytes):
            pciBusId = pciBusId.decode(errors="replace")
        wanted = parse_bus_id(pciBusId)
        for g in self.scenario.gpus:
            if wanted is not None and parse_bus_id(self._bus_id(g)) == wanted:
                return self._handle(self._gpu_addr[g.index])
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)



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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return values[type]


    # -- NVLink and GPM support --------------------------------------------------------------------

    def _link(self, g: GpuSpec, link: Any, t: float) -> tuple[bool, int | None]:
        if not isinstance(link, int) or not 0 <= link < g.model.nvlink_links:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        peers = self._node.peers[g.index]
        if not peers or link in g.nvlink_down or self._node.link_down(g.index, link, t):
            return False, None
        return True, peers[link % len(peers)]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: Any) -> Any:
        g, _, t = self._device(device)
        up, _ = self._link(g, link, t)
        return pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: Any) -> Any:
        g, _, t = self._device(device)
        up, peer = self._link(g, link, t)
        if not up or peer is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._pci_info(self.scenario.gpus[peer])

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if g.model.gpm else 0
        return support

