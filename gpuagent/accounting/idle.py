"""Idle episodes and efficiency over a sliding window, per pod (or workload) and GPU.

Idle: at a poll, a workload that holds part of a GPU (``allocated > 0``) and whose SM use of what it holds
(``busy / allocated``: for a MIG slice, the slice's activity; for one of N replicas, its use of 1/N) is
under ``threshold_ratio``. An episode starts at the first such poll and ends at the first poll where it is
busy, no longer holds the GPU, or its use is unknown (MIG without GPM: never flagged without evidence).
It is flagged once the episode is ``window_seconds`` long. Flagging only reports: nothing is stopped.

Efficiency: ``busy / allocated`` GPU-seconds over the last ``window_seconds`` (0-1; above 1 is clipped: a
replica holder using more than its 1/N). The window slides over checkpoints of the running totals taken
every window/``CHECKPOINTS``, so memory per series is bounded and the window is exact to that resolution.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuagent.frozen import faster_init

CHECKPOINTS = 60

K = TypeVar("K")


@dataclass(slots=True)
class _State:
    idle_since: float | None = None
    checkpoints: deque[tuple[float, float, float]] = field(default_factory=deque)  # (t, allocated, busy)


@faster_init  # one per tenant per poll (gpuagent/frozen.py)
@dataclass(frozen=True, slots=True)
class Observation:
    idle_since: float | None  # monotonic start of the current idle episode
    idle_seconds: float
    efficiency_ratio: float | None


class IdleTracker(Generic[K]):
    """``observe`` each running series once per poll; ``forget`` a series that ended."""

    def __init__(
        self, *, threshold_ratio: float, idle_window_seconds: float, efficiency_window_seconds: float
    ) -> None:
        self.threshold_ratio = threshold_ratio
        self.idle_window_seconds = idle_window_seconds
        self.efficiency_window_seconds = efficiency_window_seconds
        self._spacing = efficiency_window_seconds / CHECKPOINTS
        self._states: dict[K, _State] = {}

    def observe(
        self,
        key: K,
        now: float,
        allocated_now: float,
        busy_now: float | None,
        allocated_total: float,
        busy_total: float | None,
    ) -> Observation:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _State()
        idle = allocated_now > 0 and busy_now is not None and busy_now < self.threshold_ratio * allocated_now
        if not idle:
            state.idle_since = None
        elif state.idle_since is None:
            state.idle_since = now
        return Observation(  # positional, in its field order: one per pod and GPU per poll
            state.idle_since,
            0.0 if state.idle_since is None else now - state.idle_since,
            self._efficiency(state, now, allocated_total, busy_total),
        )

    def flagged(self, observation: Observation) -> bool:
        return observation.idle_since is not None and observation.idle_seconds >= self.idle_window_seconds

    def end(self, key: K) -> None:
        """The series is not running now: its idle episode (if any) is over; its efficiency history stays."""
        state = self._states.get(key)
        if state is not None:
            state.idle_since = None

    def forget(self, key: K) -> None:
        self._states.pop(key, None)

    def __len__(self) -> int:
        return len(self._states)

    def _efficiency(self, state: _State, now: float, allocated: float, busy: float | None) -> float | None:
        points = state.checkpoints
        if not points or now - points[-1][0] >= self._spacing:
            points.append((now, allocated, busy or 0.0))
        # keep the newest checkpoint at or before the window's start as the base, drop older ones
        while len(points) > 1 and points[1][0] <= now - self.efficiency_window_seconds:
            points.popleft()
        if busy is None:
            return None
        _, base_allocated, base_busy = points[0]
        held = allocated - base_allocated
        if held <= 0:
            return None
        return min(1.0, max(0.0, (busy - base_busy) / held))
