"""Benchmark the hints scoring: ``score_node`` over 100 nodes' hints (the extender's path) and
``POST /v1/hints/score`` on the agent (server-side, and a loopback round trip).

Usage: .venv/bin/python bench/bench_hints.py [--nodes 100] [--rounds 300] [--requests 1000]

- nodes: the hints of the simulated 8xH100 busy node, the MIG A100 node and the node with a lost GPU (the
  agent's real hints of each, polled through the simulator), repeated with other hostnames and shifted
  figures up to ``--nodes`` nodes, as an extender holds them in memory;
- score_node: one round scores one request against every node (what a filter call does per pod); the
  median and p95 of ``--rounds`` rounds per request kind, plus per node;
- POST /v1/hints/score: parse, score and serialise, timed inside the server (a middleware around the
  handler), and the loopback round trip of a keep-alive client, ``--requests`` each.
Medians and p95 over repeated runs: this machine is noisy, single timings mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' simulated-node helpers

from test_hints_score import A100_MIG, FAULTS, H100, sim_snapshot  # noqa: E402

from gpuagent.api.app import build_app  # noqa: E402
from gpuagent.export import build_registry  # noqa: E402
from gpuagent.hints.score import parse_fit_request, score_node  # noqa: E402
from gpuagent.snapshot.hints import NodeHints  # noqa: E402
from gpuagent.snapshot.node import NodeSnapshot  # noqa: E402

REQUESTS = {
    "shared": {"gpus": 1, "memory": "20Gi", "share": 0.3},
    "shared_x2_spread": {"gpus": 2, "memory": "8Gi", "share": 0.1, "policy": "spread"},
    "exclusive": {"gpus": 1, "exclusive": True},
    "mig": {"mig_profile": "1g.10gb"},
}


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p95": ordered[int(0.95 * (len(ordered) - 1))],
            "n": len(ordered)}


def many_nodes(count: int) -> list[NodeHints]:
    bases = []
    for scenario, times in ((H100, (60.0, 61.0)), (A100_MIG, (30.0, 31.0)), (FAULTS, (55.0, 70.0))):
        hints = sim_snapshot(scenario, *times).hints
        assert hints is not None
        bases.append(hints)
    nodes = []
    for i in range(count):
        base = bases[i % len(bases)]
        shift = (i % 7) / 20  # other nodes are more or less loaded
        gpus = tuple(
            replace(g, schedulable_share_ratio=max(0.0, min(1.0, g.schedulable_share_ratio - 0.15 + shift)))
            for g in base.gpus
        )
        nodes.append(replace(base, hostname=f"node-{i:04d}", gpus=gpus))
    return nodes


def bench_score_node(nodes: list[NodeHints], rounds: int) -> dict[str, object]:
    now = max(n.taken_at_unix for n in nodes)
    out: dict[str, object] = {}
    for name, body in REQUESTS.items():
        request = parse_fit_request(body)
        timings = []
        fits = 0
        for _ in range(rounds):
            started = time.perf_counter()
            results = [score_node(n, request, now=now, max_age_seconds=30.0) for n in nodes]
            timings.append(time.perf_counter() - started)
            fits = sum(r.fits for r in results)
        q = quantiles(timings)
        out[name] = {"round_ms": {k: (v * 1000 if k != "n" else v) for k, v in q.items()},
                     "per_node_us_median": q["median"] / len(nodes) * 1e6, "nodes_fitting": fits}
    return out


async def bench_http(snapshot: NodeSnapshot, requests: int) -> dict[str, object]:
    clock = lambda: snapshot.taken_at_unix + 1  # noqa: E731
    app = build_app(lambda: snapshot, build_registry(lambda: snapshot, clock=clock), clock=clock)
    handler_seconds: list[float] = []

    @web.middleware
    async def timed(request: web.Request, handler):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            if request.path == "/v1/hints/score":
                handler_seconds.append(time.perf_counter() - started)

    app.middlewares.append(timed)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    out: dict[str, object] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for name, body in REQUESTS.items():
                handler_seconds.clear()
                round_trips = []
                payload = json.dumps(body).encode()
                for _ in range(requests):
                    started = time.perf_counter()
                    async with session.post(f"http://127.0.0.1:{port}/v1/hints/score", data=payload,
                                            headers={"Content-Type": "application/json"}) as response:
                        await response.read()
                        assert response.status == 200, response.status
                    round_trips.append(time.perf_counter() - started)
                server = quantiles(handler_seconds)
                client = quantiles(round_trips)
                out[name] = {"server_us": {k: (v * 1e6 if k != "n" else v) for k, v in server.items()},
                             "round_trip_us": {k: (v * 1e6 if k != "n" else v) for k, v in client.items()}}
    finally:
        await runner.cleanup()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    nodes = many_nodes(args.nodes)
    results = {
        "nodes": args.nodes,
        "score_node": bench_score_node(nodes, args.rounds),
        "post_score": asyncio.run(bench_http(sim_snapshot(H100, 60.0, 61.0), args.requests)),
    }
    print(json.dumps(results, indent=2))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"hints_{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
