"""The per-call probe: what each NVML call the agent makes costs on this GPU, and whether a cheaper call gives
the same figure.

- ``call_us``: the median time of every per-poll and tiered call (15 repeats), idle and next to two busy
  tenants; ``field_us``: each field value alone, then the batches the agent reads (``bench_nvml_cost.py
  --costs`` takes this JSON).
- energy: ``nvmlDeviceGetTotalEnergyConsumption`` against the batched field ``TOTAL_ENERGY_CONSUMPTION``:
  cost and the two readings taken back to back.
- per-process utilization: ``nvmlDeviceGetProcessesUtilizationInfo`` against
  ``nvmlDeviceGetProcessUtilization``: cost and figures over the same window; and the latter as one driver
  call into a buffer sized ahead (pynvml's wrapper makes two: the size, then the samples).
- GPM: whether ``nvmlGpmMetricsGet`` (which computes from two samples) holds up another thread's calls,
  i.e. whether its 1.5 ms is lock time at all.
- the samples two identical time-slicing tenants get, read every 1 s and every 0.25 s, against their true
  split (what the share controller's noise model rests on).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from gpucheck.context import Context
from gpucheck.registry import ItemResult
from gpucheck.tenants import Tenant, rates

PER_POLL = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption")


def timed(nvml: Any, call: Callable[..., Any], *args: Any, repeat: int = 15) -> float | None:
    """Median microseconds of ``call(*args)``; None when it fails every time."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            call(*args)
        except Exception:  # unsupported, missing from this pynvml or driver: a probe reports what it sees
            continue
        times.append(time.perf_counter() - started)
    return round(1e6 * statistics.median(times), 1) if times else None


def field_specs() -> list[Any]:
    from gpuagent.devices.fields import DETAIL_FIELDS, ENERGY_FIELDS, FAST_FIELDS, SLOW_FIELDS

    return [*FAST_FIELDS, *DETAIL_FIELDS, *ENERGY_FIELDS, *SLOW_FIELDS]


def costs(nvml: Any, handle: Any) -> dict[str, Any]:
    """``call_us`` and ``field_us`` of this GPU now."""
    from gpuagent.devices.fields import DETAIL_FIELDS, FAST_FIELDS, field_ids

    call_us: dict[str, float | None] = {}
    for name in PER_POLL:
        call_us[name] = timed(nvml, getattr(nvml, name), handle)
    call_us["nvmlDeviceGetTemperature"] = timed(nvml, nvml.nvmlDeviceGetTemperature, handle,
                                                nvml.NVML_TEMPERATURE_GPU)
    for clock in ("SM", "MEM", "GRAPHICS"):
        call_us[f"nvmlDeviceGetClockInfo[{clock}]"] = timed(nvml, nvml.nvmlDeviceGetClockInfo, handle,
                                                            getattr(nvml, f"NVML_CLOCK_{clock}"))
    call_us["nvmlDeviceGetClockInfo"] = call_us["nvmlDeviceGetClockInfo[SM]"]
    call_us["nvmlDeviceGetProcessUtilization"] = timed(nvml, nvml.nvmlDeviceGetProcessUtilization, handle, 0)
    call_us["nvmlDeviceGetProcessesUtilizationInfo"] = timed(nvml, processes_utilization_info, nvml,
                                                             handle, 0)
    call_us["nvmlDeviceGetProcessUtilization[one call]"] = timed(nvml, one_call_process_utilization, nvml,
                                                                 handle, 0)
    field_us: dict[str, float | None] = {}
    for spec in field_specs():
        fid = getattr(nvml, spec.nvml_name, None)
        if fid is not None:
            field_us[spec.nvml_name] = timed(nvml, nvml.nvmlDeviceGetFieldValues, handle, [fid])
    batch = nvml.nvmlDeviceGetFieldValues
    field_us["batch:every_poll"] = timed(nvml, batch, handle, field_ids(nvml, FAST_FIELDS))
    field_us["batch:detail"] = timed(nvml, batch, handle, field_ids(nvml, DETAIL_FIELDS))
    field_us["batch:old_every_poll"] = timed(nvml, nvml.nvmlDeviceGetFieldValues, handle,
                                             field_ids(nvml, FAST_FIELDS + DETAIL_FIELDS))
    return {"call_us": call_us, "field_us": field_us, **gpm_costs(nvml, handle)}


def processes_utilization_info(nvml: Any, handle: Any, cursor: int) -> list[Any]:
    """``nvmlDeviceGetProcessesUtilizationInfo`` in either pynvml shape: (handle, timestamp), or a struct."""
    try:
        return list(nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, cursor))
    except TypeError:
        info = nvml.c_nvmlProcessesUtilizationInfo_t()
        info.version = nvml.nvmlProcessesUtilizationInfo_v1
        info.lastSeenTimeStamp = cursor
        got = nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, info)
        return list(got.procUtilArray[: got.processSamplesCount])


def one_call_process_utilization(nvml: Any, handle: Any, cursor: int, room: int = 64) -> list[Any]:
    """``nvmlDeviceGetProcessUtilization`` as one driver call into a buffer sized ahead."""
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    samples = (nvml.c_nvmlProcessUtilizationSample_t * room)()
    count = ctypes.c_uint(room)
    ret = fn(handle, samples, ctypes.byref(count), ctypes.c_ulonglong(cursor))
    if ret != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(ret)
    return list(samples[: count.value])


def gpm_costs(nvml: Any, handle: Any) -> dict[str, Any]:
    """GPM sample and metrics costs, and whether the metrics computation holds up another thread's call."""
    out: dict[str, Any] = {}
    try:
        first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    except (nvml.NVMLError, AttributeError) as exc:
        return {"gpm": f"not available: {exc!r}"}
    try:
        nvml.nvmlGpmSampleGet(handle, first)
        time.sleep(0.2)
        nvml.nvmlGpmSampleGet(handle, second)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        out["gpm_us"] = {"nvmlGpmSampleGet": timed(nvml, nvml.nvmlGpmSampleGet, handle, second),
                         "nvmlGpmMetricsGet": timed(nvml, nvml.nvmlGpmMetricsGet, request)}
        alone = timed(nvml, nvml.nvmlDeviceGetUtilizationRates, handle, repeat=50)
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlGpmMetricsGet(request)

        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
        try:
            during = timed(nvml, nvml.nvmlDeviceGetUtilizationRates, handle, repeat=50)
        finally:
            stop.set()
            spinner.join(timeout=5)
        out["utilization_us_alone_vs_during_gpm_metrics"] = [alone, during]
    finally:
        for buffer in (first, second):
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlGpmSampleFree(buffer)
    return out


def energy_pair(nvml: Any, handle: Any) -> dict[str, Any]:
    """The energy counter both ways, back to back (mJ), and what each costs."""
    fid = nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    try:
        direct = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        field = nvml.nvmlDeviceGetFieldValues(handle, [fid])[0]
        direct_after = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except nvml.NVMLError as exc:
        return {"energy": f"not available: {exc!r}"}
    return {"energy_mj": {"direct": direct, "field": int(field.value.ullVal), "direct_after": direct_after}}


def cursor_reads(nvml: Any, handle: Any, interval: float, reads: int,
                 row: Callable[[Any], Any]) -> list[list[Any] | str]:
    """Per-process utilization read ``reads`` times, ``interval`` seconds apart, each from the newest
    timestamp of the read before (the agent's cursor): ``row(sample)`` of each sample, or a read's error."""
    cursor, out = 0, []
    with contextlib.suppress(nvml.NVMLError):  # start from now: the driver's buffer so far is not wanted
        cursor = max((s.timeStamp for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)), default=0)
    for _ in range(reads):
        time.sleep(interval)
        try:
            got = nvml.nvmlDeviceGetProcessUtilization(handle, cursor)
        except nvml.NVMLError as exc:
            out.append(str(exc))
            continue
        cursor = max([cursor, *(s.timeStamp for s in got)])
        out.append([row(s) for s in got])
    return out


def process_figures(nvml: Any, handle: Any, tenants: list[Tenant]) -> dict[str, Any]:
    """Both per-process APIs over the same window, and the samples every 1 s and 0.25 s vs the true split."""
    names = {t.pid: t.name for t in tenants}
    out: dict[str, Any] = {}

    def samples(cursor: int) -> list[Any]:
        try:
            return list(nvml.nvmlDeviceGetProcessUtilization(handle, cursor))
        except nvml.NVMLError:  # NOT_FOUND: nobody ran kernels since the cursor
            return []

    stamp = max((s.timeStamp for s in samples(0)), default=0)
    time.sleep(2.0)
    legacy = samples(stamp)
    try:
        info = processes_utilization_info(nvml, handle, stamp)
    except (nvml.NVMLError, AttributeError) as exc:
        info, out["v2_error"] = [], repr(exc)
    out["same_window_sm_percent"] = {
        "nvmlDeviceGetProcessUtilization": {names.get(s.pid, s.pid): s.smUtil for s in legacy},
        "nvmlDeviceGetProcessesUtilizationInfo": {names.get(s.pid, s.pid): s.smUtil for s in info},
    }
    for interval in (1.0, 0.25):
        out[f"process_samples_every_{interval}s"] = cursor_reads(
            nvml, handle, interval, int(4 / interval),
            lambda s: (names.get(s.pid, s.pid), s.smUtil, s.timeStamp % 10**8))
    split = rates(tenants, 4.0)
    total = sum(split.values())
    out["true_split"] = {n: round(v / total, 3) for n, v in split.items()} if total else None
    return out


def probe(nvml: Any, tenants: list[Tenant] | None) -> dict[str, Any]:
    """Everything above on GPU 0; the loaded parts only with ``tenants`` (two busy ones)."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        result: dict[str, Any] = {"idle": costs(nvml, handle), **energy_pair(nvml, handle)}
        if tenants:
            time.sleep(2.0)
            loaded = costs(nvml, handle)
            result["call_us"], result["field_us"] = loaded["call_us"], loaded["field_us"]
            result["gpm_loaded"] = {k: v for k, v in loaded.items() if k not in ("call_us", "field_us")}
            result.update(process_figures(nvml, handle, tenants))
        else:
            result["call_us"], result["field_us"] = result["idle"]["call_us"], result["idle"]["field_us"]
            result["loaded"] = "needs torch (no busy tenants): the costs above are of an idle GPU"
    finally:
        nvml.nvmlShutdown()
    return result


def run(ctx: Context) -> ItemResult:
    import pynvml

    tenants = ctx.tenants("matmul", 2) if ctx.facts.get("torch") else None
    figures = probe(pynvml, tenants)
    path = ctx.workdir / "probe.json"
    path.write_text(json.dumps(figures, indent=1, default=str))
    ctx.records["probe_costs_file"] = str(path)
    ctx.records["probe"] = {"call_us": figures["call_us"], "field_us": figures["field_us"]}
    result = ItemResult(figures=figures)
    calls = figures["call_us"]
    for name in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessUtilization[one call]",
                 "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetTotalEnergyConsumption"):
        result.check(f"{name} us", calls.get(name), None)
    result.check("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION field us",
                 figures["field_us"].get("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), None)
    energy = figures.get("energy_mj")
    if isinstance(energy, dict):
        gap = energy["direct_after"] - energy["direct"]  # what the GPU drew between the two direct reads
        same = energy["direct"] <= energy["field"] <= energy["direct_after"] + 1
        result.check("energy: the direct call and the field agree", energy, same,
                     bar=f"field between the two direct reads ({gap} mJ apart)")
    return result.settle()
