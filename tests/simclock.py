"""A hand-moved clock for the simulated NVML's scenario time."""

from __future__ import annotations


class FakeClock:
    """A clock tests move by hand; ``sleep`` advances it (inject it as the simulator's sleep).

    It reads 0 when the simulator is built (``t0``) and ``start`` right after, so ``t`` is scenario time.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.t = 0.0
        self.start = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    def sleep(self, dt: float) -> None:
        self.slept.append(dt)
        self.t += dt
