"""The one NVML wrapper: triage of every outcome, memos, and time accounting."""

import logging
import types

import pynvml
import pytest

from gpuagent.devices.guard import GpuLostError, NvmlGuard, NvmlUnavailableError, error_code_name


def fake_nvml(**functions):
    """pynvml's constants and error classes with the given functions (each may raise NVMLError)."""
    module = types.SimpleNamespace(
        **{n: getattr(pynvml, n) for n in dir(pynvml) if n.startswith(("NVML_", "NVMLError"))}
    )
    for name, fn in functions.items():
        setattr(module, name, fn)
    return module


def raising(code):
    def fn(*args):
        fn.calls += 1
        raise pynvml.NVMLError(code)

    fn.calls = 0
    return fn


def test_success_returns_value_and_counts_time():
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetCount=lambda: 8))
    assert guard.call("nvmlDeviceGetCount") == 8
    (stats,) = guard.call_stats()
    assert stats.function == "nvmlDeviceGetCount" and stats.calls_total == 1 and stats.seconds_total >= 0


def test_not_supported_is_absent_and_not_called_again():
    fn = raising(pynvml.NVML_ERROR_NOT_SUPPORTED)
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetPowerUsage=fn))
    assert guard.call("nvmlDeviceGetPowerUsage", object(), scope=0) is None
    assert guard.call("nvmlDeviceGetPowerUsage", object(), scope=0) is None
    assert fn.calls == 1
    assert guard.error_counts() == ()  # unsupported is not an error
    guard.call("nvmlDeviceGetPowerUsage", object(), scope=1)  # memo is per device
    assert fn.calls == 2


def test_memo_distinguishes_scalar_arguments():
    def clock(handle, kind):
        if kind == pynvml.NVML_CLOCK_MEM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1410

    guard = NvmlGuard(fake_nvml(nvmlDeviceGetClockInfo=clock))
    assert guard.call("nvmlDeviceGetClockInfo", None, pynvml.NVML_CLOCK_MEM, scope=0) is None
    assert guard.call("nvmlDeviceGetClockInfo", None, pynvml.NVML_CLOCK_SM, scope=0) == 1410


def test_forget_clears_a_gpu_and_its_mig_scopes():
    fn = raising(pynvml.NVML_ERROR_NOT_SUPPORTED)
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetUtilizationRates=fn))
    guard.call("nvmlDeviceGetUtilizationRates", None, scope=2)
    guard.call("nvmlDeviceGetUtilizationRates", None, scope=(2, "mig", 0))
    guard.call("nvmlDeviceGetUtilizationRates", None, scope=3)
    guard.forget(2)
    for scope in (2, (2, "mig", 0), 3):
        guard.call("nvmlDeviceGetUtilizationRates", None, scope=scope)
    assert fn.calls == 5  # 2 and (2, mig) asked again, 3 still remembered


def test_missing_function_is_absent(caplog):
    guard = NvmlGuard(fake_nvml())
    with caplog.at_level(logging.INFO):
        assert guard.call("nvmlDeviceGetBrandNew", None, scope=0) is None
        assert guard.call("nvmlDeviceGetBrandNew", None, scope=0) is None
    assert sum("not in this driver" in r.message for r in caplog.records) == 1


def test_expected_empty_code_is_not_an_error():
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetProcessUtilization=raising(pynvml.NVML_ERROR_NOT_FOUND)))
    absent = (pynvml.NVML_ERROR_NOT_FOUND,)
    assert guard.call("nvmlDeviceGetProcessUtilization", None, 0, absent_on=absent) is None
    assert guard.error_counts() == ()


def test_gpu_lost_raises_and_is_counted():
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetTemperature=raising(pynvml.NVML_ERROR_GPU_IS_LOST)))
    with pytest.raises(GpuLostError) as info:
        guard.call("nvmlDeviceGetTemperature", None, 0, scope=5)
    assert info.value.scope == 5 and "nvmlDeviceGetTemperature" in str(info.value)
    assert [(e.function, e.code, e.count) for e in guard.error_counts()] == [
        ("nvmlDeviceGetTemperature", "GPU_IS_LOST", 1)
    ]


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
             pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH],
)
def test_library_gone_raises_unavailable(code):
    guard = NvmlGuard(fake_nvml(nvmlDeviceGetCount=raising(code)))
    with pytest.raises(NvmlUnavailableError, match="nvmlDeviceGetCount"):
        guard.call("nvmlDeviceGetCount")


def test_other_errors_are_absent_counted_and_logged_once_per_state(caplog):
    state = {"fail": True}

    def temp(handle, kind):
        if state["fail"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return 40

    guard = NvmlGuard(fake_nvml(nvmlDeviceGetTemperature=temp))
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            assert guard.call("nvmlDeviceGetTemperature", None, 0, scope=1) is None
        state["fail"] = False
        assert guard.call("nvmlDeviceGetTemperature", None, 0, scope=1) == 40
        assert guard.call("nvmlDeviceGetTemperature", None, 0, scope=1) == 40
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed: NVML_ERROR_UNKNOWN" in m for m in messages) == 1
    assert sum("works again" in m for m in messages) == 1
    assert guard.error_counts()[0].count == 5


def test_default_tells_failure_from_none_result():
    failed = object()
    ok = NvmlGuard(fake_nvml(nvmlDeviceRegisterEvents=lambda *a: None))
    assert ok.call("nvmlDeviceRegisterEvents", None, 8, None, default=failed) is None
    bad = NvmlGuard(fake_nvml(nvmlDeviceRegisterEvents=raising(pynvml.NVML_ERROR_NOT_SUPPORTED)))
    assert bad.call("nvmlDeviceRegisterEvents", None, 8, None, default=failed) is failed


def test_error_code_names():
    assert error_code_name(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU_IS_LOST"
    assert error_code_name(12345) == "CODE_12345"
