"""The simulated NVML's process calls: the running-process lists and per-process utilization samples."""

from __future__ import annotations

from typing import Any

import pynvml

from gpuagent.devices.sim.core import (
    NO_INSTANCE,
    SAMPLE_PERIOD_US,
    SimCore,
    nvml_error,
)

_COMPUTE = ("compute", "both", "mps_server")  # the MPS server is a compute process
_GRAPHICS = ("graphics", "both")
_MPS_CLIENTS = ("mps_client",)  # listed by the MPS call only, as the real driver does


class ProcessCalls(SimCore):
    """Process lists and per-process utilization."""

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
        return self._running(handle, _COMPUTE, "nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> Any:
        return self._running(handle, _COMPUTE, "nvmlDeviceGetComputeRunningProcesses_v3")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> Any:
        return self._running(handle, _GRAPHICS, "nvmlDeviceGetGraphicsRunningProcesses")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> Any:
        return self._running(handle, _GRAPHICS, "nvmlDeviceGetGraphicsRunningProcesses_v3")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> Any:
        return self._running(handle, _MPS_CLIENTS, "nvmlDeviceGetMPSComputeRunningProcesses")

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any) -> Any:
        return self._running(handle, _MPS_CLIENTS, "nvmlDeviceGetMPSComputeRunningProcesses_v3")

    def _utilization_samples(
        self, handle: Any, since: int, name: str
    ) -> tuple[int, list[tuple[int, int, int]]]:
        """The sample time and (pid, SM %, memory %) of each process that ran since ``since``. With the
        scenario's ``driver.mps_utilization: server`` the MPS clients' use is the server's sample."""
        g, _, t = self._device(handle, name)
        if g.mig_enabled:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        tick = int(max(t, 0.0) * 1_000_000) // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        stamp = int(self._epoch * 1_000_000) + tick
        if stamp <= since:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        procs = self._node.procs(g.index, t)
        use = {pv.spec.pid: [pv.sm_util, pv.mem_util] for pv in procs}
        if self.scenario.driver.mps_utilization == "server":
            servers = [pv.spec.pid for pv in procs if pv.spec.type == "mps_server"]
            for pv in procs:
                if pv.spec.type == "mps_client":
                    figures = use.pop(pv.spec.pid)
                    if servers:
                        use[servers[0]][0] = min(100.0, use[servers[0]][0] + figures[0])
                        use[servers[0]][1] = min(100.0, use[servers[0]][1] + figures[1])
        busy = [(pid, round(sm), round(mem)) for pid, (sm, mem) in use.items()
                if round(sm) > 0 or round(mem) > 0]
        if not busy:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return stamp, busy

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: Any) -> Any:
        stamp, busy = self._utilization_samples(handle, timeStamp, "nvmlDeviceGetProcessUtilization")
        samples = (pynvml.c_nvmlProcessUtilizationSample_t * len(busy))()
        for s, (pid, sm, mem) in zip(samples, busy, strict=True):
            s.pid, s.timeStamp = pid, stamp
            s.smUtil, s.memUtil, s.encUtil, s.decUtil = sm, mem, 0, 0
        return samples[0:len(busy)]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: Any) -> Any:
        stamp, busy = self._utilization_samples(handle, timeStamp, "nvmlDeviceGetProcessesUtilizationInfo")
        samples = (pynvml.c_nvmlProcessUtilizationInfo_v1_t * len(busy))()
        for s, (pid, sm, mem) in zip(samples, busy, strict=True):
            s.pid, s.timeStamp = pid, stamp
            s.smUtil, s.memUtil = sm, mem
        return samples[0:len(busy)]

