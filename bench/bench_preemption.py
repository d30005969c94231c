"""What the latency class's sensing costs the agent, and what it reads: its process's CPU time while a
:class:`Preemption` watches one latency workload whose ``cpu.stat`` it rereads, the event loop otherwise
idle.

Usage: .venv/bin/python bench/bench_preemption.py [--designs shipped,still,5ms,1ms] [--loads busy,0.1,0.3,0.6]
       [--seconds 10] [--rounds 2]

The workload is a service in a v2 cgroup of its own, made here (root): a process that spins through
requests (as CUDA's synchronisation spins while a request's kernels run) arriving as a Poisson process, each
2-12 x 1.6 ms long (the model's ``Serve``), sleeping between them, at a ``--loads`` part of its time;
``busy``: it spins all the time (a service with a request always in hand: the fastest reading throughout,
the sensing's worst case). Its batch neighbour's freezes go nowhere. Designs: ``shipped`` (the
controller's defaults: fast while a hold is on, slow otherwise, an end read at the first tick the CPU
stood still through: ``ticks.py``), ``still`` (the same, an end read once the CPU stood still a tick and
1 ms), ``5ms`` and ``1ms`` (a fixed period, as measured before). The designs alternate, ``--rounds`` times
each, the median shown. One line per design and load: the percent of a core, the readings a second, the
CPU per reading, the part of the time the batch neighbour was held against the part the service's CPU was
busy (held less: starts read late or holds broken; more: ends read late), the hand-off from the reading
that changed a hold to the loop's applying it (median and 99th percentile), and the machine's load
average. The agent's budget is 2 % of a core in all (docs/isolation.md, the latency class).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuagent.enforce.actions.mounts import Hierarchies
from gpuagent.enforce.cpustat import CpuStat
from gpuagent.enforce.journal import FreezeTarget
from gpuagent.enforce.timeslice import Cycler, LatencyController, Preemption, RotationPlan, Tenant
from gpuagent.enforce.timeslice.ticks import KernelTicks

# name -> (the controller, whether the kernel's ticks are read: ticks.py)
DESIGNS: dict[str, tuple[Callable[[], LatencyController], bool]] = {
    "shipped": (lambda: LatencyController({"svc"}), True),
    "still": (lambda: LatencyController({"svc"}), False),
    "5ms": (lambda: LatencyController({"svc"}, sense_s=0.005, idle_sense_s=0.005, ended=0.0), False),
    "1ms": (lambda: LatencyController({"svc"}, sense_s=0.001, idle_sense_s=0.001, ended=0.0), False),
}

# argv: the cgroup.procs to join, the load (0 < load < 1, or 1 to spin always), a seed
_SERVICE = """
import os, random, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
load, rng = float(sys.argv[2]), random.Random(int(sys.argv[3]))
at = time.monotonic()
while True:
    if load >= 1.0:
        continue
    at += rng.expovariate(load / (7 * 0.0016))
    time.sleep(max(0.0, at - time.monotonic()))
    end = time.monotonic() + rng.randint(2, 12) * 0.0016
    while time.monotonic() < end:
        pass
"""


class _Timed(Preemption[FreezeTarget]):
    """A preemption that stamps each reading that changed a hold, and each application of one."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.changed_at: dict[Hashable, float] = {}
        self.handoffs: list[float] = []

    def sense(self, now: float, ticks: KernelTicks | None = None) -> list[Hashable]:
        changed = super().sense(now, ticks)
        for group in changed:
            self.changed_at.setdefault(group, time.monotonic())
        return changed

    def apply(self, group: Hashable) -> None:
        super().apply(group)
        at = self.changed_at.pop(group, None)
        if at is not None:
            self.handoffs.append(time.monotonic() - at)


class _Held:
    """How long the batch neighbour was held (its freezes go nowhere; the cycler's calls are timed)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.since: float | None = None

    def freeze(self, target: FreezeTarget) -> None:
        self.since = time.monotonic()

    def thaw(self, target: FreezeTarget) -> None:
        if self.since is not None:
            self.seconds += time.monotonic() - self.since
            self.since = None


async def cost(design: tuple[Callable[[], LatencyController], bool], seconds: float, cgroup: str,
               v2_mount: str) -> dict[str, float]:
    """The figures of one run of ``seconds`` watching ``cgroup``."""
    held = _Held()
    cycler: Cycler[FreezeTarget] = Cycler(held.freeze, held.thaw, plan=RotationPlan(1.0))
    build, ticks = design
    controller = build()
    controller.update(0.0, [Tenant("svc", 0.1, 0.3), Tenant("batch", 0.5, 0.7)])
    preemption = _Timed(cycler, CpuStat(v2_mount=v2_mount).open, ticks="kernel" if ticks else None)
    usage = CpuStat(v2_mount=v2_mount).open([FreezeTarget("v2", cgroup)])[0]
    preemption.watch("gpu0", controller, {"svc": [FreezeTarget("v2", cgroup)]},
                     {"batch": [FreezeTarget("v2", "/nowhere")]})
    task = asyncio.create_task(preemption.run())
    await asyncio.sleep(0.5)
    held.thaw(FreezeTarget("v2", "/nowhere"))
    cpu, wall, readings, held.seconds = time.process_time(), time.monotonic(), preemption.readings, 0.0
    used = usage.seconds() or 0.0
    if held.since is not None or controller.frozen():
        held.since = wall
    preemption.handoffs.clear()
    await asyncio.sleep(seconds)
    held.thaw(FreezeTarget("v2", "/nowhere"))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    used = (usage.seconds() or 0.0) - used
    usage.close()
    readings = preemption.readings - readings
    task.cancel()
    handoffs = sorted(preemption.handoffs) or [float("nan")]
    return {"percent": cpu / wall * 100.0, "per_s": readings / wall, "us": cpu / max(readings, 1) * 1e6,
            "held": held.seconds / wall, "busy": used / wall,
            "handoff_p50_ms": 1e3 * handoffs[len(handoffs) // 2],
            "handoff_p99_ms": 1e3 * handoffs[min(len(handoffs) - 1, int(0.99 * len(handoffs)))]}


def service(v2_mount: str, load: float, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    """A spinning service at ``load`` in a new v2 cgroup: the process and the cgroup's path."""
    cgroup = f"/gpuagent-bench-{os.getpid()}"
    directory = os.path.join(v2_mount, cgroup.lstrip("/"))
    os.makedirs(directory, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _SERVICE, os.path.join(directory, "cgroup.procs"),
                             str(load), str(seed)])
    procs = Path(directory, "cgroup.procs")
    for _ in range(200):  # until it has joined
        if procs.read_text().strip():
            break
        time.sleep(0.01)
    return proc, cgroup


def stop(proc: subprocess.Popen[bytes], v2_mount: str, cgroup: str) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(100):
        try:
            os.rmdir(os.path.join(v2_mount, cgroup.lstrip("/")))
            return
        except OSError:
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", default="shipped,still,5ms,1ms")
    parser.add_argument("--loads", default="busy,0.1,0.3,0.6")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    v2_mount = Hierarchies("/sys/fs/cgroup").mountpoints.get("v2")
    if v2_mount is None or not os.access(v2_mount, os.W_OK):
        print("no writable cgroup v2 hierarchy here (root, a v2 mount)", file=sys.stderr)
        return 2
    designs = args.designs.split(",")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped run still removes its service
    for load_text in args.loads.split(","):
        load = 1.0 if load_text == "busy" else float(load_text)
        runs: dict[str, list[dict[str, float]]] = {d: [] for d in designs}
        proc, cgroup = service(v2_mount, load, seed=29)
        try:
            for _ in range(args.rounds):
                for design in designs:
                    runs[design].append(asyncio.run(cost(DESIGNS[design], args.seconds, cgroup, v2_mount)))
        finally:
            stop(proc, v2_mount, cgroup)
        for design in designs:
            f = {k: statistics.median(r[k] for r in runs[design]) for k in runs[design][0]}
            print(f"{design} at {load_text}: {f['percent']:.2f} % of a core, "
                  f"{f['per_s']:.0f} readings a second, {f['us']:.0f} us of CPU a reading, "
                  f"held {f['held']:.1%} (its CPU busy {f['busy']:.1%}), hand-off "
                  f"{f['handoff_p50_ms']:.2f} / {f['handoff_p99_ms']:.2f} ms, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
