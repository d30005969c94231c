"""The share schemes on the GPU-contention plant (``gpuagent/devices/sim/contention.py``), in virtual time.

:class:`Enforced` runs a controller and a plan the way the agent does (a controller update at each poll,
each period's windows from the plan with the fractions then in force, the same ``desired`` the cycler
walks), so the plant's tenants are frozen exactly when the agent would freeze them. ``DESIGNS`` are the
candidates docs/shares.md compares; ``bench/bench_timeslice.py --plant`` and the tests use them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuagent.devices.sim import contention
from gpuagent.enforce.timeslice import (
    DutyPlan,
    RotationController,
    RotationPlan,
    ShareController,
    Tenant,
    desired,
)
from gpuagent.enforce.timeslice.plans import Period

_EPSILON = 1e-9
SPLITS: dict[str, tuple[int, ...]] = {"70/30": (70, 30), "90/10": (90, 10), "50/30/20": (50, 30, 20)}


class Enforced:
    """A controller (``update(now, tenants) -> fractions``) and a plan, as a plant scheme."""

    def __init__(self, controller: object, plan: object, shares: Mapping[str, float | None], *,
                 priorities: Mapping[str, int] | None = None) -> None:
        self.controller = controller
        self.plan = plan
        self.shares = dict(shares)
        self.priorities = dict(priorities or {})
        self.fractions: dict[str, float] = {}
        self.start = 0.0
        self.period: Period[str] = plan.next_period({})  # type: ignore[attr-defined]
        self.trace: list[tuple[float, dict[str, float]]] = []  # (poll time, fractions decided)

    def poll(self, t: float, readings: Mapping[str, float]) -> None:
        tenants = [Tenant(k, readings.get(k, 0.0), share, self.priorities.get(k, 0))
                   for k, share in self.shares.items()]
        self.fractions = dict(self.controller.update(t, tenants))  # type: ignore[attr-defined]
        self.trace.append((t, dict(self.fractions)))

    def _advance(self, t: float) -> None:
        while t + _EPSILON >= self.start + self.period.length:
            self.start += self.period.length
            self.period = self.plan.next_period(
                {k: f for k, f in self.fractions.items() if f > 0.0})  # type: ignore[attr-defined]

    def frozen_at(self, t: float) -> set[str]:
        self._advance(t)
        return desired(self.period, t - self.start + _EPSILON)[0]

    def next_change(self, t: float) -> float:
        self._advance(t)
        return self.start + desired(self.period, t - self.start + _EPSILON)[1]


@dataclass(frozen=True)
class Design:
    name: str
    build: Callable[[Mapping[str, float | None], str, int], Enforced]  # (shares, tenant kind, seed)


def _drain_period(kind: str) -> float:
    """Ten times the queue a frozen tenant of ``kind`` leaves running (known to the model, an oracle)."""
    s = contention.PlantSettings()
    return max(0.1, 10 * (s.kernel_s if kind == "matmul" else s.deep_queue_s))


DESIGNS: dict[str, Design] = {
    "duty": Design("duty cycle, 100 ms (before)",
                   lambda shares, kind, seed: Enforced(ShareController(), DutyPlan(0.1), shares)),
    "duty-dithered": Design("duty cycle, 100 ms +-30 %",
                            lambda shares, kind, seed: Enforced(
                                ShareController(), DutyPlan(0.1, dither=0.3, seed=seed), shares)),
    "duty-drain": Design("duty cycle, period 10x drain +-30 %",
                         lambda shares, kind, seed: Enforced(
                             ShareController(), DutyPlan(_drain_period(kind), dither=0.3, seed=seed), shares)),
    "rotation-fixed": Design("rotation, 1 s fixed",
                             lambda shares, kind, seed: Enforced(
                                 RotationController(), RotationPlan(1.0, dither=0.0, seed=seed), shares)),
    "rotation": Design("rotation, 1 s +-30 % (chosen)",
                       lambda shares, kind, seed: Enforced(
                           RotationController(), RotationPlan(1.0, dither=0.3, seed=seed), shares)),
}


@dataclass(frozen=True)
class Outcome:
    truth: dict[str, float]
    view: dict[str, float]
    targets: dict[str, float]
    kept: float
    scheme: Enforced
    result: contention.Result

    @property
    def max_error(self) -> float:
        return max(abs(self.truth[k] - self.targets[k]) for k in self.targets)


def run_split(design: str | Design, kind: str, split: Sequence[int], *, seed: int = 0,
              seconds: float = 60.0, measured: float = 45.0, phase: float | None = None,
              settings: contention.PlantSettings | None = None) -> Outcome:
    """Tenants of ``kind`` held at ``split`` (percent) by ``design``, judged over the last ``measured`` s."""
    chosen = DESIGNS[design] if isinstance(design, str) else design
    names = [chr(ord("a") + i) for i in range(len(split))]
    shares = {n: p / 100 for n, p in zip(names, split, strict=True)}
    scheme = chosen.build(shares, kind, seed)
    result = contention.run([(n, kind) for n in names], scheme, seconds=seconds, seed=seed, phase=phase,
                            settings=settings)
    after = seconds - measured
    return Outcome(result.truth(after), result.view(after), shares, result.kept(after), scheme, result)
