"""Value curves: what a scenario quantity is at scenario time ``t`` (seconds since the simulator started).

Scenario syntax (see ``scenario/`` for the validation):

- ``42``                                            a constant
- ``{sine: {min: 10, max: 90, period: 60, phase: 0}}``  ``phase`` shifts the wave, in seconds
- ``{points: [[0, 10], [30, 90]], repeat: true}``   linear interpolation between points; before the first
  point the first value holds, after the last the last one, unless ``repeat`` (period: the last point's
  time, or ``period:``)
- ``{steps: [[0, 10], [30, 90]], repeat: false}``   piecewise constant: each value holds from its time on
- ``{follow_cpu: {scale: 1.0, queue_seconds: 0.2}}`` SM utilization of a real PID from its CPU use
  (only for ``sm_util``; evaluated by the simulator through :mod:`gpuagent.devices.sim.cpu`)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Constant:
    v: float

    def value(self, t: float) -> float:
        return self.v

    def bounds(self) -> tuple[float, float]:
        return self.v, self.v


@dataclass(frozen=True)
class Sine:
    min: float
    max: float
    period: float
    phase: float = 0.0

    def value(self, t: float) -> float:
        mid = (self.min + self.max) / 2.0
        amp = (self.max - self.min) / 2.0
        return mid + amp * math.sin(2.0 * math.pi * (t - self.phase) / self.period)

    def bounds(self) -> tuple[float, float]:
        return self.min, self.max


@dataclass(frozen=True)
class Points:
    """Linear interpolation (``steps=False``) or a step function (``steps=True``) through ``points``."""

    points: tuple[tuple[float, float], ...]
    steps: bool = False
    repeat: bool = False
    period: float | None = None

    def value(self, t: float) -> float:
        pts = self.points
        if self.repeat:
            period = self.period if self.period is not None else pts[-1][0]
            if period > 0:
                t = t % period
        times = [p[0] for p in pts]
        i = bisect.bisect_right(times, t)  # pts[i-1].t <= t < pts[i].t
        if i == 0:
            return pts[0][1]
        if i == len(pts) or self.steps:
            return pts[i - 1][1]
        (t0, v0), (t1, v1) = pts[i - 1], pts[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def bounds(self) -> tuple[float, float]:
        values = [p[1] for p in self.points]
        return min(values), max(values)


@dataclass(frozen=True)
class FollowCpu:
    """SM utilization = 100 x CPU seconds of the PID over the last ``queue_seconds`` / window x scale."""

    scale: float = 1.0
    queue_seconds: float = 0.2

    def bounds(self) -> tuple[float, float]:
        return 0.0, 100.0


Curve = Constant | Sine | Points
UtilCurve = Constant | Sine | Points | FollowCpu
