"""Cost: the agent's CPU, RSS, poll time and NVML time per GPU per second at the default config, with
enforcement off and on, next to two busy tenants.

``off`` is every GPU of a node without the share controller; ``enforce`` (the tenants at 70/30) is a GPU
where it acts, its per-process utilization read every poll. A node's 8-GPU figure with enforcement on takes
the mix of ``bench/bench_nvml_cost.py`` (3 GPUs shared, 5 not). Bars: NVML time at most 1.25 ms per GPU per
second with enforcement off (1 % on 8 GPUs) and 2.5 ms in that mix (2 %); RSS at most 128 MiB. On a GPU the
NVML time is the agent's own ``gpuagent_nvml_call_duration_seconds``; on the simulator those seconds are the
simulator's Python, so the bars are judged on the calls counted there times the H100's per-call costs (the
bench's model), and the measured figures are recorded only.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpucheck.agents import get_json, nvml_seconds, parse_metrics, share_policies
from gpucheck.context import Context
from gpucheck.registry import ItemResult
from gpucheck.tenants import GPU_KINDS, SIM_KINDS

OFF_MS, MIX_MS, RSS_MIB = 1.25, 2.5, 128.0
SHARED_OF_8 = 3  # bench_nvml_cost's node: 3 of 8 GPUs shared


def measure(runner: Any, seconds: float) -> dict[str, Any]:
    """The agent's CPU, RSS, poll durations and NVML time over the next ``seconds``."""
    import psutil

    proc = psutil.Process(runner.proc.pid)
    gpus = max(1, len(get_json(runner, "/v1/state")["gpus"]))
    before = nvml_seconds(parse_metrics(runner.metrics()))
    cpu0, started = proc.cpu_times(), time.monotonic()
    rss, polls = [], []
    while (elapsed := time.monotonic() - started) < seconds:
        time.sleep(min(1.0, seconds - elapsed))
        rss.append(proc.memory_info().rss / 2**20)
        polls.append(get_json(runner, "/v1/state")["poll_duration_seconds"])
    cpu1, wall = proc.cpu_times(), time.monotonic() - started
    after = nvml_seconds(parse_metrics(runner.metrics()))
    spent = {f: (s - before.get(f, (0.0, 0.0))[0], n - before.get(f, (0.0, 0.0))[1])
             for f, (s, n) in after.items()}
    total = sum(s for s, _ in spent.values())
    return {
        "seconds": round(wall, 1),
        "gpus": gpus,
        "cpu_percent_of_one_core": round(
            100 * ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / wall, 2),
        "rss_mib_first_last_max": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)] if rss else None,
        "poll_seconds_median": round(statistics.median(polls), 5) if polls else None,
        "nvml_ms_per_gpu_per_s": round(1000 * total / wall / gpus, 3),
        "nvml_top_ms_per_gpu_per_s": dict(sorted(
            ((f, round(1000 * s / wall / gpus, 3)) for f, (s, _) in spent.items() if s > 0),
            key=lambda kv: -kv[1])[:10]),
        "nvml_calls_per_gpu_per_s": {f: round(n / wall / gpus, 2)
                                     for f, (_, n) in sorted(spent.items()) if n},
    }


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    tenants = ctx.tenants((SIM_KINDS if ctx.sim else GPU_KINDS)[0], 2)
    window = 8.0 if ctx.quick else 20.0
    settle = 3.0
    if ctx.sim and ctx.quick:  # nothing here is judged on the simulator but RSS and the model: CI-sized
        window, settle = 4.0, 2.0
    figures = {}
    for mode, settings in (("off", {}), ("enforce", {"mode": "enforce",
                                                       "policies": share_policies(tenants, [70, 30])})):
        runner = ctx.start_agent(f"cost-{mode}", tenants, **settings)
        try:
            time.sleep(settle)  # past start-up: steady polling
            figures[mode] = measure(runner, window)
        finally:
            ctx.stop_agent(runner)
    result.figures["measured"] = figures
    off, shared = figures["off"]["nvml_ms_per_gpu_per_s"], figures["enforce"]["nvml_ms_per_gpu_per_s"]
    mix = (SHARED_OF_8 * shared + (8 - SHARED_OF_8) * off) / 8
    rss = max(f["rss_mib_first_last_max"][2] for f in figures.values() if f["rss_mib_first_last_max"])
    judged = not ctx.sim  # on the simulator "NVML" is the simulator's Python: the model judges instead
    note = "" if judged else "simulator time, not judged"
    result.check("NVML ms per GPU per s, enforcement off", off, off <= OFF_MS if judged else None,
                 bar=f"<= {OFF_MS} (1 % on 8 GPUs)", note=note)
    result.check("NVML ms per GPU per s where the share controller acts", shared, None, note=note)
    result.check("NVML ms per GPU per s, enforcement on, 8-GPU mix (3 shared)", round(mix, 3),
                 mix <= MIX_MS if judged else None, bar=f"<= {MIX_MS} (2 % on 8 GPUs)", note=note)
    result.check("agent RSS MiB (max)", rss, rss <= RSS_MIB, bar=f"<= {RSS_MIB:g}")
    for mode, f in figures.items():
        result.check(f"agent CPU % of one core ({mode})", f["cpu_percent_of_one_core"], None)
        result.check(f"poll seconds, median ({mode})", f["poll_seconds_median"], None)
    modelled(ctx, result)
    return result.settle()


def modelled(ctx: Context, result: ItemResult) -> None:
    """bench_nvml_cost's model of the 8-GPU node: with the probe's costs when it ran on this GPU."""
    try:
        import bench_nvml_cost
    except ImportError as exc:
        result.check("modelled 8-GPU NVML time", None, None, note=f"model not available: {exc}")
        return
    costs = ctx.records.get("probe_costs_file")
    try:
        figures = bench_nvml_cost.run_modes(60, costs, {})  # two energy reads, six GPM samples a mode
    except ImportError as exc:  # the simulator needs jsonschema, which a lent GPU machine may lack
        result.check("modelled 8-GPU NVML time", None, None, note=f"model not available: {exc}")
        return
    source = "this GPU's probe" if costs else "the H100 costs of 2026-11"
    result.figures["modelled"] = {m: {k: f[k] for k in ("ms_per_gpu_per_s", "percent_8gpus")}
                                  for m, f in figures.items()}
    for mode, bar in (("off", 1.0), ("enforce", 2.0)):
        percent = figures[mode]["percent_8gpus"]
        result.check(f"modelled NVML % of wall time on 8 GPUs, {mode} ({source})", percent,
                     percent <= bar if ctx.sim or costs else None, bar=f"<= {bar:g} %")
