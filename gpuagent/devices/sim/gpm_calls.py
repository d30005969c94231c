"""The simulated NVML's GPU Performance Monitoring calls: samples, MIG samples and the metrics between two."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuagent.devices.sim.core import SimCore, nvml_error
from gpuagent.devices.sim.models import MIB
from gpuagent.devices.sim.node import Integrals
from gpuagent.devices.sim.scenario import (
    GpuSpec,
    Scenario,
)


@dataclass
class _GpmSample:
    buffer: Any
    gpu: int | None = None
    gpu_instance: int | None = None
    acc: Integrals | None = None


class GpmCalls(SimCore):
    """GPM samples are real ``c_nvmlGpmSample_t`` pointers to buffers the simulator owns."""

    def __init__(self, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(scenario, **kwargs)
        self._gpm: dict[int, _GpmSample] = {}


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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            s = self._sample(gpmSample)
            s.gpu, s.gpu_instance, s.acc = g.index, gpuInstanceId, self._node.advance(g.index, t)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._node_call()
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if metricsGet.numMetrics > pynvml.NVML_GPM_METRIC_MAX:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            s1, s2 = self._sample(metricsGet.sample1), self._sample(metricsGet.sample2)
        if s1.acc is None or s2.acc is None or (s1.gpu, s1.gpu_instance) != (s2.gpu, s2.gpu_instance):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert s1.gpu is not None
        g = self.scenario.gpus[s1.gpu]
        if self._node.is_lost(g.index, self._now()):
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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

