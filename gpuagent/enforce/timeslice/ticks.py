"""The kernel's scheduler tick, as the latency class needs it to read a request's end from ``cpu.stat``.

The kernel charges a running task's CPU time to its cgroup only at a scheduler tick (every 1/HZ: 4 ms at
HZ=250) and when the task stops, so a counter read between two ticks stands still while the service spins.
Waiting for it to stand still longer than a tick (:func:`still_for`) reads every end 5-7 ms late, and the
GPU idles through it (its neighbours held frozen for nothing). A tick, though, is an instant every CPU
shares: without ``skew_tick=1`` on the kernel's command line each CPU's tick timer fires on one grid of
the monotonic clock, every ``tick`` from one phase, for as long as the machine runs. So a counter that did
not move between two readings with a tick between them says nothing of the cgroup ran at that tick: the
request ended (or the service lost its CPU at a tick, which the controller tells apart: a task switched
out at a tick is charged at it). :class:`TickGrid` is the grid, what a window between two readings holds
(surely a tick, surely none, or cannot tell) and where to read around it; the latency controller takes
that from its caller: the plant knows its grid, the agent's :class:`KernelTicks` finds it.

Finding it: the coarse monotonic clock changes at the timekeeping tick while a CPU is busy, so a thread
that spins reading it and the monotonic clock sees the change within microseconds of a tick (its own
CPU ticking); :meth:`KernelTicks.calibrate` does that, at most a tick and a half of CPU, once a minute
while no hold is on, and places the grid at the first reading after the change (never before the tick).
The coarse clock's *value* is no guide (its own grid, 3.08 ms behind the ticks on the VM of the tests, and
set at any instant when an idle CPU wakes), nor its changes while the CPUs idle. Measured on the VM (a
spinning process in a v2 cgroup, ``cpu.stat`` read every 0.2 ms for 3 s): every change of the counter came
at a tick or at a preemption, and 11 of 14,727 windows across a tick, 0.1 ms after it, saw no movement
(the spinner preempted). docs/shares.md, the latency class, has the figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_MONOTONIC_COARSE = 6  # Linux's clock id: its resolution is the kernel's tick (1/HZ)
TICK_MARGIN_S = 0.0003  # a tick counts at a reading this long after it (the charged CPU's own handler)
TICK_GUARD_S = 0.00025  # a tick may come this long before the grid learnt places it (the lag's error)
READ_BEFORE_S = 0.0005  # while a hold is on, a reading this long before each tick, and one after it
_STILL_MARGIN_S = 0.001  # a request ended once its CPU stood still a tick and this long (no grid known)
_TICK_FALLBACK_S = 0.01  # HZ=100, the slowest tick a kernel is built with: the longest still time
_CALIBRATION_GAP_S = 0.0001  # the most two readings straddling a calibration's tick may lie apart
_RECALIBRATE_S = 60.0  # seconds between two calibrations (the grid is exact on the monotonic clock)
_RETRY_S = 1.0  # seconds before a failed calibration is tried again


def kernel_tick() -> float:
    """Seconds between two of the kernel's scheduler ticks (4 ms at HZ=250, 1 ms at HZ=1000, 10 ms at
    HZ=100): the coarse monotonic clock's resolution is exactly a tick (``clock_getres``). A running
    task's CPU time reaches ``cpu.stat`` only at a tick (and when it stops), so the still time that ends a
    request must outlast one. Where the clock cannot be asked, HZ=100's tick, the longest."""
    try:
        tick = time.clock_getres(CLOCK_MONOTONIC_COARSE)
    except (AttributeError, OSError):
        return _TICK_FALLBACK_S
    return tick if 0.0001 <= tick <= 0.02 else _TICK_FALLBACK_S


def still_for(tick: float) -> float:
    """The still time that ends a request on a kernel ticking every ``tick`` seconds when its ticks are not
    known: the tick and 1 ms (5 ms at HZ=250, 11 ms at HZ=100, 2 ms at HZ=1000)."""
    return tick + _STILL_MARGIN_S


STILL_S = still_for(0.004)  # the still time at HZ=250 (a 4 ms tick): the model's, and the default


@dataclass(frozen=True, slots=True)
class TickGrid:
    """The scheduler's ticks: every ``tick`` seconds from ``base`` on the readings' clock."""

    tick: float
    base: float = 0.0

    def last(self, t: float) -> float:
        """The last tick at or before ``t``."""
        return self.base + math.floor((t - self.base) / self.tick) * self.tick

    def window(self, since: float, now: float, *, guard: float = TICK_GUARD_S,
               margin: float = TICK_MARGIN_S) -> bool | None:
        """Whether a tick's charge lies within ``(since, now]``: True surely (a tick ``guard`` after
        ``since`` and ``margin`` before ``now``), False surely not (every tick that could be in it is
        ``margin`` before ``since``), None: cannot tell. A tick of the grid may really come up to ``guard``
        before it (the grid learnt is placed late), and its charge up to ``margin`` after it (the charged
        CPU's own handler); to 100 ns, so a reading planned ``margin`` after a tick counts it."""
        if self.last(now - margin + 1e-7) - guard > since:
            return True
        if self.last(now + guard) + margin <= since + 1e-7:
            return False
        return None

    def delay(self, now: float, period: float, *, before: float = READ_BEFORE_S,
              after: float = TICK_MARGIN_S) -> float:
        """Seconds to the next reading for a caller reading every ``period``: where a tick is at least two
        periods long, the next of the instants ``before`` each tick and ``after`` it (as many readings,
        each window with a tick ending just after it, so an end is read at the first tick after it);
        otherwise ``period`` (every window holds a tick)."""
        if self.tick < 2.0 * period:
            return period
        tick = self.last(now)
        soonest = now + min(period, before + after) / 2.0  # no two readings closer than this
        for at in (tick + after, tick + self.tick - before, tick + self.tick + after):
            if at >= soonest:
                return at - now
        return tick + 2.0 * self.tick - before - now


def _coarse() -> float:
    return time.clock_gettime(CLOCK_MONOTONIC_COARSE)


def _skewed(cmdline: str = "/proc/cmdline") -> bool:
    """The kernel offsets each CPU's tick (``skew_tick=1``): no one grid (the host's command line, also
    from a container)."""
    try:
        with open(cmdline, encoding="utf-8", errors="replace") as f:
            return "skew_tick=1" in f.read(65536).split()
    except OSError:
        return False


class KernelTicks:
    """The kernel's tick grid on the monotonic clock, found by :meth:`calibrate` (see the module); then
    :meth:`begin` before each reading (the instant to give the controller) and :meth:`end` after it
    (whether a tick was surely charged between the last reading and this one; None where it cannot be
    told: ticks not on one grid, no coarse clock, not calibrated)."""

    def __init__(self, tick: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 coarse: Callable[[], float] = _coarse, margin: float = TICK_MARGIN_S,
                 skewed: bool | None = None) -> None:
        self.tick = kernel_tick() if tick is None else tick
        self.margin = margin
        self._clock = clock
        self._coarse = coarse
        self._usable = not (_skewed() if skewed is None else skewed)
        self.grid: TickGrid | None = None  # the ticks as last calibrated (placed no earlier than they are)
        self._calibrated = -math.inf  # when (the clock's instant)
        self._tried = -math.inf  # the last attempt
        self._retry = _RETRY_S  # seconds from a failed attempt to the next
        self._began: float | None = None  # this reading's start
        self._after: float | None = None  # the last reading's end

    @property
    def state(self) -> str:
        """``calibrated`` (an end is read at the tick), ``pending`` (no calibration has held yet) or
        ``off`` (no one grid: ``skew_tick=1``, or no coarse clock): until calibrated, the still time ends
        a request."""
        if not self._usable:
            return "off"
        return "calibrated" if self.grid is not None else "pending"

    def due(self, now: float) -> bool:
        """A calibration is due: none yet, or the last over ``_RECALIBRATE_S`` ago (the last attempt failed
        over ``_RETRY_S`` ago, twice that after each failure, up to ``_RECALIBRATE_S``: a thread that is
        always preempted does not spin every second)."""
        if not self._usable or now - self._tried < self._retry:
            return False
        return self.grid is None or now - self._calibrated >= _RECALIBRATE_S

    def calibrate(self) -> bool:
        """Spin reading the coarse clock and the clock until the coarse clock changes (at most a tick and a
        half): the change is a tick, so this thread's CPU being busy. Kept when two readings
        ``_CALIBRATION_GAP_S`` apart at most straddle it (not preempted), placed at the later one."""
        clock = self._clock
        self._tried = start = clock()
        try:
            coarse, before = self._coarse(), clock()
            while before - start < 1.5 * self.tick:
                value, now = self._coarse(), clock()
                if value != coarse:
                    if now - before > _CALIBRATION_GAP_S:
                        break
                    self.grid, self._calibrated, self._retry = TickGrid(self.tick, now), now, _RETRY_S
                    return True
                before = now
        except OSError:
            self._usable = False
        self._retry = min(2.0 * self._retry, _RECALIBRATE_S)
        return False

    def begin(self) -> float:
        """Before a reading: its instant."""
        self._began = now = self._clock()
        return now

    def end(self) -> bool | None:
        """After the reading begun: whether a tick was charged between the last reading's end and this
        one's start (:meth:`TickGrid.window`; None: not known)."""
        began, after = self._began, self._after
        self._after = self._clock()
        if not self._usable or self.grid is None or began is None or after is None:
            return None
        return self.grid.window(after, began, margin=self.margin)
