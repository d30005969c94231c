"""Benchmark one poll and one scrape on the simulated 8xH100 / 64-process node, and the agent's footprint.

Usage: .venv/bin/python bench/bench_poll_scrape.py [--polls 300] [--scrapes 500] [--soak 60]
(each scrape measured follows a poll of its own: --scrapes 500 polls 500 more times)

- poll: ``Agent.poll_once()`` end to end, with attribution: NVML reads on the per-GPU threads, every process's
  cgroup (a /proc tree of kubelet-shaped cgroup files), the kubelet's allocations (the real gRPC
  pod-resources server of the tests, one pod per process, time-sliced replicas) and the pods' names from the
  API server (the tests' fake one, watched as in a cluster), snapshot build. On the
  simulator the "NVML" time is the simulator's own Python, so the figure is an upper bound for the
  agent's share; the agent's own overhead (poll minus time inside NVML calls) is reported separately.
- scrape: the server-side cost of ``/metrics`` (``export.scrape``: rendering the registry, encoding, and
  gzip where said). ``scrape_new_snapshot``: the first scrape after a poll, which renders everything (the
  figure the target is about); ``scrape_cached``: a further scrape of the same snapshot, which re-renders
  only the clock-dependent health families. Both in text 0.0.4, plain and gzipped. Then the same through
  a real HTTP round trip on loopback.
- footprint: a real ``gpuagent run`` process polling every second for ``--soak`` seconds: CPU share of one
  core and RSS at start and end.
Medians and p95 over repeated runs: this machine is noisy, single timings mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from kubenode import kubelet_node, one_pod_per_process, running_agent
from measure import PrometheusClientRender, median_ms, quantiles, series_count

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"


async def bench_poll_and_scrape(polls: int, scrapes: int) -> dict[str, object]:
    from gpuagent.devices.sim import SimulatedNvml, load_scenario
    from gpuagent.export import scrape
    from gpuagent.httpguard import ConnectionGuard, GuardCollector

    nvml = SimulatedNvml(load_scenario(str(SCENARIO)))
    async with kubelet_node() as node:
        node.add_pods(*one_pod_per_process(nvml, node.work / "proc"))
        async with running_agent(node, nvml, SCENARIO) as agent:
            agent.registry.register(GuardCollector(ConnectionGuard()))  # as serving.py registers it
            return await _measure(agent, polls, scrapes, scrape)


async def _measure(agent, polls: int, scrapes: int, scrape) -> dict[str, object]:
    for _ in range(5):  # warm up: static info, GPM first sample, process names, cgroups
        await agent.poll_once()
    poll_times, own_times = [], []
    for _ in range(polls):
        nvml_before = sum(s.seconds_total for s in agent.devices.guard.call_stats())
        started = time.perf_counter()
        snapshot = await agent.poll_once()
        elapsed = time.perf_counter() - started
        nvml_spent = sum(s.seconds_total for s in agent.devices.guard.call_stats()) - nvml_before
        poll_times.append(elapsed)
        # The GIL serialises the 8 reader threads, so wall time minus the time inside (simulated) NVML
        # calls approximates the agent's own share of a poll.
        own_times.append(max(0.0, elapsed - nvml_spent))
    processes = sum(len(g.processes) for g in snapshot.gpus)
    timings: dict[str, list[float]] = {
        name + gz: [] for name in ("scrape_new_snapshot", "scrape_cached") for gz in ("", "_gzip")
    }
    stock: list[float] = []  # prometheus-client rendering the series of each plain new-snapshot scrape
    for index in range(scrapes):
        gzip = "gzip" if index % 2 else None  # alternate, so both see the same snapshots' mix
        suffix = "_gzip" if gzip else ""
        snapshot = await agent.poll_once()  # a new snapshot: nothing of it rendered yet
        started = time.perf_counter()
        body = scrape(agent.registry, None, gzip).body
        timings["scrape_new_snapshot" + suffix].append(time.perf_counter() - started)
        started = time.perf_counter()
        scrape(agent.registry, None, gzip)
        timings["scrape_cached" + suffix].append(time.perf_counter() - started)
        if not gzip:
            baseline = PrometheusClientRender(body.decode())
            started = time.perf_counter()
            baseline.render()
            stock.append(time.perf_counter() - started)
    body = scrape(agent.registry, None, None).body
    gzipped = scrape(agent.registry, None, "gzip").body
    series = series_count(body.decode())
    named = sum(1 for g in snapshot.gpus for p in g.processes if p.workload and p.workload.namespace)
    return {
        "gpus": len(snapshot.gpus),
        "processes": processes,
        "processes_attributed_to_named_pods": named,
        "series": series,
        "exposition_bytes": len(body),
        "exposition_gzip_bytes": len(gzipped),
        "poll": quantiles(poll_times),
        "poll_agent_overhead": quantiles(own_times),
        **{name: quantiles(times) for name, times in timings.items() if times},
        **({"prometheus_client_render": quantiles(stock), "scrape_new_snapshot_speedup_vs_prometheus_client":
            round(median_ms(stock) / median_ms(timings["scrape_new_snapshot"]), 1)} if stock else {}),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nvml_seconds(url: str) -> float:
    """Total time the agent spent inside NVML calls, from its own gpuagent_nvml_call_duration_seconds."""
    body = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("gpuagent_nvml_call_duration_seconds_sum{")
    )


def bench_process(soak: float, scrapes: int) -> dict[str, object]:
    port = free_port()
    env = {**os.environ, "GPUAGENT_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "run", "--backend", "sim", "--scenario", str(SCENARIO),
         "--listen", f"127.0.0.1:{port}", "--poll-interval", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(f"{url}/readyz", timeout=1).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        http_times = []
        for _ in range(scrapes):
            started = time.perf_counter()
            urllib.request.urlopen(f"{url}/metrics", timeout=5).read()
            http_times.append(time.perf_counter() - started)
        ps = psutil.Process(proc.pid)
        time.sleep(2)
        rss_start = ps.memory_info().rss
        nvml_start = nvml_seconds(url)
        cpu_start = sum(ps.cpu_times()[:2])
        started = time.monotonic()
        time.sleep(soak)
        cpu = sum(ps.cpu_times()[:2]) - cpu_start
        wall = time.monotonic() - started
        nvml = nvml_seconds(url) - nvml_start
        rss_end = ps.memory_info().rss
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    return {
        "scrape_http_roundtrip": quantiles(http_times),
        "soak_seconds": round(wall, 1),
        "cpu_percent_of_one_core_at_1s_polling": round(100 * cpu / wall, 2),
        # On the simulator, "NVML" is the simulator's own Python; a real driver's calls cost far less CPU.
        "of_which_inside_nvml_calls_percent": round(100 * nvml / wall, 2),
        "agent_own_cpu_percent": round(100 * (cpu - nvml) / wall, 2),
        "rss_mib_start": round(rss_start / 2**20, 1),
        "rss_mib_end": round(rss_end / 2**20, 1),
        "exit_code_on_sigterm": proc.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=300)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--soak", type=float, default=60.0, help="seconds of the CPU/RSS run (0 to skip)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the figures go")
    args = parser.parse_args()
    results: dict[str, object] = {"in_process": asyncio.run(bench_poll_and_scrape(args.polls, args.scrapes))}
    if args.soak > 0:
        results["agent_process"] = bench_process(args.soak, min(args.scrapes, 200))
    print(json.dumps(results, indent=2))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / f"poll_scrape_{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
