"""The memory ladder: a tenant over its GPU memory limit gets SIGTERM, then SIGKILL; its memory is freed
(seen in NVML, through the agent); the neighbour is untouched.

On a GPU the hog allocates 1 GiB, then 6 GiB against a 4 GiB limit, and ignores SIGTERM; on the simulator
the scenario gives it 10 GiB. The neighbour (limit 60 GiB) keeps computing. The agent enforces with
``memory_term_after`` 1 s and ``memory_kill_grace`` 3 s.
"""

from __future__ import annotations

import signal
import time

from gpucheck.agents import get_json, parse_metrics, value
from gpucheck.context import Context
from gpucheck.registry import ItemResult
from gpucheck.tenants import GPU_KINDS, SIM_KINDS, wait_counting

GIB = 1 << 30


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    neighbour = ctx.tenants((SIM_KINDS if ctx.sim else GPU_KINDS)[0], 1)[0]
    hog = ctx.start_tenant("hog", "hog", start_gib=1.0, peak_gib=6.0, after_s=3.0)
    wait_counting([hog], timeout=max(10.0, min(60.0, ctx.left() - 20)))
    settings = {"mode": "enforce", "memory_term_after": 1.0, "memory_kill_grace": 3.0,
                "policies": [{"match_pod": hog.uid, "gpu_memory": "4Gi"},
                             {"match_pod": neighbour.uid, "gpu_memory": "60Gi"}]}
    if ctx.sim:
        settings["poll_interval"] = 0.5
    runner = ctx.start_agent("ladder", [hog, neighbour], memory={"hog": "10Gi"}, **settings)
    try:
        started = time.monotonic()
        neighbour_before = neighbour.count()
        used: list[tuple[float, int | None, bool]] = []  # (t, GPU memory used, hog listed)
        ended_at = None
        while time.monotonic() - started < 30 and (ended_at is None or time.monotonic() - ended_at < 5):
            state = get_json(runner, "/v1/state")
            gpu = state["gpus"][0]
            listed = any(p["pid"] == hog.pid for p in gpu.get("processes", ()))
            used.append((round(time.monotonic() - started, 1), gpu.get("memory_used_bytes"), listed))
            if ended_at is None and not hog.alive():
                ended_at = time.monotonic()
            time.sleep(0.25)
        samples = parse_metrics(runner.metrics())
        neighbour_after = neighbour.count()
    finally:
        ctx.stop_agent(runner)
    code = hog.process.popen.poll()
    term = value(samples, "gpuagent_enforcement_actions_total", action="signal_term", outcome="done") or 0
    kill = value(samples, "gpuagent_enforcement_actions_total", action="signal_kill", outcome="done") or 0
    result.figures["memory_used_trace"] = [(t, round(u / GIB, 2) if u is not None else None, listed)
                                           for t, u, listed in used]
    result.check("SIGTERM sent to the hog", int(term), term >= 1, bar=">= 1")
    result.check("the hog ignored it and was SIGKILLed", code, code == -signal.SIGKILL,
                 bar=f"exit by signal {int(signal.SIGKILL)}")
    result.check("SIGKILL actions", int(kill), kill >= 1, bar=">= 1")
    peak = max((u for _, u, listed in used if listed and u is not None), default=None)
    after = [u for _, u, listed in used if not listed and u is not None]
    allocation = 9 * GIB if ctx.sim else 4 * GIB  # 10 GiB on the simulator, 1 -> 6 GiB on a GPU (less slack)
    freed = peak is not None and bool(after) and peak - min(after) >= 0.8 * allocation
    result.check("its memory freed, seen in NVML", [round(peak / GIB, 2) if peak else None,
                                                   round(min(after) / GIB, 2) if after else None],
                 freed and not used[-1][2],
                 bar="GiB used drops by the hog's allocation; the hog no longer listed")
    result.check("the neighbour untouched and still computing", neighbour_after - neighbour_before,
                 neighbour.alive() and neighbour_after > neighbour_before, bar="alive, iterations grew")
    return result.settle()
