"""What a ``gpuagent top`` viewer costs the agent it watches, and what the view costs the viewer.

Usage: .venv/bin/python bench/bench_top.py [--seconds 20] [--runs 3]

An agent process on the tenant node of ``tests/tenant_node.py`` (simulated 8xH100, 43 pods, 64 processes,
``mode: audit``, poll every 0.5 s). In each run, the agent's CPU time (user + system, from
``/proc/PID/stat``) is taken over ``--seconds`` for each of, in turn:

- ``alone``: nobody asks;
- ``viewer``: one viewer as ``gpuagent top`` refreshes (an ``AgentWatch`` asking ``/healthz`` and
  ``/v1/state`` with If-None-Match every poll interval, 0.5 s);
- ``viewer x4``: one viewer asking four times per poll (mostly 304s: what the ETag is for);
- ``viewer, no ETag``: the same four times per poll, without If-None-Match (every ask a 200 with the body).

The figures are ratios to ``alone`` within one run (this machine is shared and noisy: absolute figures
mean little; the medians over ``--runs`` are reported). Then the viewer's side: the median time to build the
node view (``node_view``, ``arrange``, ``render.body``) of one snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tenant_node import tenant_agent  # noqa: E402

from gpuagent.top import render  # noqa: E402
from gpuagent.top.arrange import ViewOptions, arrange  # noqa: E402
from gpuagent.top.client import AgentWatch, new_session  # noqa: E402
from gpuagent.top.history import History  # noqa: E402
from gpuagent.top.model import node_view  # noqa: E402

POLL = 0.5
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def watch_for(url: str, seconds: float, every: float, etag: bool) -> int:
    """Refresh as gpuagent top does for ``seconds``; returns how many asks were 304s."""
    not_modified = 0
    async with new_session() as session:
        watch = AgentWatch(url, session)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not etag:
                watch.etag = None
            await watch.refresh()
            not_modified += watch.state is not None and not watch.state_changed
            await asyncio.sleep(every)
    return not_modified


def measure(pid: int, url: str, seconds: float, every: float | None, etag: bool = True) -> tuple[float, int]:
    before = cpu_seconds(pid)
    hits = 0
    if every is None:
        time.sleep(seconds)
    else:
        hits = asyncio.run(watch_for(url, seconds, every, etag))
    return cpu_seconds(pid) - before, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tempfile import TemporaryDirectory

    cases = {"alone": (None, True), "viewer": (POLL, True), "viewer x4": (POLL / 4, True),
             "viewer, no ETag": (POLL / 4, False)}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    with TemporaryDirectory() as tmp, tenant_agent(Path(tmp) / "node") as agent:
        url = f"http://{agent.target}"
        time.sleep(3)
        for run in range(args.runs):
            spent = {}
            for name, (every, etag) in cases.items():
                spent[name], hits = measure(agent.proc.pid, url, args.seconds, every, etag)
                print(f"run {run + 1}: {name:16} agent CPU {spent[name]:.2f} s over {args.seconds:g} s"
                      + (f" ({hits} asks answered 304)" if every else ""), flush=True)
            for name in cases:
                ratios[name].append(spent[name] / spent["alone"])
        state = asyncio.run(_one_state(url))
    print("\nagent CPU, median ratio to alone over", args.runs, "runs:")
    for name, values in ratios.items():
        print(f"  {name:16} x{statistics.median(values):.3f}")
    times = []
    for _ in range(50):
        started = time.perf_counter()
        node = node_view(state)
        render.body(arrange(node, ViewOptions()), ViewOptions(), History(), 150)
        times.append(time.perf_counter() - started)
    built = statistics.median(times) * 1e3
    print(f"\nthe viewer: one node view of {len(node.gpus)} GPUs built in {built:.1f} ms (median of 50)")


async def _one_state(url: str) -> dict:
    async with new_session() as session:
        watch = AgentWatch(url, session)
        await watch.refresh()
        assert watch.state is not None
        return watch.state


if __name__ == "__main__":
    main()
