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
from gpuagent.devices.sim.node import ProcView


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
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        tick = int(max(t, 0.0) * 1_000_000) // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        stamp = int(self._epoch * 1_000_000) + tick
        if stamp <= since:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        busy = [pv for pv in self._node.procs(g.index, t) if round(pv.sm_util) > 0 or round(pv.mem_util) > 0]
        if not busy:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
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

