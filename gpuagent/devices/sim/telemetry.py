"""The simulated NVML's per-poll readings: utilization, memory, clocks, temperature, power, field values
and the health counters (ECC, remapped rows), from the node's physics at scenario time.
"""

from __future__ import annotations

from typing import Any

import pynvml

from gpuagent.devices.sim.core import (
    ENCODER_PERIOD_US,
    SimCore,
    nvml_error,
)
from gpuagent.devices.sim.node import GpuView, Integrals
from gpuagent.devices.sim.scenario import (
    GpuSpec,
)


class TelemetryCalls(SimCore):
    """What the poller reads every poll (and the slow tier's health counters)."""

    # -- every poll ----------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g, _, t = self._device(handle)
        if g.mig_enabled:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
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
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return values[type]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any) -> Any:
        g, _, t = self._device(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
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
            p.NVML_FI_DEV_REMAPPED_FAILURE: (uint, 1 if self._node.remap_failed(g.index, t) else 0),
        }
        return table.get(fid)

    # -- health counters ---------------------------------------------------------------------------

    def nvmlDeviceGetRemappedRows(self, device: Any) -> Any:
        g, _, t = self._device(device)
        _, dbe = self._node.ecc_counts(g.index, t)
        return (0, dbe, 1 if dbe else 0, 1 if self._node.remap_failed(g.index, t) else 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: Any, counterType: Any) -> Any:
        g, _, t = self._device(handle)
        kinds = (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        if errorType not in kinds:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counterType not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sbe, dbe = self._node.ecc_counts(g.index, t)
        return dbe if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else sbe

    def nvmlDeviceGetEccMode(self, handle: Any) -> Any:
        self._device(handle)
        return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]

