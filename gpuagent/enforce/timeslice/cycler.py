"""Applies a plan's windows on the event loop: freezes and thaws each throttled tenant's cgroups.

One asyncio task; each period it asks the plan (``plans.py``) for the windows of the fractions in force and
walks through them: at every change it freezes first and thaws after, so under the rotation at most one
throttled tenant is ever thawed. A fraction set during a period applies from the next one; 0 thaws at once.
A late wake (a starved event loop) lengthens the slot it ends and shortens the next, which still ends at
its planned instant: windows are placed from the period's planned start, so lateness does not accumulate.
It thaws everything when it is cancelled or exits, and a target whose freeze or thaw raises is logged once
and its tenant dropped (the loop goes on). :class:`DutyCycler` is the cycler of the duty plan.

:meth:`Cycler.hold` is the latency class's preemption (``latency.py``, ``preempt.py``): it freezes a GPU's
batch tenants now, beyond the plan's windows (a tenant not throttled too), and lets each go back to the
plan's state at that instant when the hold ends: a held key is never thawed by the plan, and one with no
fraction is thawed and dropped. :attr:`Cycler.frozen_keys` is what is frozen, safe to read from another
thread (a frozenset replaced, never changed in place); everything else is the event loop's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuagent.enforce.timeslice.plans import DutyPlan, Period, Plan, desired

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)
_EPSILON = 1e-9  # seconds: a change this close is due now (the clock's float arithmetic)


@dataclass(slots=True)
class _Throttle(Generic[T]):
    targets: tuple[T, ...]
    fraction: float
    group: Hashable = None  # the keys that take turns together (a GPU)
    frozen: set[T] = field(default_factory=set)
    frozen_since: float | None = None
    held: bool = False  # frozen beyond the plan by a preemption (``hold``)


class Cycler(Generic[T]):
    """Freezes each throttled tenant's targets outside its plan's window of every period, on the event loop.

    ``freeze(target)`` / ``thaw(target)`` do the work (``enforce.actions``); ``targets`` are hashable
    (cgroup paths). A fraction of 1 keeps the targets frozen across periods (no repeated writes); the
    controller never asks for more than its ``max_frozen``.
    """

    def __init__(
        self,
        freeze: Callable[[T], object],
        thaw: Callable[[T], object],
        *,
        plan: Plan,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        max_warned: int = 1024,
    ) -> None:
        self._freeze = freeze
        self._thaw = thaw
        self.plan = plan
        self._clock = clock
        self._sleep = sleep
        self._throttles: dict[str, _Throttle[T]] = {}
        self._seconds: dict[str, float] = {}
        self._warned: OrderedDict[T, None] = OrderedDict()  # targets whose failure was logged
        self._max_warned = max_warned
        self._running = False
        self._holds: dict[Hashable, frozenset[str]] = {}  # group -> the keys its preemption holds frozen
        self._period: Period[str] | None = None  # the period in force and its start, while running
        self._start = 0.0
        self.frozen_keys: frozenset[str] = frozenset()  # keys with a target frozen (see the module)

    # -- what to throttle -----------------------------------------------------------------------------

    def set(self, key: str, targets: Sequence[T], fraction: float, group: Hashable = None) -> None:
        """Throttle ``key`` (all its targets together) at ``fraction``; 0 (or no targets) thaws it now.
        ``group``: the keys that take turns (a GPU's tenants, under the rotation)."""
        fraction = min(max(float(fraction), 0.0), 1.0)
        targets = tuple(dict.fromkeys(targets))
        throttle = self._throttles.get(key)
        if throttle is not None and throttle.held and targets and fraction <= 0.0:
            gone = [t for t in throttle.frozen if t not in targets]
            if not gone or self._thaw_targets(key, throttle, gone):
                throttle.targets, throttle.fraction = targets, 0.0  # held on, out of the plan
            return
        if fraction <= 0.0 or not targets:
            if throttle is not None:
                self._thaw_key(key, throttle)
                self._throttles.pop(key, None)
            return
        if throttle is None:
            self._throttles[key] = _Throttle(targets, fraction, group)
            return
        gone = [t for t in throttle.frozen if t not in targets]
        if gone and not self._thaw_targets(key, throttle, gone):
            return
        throttle.targets = targets
        throttle.fraction = fraction
        throttle.group = group

    def fraction(self, key: str) -> float:
        throttle = self._throttles.get(key)
        return throttle.fraction if throttle is not None else 0.0

    def throttled_seconds(self, key: str) -> float:
        """Time ``key`` has spent frozen since it was first throttled (a running total)."""
        total = self._seconds.get(key, 0.0)
        throttle = self._throttles.get(key)
        if throttle is not None and throttle.frozen_since is not None:
            total += max(0.0, self._clock() - throttle.frozen_since)
        return total

    def forget(self, key: str) -> None:
        """The tenant is gone: thaw it and drop its total."""
        self.set(key, (), 0.0)
        self._seconds.pop(key, None)

    def stop_all(self) -> None:
        """Thaw everything now and stop throttling and holding (``set`` and ``hold`` again to resume)."""
        self._holds.clear()
        for key, throttle in list(self._throttles.items()):
            self._thaw_key(key, throttle)
        self._throttles.clear()

    def hold(self, group: Hashable, held: Mapping[str, Sequence[T]]) -> None:
        """``group``'s preemption: freeze ``held`` (key -> its targets) now, beyond the plan, until the next
        call for the group; the keys it held before and not now go back to the plan's state at this instant
        (thawed, unless their window says frozen; dropped if they have no fraction)."""
        before = self._holds.get(group, frozenset())
        if held:
            self._holds[group] = frozenset(held)
        else:
            self._holds.pop(group, None)
        still = frozenset().union(*self._holds.values())
        for key in before - still:
            throttle = self._throttles.get(key)
            if throttle is None or not throttle.held:
                continue
            throttle.held = False
            if throttle.fraction <= 0.0:
                self._thaw_key(key, throttle)
                if self._throttles.get(key) is throttle:
                    del self._throttles[key]
            elif not self._due_frozen(key):
                self._thaw_key(key, throttle)
        now = self._clock()
        for key, targets in held.items():
            throttle = self._throttles.get(key)
            if throttle is None:
                targets = tuple(dict.fromkeys(targets))
                if not targets:
                    continue
                throttle = self._throttles[key] = _Throttle(targets, 0.0, group)
            throttle.held = True
            if len(throttle.frozen) < len(throttle.targets):
                self._freeze_key(key, throttle, now)

    def _due_frozen(self, key: str) -> bool:
        """The plan in force freezes ``key`` at this instant."""
        period = self._period
        if period is None or key not in period.windows:
            return False
        frozen, _ = desired(period, self._clock() - self._start + _EPSILON)
        return key in frozen

    @property
    def frozen(self) -> set[T]:
        """The targets frozen at this instant."""
        return {t for throttle in self._throttles.values() for t in throttle.frozen}

    # -- the loop -------------------------------------------------------------------------------------

    @property
    def period(self) -> float:
        """The plan's mean period, seconds."""
        return self.plan.period

    async def run(self) -> None:
        """Until cancelled; whatever ends it (cancel, error), everything it froze is thawed."""
        if self._running:
            raise RuntimeError("the cycler is already running")
        self._running = True
        try:
            start = self._clock()
            while True:
                period = self.plan.next_period(
                    {k: t.fraction for k, t in self._throttles.items() if t.fraction > 0.0},
                    {k: t.group for k, t in self._throttles.items()})
                end = start + period.length
                self._period, self._start = period, start
                while True:
                    now = self._clock()
                    if now + _EPSILON >= end:
                        break  # the next period's windows decide (no freeze at its end to thaw at its start)
                    change = self._apply(period, start, now)
                    await self._sleep(max(0.0, min(start + change, end) - now))
                now = self._clock()
                start = end if now - end < period.length else now  # fell a whole period behind: resync
        finally:
            self._running = False
            self._period = None
            self.stop_all()

    def _apply(self, period: Period[str], start: float, now: float) -> float:
        """Bring every throttled key to its state at ``now``: freezes first, then thaws (at most one throttled
        tenant thawed under the rotation); the offset of the next change."""
        frozen, change = desired(period, now - start + _EPSILON)
        thaw = []
        for key, throttle in list(self._throttles.items()):
            if key not in period.windows:
                continue  # throttled during this period: from the next one on
            if key in frozen:
                if len(throttle.frozen) < len(throttle.targets):
                    self._freeze_key(key, throttle, now)
            elif throttle.frozen and not throttle.held:
                thaw.append((key, throttle))
        for key, throttle in thaw:
            if self._throttles.get(key) is throttle:
                self._thaw_key(key, throttle)
        return change

    def _freeze_key(self, key: str, throttle: _Throttle[T], now: float) -> None:
        for target in throttle.targets:
            if target in throttle.frozen:
                continue  # no-op: still frozen (fraction 1)
            try:
                self._freeze(target)
            except Exception as exc:  # a vanished cgroup, a permission error: drop the tenant
                self._failed(key, target, "freeze", exc)
                self._drop(key, throttle)
                return
            if not throttle.frozen:
                throttle.frozen_since = now
                self.frozen_keys = self.frozen_keys | {key}
            throttle.frozen.add(target)

    def _thaw_key(self, key: str, throttle: _Throttle[T]) -> bool:
        return self._thaw_targets(key, throttle, list(throttle.frozen))

    def _thaw_targets(self, key: str, throttle: _Throttle[T], targets: list[T]) -> bool:
        """Thaw ``targets`` of ``key``; False when one failed (the key is then dropped)."""
        ok = True
        for target in targets:
            if target not in throttle.frozen:
                continue
            throttle.frozen.discard(target)  # tried once: never retried as if still frozen
            try:
                self._thaw(target)
            except Exception as exc:
                self._failed(key, target, "thaw", exc)
                ok = False
        if not throttle.frozen and throttle.frozen_since is not None:
            self._seconds[key] = self._seconds.get(key, 0.0) + max(0.0, self._clock() - throttle.frozen_since)
            throttle.frozen_since = None
            self.frozen_keys = self.frozen_keys - {key}
        if not ok:
            self._drop(key, throttle)
        return ok

    def _drop(self, key: str, throttle: _Throttle[T]) -> None:
        """Stop throttling ``key`` after a failure: thaw what is still frozen (best effort)."""
        if self._throttles.get(key) is throttle:
            del self._throttles[key]
        for target in list(throttle.frozen):
            throttle.frozen.discard(target)
            try:
                self._thaw(target)
            except Exception as exc:
                self._failed(key, target, "thaw", exc)
        if throttle.frozen_since is not None:
            self._seconds[key] = self._seconds.get(key, 0.0) + max(0.0, self._clock() - throttle.frozen_since)
            throttle.frozen_since = None
            self.frozen_keys = self.frozen_keys - {key}

    def _failed(self, key: str, target: T, what: str, exc: Exception) -> None:
        if target in self._warned:
            return
        self._warned[target] = None
        if len(self._warned) > self._max_warned:
            self._warned.popitem(last=False)
        log.warning("%s %s of %s failed, no longer throttling it: %s", what, target, key, exc)


class DutyCycler(Cycler[T]):
    """The cycler of the duty plan: each throttled tenant frozen for ``fraction * period`` of every period."""

    def __init__(
        self,
        freeze: Callable[[T], object],
        thaw: Callable[[T], object],
        *,
        period: float = 0.1,
        dither: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        max_warned: int = 1024,
    ) -> None:
        super().__init__(freeze, thaw, plan=DutyPlan(period, dither=dither), clock=clock, sleep=sleep,
                         max_warned=max_warned)
