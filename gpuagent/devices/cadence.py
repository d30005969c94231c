"""When a read on a slower tier is due: once ``interval`` seconds have passed since the last one.

NVML calls that cost milliseconds on a real GPU (the energy counter, GPM metrics, per-process utilization,
the batched counters) run on their own cadence rather than every poll (``docs/nvml-cost.md``). A poll at
1 s lands a little early or late; 5 % slack makes a 10 s interval read every 10th poll, not every 11th
after jitter. An interval at or under the poll interval reads every poll.
"""

from __future__ import annotations

SLACK = 0.95


class Cadence:
    """``due(now)``: no read yet, or ``interval`` (less the slack) since the last ``mark``."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last: float | None = None

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= SLACK * self.interval

    def mark(self, now: float) -> None:
        self.last = now

    def reset(self) -> None:
        """The next ``due`` is True (a failed read, or state that must be read again)."""
        self.last = None
