"""Shares: identical tenants held at 70/30, 90/10 and 50/30/20 of the GPU by the enforcing agent.

Each run starts a fresh ``gpuagent run --mode enforce`` whose policies give the tenants their shares (the
tenants keep running between runs), lasts ``seconds`` (60 on a GPU) and is judged over its last
``measured`` seconds (45) by the tenants' own iteration counts: bar, every tenant within 5 points of its
share; goal, within 2. Also recorded: the throughput kept against one tenant alone (the others frozen by
hand) and the time until every 5 s window is first inside the 5-point band. After SIGTERM nothing may be
left frozen. The first run's figures serve the accounting item too.

Each run starts on an otherwise idle device (``ctx.quiet``: every other tenant stopped, NVML's process list
checked on a GPU) and reports, beside the truth, NVML's per-process view of the same window as the agent read
it (``sm_util_percent`` of each tenant's process, each read counted once) and the share design's parameters
as the agent exposes them: the enforcement section of ``/v1/state`` for the GPU, whatever keys it has.

The plan on a GPU within the 8-minute command: each of the three splits once with ``matmul`` tenants and
70/30 once with ``deep`` ones; ``--runs 3`` (and ``--share-configs``, ``--share-kinds``) for the full
matrix of the issue (3 runs of each), which takes several commands (docs/real-gpu.md).
"""

from __future__ import annotations

import time
from typing import Any

from gpucheck.agents import get_json, parse_metrics, share_policies
from gpucheck.context import Context
from gpucheck.registry import ItemResult
from gpucheck.tenants import GPU_KINDS, SIM_KINDS, Tenant, rates

CONFIGS: dict[str, tuple[int, ...]] = {"70/30": (70, 30), "90/10": (90, 10), "50/30/20": (50, 30, 20)}
BAR, GOAL = 0.05, 0.02
OVERHEAD_S = 5.0  # an agent's start and stop around each run


def plan(ctx: Context) -> list[tuple[str, str, int]]:
    """(tenant kind, split, run number) of every run, in order."""
    kinds = ctx.options.get("share_kinds") or (SIM_KINDS if ctx.sim else GPU_KINDS)
    configs = ctx.options.get("share_configs") or list(CONFIGS)
    runs = int(ctx.options.get("runs") or 1)
    if ctx.options.get("share_kinds") or ctx.options.get("share_configs") or runs > 1:
        return [(k, c, r) for k in kinds for c in configs for r in range(1, runs + 1)]
    if ctx.quick:  # CI-size: one run (the end-to-end tests hold the other splits on the simulator)
        return [(kinds[0], "70/30", 1)]
    return [(kinds[0], c, 1) for c in configs] + [(kinds[1], "70/30", 1)]


def lengths(ctx: Context) -> tuple[float, float]:
    """(run seconds, seconds measured at its end)."""
    if ctx.options.get("share_seconds"):
        seconds = float(ctx.options["share_seconds"])
        return seconds, seconds * 0.75
    return (20.0, 15.0) if ctx.quick else (60.0, 45.0)


def budget(ctx: Context) -> float:
    """The runs, an agent start and stop around each, a solo measure and the tenants' start per kind."""
    seconds, _ = lengths(ctx)
    runs = plan(ctx)
    return len(runs) * (seconds + OVERHEAD_S) + len({k for k, _, _ in runs}) * 5.0 + 20.0


def solo_rate(ctx: Context, tenants: list[Tenant]) -> float:
    """Iterations per second of the first tenant alone (the others frozen by hand), once per kind."""
    key = f"solo:{tenants[0].kind}"
    if key not in ctx.records:
        for other in tenants[1:]:
            other.freeze(True)
        try:
            time.sleep(1.0)
            ctx.records[key] = rates(tenants[:1], 2.0 if ctx.quick else 4.0)[tenants[0].name]
        finally:
            for other in tenants[1:]:
                other.freeze(False)
    return float(ctx.records[key])


def run_share(ctx: Context, kind: str, targets: tuple[int, ...], label: str, seconds: float,
              measured: float) -> dict[str, Any]:
    """One enforced run: the tenants' counts every second, what the agent decided, and its last metrics."""
    tenants = ctx.tenants(kind, len(targets))
    idle = ctx.quiet(tenants)
    solo = solo_rate(ctx, tenants)
    # the energy counter every 10 s (30 by default): a run holds several readings for the accounting item
    settings: dict[str, Any] = {"mode": "enforce", "policies": share_policies(tenants, list(targets)),
                                "energy_interval": 10.0}
    if ctx.sim:
        settings["poll_interval"] = 0.5  # as the enforcement end-to-end tests: CPU tenants, a faster loop
    runner = ctx.start_agent(f"share-{label}", tenants, **settings)
    try:
        ready_state = get_json(runner, "/v1/state")
        started = time.monotonic()
        counts: list[tuple[float, list[int]]] = [(0.0, [t.count() for t in tenants])]
        frozen: list[list[float]] = []
        seen: list[tuple[float, list[float | None]]] = []  # NVML's per-process view, one entry per read
        read_at = None
        with_state = ready_state
        window: dict[str, Any] | None = None  # the agent's metrics where the measured window starts
        while (elapsed := time.monotonic() - started) < seconds:
            time.sleep(min(1.0, seconds - elapsed))
            counts.append((time.monotonic() - started, [t.count() for t in tenants]))
            if window is None and counts[-1][0] >= seconds - measured:
                window = {"count_index": len(counts) - 1, "samples": parse_metrics(runner.metrics()),
                          "cpu_seconds": cpu_seconds(tenants) if ctx.sim else None}
            with_state = get_json(runner, "/v1/state")
            decided = {s["pod"]: s["frozen_ratio"]
                       for s in (with_state.get("enforcement") or {}).get("shares", ())}
            frozen.append([round(decided.get(t.uid, 0.0), 2) for t in tenants])
            gpu = (with_state.get("gpus") or [{}])[0]
            if gpu.get("process_util_read_at_unix") != read_at:
                read_at = gpu.get("process_util_read_at_unix")
                by_pid = {p.get("pid"): p.get("sm_util_percent") for p in gpu.get("processes", ())}
                seen.append((counts[-1][0], [by_pid.get(t.pid) for t in tenants]))
        end_samples = parse_metrics(runner.metrics())
        end_cpu = cpu_seconds(tenants) if ctx.sim else None
        design = enforcement_for_gpu(with_state, 0)
    finally:
        ctx.stop_agent(runner)
    left_frozen = [t.name for t in tenants if t.frozen()]
    return {
        "kind": kind, "targets": [x / 100 for x in targets], "label": label, "solo": solo,
        "tenants": [{"name": t.name, "uid": t.uid} for t in tenants], "counts": counts, "frozen": frozen,
        "measured": measured, "ready_state": ready_state, "end_samples": end_samples, "window": window,
        "end_cpu_seconds": end_cpu,
        "left_frozen": left_frozen, "idle": idle, "nvml_seen": seen, "design": design,
    }


def cpu_seconds(tenants: list[Tenant]) -> list[float]:
    """Each simulator tenant's CPU seconds so far: what the simulated GPU serves it, by construction."""
    import psutil

    return [sum(psutil.Process(t.pid).cpu_times()[:2]) for t in tenants]


def enforcement_for_gpu(state: dict[str, Any], index: int) -> dict[str, Any] | None:
    """The enforcement section of ``/v1/state`` as it is, every list of per-GPU entries kept to GPU ``index``
    (entries naming a ``gpu_index``); None when enforcement is off."""
    section = state.get("enforcement")
    if not isinstance(section, dict):
        return None
    out: dict[str, Any] = {}
    for key, value in section.items():
        if isinstance(value, list) and any(isinstance(v, dict) and "gpu_index" in v for v in value):
            value = [v for v in value if not isinstance(v, dict) or v.get("gpu_index", index) == index]
        out[key] = value
    return out


def nvml_view(record: dict[str, Any]) -> list[float] | None:
    """NVML's split of the measured window: each tenant's summed ``sm_util_percent`` over the agent's reads
    in it (a read without a figure for a tenant counts 0); None without any."""
    end_t = record["counts"][-1][0]
    sums = [0.0] * len(record["targets"])
    for t, values in record.get("nvml_seen", ()):
        if t >= end_t - record["measured"] - 1e-9:
            for i, v in enumerate(values):
                sums[i] += v or 0.0
    total = sum(sums)
    return [round(x / total, 3) for x in sums] if total else None


def judge(record: dict[str, Any]) -> dict[str, Any]:
    """Shares over the measured window, the throughput kept, and the time to enter the 5-point band."""
    counts, targets = record["counts"], record["targets"]
    end_t, end = counts[-1]
    start_t, start = next((t, c) for t, c in counts if t >= end_t - record["measured"] - 1e-9)
    done = [b - a for a, b in zip(start, end, strict=True)]
    total = sum(done)
    shares = [d / total if total else 0.0 for d in done]
    errors = [abs(s - x) for s, x in zip(shares, targets, strict=True)]
    entered = None
    for i in range(5, len(counts)):
        window = [b - a for a, b in zip(counts[i - 5][1], counts[i][1], strict=True)]
        if sum(window) and all(abs(w / sum(window) - x) <= BAR for w, x in zip(window, targets, strict=True)):
            entered = round(counts[i][0], 1)
            break
    seconds = end_t - start_t
    kept = total / seconds / record["solo"] if seconds > 0 and record["solo"] else None
    return {"shares": [round(s, 3) for s in shares], "max_error": round(max(errors), 3),
            "nvml_shares": nvml_view(record),
            "throughput_kept_vs_solo": round(kept, 3) if kept is not None else None,
            "seconds_to_band": entered, "measured_seconds": round(seconds, 1)}


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    seconds, measured = lengths(ctx)
    runs = plan(ctx)
    result.figures["plan"] = [f"{k} {c} #{r}" for k, c, r in runs]
    result.figures["runs"] = []
    skipped = []
    for kind, config, number in runs:
        label = f"{kind} {config} #{number}"
        if ctx.left() < seconds + OVERHEAD_S:
            skipped.append(label)
            continue
        record = run_share(ctx, kind, CONFIGS[config], label.replace(" ", "-").replace("/", "-")
                           .replace("#", ""), seconds, measured)
        ctx.records.setdefault("share_runs", []).append(record)
        figures = judge(record)
        result.figures["runs"].append({"run": label, **figures, "frozen_trace": record["frozen"],
                                       "idle": record["idle"], "design": record["design"]})
        result.check(f"{label}: shares over the last {measured:g} s", figures["shares"],
                     figures["max_error"] <= BAR, bar="each within 5 points",
                     expected=list(record["targets"]),
                     note=("within the 2-point goal" if figures["max_error"] <= GOAL else
                           f"off by up to {figures['max_error'] * 100:.1f} points"))
        result.check(f"{label}: NVML's per-process split of the same window (as the agent read it)",
                     figures["nvml_shares"], None, expected=figures["shares"], note="expected: the truth")
        result.check(f"{label}: throughput kept against one tenant alone", figures["throughput_kept_vs_solo"],
                     None)
        result.check(f"{label}: seconds until a 5 s window is inside the band", figures["seconds_to_band"],
                     None)
        result.check(f"{label}: nothing left frozen after SIGTERM", record["left_frozen"],
                     not record["left_frozen"], bar="no cgroup frozen")
        idle = record["idle"]
        result.check(f"{label}: the device otherwise idle before the run", idle,
                     None if ctx.sim else bool(idle.get("idle")),
                     bar="" if ctx.sim else "no other process on the GPU; < 5 % busy")
        result.check(f"{label}: the share design as the agent exposes it (/v1/state enforcement, GPU 0)",
                     record["design"], None)
    if skipped:
        result.figures["not_run_for_lack_of_time"] = skipped
    if not result.checks:
        result.status, result.reason = "fail", "no run fitted in the time left"
    return result.settle()
