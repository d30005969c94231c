"""The kernel's scheduler tick, as the latency class needs it to read a request's end from ``cpu.stat``.

The kernel charges a running task's CPU time to its cgroup only at a scheduler tick (every 1/HZ: 4 ms at
HZ=250) and when the task stops, so a counter read between two ticks stands still while the service spins.
Waiting for it to stand still longer than a tick (:func:`still_for`) reads every end 5-7 ms late, and the
GPU idles through it (its neighbours held frozen for nothing). A tick, though, is an instant every CPU
shares: without ``skew_tick=1`` on the kernel's command line each CPU's tick timer fires on one grid of
the monotonic clock, every ``tick`` from one phase. So a counter that did not move between two readings
with a tick between them says that nothing of the cgroup ran at that tick: the request ended before it
(or the service lost its CPU). :class:`TickGrid` is the grid and where to read around it; the latency
controller takes ``ticked`` (a tick surely charged between its last reading and this one) from its caller:
the plant knows its grid, the agent's :class:`KernelTicks` learns it from the coarse monotonic clock.

The coarse clock (``CLOCK_MONOTONIC_COARSE``) changes exactly at a tick (the timekeeping update), and its
resolution is the tick; its value lags the instant by a constant less than a tick (the timekeeper keeps
whole intervals; 3.08 ms of 4 on the VM of the tests). So a reading taken just after the clock changed,
coarse value first and then the monotonic clock, gives ``monotonic - coarse`` at its smallest, the lag, and
every other reading gives more: the smallest seen so far is never under the lag. Between two readings a
tick happened if the coarse value read before the second is newer than the one read after the first; the
tick is surely charged by the second reading if it lies ``margin`` before it by the lag so far (an
overestimate, so the tick is placed late and the test errs towards no tick). Measured on the VM (a spinning
process in a v2 cgroup, ``cpu.stat`` read every 0.2 ms for 3 s): every change of the counter came at a
change of the coarse clock or at a preemption, and 11 of 14,727 windows across a tick, margin 0.1 ms, saw
no movement (the spinner preempted): docs/shares.md, the latency class, has the figures.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_MONOTONIC_COARSE = 6  # Linux's clock id: its resolution is the kernel's tick (1/HZ)
TICK_MARGIN_S = 0.0003  # a tick counts at a reading this long after it (the charged CPU's own handler)
READ_BEFORE_S = 0.0005  # while a hold is on, a reading this long before each tick, and one after it
_STILL_MARGIN_S = 0.001  # a request ended once its CPU stood still a tick and this long (no grid known)
_TICK_FALLBACK_S = 0.01  # HZ=100, the slowest tick a kernel is built with: the longest still time
_LAG_WINDOW = 1024  # readings the smallest lag is taken over (20 s of idle readings: a drift is followed)


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

    def ticked(self, since: float, now: float, margin: float = TICK_MARGIN_S) -> bool:
        """A tick lies after ``since`` and ``margin`` before ``now`` (to 100 ns: a reading planned
        ``margin`` after a tick counts it)."""
        return self.last(now - margin + 1e-7) > since

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
    """The kernel's tick grid on the monotonic clock, learnt from the coarse clock at each reading (see the
    module). :meth:`begin` before a reading (the instant to give the controller), :meth:`end` after it
    (whether a tick was surely charged between the last reading and this one; None where the kernel's
    ticks are not on one grid or there is no coarse clock)."""

    def __init__(self, tick: float | None = None, *, clock: Callable[[], float] = time.monotonic,
                 coarse: Callable[[], float] = _coarse, margin: float = TICK_MARGIN_S,
                 skewed: bool | None = None) -> None:
        self.tick = kernel_tick() if tick is None else tick
        self.margin = margin
        self._clock = clock
        self._coarse = coarse
        self._usable = not (_skewed() if skewed is None else skewed)
        self._lags: deque[tuple[int, float]] = deque()  # (reading, lag): the window's minimum first
        self._count = 0
        self._began: tuple[float, float] | None = None  # (coarse, now) read before this reading
        self._after: float | None = None  # the coarse value read after the last reading

    @property
    def lag(self) -> float | None:
        """The coarse clock's lag behind its tick so far (never under the true one)."""
        return self._lags[0][1] if self._lags else None

    @property
    def grid(self) -> TickGrid | None:
        """The ticks as learnt so far (placed no earlier than they are)."""
        if not self._usable or self._began is None or not self._lags:
            return None
        return TickGrid(self.tick, self._began[0] + self._lags[0][1])

    def begin(self) -> float:
        """Before a reading: the coarse clock, then the clock (the instant returned); the lag learnt."""
        try:
            coarse = self._coarse()
        except OSError:
            self._usable = False
            return self._clock()
        now = self._clock()
        self._began = (coarse, now)
        self._count += 1
        lag = now - coarse
        lags = self._lags
        while lags and lags[-1][1] >= lag:
            lags.pop()
        lags.append((self._count, lag))
        if lags[0][0] <= self._count - _LAG_WINDOW:
            lags.popleft()
        return now

    def end(self) -> bool | None:
        """After the reading begun: a tick lies between the last reading and this one, ``margin`` before
        this one's start (None: not known)."""
        began, after = self._began, self._after
        if not self._usable or began is None:
            return None
        try:
            self._after = self._coarse()
        except OSError:
            self._usable = False
            return None
        if after is None:
            return None
        coarse, now = began
        if coarse <= after + self.tick / 2:  # no tick since the last reading's counters were read
            return False
        # the newest tick placed late by the lag so far; an older one since the last reading is older still
        return coarse - self.tick > after + self.tick / 2 or now - self.margin >= coarse + self._lags[0][1]
