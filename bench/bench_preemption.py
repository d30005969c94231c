"""What the latency class's sensing costs the agent: its process's CPU time while a :class:`Preemption`
watches one latency workload, its ``cpu.stat`` reread every period, the event loop otherwise idle.

Usage: .venv/bin/python bench/bench_preemption.py [--periods 0.001,0.002,0.005,0.01] [--seconds 10]
       [--cgroup /]

The workload is the v2 cgroup ``--cgroup`` (the unified hierarchy's root by default, whose CPU always
moves: a service with a request always in hand, so the readings never change what is held and the figure
is the sensing alone); its batch neighbour's freezes go nowhere. One line per period: the percent of a core
and the CPU per reading. The agent's budget is 2 % of a core (docs/isolation.md, the latency class).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuagent.enforce.actions.mounts import Hierarchies
from gpuagent.enforce.cpustat import CpuStat
from gpuagent.enforce.journal import FreezeTarget
from gpuagent.enforce.timeslice import Cycler, LatencyController, Preemption, RotationPlan, Tenant


async def cost(period: float, seconds: float, cgroup: str, v2_mount: str) -> tuple[float, float]:
    """(percent of a core, microseconds of CPU per reading) over ``seconds``."""
    cycler: Cycler[FreezeTarget] = Cycler(lambda target: None, lambda target: None, plan=RotationPlan(1.0))
    controller = LatencyController({"svc"}, sense_s=period)
    controller.update(0.0, [Tenant("svc", 0.1, 0.3), Tenant("batch", 0.5, 0.7)])
    preemption = Preemption(cycler, CpuStat(v2_mount=v2_mount).open, period_s=period)
    preemption.watch("gpu0", controller, {"svc": [FreezeTarget("v2", cgroup)]},
                     {"batch": [FreezeTarget("v2", "/nowhere")]})
    task = asyncio.create_task(preemption.run())
    await asyncio.sleep(0.5)
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    task.cancel()
    return cpu / wall * 100.0, cpu / (wall / period) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--periods", default="0.001,0.002,0.005,0.01")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cgroup", default="/")
    args = parser.parse_args(argv)
    v2_mount = Hierarchies("/sys/fs/cgroup").mountpoints.get("v2")
    if v2_mount is None or not os.path.exists(os.path.join(v2_mount, args.cgroup.lstrip("/"), "cpu.stat")):
        print("no cgroup v2 cpu.stat to read here", file=sys.stderr)
        return 2
    for period in (float(p) for p in args.periods.split(",")):
        percent, per_reading = asyncio.run(cost(period, args.seconds, args.cgroup, v2_mount))
        print(f"period {period * 1e3:g} ms: {percent:.2f} % of a core, {per_reading:.0f} us of CPU a reading")
    return 0


if __name__ == "__main__":
    sys.exit(main())
