"""Tests of the simulated NVML itself: fidelity to pynvml, scenario semantics, faults, validation."""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from simclock import FakeClock

from gpuagent.devices.sim import (
    Scenario,
    ScenarioError,
    SimulatedNvml,
    default_scenario_path,
    load_scenario,
    parse_scenario,
)
from gpuagent.devices.sim.models import MODELS
from gpuagent.devices.sim.scenario import SCHEMA_PATH

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
ALL_SCENARIOS = [*EXAMPLES, default_scenario_path()]


def make(source: str | Path | Scenario, clock: FakeClock | None = None, *, init: bool = True,
         sleep: bool = False) -> SimulatedNvml:
    if isinstance(source, Scenario):
        scenario = source
    elif isinstance(source, Path):
        scenario = load_scenario(source)
    else:
        scenario = parse_scenario(source, source="test.yaml")
    kwargs: dict[str, Any] = {}
    if clock is not None:
        kwargs["clock"] = clock
        if sleep:
            kwargs["sleep"] = clock.sleep
    nvml = SimulatedNvml(scenario, **kwargs)
    if clock is not None:
        clock.t = clock.start
    if init:
        nvml.nvmlInit()
    return nvml


def example(name: str) -> Path:
    return ROOT / "examples" / "scenarios" / name


def addr(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def raises(code: int):
    """pytest.raises for the pynvml error class of ``code``."""
    return pytest.raises(pynvml.nvmlExceptionClass(code))


# -- fidelity: every function on every example ---------------------------------------------------------

FIELDS = [
    pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_POWER_INSTANT,
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    pynvml.NVML_FI_DEV_RETIRED_SBE, pynvml.NVML_FI_DEV_RETIRED_DBE, pynvml.NVML_FI_DEV_RETIRED_PENDING,
]

GPM_METRICS = [
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    pynvml.NVML_GPM_METRIC_FP64_UTIL, pynvml.NVML_GPM_METRIC_FP32_UTIL, pynvml.NVML_GPM_METRIC_FP16_UTIL,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
]


def call(fn: Any, *args: Any, allowed: tuple[int, ...] = (pynvml.NVML_ERROR_NOT_SUPPORTED,)) -> Any:
    """Call ``fn``; an NVML error in ``allowed`` yields None, any other propagates."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if exc.value in allowed:
            return None
        raise


def metrics_request(nvml: Any, s1: Any, s2: Any) -> Any:
    req = nvml.c_nvmlGpmMetricsGet_t()
    req.version = nvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(GPM_METRICS)
    req.sample1, req.sample2 = s1, s2
    for i, m in enumerate(GPM_METRICS):
        req.metrics[i].metricId = m
    return req


def exercise_device(nvml: SimulatedNvml, h: Any) -> None:
    """Every per-device function the backend uses, checking pynvml's return types."""
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert isinstance(nvml.nvmlDeviceGetIndex(h), int)
    uuid = nvml.nvmlDeviceGetUUID(h)
    assert isinstance(uuid, str) and uuid.startswith("GPU-") and len(uuid) == 40
    assert isinstance(nvml.nvmlDeviceGetName(h), str)
    serial = call(nvml.nvmlDeviceGetSerial, h)
    assert serial is None or isinstance(serial, str)
    pci = nvml.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t) and isinstance(pci.busId, str)
    assert isinstance(nvml.nvmlDeviceGetMinorNumber(h), int)
    assert isinstance(nvml.nvmlDeviceGetPowerManagementLimit(h), int)
    assert isinstance(nvml.nvmlDeviceGetEnforcedPowerLimit(h), int)
    mig = call(nvml.nvmlDeviceGetMigMode, h)
    assert mig is None or (isinstance(mig, list) and len(mig) == 2)
    count = nvml.nvmlDeviceGetMaxMigDeviceCount(h)
    assert isinstance(count, int)
    for i in range(count):
        mh = call(nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i, allowed=(pynvml.NVML_ERROR_NOT_FOUND,))
        if mh is not None:
            exercise_mig(nvml, h, mh)
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = call(nvml.nvmlDeviceGetNvLinkState, h, link,
                     allowed=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT))
        if state is None:
            break
        assert state in (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED)
        if state == pynvml.NVML_FEATURE_ENABLED:
            assert isinstance(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link), pynvml.nvmlPciInfo_t)
    support = nvml.nvmlGpmQueryDeviceSupport(h)
    assert isinstance(support, pynvml.c_nvmlGpmSupport_t)
    util = call(nvml.nvmlDeviceGetUtilizationRates, h)
    assert util is None or isinstance(util, pynvml.c_nvmlUtilization_t)
    for fn in (nvml.nvmlDeviceGetEncoderUtilization, nvml.nvmlDeviceGetDecoderUtilization):
        value = call(fn, h)
        assert value is None or (isinstance(value, list) and len(value) == 2)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(h, nvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    for clock in (nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_CLOCK_GRAPHICS):
        assert isinstance(nvml.nvmlDeviceGetClockInfo(h, clock), int)
    assert isinstance(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), int)
    assert isinstance(nvml.nvmlDeviceGetPowerUsage(h), int)
    assert isinstance(nvml.nvmlDeviceGetTotalEnergyConsumption(h), int)
    assert isinstance(nvml.nvmlDeviceGetPcieReplayCounter(h), int)
    assert isinstance(nvml.nvmlDeviceGetCurrentClocksEventReasons(h), int)
    assert isinstance(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h), int)
    values = nvml.nvmlDeviceGetFieldValues(h, FIELDS)
    assert len(values) == len(FIELDS)
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) for v in values)
    rows = call(nvml.nvmlDeviceGetRemappedRows, h)
    assert rows is None or (isinstance(rows, tuple) and len(rows) == 4)
    ecc = call(nvml.nvmlDeviceGetTotalEccErrors, h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
               nvml.NVML_VOLATILE_ECC)
    assert ecc is None or isinstance(ecc, int)
    for fn in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        for proc in fn(h):
            assert {"pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"} <= set(vars(proc))
    samples = call(nvml.nvmlDeviceGetProcessUtilization, h, 0,
                   allowed=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND))
    assert samples is None or all(isinstance(s, pynvml.c_nvmlProcessUtilizationSample_t) for s in samples)
    assert isinstance(nvml.nvmlDeviceGetSupportedEventTypes(h), int)
    if support.isSupportedDevice:
        s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        assert isinstance(s1, pynvml.c_nvmlGpmSample_t)
        nvml.nvmlGpmSampleGet(h, s1)
        nvml.nvmlGpmSampleGet(h, s2)
        answer = nvml.nvmlGpmMetricsGet(metrics_request(nvml, s1, s2))
        assert answer.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
        nvml.nvmlGpmSampleFree(s1)
        nvml.nvmlGpmSampleFree(s2)


def exercise_mig(nvml: SimulatedNvml, parent: Any, mh: Any) -> None:
    assert isinstance(mh, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceIsMigDeviceHandle(mh)
    assert nvml.nvmlDeviceGetUUID(mh).startswith("MIG-")
    assert addr(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mh)) == addr(parent)
    assert isinstance(nvml.nvmlDeviceGetGpuInstanceId(mh), int)
    assert isinstance(nvml.nvmlDeviceGetComputeInstanceId(mh), int)
    attrs = nvml.nvmlDeviceGetAttributes(mh)
    assert isinstance(attrs, pynvml.c_nvmlDeviceAttributes) and attrs.gpuInstanceSliceCount >= 1
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(mh), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetComputeRunningProcesses(mh), list)


@pytest.mark.parametrize("path", ALL_SCENARIOS, ids=lambda p: p.name)
def test_every_example_loads_and_answers_with_pynvml_types(path: Path) -> None:
    clock = FakeClock(10.0)  # past faults.yaml's init failure, before its faults
    nvml = make(path, clock)
    assert isinstance(nvml.nvmlSystemGetDriverVersion(), str)
    assert isinstance(nvml.nvmlSystemGetNVMLVersion(), str)
    assert isinstance(nvml.nvmlSystemGetCudaDriverVersion(), int)
    count = nvml.nvmlDeviceGetCount()
    assert count == len(nvml.scenario.gpus) > 0
    event_set = nvml.nvmlEventSetCreate()
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        exercise_device(nvml, h)
        nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, event_set)
        assert addr(nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(h))) == addr(h)
    with raises(pynvml.NVML_ERROR_TIMEOUT):
        nvml.nvmlEventSetWait(event_set, 0)
    nvml.nvmlEventSetFree(event_set)
    nvml.nvmlShutdown()


def test_scenarios_start_at_time_zero_with_a_real_clock() -> None:
    nvml = make(default_scenario_path())
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu > 0
    nvml.nvmlShutdown()


def test_methods_have_pynvml_names_and_positional_signatures() -> None:
    methods = sorted({n for cls in SimulatedNvml.__mro__ for n in vars(cls) if n.startswith("nvml")})
    assert len(methods) > 60
    for name in methods:
        real = getattr(pynvml, name, None)
        assert inspect.isfunction(real), f"{name} is not a pynvml function"
        want = list(inspect.signature(inspect.unwrap(real)).parameters)
        got = list(inspect.signature(getattr(SimulatedNvml, name)).parameters)[1:]
        assert got == want, name


def test_non_functions_come_from_pynvml() -> None:
    nvml = make(default_scenario_path(), init=False)
    assert nvml.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert nvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    assert nvml.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    assert nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert nvml.nvmlEventTypeXidCriticalError == pynvml.nvmlEventTypeXidCriticalError
    assert nvml.nvmlExceptionClass(pynvml.NVML_ERROR_TIMEOUT) is pynvml.NVMLError_Timeout  # pure helper
    with pytest.raises(AttributeError):
        _ = nvml.no_such_thing


def test_unimplemented_pynvml_function_is_function_not_found() -> None:
    nvml = make(default_scenario_path(), init=False)
    with raises(pynvml.NVML_ERROR_UNINITIALIZED):
        nvml.nvmlDeviceGetVbiosVersion(None)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetVbiosVersion(h)
    assert nvml.call_counts()["nvmlDeviceGetVbiosVersion"] == 2


def test_calls_before_init_and_after_shutdown_are_uninitialized() -> None:
    nvml = make(default_scenario_path(), init=False)
    for fn in (nvml.nvmlDeviceGetCount, nvml.nvmlSystemGetDriverVersion, nvml.nvmlEventSetCreate,
               nvml.nvmlGpmSampleAlloc, nvml.nvmlShutdown):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            fn()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlInit()  # reference counted, like the driver
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetPowerUsage(h) > 0
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetPowerUsage(h)


def test_handles_are_fresh_pointers_to_one_device() -> None:
    nvml = make(example("h100-8x-64proc.yaml"), FakeClock())
    a, b = nvml.nvmlDeviceGetHandleByIndex(3), nvml.nvmlDeviceGetHandleByIndex(3)
    assert a is not b and addr(a) == addr(b)
    assert nvml.nvmlDeviceGetIndex(b) == 3
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetHandleByIndex(8)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetUUID(object())
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetUUID(ctypes.cast(ctypes.c_void_p(8), pynvml.c_nvmlDevice_t))
    with raises(pynvml.NVML_ERROR_NOT_FOUND):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    bus = nvml.nvmlDeviceGetPciInfo(a).busId
    assert addr(nvml.nvmlDeviceGetHandleByPciBusId(bus)) == addr(a)
    buses = {nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(8)}
    assert len(buses) == 8 and all(len(b) == 16 for b in buses)  # "00000000:18:00.0"
    uuids = {nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)}
    again = make(example("h100-8x-64proc.yaml"), FakeClock())
    assert uuids == {again.nvmlDeviceGetUUID(again.nvmlDeviceGetHandleByIndex(i)) for i in range(8)}
    assert len(uuids) == 8


# -- NOT_SUPPORTED paths ---------------------------------------------------------------------------------


def test_laptop_gpu_lacks_datacenter_features() -> None:
    nvml = make(example("laptop-1gpu.yaml"), FakeClock(60.0))
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for fn, args in (
        (nvml.nvmlDeviceGetTotalEccErrors, (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)),
        (nvml.nvmlDeviceGetRemappedRows, ()),
        (nvml.nvmlDeviceGetNvLinkState, (0,)),
        (nvml.nvmlDeviceGetMigMode, ()),
        (nvml.nvmlDeviceGetSerial, ()),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            fn(h, *args)
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0
    sample = nvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlGpmSampleGet(h, sample)
    values = nvml.nvmlDeviceGetFieldValues(h, FIELDS)
    by_id = {v.fieldId: v for v in values}
    assert by_id[pynvml.NVML_FI_DEV_MEMORY_TEMP].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert by_id[pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert by_id[pynvml.NVML_FI_DEV_POWER_INSTANT].nvmlReturn == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    graphics = {p.pid for p in nvml.nvmlDeviceGetGraphicsRunningProcesses(h)}
    compute = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}
    names = {nvml.process_name(pid) for pid in graphics}
    assert names == {"Xorg", "firefox", "game.exe"}
    assert {nvml.process_name(pid) for pid in compute} == {"game.exe", "python train_lora.py"}


def test_per_gpu_not_supported_list() -> None:
    nvml = make(example("faults.yaml"), FakeClock(10.0))
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetEncoderUtilization(h0)
    assert nvml.nvmlDeviceGetEncoderUtilization(h1) == [0, 167000]
    nvml2 = make("gpus: [{model: H100-SXM5-80GB, not_supported: [NVML_FI_DEV_POWER_INSTANT]}]", FakeClock())
    h = nvml2.nvmlDeviceGetHandleByIndex(0)
    (v,) = nvml2.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


# -- values ----------------------------------------------------------------------------------------------


def test_field_values_types_units_and_scopes() -> None:
    clock = FakeClock()
    nvml = make("gpus: [{model: H100-SXM5-80GB, count: 2}]\n"
                "processes: [{gpu: 0, sm_util: 100, memory: 10Gi}]", clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    before = time.time() * 1e6
    ids = [pynvml.NVML_FI_DEV_POWER_INSTANT, (pynvml.NVML_FI_DEV_POWER_INSTANT, 1),
           pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_MEMORY_TEMP, 99999]
    power, power_module, energy, mem_temp, unknown = nvml.nvmlDeviceGetFieldValues(h, ids)
    assert power.nvmlReturn == pynvml.NVML_SUCCESS
    assert power.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert power.value.uiVal == nvml.nvmlDeviceGetPowerUsage(h)  # both mW
    assert 600_000 < power.value.uiVal <= 700_000
    assert power_module.scopeId == 1 and power_module.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert energy.value.ullVal == nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert mem_temp.value.uiVal > nvml.nvmlDeviceGetTemperature(h, 0)
    assert unknown.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert abs(power.timestamp - before) < 5e6
    tx_id, nvl_id = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL
    tx0, nvl0 = (v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, [tx_id, nvl_id]))
    clock.advance(10)
    tx1, nvl1 = (v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, [tx_id, nvl_id]))
    assert tx1 > tx0 and nvl1 > nvl0


def test_energy_integrates_power_and_is_monotonic() -> None:
    clock = FakeClock()
    nvml = make("gpus: [{model: A100-SXM4-40GB}]\n"
                "processes: [{gpu: 0, sm_util: {points: [[0, 0], [100, 100]]}}]", clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    readings = []
    for _ in range(20):
        readings.append(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        clock.advance(5)
    assert readings == sorted(readings) and len(set(readings)) == len(readings)
    e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    p0 = nvml.nvmlDeviceGetPowerUsage(h)
    clock.advance(1)
    p1 = nvml.nvmlDeviceGetPowerUsage(h)
    e1 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == pytest.approx((p0 + p1) / 2, rel=0.02)  # mW x 1 s = mJ


def test_derived_utilization_power_temperature_and_clocks() -> None:
    clock = FakeClock()
    nvml = make(
        "gpus: [{model: A100-SXM4-40GB, count: 3}, {model: A100-SXM4-40GB, power_w: 400}]\n"
        "processes:\n"
        "  - {gpu: 0, sm_util: 70, memory: 10Gi}\n"
        "  - {gpu: 0, sm_util: 60, memory: 5Gi}\n"
        "  - {gpu: 1, sm_util: 20, memory: 1Gi, start: 10}\n",
        clock,
    )
    busy, light, idle, capped = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(4))
    assert nvml.nvmlDeviceGetUtilizationRates(busy).gpu == 100  # min(100, 70 + 60)
    assert nvml.nvmlDeviceGetUtilizationRates(light).gpu == 0  # not started yet
    clock.advance(10)
    assert nvml.nvmlDeviceGetUtilizationRates(light).gpu == 20
    power = [nvml.nvmlDeviceGetPowerUsage(h) for h in (busy, light, idle)]
    assert power == sorted(power, reverse=True) and len(set(power)) == 3
    assert nvml.nvmlDeviceGetTemperature(busy, 0) > nvml.nvmlDeviceGetTemperature(idle, 0)
    assert nvml.nvmlDeviceGetClockInfo(busy, nvml.NVML_CLOCK_SM) > nvml.nvmlDeviceGetClockInfo(idle, 1)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(idle) & pynvml.nvmlClocksEventReasonGpuIdle
    assert not nvml.nvmlDeviceGetCurrentClocksEventReasons(busy) & pynvml.nvmlClocksEventReasonGpuIdle
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(capped) & pynvml.nvmlClocksThrottleReasonSwPowerCap
    mem = nvml.nvmlDeviceGetMemoryInfo(busy, nvml.nvmlMemory_v2)
    assert mem.used == 15 * 1024**3
    assert mem.total == mem.reserved + mem.free + mem.used
    v1 = nvml.nvmlDeviceGetMemoryInfo(busy)
    assert v1.total == mem.total and v1.free == mem.free and v1.used == mem.used + mem.reserved
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetClockInfo(busy, 99)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetTemperature(busy, 7)


def test_thermal_slowdown_from_the_temperature_curve() -> None:
    clock = FakeClock(180.0)  # laptop-1gpu.yaml: 94 C at t=180
    nvml = make(example("laptop-1gpu.yaml"), clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetTemperature(h, 0) == 94
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert reasons & pynvml.nvmlClocksEventReasonHwThermalSlowdown


def test_curves_sine_points_steps_repeat() -> None:
    clock = FakeClock()
    nvml = make(
        "gpus: [{model: L4, count: 3}]\n"
        "processes:\n"
        "  - {gpu: 0, sm_util: {sine: {min: 20, max: 60, period: 40}}}\n"
        "  - {gpu: 1, sm_util: {points: [[0, 0], [10, 100]], repeat: true}}\n"
        "  - {gpu: 2, sm_util: {steps: [[0, 10], [5, 50]], repeat: true, period: 8}}\n",
        clock,
    )
    hs = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(3)]

    def utils() -> list[int]:
        return [nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in hs]

    assert utils() == [40, 0, 10]
    clock.t = 10
    assert utils() == [60, 0, 10]  # sine peak at period/4; points wrap at 10; steps: 10 % 8 = 2
    clock.t = 6
    assert utils() == [56, 60, 50]  # 40 + 20 sin(54 deg); 6/10 of the ramp; steps from 5 on
    clock.t = 17
    assert utils() == [49, 70, 10]  # 40 + 20 sin(153 deg); 17 % 10 = 7; 17 % 8 = 1


# -- processes -------------------------------------------------------------------------------------------


def test_running_processes_start_stop_and_fake_pids() -> None:
    clock = FakeClock()
    nvml = make(example("h100-8x-64proc.yaml"), clock)
    pids = set()
    for i in range(8):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert all(p.gpuInstanceId == 0xFFFFFFFF and p.computeInstanceId == 0xFFFFFFFF for p in procs)
        assert all(p.usedGpuMemory > 0 for p in procs)
        pids |= {p.pid for p in procs}
        assert nvml.nvmlDeviceGetGraphicsRunningProcesses(h) == []
    assert len(pids) == 60  # 4 of the 64 start at t >= 30
    assert min(pids) >= 4_000_000
    assert all(nvml.process_name(pid) for pid in pids)
    assert nvml.process_name(1) is None
    clock.t = 120
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)

    def names() -> set[str | None]:
        return {nvml.process_name(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h0)}

    assert "tokenizer-cache-0" in names()
    clock.t = 301
    assert "tokenizer-cache-0" not in names()


def test_process_utilization_not_found_when_idle_and_cursor_semantics() -> None:
    clock = FakeClock(1.0)
    nvml = make("gpus: [{model: T4, count: 2}]\n"
                "processes: [{gpu: 0, sm_util: 30, mem_util: 10}, {gpu: 0, sm_util: 0},\n"
                "            {gpu: 1, memory: 1Gi}]",
                clock)
    busy, idle = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(idle, 0)
    samples = nvml.nvmlDeviceGetProcessUtilization(busy, 0)
    assert isinstance(samples, list) and len(samples) == 1  # the idle process has no sample
    (s,) = samples
    assert (s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil) == (4_200_000, 30, 10, 0, 0)
    assert abs(s.timeStamp / 1e6 - time.time()) < 5  # unix microseconds
    cursor = s.timeStamp
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than the cursor yet
        nvml.nvmlDeviceGetProcessUtilization(busy, cursor)
    clock.advance(0.2)
    (s2,) = nvml.nvmlDeviceGetProcessUtilization(busy, cursor)
    assert s2.timeStamp > cursor
    (info,) = nvml.nvmlDeviceGetProcessesUtilizationInfo(busy, 0)
    assert isinstance(info, pynvml.c_nvmlProcessUtilizationInfo_v1_t) and info.smUtil == 30


# -- MIG -------------------------------------------------------------------------------------------------


def test_mig_enumeration_memory_and_processes() -> None:
    clock = FakeClock(30.0)
    nvml = make(example("a100-mig.yaml"), clock)
    g0, g1, g3 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 3))
    assert nvml.nvmlDeviceGetMigMode(g0) == [1, 1]
    assert nvml.nvmlDeviceGetMigMode(g3) == [0, 0]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(g0) == 7
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(g3) == 0
    assert not nvml.nvmlDeviceIsMigDeviceHandle(g0)
    migs = [nvml.nvmlDeviceGetMigDeviceHandleByIndex(g0, i) for i in range(3)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(g0, 3)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(g0, 7)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetGpuInstanceId(g0)
    assert [nvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 5, 13]
    assert [nvml.nvmlDeviceGetAttributes(m).gpuInstanceSliceCount for m in migs] == [4, 2, 1]
    assert nvml.nvmlDeviceGetName(migs[0]) == "NVIDIA A100-SXM4-80GB MIG 4g.40gb"
    assert all(addr(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)) == addr(g0) for m in migs)
    assert addr(nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(migs[1]))) == addr(migs[1])
    mem = nvml.nvmlDeviceGetMemoryInfo(migs[0])
    assert mem.total == 40192 * 1024**2
    assert mem.used == (31 + 2) * 1024**3 and mem.free == mem.total - mem.used
    assert nvml.nvmlDeviceGetAttributes(migs[0]).memorySizeMB == 40192
    everyone = nvml.nvmlDeviceGetComputeRunningProcesses(g0)
    instances = sorted((p.gpuInstanceId, p.computeInstanceId) for p in everyone)
    assert instances == [(1, 0), (1, 0), (5, 0), (13, 0)]
    inside = nvml.nvmlDeviceGetComputeRunningProcesses(migs[1])
    assert [nvml.process_name(p.pid) for p in inside] == ["asr-whisper"]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(g0)  # like the real driver on a MIG-enabled GPU
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetProcessUtilization(g0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(migs[0])  # most queries are not answered on MIG handles
    assert nvml.nvmlDeviceGetPowerUsage(g0) > 0
    assert nvml.nvmlDeviceGetUtilizationRates(g3).gpu >= 85
    assert len([nvml.nvmlDeviceGetMigDeviceHandleByIndex(g1, i) for i in range(7)]) == 7


def test_gpm_metrics_whole_gpu_and_mig_instance() -> None:
    clock = FakeClock()
    nvml = make(
        "gpus: [{model: H100-SXM5-80GB, count: 2},\n"
        "       {model: H100-SXM5-80GB, mig: {instances: [{profile: 3g.40gb, id: 1}, {profile: 1g.10gb}]}}]\n"
        "processes:\n"
        "  - {gpu: 0, sm_util: {points: [[0, 0], [10, 100]]}}\n"
        "  - {gpu: 2, mig_instance: 1, sm_util: 80}\n",
        clock,
    )
    h, mig_gpu = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    clock.advance(10)
    nvml.nvmlGpmSampleGet(h, s2)
    req = metrics_request(nvml, s1, s2)
    req.metrics[len(GPM_METRICS)].metricId = pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL
    req.numMetrics = len(GPM_METRICS) + 1
    answer = nvml.nvmlGpmMetricsGet(req)
    got = {answer.metrics[i].metricId: answer.metrics[i] for i in range(answer.numMetrics)}
    assert got[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL].value == pytest.approx(50.0, abs=1.0)  # mean of a ramp
    assert 0 < got[pynvml.NVML_GPM_METRIC_SM_UTIL].value <= got[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL].value
    assert got[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC].value > 0
    assert got[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC].value > 0
    assert got[pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    # a MIG GPU instance
    m1, m2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmMigSampleGet(mig_gpu, 1, m1)
    clock.advance(5)
    nvml.nvmlGpmMigSampleGet(mig_gpu, 1, m2)
    answer = nvml.nvmlGpmMetricsGet(metrics_request(nvml, m1, m2))
    assert answer.metrics[0].value == pytest.approx(80.0)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlGpmMigSampleGet(mig_gpu, 9, m1)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlGpmMetricsGet(metrics_request(nvml, s1, m2))  # samples of different scopes
    for s in (s1, s2, m1, m2):
        nvml.nvmlGpmSampleFree(s)
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlGpmSampleGet(h, s1)


def test_nvlink_links_spread_over_peers() -> None:
    nvml = make(example("h100-8x-64proc.yaml"), FakeClock())
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    own = nvml.nvmlDeviceGetPciInfo(h).busId
    peers = []
    for link in range(18):
        assert nvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED
        peers.append(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
    assert own not in peers and len(set(peers)) == 7
    with raises(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        nvml.nvmlDeviceGetNvLinkState(h, 18)
    down = make("gpus: [{model: A100-SXM4-40GB, nvlink_down: [3]}, {model: A100-SXM4-40GB}]", FakeClock())
    state = down.nvmlDeviceGetNvLinkState(down.nvmlDeviceGetHandleByIndex(0), 3)
    assert state == pynvml.NVML_FEATURE_DISABLED
    alone = make("gpus: [{model: A100-SXM4-40GB}]", FakeClock())
    state = alone.nvmlDeviceGetNvLinkState(alone.nvmlDeviceGetHandleByIndex(0), 0)
    assert state == pynvml.NVML_FEATURE_DISABLED  # no peer to link to


# -- faults ----------------------------------------------------------------------------------------------


def test_init_failure_then_recovery() -> None:
    clock = FakeClock()
    nvml = make(example("faults.yaml"), clock, init=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    clock.t = 5.0
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 4
    other = make("gpus: []\nfaults: [{init_failure: {until: 1, error: LIB_RM_VERSION_MISMATCH}}]",
                 FakeClock(), init=False)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        other.nvmlInit()


def test_gpu_lost_at_t() -> None:
    clock = FakeClock(10.0)
    nvml = make(example("faults.yaml"), clock)
    h3 = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetPowerUsage(h3) > 0
    clock.t = 61.0
    for fn, args in ((nvml.nvmlDeviceGetUUID, ()), (nvml.nvmlDeviceGetPowerUsage, ()),
                     (nvml.nvmlDeviceGetFieldValues, ([pynvml.NVML_FI_DEV_POWER_INSTANT],)),
                     (nvml.nvmlDeviceGetComputeRunningProcesses, ()), (nvml.nvmlGpmSampleGet, (None,))):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            fn(h3, *args)
    again = nvml.nvmlDeviceGetHandleByIndex(3)  # the handle is still handed out
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(again)
    assert nvml.nvmlDeviceGetCount() == 4
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(2)) > 0


def test_gpu_lost_covers_its_mig_handles() -> None:
    clock = FakeClock()
    nvml = make("gpus: [{model: A100-SXM4-40GB, mig: {instances: [{profile: 7g.40gb}]}}]\n"
                "faults: [{gpu_lost: {gpu: 0, at: 1}}]", clock)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert nvml.nvmlDeviceGetMemoryInfo(mig).total > 0
    clock.t = 1
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(mig)


def register_all(nvml: SimulatedNvml, mask: int) -> Any:
    event_set = nvml.nvmlEventSetCreate()
    for i in range(nvml.nvmlDeviceGetCount()):
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i), mask, event_set)
    return event_set


def drain(nvml: SimulatedNvml, event_set: Any) -> list[Any]:
    out = []
    while True:
        try:
            out.append(nvml.nvmlEventSetWait(event_set, 0))
        except pynvml.NVMLError_Timeout:
            return out


def test_xid_events_in_time_order_once_each_and_a_storm_drains_fast() -> None:
    clock = FakeClock(10.0)
    nvml = make(example("faults.yaml"), clock, sleep=True)
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    addresses = [addr(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    event_set = register_all(nvml, pynvml.nvmlEventTypeXidCriticalError)
    assert drain(nvml, event_set) == []
    clock.t = 65.0
    events = drain(nvml, event_set)
    assert all(isinstance(e, pynvml.c_nvmlEventData_t) for e in events)
    seen = [(addresses.index(addr(e.device)), e.eventData) for e in events]
    assert seen == [(1, 31), (2, 48), (3, 79)]
    assert nvml.nvmlDeviceGetUUID(events[0].device) == uuids[1]
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # GPU 3 is lost since t=61
        nvml.nvmlDeviceGetUUID(events[2].device)
    assert all(e.eventType == pynvml.nvmlEventTypeXidCriticalError for e in events)
    assert events[0].gpuInstanceId == 0xFFFFFFFF
    assert drain(nvml, event_set) == []  # delivered once each
    clock.t = 100.0
    slept = len(clock.slept)
    storm = drain(nvml, event_set)
    assert clock.slept[slept:] == []  # a storm's events are all there at once: no wait between them
    assert len(storm) == 5000 and {e.eventData for e in storm} == {13}


def test_event_wait_sleeps_until_the_next_event_within_the_timeout() -> None:
    clock = FakeClock(10.0)
    nvml = make(example("faults.yaml"), clock, sleep=True)
    event_set = register_all(nvml, pynvml.nvmlEventTypeXidCriticalError)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 1000)
    assert clock.t == pytest.approx(11.0)
    data = nvml.nvmlEventSetWait(event_set, 60_000)  # XID 31 is due at t=20
    assert data.eventData == 31 and clock.t == pytest.approx(20.0)


def test_event_wait_times_out_in_real_time_and_ecc_events_need_their_type() -> None:
    nvml = make("gpus: [{model: L4}]\nfaults: [{ecc_dbe: {gpu: 0, at: 0}}]")
    event_set = register_all(nvml, pynvml.nvmlEventTypeXidCriticalError)
    started = time.perf_counter()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 50)
    assert 0.04 < time.perf_counter() - started < 5.0  # waited its 50 ms, not a scenario's worth
    laptop = make(example("laptop-1gpu.yaml"))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        laptop.nvmlDeviceRegisterEvents(laptop.nvmlDeviceGetHandleByIndex(0),
                                        pynvml.nvmlEventTypeDoubleBitEccError, laptop.nvmlEventSetCreate())


def test_mig_xid_carries_the_gpu_instance() -> None:
    clock = FakeClock(50.0)
    nvml = make(example("a100-mig.yaml"), clock)
    event_set = nvml.nvmlEventSetCreate()
    clock.t = 0.0
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError,
                                  event_set)
    clock.t = 50.0
    (event,) = drain(nvml, event_set)
    assert (event.eventData, event.gpuInstanceId, event.computeInstanceId) == (43, 5, 0)


def test_ecc_double_bit_error() -> None:
    clock = FakeClock(10.0)
    nvml = make(example("faults.yaml"), clock)
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    ecc_fields = [pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
                  pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
                  pynvml.NVML_FI_DEV_RETIRED_DBE]

    def counts() -> list[int | None]:
        values = nvml.nvmlDeviceGetFieldValues(h, ecc_fields)
        return [v.value.ullVal if v.nvmlReturn == pynvml.NVML_SUCCESS else None for v in values]

    ecc_events = pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
    early = register_all(nvml, ecc_events)
    assert counts() == [0, 0, 0, 0, None]  # H100 remaps rows; it does not retire pages
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    clock.t = 40.0
    assert counts() == [1, 1, 1, 1, None]  # an SBE at 30, a DBE at 40
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)
    unc, agg = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
    assert nvml.nvmlDeviceGetTotalEccErrors(h, unc, agg) == 1
    clock.t = 45.0
    late = register_all(nvml, ecc_events)
    assert drain(nvml, late) == []  # they happened before this registration
    assert [(e.eventType, addr(e.device)) for e in drain(nvml, early)] == [
        (pynvml.nvmlEventTypeSingleBitEccError, addr(h)), (pynvml.nvmlEventTypeDoubleBitEccError, addr(h))
    ]
    t4 = make("gpus: [{model: T4}]\nfaults: [{ecc_dbe: {gpu: 0, at: 0, count: 2}}]", FakeClock())
    h4 = t4.nvmlDeviceGetHandleByIndex(0)
    retired = t4.nvmlDeviceGetFieldValues(
        h4, [pynvml.NVML_FI_DEV_RETIRED_DBE, pynvml.NVML_FI_DEV_RETIRED_PENDING]
    )
    assert [retired[0].value.ullVal, retired[1].value.uiVal] == [2, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        t4.nvmlDeviceGetRemappedRows(h4)


def test_pcie_replays() -> None:
    clock = FakeClock(10.0)
    nvml = make(example("faults.yaml"), clock)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPcieReplayCounter(h) == 0
    clock.t = 50
    assert nvml.nvmlDeviceGetPcieReplayCounter(h) == 3


HANG = ("gpus: [{model: L4, count: 2}]\n"
        "faults: [{hang: {function: nvmlDeviceGetPowerUsage, gpu: 0, at: 0, seconds: %s}}]")


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def test_hung_call_blocks_for_its_time_without_blocking_others() -> None:
    nvml = make(HANG % 0.3)
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    results: dict[str, float] = {}

    def hung() -> None:
        results["hung"], _ = timed(nvml.nvmlDeviceGetPowerUsage, h0)

    worker = threading.Thread(target=hung)
    worker.start()
    time.sleep(0.05)
    assert worker.is_alive()
    elapsed, _ = timed(nvml.nvmlDeviceGetPowerUsage, h1)  # another GPU
    assert elapsed < 0.2
    elapsed, _ = timed(nvml.nvmlDeviceGetTemperature, h0, 0)  # another function, same GPU
    assert elapsed < 0.2
    worker.join(2)
    assert 0.28 < results["hung"] < 1.0
    elapsed, _ = timed(nvml.nvmlDeviceGetPowerUsage, h0)  # the hang is over
    assert elapsed < 0.2


def test_release_hangs_wakes_blocked_calls() -> None:
    nvml = make(HANG % 30)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    results: list[Any] = []
    workers = [threading.Thread(target=lambda: results.append(timed(nvml.nvmlDeviceGetPowerUsage, h0)))
               for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.1)
    assert all(w.is_alive() for w in workers)
    nvml.release_hangs()
    for w in workers:
        w.join(2)
    assert len(results) == 2
    assert all(elapsed < 1.0 and isinstance(mw, int) for elapsed, mw in results)


def test_concurrent_callers() -> None:
    nvml = make(example("h100-8x-64proc.yaml"))
    errors: list[BaseException] = []
    stop = time.perf_counter() + 0.3

    def poll(i: int) -> None:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        cursor = 0
        s = nvml.nvmlGpmSampleAlloc()
        try:
            while time.perf_counter() < stop:
                nvml.nvmlDeviceGetFieldValues(h, FIELDS)
                nvml.nvmlDeviceGetComputeRunningProcesses(h)
                nvml.nvmlGpmSampleGet(h, s)
                try:
                    for sample in nvml.nvmlDeviceGetProcessUtilization(h, cursor):
                        cursor = max(cursor, sample.timeStamp)
                except pynvml.NVMLError_NotFound:
                    pass
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    def watch() -> None:
        event_set = register_all(nvml, pynvml.nvmlEventTypeXidCriticalError)
        while time.perf_counter() < stop:
            with pytest.raises(pynvml.NVMLError_Timeout):
                nvml.nvmlEventSetWait(event_set, 20)

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(8)] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert errors == []


# -- real processes --------------------------------------------------------------------------------------


@pytest.fixture
def sim_busy_child():
    """A CPU-bound child process; always killed."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield child
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(5)


def sm_util_of(nvml: SimulatedNvml, h: Any, pid: int) -> int:
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(h, 0)
    except pynvml.NVMLError_NotFound:
        return 0
    return next((s.smUtil for s in samples if s.pid == pid), 0)


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.mark.serial  # measures a real process's CPU progress
@pytest.mark.integration
def test_follow_cpu_tracks_a_real_process_and_decays_when_frozen(sim_busy_child: subprocess.Popen) -> None:
    pid = sim_busy_child.pid
    nvml = make(
        "gpus: [{model: L4}]\n"
        f"processes: [{{pid: {pid}, name: spinner, gpu: 0, sm_util: {{follow_cpu: {{queue_seconds: 0.2}}}}}}]"
    )
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [pid]
    busy = 25  # a spinning child uses ~100 % of a core; leave room for a loaded test machine
    assert wait_for(lambda: sm_util_of(nvml, h, pid) > busy, 3.0)
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu > busy
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        assert wait_for(lambda: sm_util_of(nvml, h, pid) <= 2, 0.2 + 0.3)
        assert time.monotonic() - stopped >= 0.1  # it decays over the queue, not at once
        assert nvml.nvmlDeviceGetUtilizationRates(h).gpu <= 2
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: sm_util_of(nvml, h, pid) > busy, 3.0)
    sim_busy_child.kill()
    sim_busy_child.wait(5)
    assert wait_for(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h) == [], 1.0)
    nvml.nvmlShutdown()


# -- validation -------------------------------------------------------------------------------------------

BAD = [
    ("gpus: [{model: L4}, {model: H101}]",
     "scenario.yaml: gpus[1].model: unknown model 'H101'; known: H100-SXM5-80GB, A100-SXM4-40GB"),
    ("gpus: [{model: L4, count: 8}]\nprocesses: [{gpu: 0}, {gpu: 0}, {gpu: 1}, {gpu: 9}]",
     "scenario.yaml: processes[3].gpu: GPU index 9 does not exist (scenario has 8 GPUs)"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, memory: -5}]", "processes[0].memory: must be >= 0, got -5"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, memory: 4Gx}]", "processes[0].memory: '4Gx' is not a size"),
    ("gpus: [{model: L4, modle: L4}]", "gpus[0].modle: unknown key (did you mean 'model'?)"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: {sine: {min: 1, max: 2}}}]",
     "processes[0].sm_util.sine: missing required key 'period'"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: {sin: {min: 1, max: 2, period: 3}}}]",
     "processes[0].sm_util.sin: unknown key (did you mean 'sine'?)"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: {points: [[5, 1], [3, 2]]}}]",
     "processes[0].sm_util.points[1]: times must increase"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: 150}]",
     "processes[0].sm_util: values must lie in 0..100"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: busy}]",
     "processes[0].sm_util: expected a number or"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, memory: 30Gi}]",
     "processes[0].memory: up to 30.0 GiB, more than the 22.2 GiB GPU 0 can hold"),
    ("gpus: [{model: A100-SXM4-40GB, mig: {instances: [{profile: 1g.10gb}]}}]",
     "gpus[0].mig.instances[0].profile: unknown profile '1g.10gb' for A100-SXM4-40GB; known: 1g.5gb"),
    ("gpus: [{model: T4, mig: {}}]", "gpus[0].mig: model T4 does not support MIG"),
    ("gpus: [{model: A100-SXM4-40GB, mig: {instances: [{profile: 7g.40gb}, {profile: 1g.5gb}]}}]",
     "gpus[0].mig.instances: the instances need 8 compute slices"),
    ("gpus: [{model: A100-SXM4-40GB, mig: {instances: [{profile: 3g.20gb, id: 1}]}}]\n"
     "processes: [{gpu: 0, mig_instance: 2}]", "processes[0].mig_instance: GPU 0 has no GPU instance 2"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, mig_instance: 1}]",
     "processes[0].mig_instance: GPU 0 is not in MIG mode"),
    ("gpus: [{model: L4}]\nprocesses: [{pid: 10, gpu: 0}, {pid: 10, gpu: 0}]",
     "processes[1].pid: PID 10 is already used by processes[0]"),
    ("gpus: [{model: L4}]\nprocesses: [{gpu: 0, sm_util: {follow_cpu: {}}}]",
     "processes[0].sm_util.follow_cpu: needs a real 'pid'"),
    ("gpus: [{model: L4}]\nfaults: [{xid: {gpu: 0, at: 1}}]", "faults[0].xid: missing required key 'code'"),
    ("gpus: [{model: L4}]\nfaults: [{gpu_lost: {gpu: 2, at: 1}}]",
     "faults[0].gpu_lost.gpu: GPU index 2 does not exist (scenario has 1 GPUs)"),
    ("gpus: [{model: L4}]\nfaults: [{hang: {function: nvmlDeviceGetPowerUsag, seconds: 1}}]",
     "faults[0].hang.function: 'nvmlDeviceGetPowerUsag' is not a pynvml function (or 'any'); did you mean"),
    ("gpus: [{model: L4}]\nfaults: [{init_failure: {until: 3, error: NO_SUCH_ERROR}}]",
     "faults[0].init_failure.error: unknown NVML error 'NO_SUCH_ERROR'"),
    ("gpus: [{model: L4, not_supported: [nvmlDeviceGetPowerUsge]}]",
     "gpus[0].not_supported[0]: 'nvmlDeviceGetPowerUsge' is neither a pynvml function nor an NVML_FI_*"),
    ("gpus: [{model: L4}]\nfaults: [{xid: {gpu: 0, at: 1, code: 31}, gpu_lost: {gpu: 0, at: 2}}]",
     "faults[0]: a fault is a mapping with exactly one key"),
    ("gpus: []\ndriver: {latency_ms: {nvmlDeviceGetPowr: 3}}",
     "driver.latency_ms.nvmlDeviceGetPowr: not a pynvml function (or 'default')"),
    ("gpus: [{model: L4}\n", "scenario.yaml: line 2, column 1: not valid YAML"),
    ("- just a list", "scenario.yaml: expected a mapping at the top level, got a list"),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(":")[1].strip() for _, m in BAD])
def test_validation_errors_name_the_path(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, source="scenario.yaml")
    assert message in str(caught.value)
    assert all(path or "YAML" in msg or "top level" in msg for path, msg in caught.value.errors)


def test_all_errors_are_reported_one_per_line(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("gpus: [{model: L4, colour: red}]\nprocesses: [{gpu: 0, memory: -1}]\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    lines = str(caught.value).splitlines()
    assert lines == [f"{path}: gpus[0].colour: unknown key; allowed: compute_mode, count, decoder_util, "
                     "encoder_util, memory, memory_reserved, memory_util, mig, model, name, not_supported, "
                     "numa_node, nvlink_down, pci_bus_id, power_limit_w, power_w, serial, temperature, "
                     "utilization",
                     f"{path}: processes[0].memory: must be >= 0, got -1"]
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")


def test_a_numeric_key_is_reported_with_the_other_errors() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario("gpus: [{model: L4, 1: a}]\n2: x\n")
    assert [path for path, _ in caught.value.errors] == ["2", "gpus[0].1"]


def test_schema_is_strict_and_matches_the_catalogue() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$defs"]["gpu"]["properties"]["model"]["enum"] == list(MODELS)

    def objects(node: Any) -> list[dict[str, Any]]:
        found = []
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                found.append(node)
            for v in node.values():
                found += objects(v)
        elif isinstance(node, list):
            for v in node:
                found += objects(v)
        return found

    assert all(o.get("additionalProperties") is False for o in objects(schema))


def test_sizes_and_defaults() -> None:
    s = parse_scenario("gpus: [{model: L4, memory: 24GB, power_limit_w: 60}]\n"
                       "processes: [{gpu: 0, memory: 512Mi}, {gpu: 0, memory: 1.5Gi}, {gpu: 0}]")
    assert s.gpus[0].memory_bytes == 24 * 10**9
    assert [int(p.memory.value(0)) for p in s.processes] == [512 * 2**20, 3 * 2**29, 300 * 2**20]
    assert s.hostname == "sim-node" and s.processes[2].type == "compute"
    nvml = make(s, FakeClock())
    assert nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(0)) == 60_000
    assert nvml.hostname == "sim-node"


def test_the_format_example_in_the_docstring_loads() -> None:
    from gpuagent.devices.sim import scenario as module

    block = (module.__doc__ or "").split("::\n\n", 1)[1].split("\n\nDefaults", 1)[0]
    s = parse_scenario("\n".join(line[4:] for line in block.splitlines()))
    assert [g.model.key for g in s.gpus] == ["H100-SXM5-80GB", "H100-SXM5-80GB", "A100-SXM4-40GB"]
    assert [(p.gpu, p.mig_instance) for p in s.processes] == [(0, None), (2, 1)]


def test_injected_latency_per_function() -> None:
    nvml = make("gpus: [{model: L4}]\ndriver: {latency_ms: {nvmlDeviceGetGraphicsRunningProcesses: 30}}")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    slow, _ = timed(nvml.nvmlDeviceGetGraphicsRunningProcesses, h)
    fast, _ = timed(nvml.nvmlDeviceGetComputeRunningProcesses, h)
    assert slow >= 0.03 > fast
