"""Scale on one pod-dense node: the cost of a poll, of a scrape and of accounting against the number of pods.

    .venv/bin/python bench/bench_scale.py [--sizes 8 32 110 250] [--polls 200] [--scrapes 40]
        [--scrape-every 15] [--mode audit] [--gc agent] [--profile DIR] [--plot FILE] [--out DIR]

Time-slicing replicas make the 8 GPUs of a node into 80-110 pods (the kubelet's default cap is 110). For each
size the simulated 8xH100 node runs that many pods, one GPU process each, spread round-robin over the GPUs,
each allocated a replica ``<uuid>::<n>`` of its GPU and annotated with a share and a memory limit; the pods
are named through the tests' real gRPC pod-resources server and fake API server (``kubenode``, the set-up
``bench_poll_scrape`` and ``bench_soak`` share). Each size has an agent in this process (``--mode audit`` by
default, so the enforcer decides for every pod; the network source off), polling on a virtual clock one
second a poll, so whatever runs on a cadence (the kubelet's refresh, energy and GPM reads, the controller's
windows) does what it would on a node, however fast the polls follow each other here. The sizes are polled
in turn, one poll each, so a change of this shared machine's load meets every size alike. The garbage
collector is tuned as ``gpuagent run`` tunes it (``--gc default``: CPython's settings, to see the
difference).

A poll's own work is the process's CPU time over ``poll_once`` minus the CPU time the simulator spends
inside the "NVML" calls (``measure.SimulatorTime``; a real driver's calls cost the agent no such CPU), in
parts: the device reads (the agent's side), attribution (cgroups, the kubelet's allocations, names),
enforcement, accounting, hints, and "other" (the snapshot's assembly); the garbage collector's share is
counted apart too. Then ``--scrapes`` times ``/metrics`` of a new snapshot (``export.scrape``, text 0.0.4)
``--scrape-every`` polls after the last one (15: Prometheus scraping every 15 s, as ``deploy/`` has it, an
agent polling every second; 1 makes the scrapes follow each other poll by poll, which flatters the
families kept from the last scrape), and as many times prometheus-client rendering the same series
(``measure.PrometheusClientRender``: a custom collector's fresh typed families filled with ``add_metric``,
``generate_latest``; and its cheaper ``add_sample`` variant, for comparison), in alternating blocks, each
side's timing after as many polls and never after the other side's work.

Bars, as ratios within one run: a poll's own work at 110 pods <= 3x the 8-pod one, and <= 2.3x from 110 to
250 pods; the scrape of a new snapshot >= 10x faster than prometheus-client at every size. Prints a table,
writes a PNG plot (matplotlib, imported here only) and the figures under ``--out``, and ends with one JSON
line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubenode import ROOT, VirtualClock, gpus, kubelet_node, one_pod_per_process, running_agent
from measure import (
    PrometheusClientRender,
    SimulatorTime,
    median_ms,
    name_dataclass_constructors,
    quantiles,
    series_count,
)

GPUS = 8
POLL_INTERVAL = 1.0  # virtual seconds between polls: the agent's default cadence
WARM_UP_POLLS = 5  # static info, GPM's first sample, process names, cgroups, the kubelet's first answer
BASE, DENSE, OVER = 8, 110, 250  # the sizes the bars compare
BAR_DENSE_OVER_BASE = 3.0
BAR_OVER_OVER_DENSE = 2.3
BAR_SCRAPE_SPEEDUP = 10.0
SCRAPE_BLOCK = 5  # scrapes timed in a row on one side before the other side's (see measure_scrapes)
PHASES = ("devices", "attribution", "enforcement", "accounting", "hints", "other")


def scenario(pods: int) -> dict[str, Any]:
    """``pods`` processes spread round-robin over 8 H100s; each GPU's tenants together keep it about 60-100 %
    busy, each on a sine of its own, so every poll's figures differ from the last one's."""
    per_gpu = math.ceil(pods / GPUS)
    top = min(100, max(1, 120 // per_gpu))
    processes = [
        {"name": f"tenant-{i}", "gpu": i % GPUS, "memory": f"{512 + 256 * (i % 4)}Mi",
         "sm_util": {"sine": {"min": 0, "max": top, "period": 20 + 5 * (i % 7), "phase": i % 13}}}
        for i in range(pods)
    ]
    return {"version": 1, "name": f"scale-{pods}", "hostname": "hgx-h100-01",
            "gpus": [{"model": "H100-SXM5-80GB", "count": GPUS}], "processes": processes}


class PhaseClock:
    """Sums the process CPU time of each of the agent's per-poll steps (wrapping them as instance
    attributes), and the garbage collector's time (``gc.callbacks``; wherever it struck, that step's time
    holds it too)."""

    def __init__(self, agent: Any, simulator: SimulatorTime) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.gc_seconds = 0.0
        self._gc_started = 0.0
        self._simulator = simulator
        self._wrap_async(agent.devices, "poll", "devices", net_of_simulator=True)
        self._wrap_async(agent.pods, "attribute", "attribution")
        self._wrap(agent.accountant, "update", "accounting")
        self._wrap(agent.hints, "update", "hints")
        if agent.enforcer is not None:
            self._wrap(agent.enforcer, "update", "enforcement")
        gc.callbacks.append(self._collecting)

    def close(self) -> None:
        gc.callbacks.remove(self._collecting)

    def _collecting(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.process_time()
        else:
            self.gc_seconds += time.process_time() - self._gc_started

    def _wrap(self, owner: Any, method: str, phase: str) -> None:
        fn: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.process_time() - started

        setattr(owner, method, timed)

    def _wrap_async(self, owner: Any, method: str, phase: str, *, net_of_simulator: bool = False) -> None:
        fn: Callable[..., Awaitable[Any]] = getattr(owner, method)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started, simulated = time.process_time(), self._simulator.seconds
            try:
                return await fn(*args, **kwargs)
            finally:
                spent = time.process_time() - started
                if net_of_simulator:
                    spent -= self._simulator.seconds - simulated
                self.seconds[phase] += spent

        setattr(owner, method, timed)


@dataclass
class ScaleNode:
    """One size's node: its agent, the virtual clock it and its simulator run on, the simulator's timer."""

    pods: int
    agent: Any
    clock: VirtualClock
    simulator: SimulatorTime


@asynccontextmanager
async def scale_node(pods: int, mode: str, work: Path) -> AsyncIterator[ScaleNode]:
    """The simulated node of ``pods`` pods with its kubelet, API server and agent, warmed up."""
    from gpuagent.devices.sim import SimulatedNvml, load_scenario

    work.mkdir(parents=True, exist_ok=True)
    path = work / f"scale-{pods}.json"
    path.write_text(json.dumps(scenario(pods)))  # JSON: a YAML subset the simulator reads quickly
    clock = VirtualClock()
    simulator = SimulatorTime(SimulatedNvml(load_scenario(path), clock=clock.monotonic))
    per_gpu = math.ceil(pods / GPUS)
    annotations = {"gpuagent.io/gpu-share": f"{max(1, 100 // per_gpu)}%", "gpuagent.io/gpu-memory": "4Gi"}
    keys = {"poll_interval": POLL_INTERVAL, "mode": mode, "journal_path": str(work / "journal.json"),
            "cgroup_root": str(work / "cgroup"), "network": False, "idle_events": "off"}
    async with kubelet_node(work) as node:
        kubelet_pods, api_pods = one_pod_per_process(simulator, node.work / "proc", annotations=annotations)
        uuids = [simulator.nvmlDeviceGetUUID(simulator.nvmlDeviceGetHandleByIndex(i)) for i in range(GPUS)]
        node.kubelet.set_allocatable([gpus(*(f"{u}::{n}" for u in uuids for n in range(per_gpu)))])
        node.add_pods(kubelet_pods, api_pods)
        async with running_agent(node, simulator, path, clock=clock, **keys) as agent:
            for _ in range(WARM_UP_POLLS):
                clock.advance(POLL_INTERVAL)
                await agent.poll_once()
            yield ScaleNode(pods, agent, clock, simulator)


async def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Every size's node at once, polled in turn (a change of the machine's load meets every size alike),
    then each one's scrapes."""
    from gpuagent.export import scrape

    thresholds = gc.get_threshold()
    async with AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(scale_node(pods, args.mode, work / str(pods)))
                 for pods in args.sizes]
        if args.gc == "agent":
            from gpuagent.agent import tune_garbage_collector

            tune_garbage_collector()
        try:
            if args.profile is not None:  # a pass of its own: the profiler's overhead is in no figure
                for node in nodes:
                    await profile_polls(node, scrape, args.polls, args.profile / f"scale-{node.pods}")
            polls = await measure_polls(nodes, args.polls)
            scrapes = [await measure_scrapes(node, scrape, args.scrapes, args.scrape_every) for node in nodes]
        finally:
            gc.unfreeze()
            gc.set_threshold(*thresholds)
        return [{**describe(node, scrape), **poll, **scraped}
                for node, poll, scraped in zip(nodes, polls, scrapes, strict=True)]


def describe(node: ScaleNode, scrape: Callable[..., Any]) -> dict[str, Any]:
    """What the node holds: pods, processes, those named, series (ours and prometheus-client's)."""
    snapshot = node.agent.latest
    body = scrape(node.agent.registry, None, None).body.decode()
    baseline = PrometheusClientRender(body).render().decode()
    return {
        "pods": node.pods,
        "processes": sum(len(g.processes) for g in snapshot.gpus),
        "processes_named_by_api_server": sum(
            1 for g in snapshot.gpus for p in g.processes if p.workload and p.workload.namespace),
        "series": series_count(body),
        "series_prometheus_client": series_count(baseline),
        "exposition_bytes": len(body.encode()),
    }


async def measure_polls(nodes: list[ScaleNode], count: int) -> list[dict[str, Any]]:
    """``count`` polls of each node, in turn, back to back: what the garbage collector does in between
    is theirs."""
    clocks = [PhaseClock(node.agent, node.simulator) for node in nodes]
    figures = [_PollFigures() for _ in nodes]
    try:
        for _ in range(count):
            for node, phase_clock, seen in zip(nodes, clocks, figures, strict=True):
                node.clock.advance(POLL_INTERVAL)
                parts, simulated = dict(phase_clock.seconds), node.simulator.seconds
                collected = phase_clock.gc_seconds
                wall, cpu = time.perf_counter(), time.process_time()
                await node.agent.poll_once()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                inside = node.simulator.seconds - simulated
                own = max(0.0, cpu - inside)
                spent = {p: phase_clock.seconds[p] - parts[p] for p in PHASES if p != "other"}
                spent["other"] = max(0.0, own - sum(spent.values()))
                seen.add(wall, inside, own, phase_clock.gc_seconds - collected, spent)
    finally:
        for phase_clock in clocks:
            phase_clock.close()
    return [seen.figures() for seen in figures]


@dataclass
class _PollFigures:
    walls: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    collected: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})

    def add(self, wall: float, inside: float, own: float, collected: float, spent: dict[str, float]) -> None:
        self.walls.append(wall)
        self.inside.append(inside)
        self.own.append(own)
        self.collected.append(collected)
        for phase, seconds in spent.items():
            self.phases[phase].append(seconds)

    def figures(self) -> dict[str, Any]:
        return {
            "poll_wall": quantiles(self.walls),
            "poll_inside_simulator": quantiles(self.inside),
            "poll_own": {**quantiles(self.own), "mean_ms": round(statistics.fmean(self.own) * 1000, 3)},
            "phases_median_ms": {p: median_ms(v) for p, v in self.phases.items()},
            "poll_garbage_collection": {
                "mean_ms": round(statistics.fmean(self.collected) * 1000, 3),
                "share_of_own": round(sum(self.collected) / max(sum(self.own), 1e-9), 3),
            },
        }


async def measure_scrapes(
    node: ScaleNode, scrape: Callable[..., Any], count: int, every: int = 1
) -> dict[str, Any]:
    """Our scrape of a new snapshot ``every`` polls after the last scrape, and prometheus-client rendering
    the same series, each timed right after ``every`` polls, in alternating blocks of ``SCRAPE_BLOCK``: a
    change of the machine's load meets both sides alike, and neither side's timing follows the other's work.
    (prometheus-client's parse and render leave some 100,000 freed objects behind; a scrape timed right
    after them allocates into that cold memory and took 1.3-1.5 times as long as after a poll alone.) The
    first scrape of each of our blocks, after the other side's, is not timed."""
    ours: list[float] = []
    stock: list[float] = []
    cheaper: list[float] = []

    async def poll() -> None:
        node.clock.advance(POLL_INTERVAL)
        await node.agent.poll_once()

    while len(ours) < count:
        await poll()
        scrape(node.agent.registry, None, None)
        bodies = []
        for _ in range(min(SCRAPE_BLOCK, count - len(ours))):
            for _ in range(every):
                await poll()
            started = time.process_time()
            bodies.append(scrape(node.agent.registry, None, None).body)
            ours.append(time.process_time() - started)
        for body in bodies:
            for times, add_sample in ((stock, False), (cheaper, True)):
                baseline = PrometheusClientRender(body.decode(), add_sample=add_sample)
                for _ in range(every):  # as many polls as before ours: as much else in the caches
                    await poll()
                started = time.process_time()
                baseline.render()
                times.append(time.process_time() - started)
    return {
        "scrape_new_snapshot": quantiles(ours),
        "prometheus_client_render": quantiles(stock),
        "scrape_speedup": round(median_ms(stock) / max(median_ms(ours), 1e-6), 1),
        "prometheus_client_add_sample": quantiles(cheaper),
        "scrape_speedup_add_sample": round(median_ms(cheaper) / max(median_ms(ours), 1e-6), 1),
    }


async def profile_polls(node: ScaleNode, scrape: Callable[..., Any], count: int, stem: Path) -> None:
    """cProfile over ``count`` polls and as many scrapes of their snapshots: ``<stem>-poll.pstats`` and
    ``<stem>-scrape.pstats`` (``python -m pstats`` reads them), and the top functions on stderr. The
    event loop's thread only: the GPUs are read on threads of their own."""
    import cProfile
    import pstats

    stem.parent.mkdir(parents=True, exist_ok=True)
    name_dataclass_constructors()
    polling, scraping = cProfile.Profile(), cProfile.Profile()
    for _ in range(count):
        node.clock.advance(POLL_INTERVAL)
        polling.enable()
        await node.agent.poll_once()
        polling.disable()
        scraping.enable()
        scrape(node.agent.registry, None, None)
        scraping.disable()
    for name, profiler in (("poll", polling), ("scrape", scraping)):
        path = stem.parent / f"{stem.name}-{name}.pstats"
        profiler.dump_stats(path)
        print(f"--- {path} (by own time)", file=sys.stderr)
        pstats.Stats(str(path), stream=sys.stderr).sort_stats("tottime").print_stats(25)


def verdict(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The bars, as ratios of this run's medians (a bar whose sizes were not run is left out)."""
    own = {r["pods"]: r["poll_own"]["median_ms"] for r in results}
    out: dict[str, Any] = {}
    for name, (low, high), bar in (("own_poll_110_over_8", (BASE, DENSE), BAR_DENSE_OVER_BASE),
                                   ("own_poll_250_over_110", (DENSE, OVER), BAR_OVER_OVER_DENSE)):
        if low in own and high in own:
            ratio = own[high] / own[low]
            out[name] = {"ratio": round(ratio, 2), "bar": bar, "pass": ratio <= bar}
    slowest = min(r["scrape_speedup"] for r in results)
    out["scrape_speedup_min"] = {"ratio": slowest, "bar": BAR_SCRAPE_SPEEDUP,
                                 "pass": slowest >= BAR_SCRAPE_SPEEDUP}
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = ("pods", "series", "poll wall", "in sim", "own", *PHASES, "gc", "scrape", "prom-client", "x",
            "x add_sample")
    rows = [head]
    for r in results:
        rows.append((
            str(r["pods"]), str(r["series"]), f'{r["poll_wall"]["median_ms"]:.2f}',
            f'{r["poll_inside_simulator"]["median_ms"]:.2f}', f'{r["poll_own"]["median_ms"]:.2f}',
            *(f'{r["phases_median_ms"][p]:.2f}' for p in PHASES),
            f'{r["poll_garbage_collection"]["mean_ms"]:.2f}',
            f'{r["scrape_new_snapshot"]["median_ms"]:.2f}',
            f'{r["prometheus_client_render"]["median_ms"]:.2f}', f'{r["scrape_speedup"]:.1f}',
            f'{r["scrape_speedup_add_sample"]:.1f}',
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines) + (
        "\n(ms of CPU time, medians; gc: the garbage collector's mean per poll; "
        "in sim: the simulator inside NVML calls, not the agent's;\n"
        "prom-client: typed families filled with add_metric; x add_sample: against Metric.add_sample "
        "with prebuilt label dicts)"
    )


def plot(results: list[dict[str, Any]], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pods = [r["pods"] for r in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    left.plot(pods, [r["poll_own"]["median_ms"] for r in results], "o-", color="black",
              label="the agent's own work")
    for phase in PHASES:
        left.plot(pods, [r["phases_median_ms"][phase] for r in results], ".--", label=phase)
    left.plot(pods, [r["poll_inside_simulator"]["median_ms"] for r in results], "x:", color="grey",
              label="inside the simulated NVML")
    left.set(xlabel="pods on the node (8 GPUs)", ylabel="ms of CPU per poll (median)", title="A poll")
    right.plot(pods, [r["scrape_new_snapshot"]["median_ms"] for r in results], "o-",
               label="gpuagent /metrics")
    right.plot(pods, [r["prometheus_client_render"]["median_ms"] for r in results], "s-",
               label="prometheus-client, the same series")
    right.set(xlabel="pods on the node (8 GPUs)", ylabel="ms of CPU (median)",
              title="A scrape of a new snapshot")
    for axis in (left, right):
        axis.set_xticks(pods)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"gpuagent on a simulated 8xH100 node ({machine})", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def machine_name() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gpuagent-scale-") as tmp:
        return await measure(args, Path(tmp))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 110, 250], help="pods on the node")
    parser.add_argument("--polls", type=int, default=200, help="polls measured per size")
    parser.add_argument("--scrapes", type=int, default=40, help="scrapes measured per size")
    parser.add_argument("--scrape-every", type=int, default=15,
                        help="polls between two scrapes (15: every 15 s at the default 1 s poll interval)")
    parser.add_argument("--mode", choices=("off", "audit", "enforce"), default="audit")
    parser.add_argument("--gc", choices=("agent", "default"), default="agent",
                        help="the garbage collector as gpuagent run tunes it, or CPython's defaults")
    parser.add_argument("--profile", type=Path, default=None,
                        help="directory for cProfile statistics of each size (a pass before the timed one)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG file (default: under --out)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    if any(n < 1 for n in args.sizes) or min(args.polls, args.scrapes, args.scrape_every) < 1:
        parser.error("--sizes, --polls, --scrapes and --scrape-every must be at least 1")
    if importlib.util.find_spec("matplotlib") is None:  # said before minutes of measuring, not after
        parser.error("the plot needs matplotlib, a test extra: make install-test (pip install -e '.[test]')")
    logging_off()
    results = asyncio.run(run(args))
    machine = machine_name()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    plot_path = args.plot or args.out / f"scale_{stamp}.png"
    plot(results, plot_path, machine)
    figures = {"machine": machine, "mode": args.mode, "gc": args.gc, "polls": args.polls,
               "scrapes": args.scrapes, "scrape_every": args.scrape_every, "sizes": results,
               "bars": verdict(results), "plot": str(plot_path)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"scale_{stamp}.json").write_text(json.dumps(figures, indent=1))
    print(table(results))
    print(f"plot: {plot_path}")
    print(json.dumps(figures))
    return 0


def logging_off() -> None:
    """The agent's warnings (audit mode, no freezer under the bench's cgroup root) say nothing here."""
    import logging

    logging.getLogger("gpuagent").setLevel(logging.ERROR)


if __name__ == "__main__":
    raise SystemExit(main())
