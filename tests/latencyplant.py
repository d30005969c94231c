"""Issue 29's scenario on the contention plant: a request-driven service beside trainers, per share design.

The service (``serve``, a 30 % share) at a load of 10, 30 or 60 % of the GPU, beside one or two trainers
of one kind (``matmul``, ``deep``, ``trainer``) that share the rest equally; each design enforces those
shares as the agent would (``shareplant.Enforced``), and a run reports the service's latency, what each
tenant got and the throughput kept. ``bench/bench_latency.py`` tabulates it; ``tests/test_plant_latency.py``
checks the physics and the latency class on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shareplant import Enforced

from gpuagent.devices.sim import contention
from gpuagent.devices.sim.workloads import Serve
from gpuagent.enforce.timeslice import (
    DutyPlan,
    LatencyController,
    RotationController,
    RotationPlan,
    ShareController,
)
from gpuagent.enforce.timeslice.ticks import TickGrid

SERVICE = "svc"
SERVICE_SHARE = 0.3
LOADS = (0.1, 0.3, 0.6)
NEIGHBOURS = ("matmul", "deep", "trainer")


class Unenforced:
    """No enforcement at all: nothing is ever frozen."""

    def frozen_at(self, t: float) -> set[str]:
        return set()

    def next_change(self, t: float) -> float:
        return math.inf

    def poll(self, t: float, readings: object) -> None:
        return None


class LatencyEnforced(Enforced):
    """A :class:`LatencyController` and its rotation's plan: the plan's windows, and the batch tenants
    frozen beyond them while a latency tenant has work (read from its CPU every ``sense_s``). With
    ``ticks`` (as the agent on a kernel whose ticks share one grid) it reads around the plant's scheduler
    ticks while a hold is on and tells the controller when one lies between two readings (``ticks.py``);
    without, the controller's still time alone ends a request."""

    def __init__(self, controller: LatencyController, plan: RotationPlan,
                 shares: Mapping[str, float | None], *, ticks: bool = True, waited: float | None = 0.0) -> None:
        super().__init__(controller, plan, shares)
        self.latency = controller
        self.use_ticks = ticks
        self.waited = waited  # the CPU pressure the service's cgroup shows (None: unknown)
        self.grid: TickGrid | None = None
        self._sensed = -math.inf

    def cpu_ticks(self, tick_s: float, phase_s: float) -> None:
        if self.use_ticks:
            self.grid = TickGrid(tick_s, phase_s)
            for key in self.latency.latency:  # the plant's CPUs are never short: no task waits for one
                self.latency.waited(key, self.waited)

    @property
    def sense_s(self) -> float:
        """Seconds to the next reading: the controller's (fast while a hold is on, as the agent reads),
        placed around the ticks while it is fast."""
        period = self.latency.period()
        if self.grid is None or period >= self.latency.idle_sense_s or not math.isfinite(self._sensed):
            return period
        return self.grid.delay(self._sensed, period)

    def sense(self, t: float, cpu: Mapping[str, float]) -> bool:
        ticked = self.grid.window(self._sensed, t) if self.grid is not None else None
        self._sensed = t
        return self.latency.sense(t, cpu, thawed=set(self.shares) - self.frozen_at(t), ticked=ticked)

    def frozen_at(self, t: float) -> set[str]:
        return super().frozen_at(t) | self.latency.frozen()


def _fixed(period: float, *, hold_s: float = 0.0) -> LatencyController:
    """The class read every ``period`` whatever it holds, an end read only once the CPU stood still."""
    return LatencyController({SERVICE}, sense_s=period, idle_sense_s=period, ended=0.0, still_s=0.0,
                             hold_s=hold_s)


Build = Callable[[dict[str, float | None], int], object]  # (shares, seed) -> a plant scheme

DESIGNS: dict[str, tuple[str, Build]] = {
    "none": ("no enforcement", lambda shares, seed: Unenforced()),
    "duty": ("duty cycle, 100 ms", lambda shares, seed: Enforced(ShareController(), DutyPlan(0.1), shares)),
    "rotation": ("rotation, 1 s +-30 %", lambda shares, seed: Enforced(
        RotationController(), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
    "exempt": ("latency class (no preemption)", lambda shares, seed: LatencyEnforced(
        LatencyController({SERVICE}, preempt=False), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
    # the agent's sensing, as shipped (LatencyController's defaults: read around each tick while a hold is
    # on, every 20 ms otherwise; a request ended once its CPU stood still through a scheduler tick)
    "latency": ("latency class (preempt, as shipped)", lambda shares, seed: LatencyEnforced(
        LatencyController({SERVICE}), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
    # as shipped where the service's tasks wait for a CPU (or PSI is off): a still tick ends a request only
    # if it last moved between two ticks
    "latency-pressed": ("latency class (preempt, its CPU contended)", lambda shares, seed: LatencyEnforced(
        LatencyController({SERVICE}), RotationPlan(1.0, dither=0.3, seed=seed), shares, waited=None)),
    # without the ticks' grid: read every 2 ms while a hold is on, an end once still 5 ms (a tick and some)
    "latency-still": ("latency class (preempt, ends still 5 ms)", lambda shares, seed: LatencyEnforced(
        LatencyController({SERVICE}), RotationPlan(1.0, dither=0.3, seed=seed), shares, ticks=False)),
    # and an end read from an interval that moved under 0.9 of the usual rate (measured, left off)
    "latency-ended": ("latency class (as shipped, ends from part-moved intervals)", lambda shares, seed:
                      LatencyEnforced(LatencyController({SERVICE}, ended=0.9), RotationPlan(1.0, dither=0.3,
                                                                                            seed=seed), shares)),
    # the fixed periods measured before (an end read from the first interval that did not move)
    "latency-1ms": ("latency class (preempt, every 1 ms)", lambda shares, seed: LatencyEnforced(
        _fixed(0.001), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
    "latency-5ms": ("latency class (preempt, every 5 ms)", lambda shares, seed: LatencyEnforced(
        _fixed(0.005), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
    "latency-hold": ("latency class (preempt, every 1 ms, held 20 ms)", lambda shares, seed: LatencyEnforced(
        _fixed(0.001, hold_s=0.02), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
}


@dataclass(frozen=True)
class Beside:
    """One run: the service's latency (seconds), each tenant's part of the work, the neighbours' parts of
    their own work, the throughput kept against one neighbour alone, the service's frozen fraction."""

    latency: dict[str, float]
    got: dict[str, float]
    neighbours: dict[str, float]
    shares: dict[str, float]
    kept: float
    frozen: float
    result: contention.Result

    @property
    def neighbour_error(self) -> float:
        """The largest miss of a neighbour's part of the neighbours' work against its part of their shares."""
        total = sum(self.shares[k] for k in self.neighbours)
        return max(abs(v - self.shares[k] / total) for k, v in self.neighbours.items())


def run_beside(design: str | Build, neighbour: str, count: int, load: float | None, *, seed: int = 0,
               arrivals: str = "poisson", seconds: float = 120.0, measured: float = 105.0,
               settings: contention.PlantSettings | None = None) -> Beside:
    """The service at ``load`` (None: no service) beside ``count`` neighbours of kind ``neighbour``."""
    build = DESIGNS[design][1] if isinstance(design, str) else design
    names = [f"t{i}" for i in range(count)]
    shares: dict[str, float] = {n: (1.0 - SERVICE_SHARE) / count for n in names}
    tenants: list[tuple[str, contention.TenantKind]] = [(n, neighbour) for n in names]
    if load is not None:
        shares[SERVICE] = SERVICE_SHARE
        tenants.append((SERVICE, Serve(load, arrivals)))
    scheme = build(dict(shares), seed)
    result = contention.run(tenants, scheme, seconds=seconds, seed=seed,  # type: ignore[arg-type]
                            settings=settings)
    after = seconds - measured
    got = result.truth(after)
    work = {n: result.work[-1][n] - _at(result, after)[n] for n in names}
    total = sum(work.values())
    return Beside(result.latency(SERVICE, after) if load is not None else {},
                  got, {n: (w / total if total else 0.0) for n, w in work.items()}, shares,
                  result.kept(after), result.frozen_s.get(SERVICE, 0.0) / seconds, result)


def _at(result: contention.Result, after: float) -> dict[str, float]:
    start = next(i for i, t in enumerate(result.poll_times) if t >= after)
    return result.work[start]
