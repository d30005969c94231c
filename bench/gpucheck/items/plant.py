"""The plant experiment: how the GPU answers the freezer, open loop, with no controller in the way.

Two identical tenants of a kind (``matmul``: a synchronous bf16 product per iteration; ``deep``: CUDA graphs
with about 90 ms queued) and this item freezing and thawing their cgroups itself (``cgroup.freeze``, or the
v1 freezer: the agent's mechanism), cell after cell:

- ``solo a``, ``solo b``: one tenant thawed, the other frozen: the rate 100 % of the GPU gives;
- ``together``: both thawed: the truth split, NVML's split of the same seconds, the total against solo;
- ``frozen F% / P ms``: tenant b frozen F % of every period P, a never; the period fixed, or drawn anew each
  period from [P/2, 3P/2] (dithered): what a duty cycle buys, against the naive model that b gets half of
  the time it is thawed (the target column);
- ``rotation 70/30 / P ms``: exclusive rotation, at most one tenant thawed at a time (the other frozen
  first), slots of 0.7 P and 0.3 P, for P of 100, 250, 500 and 1000 ms;
- ``drain``: tenant a alone, frozen for half of each second: how long its queue keeps the device busy after
  the freeze (its own GPU completion times, and NVML's device utilization samples).

Each measured window holds whole periods and starts after a settling time. The table (``plantstats``): per
cell the truth split, NVML's split, the target, the error in points, the throughput against solo and the
drain after each freeze. The raw traces stay in the work folder (``plant/``): every tenant's iteration
completion times (``*.times``, float64 seconds of CLOCK_MONOTONIC) and a deep tenant's enqueue times,
``plant.json`` with every cell's freezes and thaws and NVML's samples with their timestamps.

Timing on a GPU: about 120 s of cells per kind and a tenant start and idle check per kind, about 5 minutes
in all (budget 420 s); the cells shrink in proportion if the deadline leaves less. Without a GPU the same
cells run shortened (about 40 s) with CPU tenants sharing one CPU, the ``deep`` kind and NVML's figures
marked "needs GPU".
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpucheck import plantstats
from gpucheck.context import Context
from gpucheck.plantstats import NEEDS_GPU, Cell
from gpucheck.registry import ItemResult
from gpucheck.tenants import DEEP_QUEUE_MS, Tenant

Slot = tuple[float, frozenset[int]]  # (seconds, the tenants thawed)
SHARES = (0.7, 0.3)
PERIODS_MS = (100, 250, 500, 1000)
FRACTIONS = (0.5, 0.8)
TENANT_START_S = 40.0  # on a GPU: two tenants' CUDA start (a deep one captures a graph), the idle check


@dataclass(frozen=True)
class Spec:
    """A cell before it runs: its name, one period's slots (``cycle(rng)``), length and target."""

    name: str
    scheme: str
    seconds: float  # measured (whole periods of it)
    cycle: Callable[[random.Random], list[Slot]]
    target: tuple[float, ...] | None = None
    params: tuple[tuple[str, Any], ...] = ()


def _steady(thawed: set[int]) -> Callable[[random.Random], list[Slot]]:
    return lambda rng: [(0.25, frozenset(thawed))]


def _fraction(frozen: float, period: float, dither: bool) -> Callable[[random.Random], list[Slot]]:
    def cycle(rng: random.Random) -> list[Slot]:
        p = rng.uniform(period / 2, period * 1.5) if dither else period
        return [(p * (1 - frozen), frozenset({0, 1})), (p * frozen, frozenset({0}))]
    return cycle


def _rotation(period: float) -> Callable[[random.Random], list[Slot]]:
    return lambda rng: [(period * SHARES[0], frozenset({0})), (period * SHARES[1], frozenset({1}))]


def specs(gpu: bool) -> list[Spec]:
    """The cells of one kind, in order; shorter without a GPU."""
    solo, free, fraction, rotation, drain = (5.0, 10.0, 10.0, 12.0, 6.0) if gpu else (2.0, 3.0, 3.0, 3.0, 3.0)
    out = [Spec("solo a", "solo", solo, _steady({0})), Spec("solo b", "solo", solo, _steady({1})),
           Spec("together", "free", free, _steady({0, 1}), (0.5, 0.5))]
    for frozen in FRACTIONS:
        model = ((1 + frozen) / 2, (1 - frozen) / 2)  # b gets half of the time it is thawed
        for dither in (False, True):
            out.append(Spec(f"b frozen {frozen:.0%} / 100 ms{' dithered' if dither else ''}", "fraction",
                            fraction, _fraction(frozen, 0.1, dither), model,
                            (("frozen", frozen), ("period_s", 0.1), ("dither", dither))))
    for period in PERIODS_MS:
        seconds = rotation if gpu or period < 1000 else rotation + 1.0
        out.append(Spec(f"rotation 70/30 / {period} ms", "rotation", seconds, _rotation(period / 1000),
                        SHARES, (("period_s", period / 1000), ("shares", SHARES))))
    out.append(Spec("drain: a frozen 500 ms of each s", "drain", drain,
                    lambda rng: [(0.5, frozenset({0})), (0.5, frozenset())], None, (("period_s", 1.0),)))
    return out


SETTLE_S = {True: 0.5, False: 0.3}
MIN_SCALE = 0.3  # of each cell's seconds: the least a cell is cut to when time is short


def cell_seconds(spec_list: list[Spec], gpu: bool) -> float:
    return sum(s.seconds + SETTLE_S[gpu] + 1.0 for s in spec_list)  # + up to one period past the end


class Freezer:
    """The tenants' cgroups, written only when a state changes, every write's time kept (monotonic, when
    the write returned: a frozen tenant's work that completes after it is its drain)."""

    def __init__(self, tenants: list[Tenant]) -> None:
        self.tenants = tenants
        self.thawed = {i for i, t in enumerate(tenants) if not t.frozen()}
        self.events: list[tuple[float, int, str]] = []

    def apply(self, thawed: frozenset[int]) -> None:
        for i, tenant in enumerate(self.tenants):  # freezes first: at most the new set thawed at any time
            if i in self.thawed and i not in thawed:
                tenant.freeze(True)
                self.events.append((time.monotonic(), i, "freeze"))
                self.thawed.discard(i)
        for i, tenant in enumerate(self.tenants):
            if i not in self.thawed and i in thawed:
                tenant.freeze(False)
                self.events.append((time.monotonic(), i, "thaw"))
                self.thawed.add(i)


def drive(freezer: Freezer, spec: Spec, kind: str, scale: float, settle: float, rng: random.Random) -> Cell:
    """Run one cell: periods back to back on an absolute schedule (late wake-ups do not add up, and how late
    each slot began is kept); the window is from the first period boundary after ``settle`` to the last
    boundary once ``seconds`` are covered."""
    first_event = len(freezer.events)
    start = time.monotonic()
    boundaries: list[float] = []
    late: list[float] = []  # how far past its time each slot began (the freezer's own jitter)
    t = start
    measure_from = start + settle
    seconds = spec.seconds * scale
    while True:
        if t >= measure_from:
            boundaries.append(t)
            if t - boundaries[0] >= seconds - 1e-9:
                break
        for duration, thawed in spec.cycle(rng):
            late.append(time.monotonic() - t)
            freezer.apply(thawed)
            t += duration
            time.sleep(max(0.0, t - time.monotonic()))
    window = (boundaries[0], boundaries[-1])
    late.sort()
    return Cell(spec.name, kind, spec.scheme, [tn.name for tn in freezer.tenants], window,
                list(spec.target) if spec.target else None, freezer.events[first_event:],
                {**dict(spec.params), "scale": round(scale, 3),
                 "late_ms_median_max": [round(late[len(late) // 2] * 1e3, 2), round(late[-1] * 1e3, 2)]})


def nvml_trace(ctx: Context) -> Any:
    if ctx.sim:
        return None
    import pynvml

    from gpucheck.nvmltrace import NvmlTrace

    # every 0.1 s: a read returns one figure per process, the mean of its samples since the cursor (the
    # H200's 1 s reads of 2026-11-27 gave 60/40 where 0.25 s reads gave 99 or 50), and the samples come on a
    # ~200 ms grid: faster reads keep each sample apart (about 2 ms of NVML a read)
    return NvmlTrace(pynvml, 0, interval=0.1).start()


def run_kind(ctx: Context, kind: str, spec_list: list[Spec], scale: float, seed: int) -> dict[str, Any]:
    """Start the tenants, check the device is otherwise idle, run the cells, collect the traces."""
    tenants = ctx.tenants(kind, 2)
    idle = ctx.quiet(tenants)
    rng = random.Random(seed)
    freezer = Freezer(tenants)
    tracer = nvml_trace(ctx)
    cells: list[Cell] = []
    skipped: list[str] = []
    try:
        for spec in spec_list:
            if ctx.left() < spec.seconds * scale + 15.0:
                skipped.append(spec.name)
                continue
            cells.append(drive(freezer, spec, kind, scale, SETTLE_S[not ctx.sim], rng))
    finally:
        freezer.apply(frozenset(range(len(tenants))))  # every tenant thawed
        trace = tracer.stop() if tracer is not None else None
    time.sleep(0.4)  # the tenants flush their traces every 0.1 s
    times = {t.name: sorted(t.times()) for t in tenants}
    enqueued = {t.name: list(t.enqueued()) for t in tenants}
    done = {t.name: list(t.times()) for t in tenants}  # in completion order, beside the enqueue times
    out_dir = ctx.workdir / "plant"
    out_dir.mkdir(exist_ok=True)
    for tenant in tenants:
        for ext in (".times", ".enqueued"):
            src = tenant.counter.with_name(tenant.counter.name + ext)
            if src.exists() and src.stat().st_size:
                shutil.copyfile(src, out_dir / f"{kind}-{tenant.name}{ext}")
    for tenant in tenants:  # the next kind's run must have the device to itself
        ctx.stop_tenant(tenant)
    return {"kind": kind, "tenants": [{"name": t.name, "pid": t.pid} for t in tenants], "idle": idle,
            "cells": cells, "skipped": skipped, "times": times, "enqueued": enqueued, "done": done,
            "trace": trace, "log": [t.said() for t in tenants]}


def analyse(record: dict[str, Any], gpu: bool) -> dict[str, Any]:
    """The rows of one kind and its derived figures (solo rate, queue depth, NVML's clock and grid)."""
    from gpucheck.nvmltrace import clock_offset

    cells: list[Cell] = record["cells"]
    times = record["times"]
    nvml = None
    clock = None
    trace = record["trace"]
    device_clock = None
    if gpu and trace is not None:
        clock = clock_offset(trace.reads)
        device_clock = clock_offset(trace.reads, device=True)
        if clock is not None:
            # device samples dated by their own clock; none (no device sample at all) leaves them out
            device = trace.device if device_clock is not None else []
            shift = device_clock[1] - clock[1] if device_clock is not None else 0.0
            nvml = {"process": trace.process, "offset": clock[1],
                    "pids": [t["pid"] for t in record["tenants"]],
                    "device": [(stamp - shift * 1e6, value) for stamp, value in device]}
    solos = [max(plantstats.truth(c, times)["rates"]) for c in cells if c.scheme == "solo"]
    solo = statistics.mean(solos) if solos else None
    rows = [plantstats.row(c, times, solo, nvml) for c in cells]
    rows += [{"kind": record["kind"], "cell": name, "skipped": "not run: no time left"}
             for name in record["skipped"]]
    figures: dict[str, Any] = {"solo_rates": solos, "nvml_clock": clock, "nvml_device_clock": device_clock,
                               "nvml_sample_interval_s": (plantstats.sample_interval(trace.process)
                                                          if trace is not None else NEEDS_GPU)}
    alone = next((c for c in cells if c.name == "solo a"), None)
    name = record["tenants"][0]["name"]
    if alone is not None and record["enqueued"].get(name):
        figures["queue_s"] = plantstats.summary(plantstats.queue_depths(
            record["done"][name], record["enqueued"][name], alone.window))
    return {"rows": rows, "figures": figures}


def notes(figures: dict[str, Any], names: list[str]) -> list[str]:
    """A line per kind under the table: its solo rates, NVML's sample grid and clock, the deep queue."""
    lines = []
    for kind in names:
        got = figures.get(kind)
        if not got:
            continue
        solo = ", ".join(f"{r:.1f}" for r in got["solo_rates"]) or "-"
        grid = got["nvml_sample_interval_s"]
        grid_text = grid if isinstance(grid, str) or grid is None else f"every {grid * 1e3:.0f} ms"
        clock = got["nvml_clock"][0] if got.get("nvml_clock") else "-"
        line = f"- {kind}: solo {solo} it/s; NVML per-process samples {grid_text} (clock: {clock})"
        if got.get("queue_s"):
            line += f"; queued in front of each replay, alone: median {got['queue_s']['median'] * 1e3:.0f} ms"
        lines.append(line + ".")
    return lines


def kinds(ctx: Context) -> list[str]:
    return ["cpu"] if ctx.sim else ["matmul", "deep"]


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    gpu = not ctx.sim
    spec_list = specs(gpu)
    planned = len(kinds(ctx)) * (cell_seconds(spec_list, gpu) + (TENANT_START_S if gpu else 8.0))
    scale = min(1.0, max(MIN_SCALE, (ctx.left() - 10.0) / planned))
    if ctx.sim and ctx.quick:  # CI-sized: every cell, each a few periods (the harness is what is tested)
        scale = MIN_SCALE
    result.figures["planned_s"] = round(planned, 1)
    result.figures["scale"] = round(scale, 3)
    records, rows = [], []
    seed = random.SystemRandom().randrange(1 << 30)
    result.figures["dither_seed"] = seed
    for kind in kinds(ctx):
        try:
            record = run_kind(ctx, kind, spec_list, scale, seed)
        except Exception as exc:  # one kind's failure (a tenant that died, a cgroup write) spares the other
            (ctx.workdir / f"plant-{kind}.traceback").write_text(traceback.format_exc())
            rows.append({"kind": kind, "cell": "every cell", "skipped": f"error: {exc!r} "
                         f"(work/plant-{kind}.traceback)"})
            result.check(f"{kind}: the cells ran", repr(exc), False, bar="no error")
            continue
        records.append(record)
        analysed = analyse(record, gpu)
        rows += analysed["rows"]
        result.figures[kind] = {**analysed["figures"], "idle": record["idle"], "tenant_log": record["log"]}
        idle = record["idle"]
        result.check(f"{kind}: the device otherwise idle before the cells", idle,
                     idle.get("idle") if gpu else None, bar="no other process on the GPU; < 5 % busy"
                     if gpu else "", note="" if gpu else "recorded: the CPU is shared with other programs")
        queue = analysed["figures"].get("queue_s")
        if kind == "deep":
            result.check("deep: work queued in front of each replay, alone (s)", queue,
                         None if queue is None else abs(queue["median"] * 1000 - DEEP_QUEUE_MS) <= 30.0,
                         bar=f"median {DEEP_QUEUE_MS:.0f} ms ± 30")
    if ctx.sim:
        rows += [{"kind": "deep", "cell": "every cell", "skipped": NEEDS_GPU}]
    left_frozen = [t.name for t in ctx.live_tenants() if t.frozen()]
    result.check("nothing left frozen", left_frozen, not left_frozen, bar="no tenant frozen")
    result.figures["rows"] = rows
    result.text = "\n".join([*plantstats.table(rows), "", *notes(result.figures, kinds(ctx))])
    save(ctx, records, rows, result.figures)
    return result.settle()


def save(ctx: Context, records: list[dict[str, Any]], rows: list[dict[str, Any]], figures: dict[str, Any]
         ) -> None:
    """``plant/plant.json``: the cells (windows, every freeze and thaw), NVML's samples, the rows."""
    out_dir = ctx.workdir / "plant"
    out_dir.mkdir(exist_ok=True)
    document = {
        "clock": "CLOCK_MONOTONIC seconds; tenant traces in plant/<kind>-<tenant>.times (float64)",
        "figures": figures, "rows": rows,
        "kinds": [{"kind": r["kind"], "tenants": r["tenants"], "idle": r["idle"],
                   "cells": [c.as_json() for c in r["cells"]], "skipped": r["skipped"],
                   "nvml": r["trace"].as_json() if r["trace"] is not None else NEEDS_GPU}
                  for r in records],
    }
    with contextlib.suppress(OSError):
        (out_dir / "plant.json").write_text(json.dumps(document, default=str))
