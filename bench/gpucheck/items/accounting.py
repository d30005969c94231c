"""Accounting on the device: the energy shared out against the GPU's own counter, and the tenants' busy
seconds against the shares their iteration counts measured.

It reads the first shares run (or makes a short one of its own): the agent's counters at the end of the run
against the energy counter's readings and the tenants' counts over the same run. Bars: the energy accounted
equals the counter's delta between the first and last readings (within 0.5 %), the tenants' and the
unattributed energy add up to it (0.5 %), and on a GPU each tenant's share of the busy seconds is within 5
points of its share of the iterations over the run's measured window (where the shares are held); on the
simulator that comparison is recorded (``busy``'s docstring says why).
"""

from __future__ import annotations

from typing import Any

from gpucheck.agents import value
from gpucheck.context import Context
from gpucheck.items.shares import run_share
from gpucheck.registry import ItemResult
from gpucheck.tenants import GPU_KINDS, SIM_KINDS

TOLERANCE = 0.005


def budget(ctx: Context) -> float:
    """Seconds: little after a shares run (its figures are read), a short run of its own otherwise."""
    if ctx.records.get("share_runs") or "shares" in ctx.options.get("planned", ()):
        return 10.0
    return 35.0 if ctx.quick else 60.0


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    records = ctx.records.get("share_runs")
    if records:
        record = records[0]
        result.figures["run"] = f"the shares item's run {record['label']}"
    else:
        seconds = 20.0 if ctx.quick else 40.0
        kind = (SIM_KINDS if ctx.sim else GPU_KINDS)[0]
        record = run_share(ctx, kind, (70, 30), "accounting", seconds, seconds * 0.75)
        result.figures["run"] = f"its own {seconds:g} s run at 70/30"
    samples = record["end_samples"]
    energy(result, record, samples)
    busy(result, record, samples)
    return result.settle()


def energy(result: ItemResult, record: dict[str, Any], samples: Any) -> None:
    first = (record["ready_state"]["gpus"][0] or {}).get("energy_joules_total")
    counter_mj = value(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    accounted = value(samples, "gpuagent_gpu_energy_accounted_joules_total")
    unattributed = value(samples, "gpuagent_gpu_energy_unattributed_joules_total") or 0.0
    if first is None or counter_mj is None or accounted is None:
        result.check("energy counter", None, None, note="the GPU reports no energy counter: nothing to split")
        return
    delta = counter_mj / 1000 - first
    tenants = sum(value(samples, "gpuagent_pod_gpu_energy_joules_total", pod=t["uid"]) or 0.0
                  for t in record["tenants"])
    result.figures["energy_joules"] = {"counter_delta": round(delta, 3), "accounted": round(accounted, 3),
                                       "tenants": round(tenants, 3), "unattributed": round(unattributed, 3)}
    result.check("energy accounted = the counter's delta over the run", round(accounted, 3),
                 delta > 0 and abs(accounted - delta) <= TOLERANCE * delta, bar="within 0.5 %",
                 expected=round(delta, 3))
    result.check("tenants' + unattributed energy = accounted", round(tenants + unattributed, 3),
                 accounted > 0 and abs(tenants + unattributed - accounted) <= TOLERANCE * accounted,
                 bar="within 0.5 %", expected=round(accounted, 3))


def busy(result: ItemResult, record: dict[str, Any], samples: Any) -> None:
    """Each tenant's busy seconds against its work over the run's measured window (from the agent's counters
    read where the window starts; the whole run where a record has no such reading). The window leaves out
    the controller's first seconds: the bar is about what the accounting says once shares are held.

    On a GPU the work is the tenants' iterations, and this is the real question: does NVML's per-process
    utilization, which the ledger integrates, credit each context with what it ran? On the simulator the
    figures are recorded, not judged: its per-process reading is the CPU use of the last 0.2 s on a sample
    grid (as NVML's is a sample, not a mean), so over 15 s it lands 3 to 8 points from the CPU seconds the
    simulated GPU served, either way, from run to run on a quiet machine; the ledger's own arithmetic is
    judged exactly by ``tests/test_accounting*.py``."""
    counts, tenants = record["counts"], record["tenants"]
    window = record.get("window")
    start_index = window["count_index"] if window else 0
    done = deltas(counts[start_index][1], counts[-1][1])
    end = pod_busy(samples, tenants)
    busy_seconds = deltas(pod_busy(window["samples"], tenants) if window else [0.0] * len(end), end)
    if not sum(done) or not sum(busy_seconds):
        result.check("busy seconds", busy_seconds, False, note="no busy seconds or no iterations counted")
        return
    seconds = counts[-1][0] - counts[start_index][0]
    by_busy = [round(b / sum(busy_seconds), 3) for b in busy_seconds]
    by_iterations = [round(d / sum(done), 3) for d in done]
    result.figures["busy_seconds"] = [round(b, 2) for b in busy_seconds]
    result.figures["window_seconds"] = round(seconds, 1)
    cpu_before, cpu_after = (window or {}).get("cpu_seconds"), record.get("end_cpu_seconds")
    if cpu_before and cpu_after:  # the simulator
        cpu = deltas(cpu_before, cpu_after)
        by_cpu = [round(c / sum(cpu), 3) for c in cpu] if sum(cpu) else None
        note = f"the simulator's sampled reading, over the last {seconds:.0f} s"
        result.check("tenants' shares of busy seconds vs of the CPU seconds the simulated GPU served",
                     by_busy, None, expected=by_cpu, note=note)
        result.check("tenants' shares of busy seconds vs of iterations", by_busy, None,
                     expected=by_iterations, note=note)
        return
    result.check("tenants' shares of busy seconds vs of iterations", by_busy,
                 error(by_busy, by_iterations) <= 0.05, bar="each within 5 points", expected=by_iterations,
                 note=f"over the last {seconds:.0f} s of the run")


def error(shares: list[float], truth: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(shares, truth, strict=True))


def pod_busy(samples: Any, tenants: list[dict[str, Any]]) -> list[float]:
    """Each tenant's busy-seconds counter in ``samples`` (0 where it has none yet)."""
    return [value(samples, "gpuagent_pod_gpu_busy_seconds_total", pod=t["uid"]) or 0.0 for t in tenants]


def deltas(start: list[float], end: list[float]) -> list[float]:
    return [b - a for a, b in zip(start, end, strict=True)]
