"""The per-poll parts of the agent, replayed: the same recorded polls through fresh consumers, best of N.

    .venv/bin/python bench/bench_parts.py [--sizes 8 110 250] [--polls 60] [--repeat 7] [--mode audit]

``bench_scale`` measures whole polls of a live node, where the device reads, the event loop and this shared
machine's load move every figure by 10-20 %. To see what a change to one part saves, this bench records
the inputs of ``--polls`` polls of the same simulated node (``bench_scale.scale_node``): the arguments of
the attribution (``Attributor.attribute``) and the snapshots the enforcer, the accountant and the hints
engine were given. Then, ``--repeat`` times, it feeds each part a fresh instance of itself (built from the
agent's config as ``gpuagent run`` builds it, on a clock that reads each snapshot's time) with those
inputs in order, and takes each part's CPU time over the polls after the first ``WARM_UP`` (the garbage
collector off, so none of its passes lands in one part and not another). It prints the best of the
repeats per part, in microseconds a poll and a pod, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_scale import POLL_INTERVAL, logging_off, machine_name, scale_node

PARTS = ("attribution", "enforcement", "accounting", "hints")
WARM_UP = 10  # replayed polls not timed: the consumers' windows and caches fill


class _Recorder:
    """Wraps a method as an instance attribute and keeps the arguments of every call."""

    def __init__(self, owner: Any, method: str) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        fn = getattr(owner, method)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((args, kwargs))
            return fn(*args, **kwargs)

        setattr(owner, method, recorded)


async def record(pods: int, mode: str, polls: int, work: Path) -> dict[str, Any]:
    """The inputs of ``polls`` polls of the node, and what builds a fresh consumer of each part."""
    from gpuagent.agent import build_accountant, build_enforcer
    from gpuagent.hints.engine import HintsEngine
    from gpuagent.pods.attribution import Attributor

    async with scale_node(pods, mode, work) as node:
        agent = node.agent
        attributor = agent.pods._attributor
        recorders = {"attribution": _Recorder(attributor, "attribute"),
                     "accounting": _Recorder(agent.accountant, "update"),
                     "hints": _Recorder(agent.hints, "update")}
        if agent.enforcer is not None:
            recorders["enforcement"] = _Recorder(agent.enforcer, "update")
        for _ in range(polls):
            node.clock.advance(POLL_INTERVAL)
            await agent.poll_once()
        config, node_names = agent.config, attributor._node_names
    builders: dict[str, Callable[[Callable[[], float]], Callable[..., Any]]] = {
        "attribution": lambda clock: Attributor(node_names).attribute,
        "accounting": lambda clock: build_accountant(config).update,
        "hints": lambda clock: HintsEngine().update,
        "enforcement": lambda clock: build_enforcer(config, monotonic=clock).update,  # type: ignore[union-attr]
    }
    return {part: (builders[part], recorder.calls) for part, recorder in recorders.items()}


def replay(build: Callable[[Callable[[], float]], Callable[..., Any]],
           calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> float:
    """CPU seconds per poll of a fresh consumer over the recorded calls after the first WARM_UP."""
    now = [0.0]
    update = build(lambda: now[0])
    spent = 0.0
    for i, (args, kwargs) in enumerate(calls):
        snapshot = args[0] if args else None
        now[0] = getattr(snapshot, "taken_at_monotonic", now[0] + POLL_INTERVAL)
        started = time.process_time()
        update(*args, **kwargs)
        if i >= WARM_UP:
            spent += time.process_time() - started
    return spent / max(1, len(calls) - WARM_UP)


async def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    results = []
    for pods in args.sizes:
        recorded = await record(pods, args.mode, args.polls, work / str(pods))
        best: dict[str, float] = {}
        gc.disable()
        try:
            for _ in range(args.repeat):
                for part, (build, calls) in recorded.items():
                    gc.collect()
                    seconds = replay(build, calls)
                    best[part] = min(best.get(part, seconds), seconds)
        finally:
            gc.enable()
        us = {part: round(best[part] * 1e6, 1) for part in PARTS if part in best}
        results.append({"pods": pods, "us_per_poll": us,
                        "us_per_poll_per_pod": {p: round(v / pods, 2) for p, v in us.items()}})
    return results


def table(results: list[dict[str, Any]]) -> str:
    parts = [p for p in PARTS if p in results[0]["us_per_poll"]]
    rows = [("pods", *parts, "sum")]
    for r in results:
        figures = [r["us_per_poll"][p] for p in parts]
        rows.append((str(r["pods"]), *(f"{v:.0f}" for v in figures), f"{sum(figures):.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines) + "\n(µs of CPU a poll, the best of the repeats, the garbage collector off)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 110, 250], help="pods on the node")
    parser.add_argument("--polls", type=int, default=60, help="polls recorded per size")
    parser.add_argument("--repeat", type=int, default=7, help="replays of each part; the best counts")
    parser.add_argument("--mode", choices=("off", "audit", "enforce"), default="audit")
    args = parser.parse_args()
    if any(n < 1 for n in args.sizes) or args.polls <= WARM_UP or args.repeat < 1:
        parser.error(f"--sizes must be at least 1, --polls more than {WARM_UP}, --repeat at least 1")
    logging_off()
    with tempfile.TemporaryDirectory(prefix="gpuagent-parts-") as tmp:
        results = asyncio.run(measure(args, Path(tmp)))
    print(table(results))
    print(json.dumps({"machine": machine_name(), "mode": args.mode, "polls": args.polls,
                      "repeat": args.repeat, "sizes": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
