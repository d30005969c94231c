"""Time-slice shares on one GPU: a controller that decides frozen fractions, and the duty cycle applying them.

Physics. Freezing a tenant's cgroups stops its CPU threads, so it stops submitting GPU work; kernels already
queued still run, so its measured SM use decays over its queue depth (a few hundred ms) rather than
dropping at once. The controller therefore never assumes what a freeze achieved: it closes the loop on the
*measured* per-tenant SM use NVML reports at each poll. Freezing a tenant for a fraction ``f`` of every
period removes about ``f`` of the use it has while running (``use = (1 - f) * r``), and the others take
the time it leaves. Throttling the tenant *over* its share is what works: freezing the one below its share
cannot raise it.

:class:`ShareController` (one per GPU) at every poll, for every tenant (a pod, or another workload):

- **use** is ``Tenant.util_ratio``, its SM use over the last poll (summed over its processes);
  **achieved** is the mean of its uses over the last ``window`` seconds (exported as the achieved share).
  A tenant is **active** when its achieved use is at least ``idle_threshold``.
- **allowance**: with ``work_conserving`` (the default) ``max(share, 1 - reserved_by_others)``, where an
  active other tenant Q reserves ``max(achieved_Q, share_Q or 0)`` and an idle one its achieved use. So a
  tenant may use what the others leave, but an active tenant can always get back up to its share (a
  light active tenant keeps its whole share reserved: the GPU may then idle below 100 %). With
  ``work_conserving=False`` the allowance is the share. A tenant without a share (``None``) is never
  throttled; it only reserves its use.
- **contended**: with ``work_conserving`` a tenant over its allowance is throttled only while another
  tenant on the GPU is active; without, it is held at its share even alone.
- **error** ``e = use - allowance`` (last poll, not the window: a 2 s mean in the loop would add a
  second of lag). Only the part of an excess that is the tenant's own counts: it is reduced by the
  deficits (``allowance - use``) of the *other throttled* tenants below their allowance, since that time is
  ours, frozen out of them; releasing them comes first. And it counts as 0 while the priority rule below
  holds the tenant back.
- **PI** on the error normalized by the tenant's running use ``r = use / (1 - f)`` (``f`` the fraction in
  force during that poll; clamped to [0.1, 1]): ``en = e / r`` is the part of its running time it must
  lose, whatever the neighbours (``r`` is about 1/2 next to one burner, 1/3 next to two, 1 alone), so one
  set of gains fits every mix. ``I += (1 - exp(-ki * dt)) * en``, ``f = kp * en + I``; ``f`` clamped to
  ``[0, max_frozen]``, ``I`` kept in ``[0, max_frozen]`` and not integrated upward while ``f`` is at
  ``max_frozen`` (anti-windup).
- **engage**: a tenant not throttled starts being throttled when its error exceeds ``tolerance`` at two
  polls in a row, or ``4 * tolerance`` at one, so measurement noise around the allowance throttles nobody;
  once engaged the PI runs until ``I`` and ``f`` are both back to 0.
- **release**: a tenant at or below its allowance is released by the PI itself: a negative error drives
  ``f`` and ``I`` to 0 (fast for a light tenant, whose ``r`` is small). When the GPU stops being contended
  or the tenant loses its share, ``I`` shrinks to a quarter at each update (0 below 0.02): the others'
  activity is already a windowed figure, so this only smooths the hand-back over a few polls. A tenant
  absent from an update is not throttled; its state is dropped once its window is empty (or at once by
  :meth:`ShareController.forget`).
- **priority**: tenant P's fraction may rise only while no tenant of *lower* priority on the GPU is over
  its allowance by more than ``tolerance`` and still below ``max_frozen``; while one is, P's error counts
  as 0 (its fraction holds, or falls as ``kp * en`` goes). So among tenants over their allowance the
  lowest priority ones are throttled first; a higher-priority tenant is throttled only once every
  lower-priority one is within ``tolerance`` of its allowance (or frozen as far as it can be). Tenants of
  equal priority are throttled together.

Gains: ``kp = 0.15``, ``ki = 2.5`` per second. Seen from one poll to the next the plant is a static gain
``-r`` (normalized away above) plus the queue's lag: with a 0.2 s queue, a 0.5 s poll right after a change
shows 63 % of it, a 1 s poll 92 %. On a lag-free static plant an integral step of 1 (the whole normalized
error in one poll) is deadbeat and more overshoots; hence the step ``1 - exp(-ki * dt)``: about
``ki * dt`` for short polls, where the lag dominates, and never above 1 for long ones: 0.71 at 0.5 s
polls, 0.92 at 1 s (the agent's default). ``kp`` makes the first correction nearly whole (0.15 + 0.71 of
it) and recedes as the error shrinks, which damps the overshoot the lag's tail would give the integral
alone. The running use is estimated conservatively, as the larger of the last two polls' estimates: a
poll right after the fraction fell still carries the frozen part's tail, which reads as a lower running
use and would over-correct. Noise-free on the simulated node of the tests (burners, 0.2 s queue; 70/30,
50/30/20, 90/10, 10/90, and one tenant alone without work conservation): at 0.5 s polls within 5 points of
the shares 1.5 s after start (two polls after the first measurement) and within 2 points after 1.5-2.5 s,
overshooting 0.4 points at most next to other tenants and 3.3 alone (``r = 1``); at 1 s polls within 5
points after 3 s and 2 points after 3-4 s, overshoot under 0.5 points (a controller's first update, with
no poll before it to time, assumes 0.5 s). The neighbours of this choice: ``kp = 0`` overshoots 1-3
points with neighbours and 6-13 alone (``ki`` 2.5-4); ``kp >= 0.3`` slows the tail at 1 s polls (2
points only after 5 s). With 1 point of measurement noise ``f`` moves by about ``0.86 / r`` points per
poll, which moves the use by under 1 point. Noisy figures: ``bench/bench_timeslice.py``.

:class:`DutyCycler` applies the fractions: one asyncio task ticking every ``period`` freezes every throttled
tenant's targets (cgroups) at the start of a period and thaws each at ``fraction * period``. It thaws
everything when it is cancelled or exits, and a target whose freeze or thaw raises is logged once and its
tenant dropped (the loop goes on).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)

_MIN_RUNNING_USE = 0.1  # floor of the running-use estimate: bounds the loop gain for a light tenant
_RELEASE_FACTOR = 0.25  # the integral's decay per update when a tenant is released
_RELEASED = 0.02  # below this, a decaying fraction is 0
_FIRST_DT = 0.5  # seconds assumed for the poll before a controller's first update
_ENGAGE_AT_ONCE = 4.0  # an excess over this many tolerances engages at the first poll that shows it


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant of one GPU at one poll."""

    key: str  # the workload's identity (e.g. "ns/pod")
    util_ratio: float  # its measured SM use on this GPU over the last poll, 0-1 (sum over its processes)
    share_ratio: float | None  # its share limit on this GPU (0-1); None: no limit
    priority: int = 0  # higher = throttled last


@dataclass(slots=True)
class _TenantState:
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time, use)
    integral: float = 0.0
    fraction: float = 0.0  # the fraction decided at the last update (in effect until the next)
    engaged: bool = False
    over: bool = False  # the last poll's excess was over the tolerance (engaging needs two in a row)
    running: float = 0.0  # the last poll's estimate of its use while not frozen

    def achieved(self) -> float:
        if not self.samples:
            return 0.0
        return math.fsum(u for _, u in self.samples) / len(self.samples)

    def reset(self) -> None:
        self.integral = self.fraction = self.running = 0.0
        self.engaged = self.over = False


@dataclass(slots=True)
class _Decision:
    """One tenant's figures at one update, before its PI step."""

    tenant: Tenant
    state: _TenantState
    use: float
    achieved: float
    active: bool = False
    allowance: float = 1.0
    error: float = 0.0  # use - allowance
    limited: bool = False  # has a share, and another tenant is active (or not work-conserving)


class ShareController:
    """One GPU: decides each tenant's frozen fraction of a period from its measured use."""

    def __init__(
        self,
        *,
        window: float = 2.0,
        work_conserving: bool = True,
        idle_threshold: float = 0.05,
        kp: float = 0.15,
        ki: float = 2.5,
        max_frozen: float = 0.9,
        tolerance: float = 0.02,
    ) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        if not 0.0 < max_frozen < 1.0:
            raise ValueError("max_frozen must be in (0, 1)")
        if kp < 0 or ki < 0 or tolerance < 0:
            raise ValueError("gains and tolerance must not be negative")
        self.window = window
        self.work_conserving = work_conserving
        self.idle_threshold = idle_threshold
        self.kp = kp
        self.ki = ki
        self.max_frozen = max_frozen
        self.tolerance = tolerance
        self._states: dict[str, _TenantState] = {}
        self._last: float | None = None

    def update(self, now: float, tenants: Sequence[Tenant]) -> dict[str, float]:
        """Feed one poll's uses; returns key -> frozen fraction for the tenants to throttle (others: 0)."""
        dt = _FIRST_DT if self._last is None else max(0.0, now - self._last)
        self._last = now
        decisions = [self._observe(now, t) for t in tenants]
        self._age_absent(now, {t.key for t in tenants})
        self._classify(decisions)
        errors = [self._effective_error(d, decisions) for d in decisions]
        result: dict[str, float] = {}
        for d, error in zip(decisions, errors, strict=True):
            fraction = self._step(d, error, dt)
            if fraction > 0:
                result[d.tenant.key] = fraction
        return result

    def achieved(self, key: str) -> float:
        """The tenant's mean use over the window (0 for an unknown tenant)."""
        state = self._states.get(key)
        return state.achieved() if state is not None else 0.0

    def fraction(self, key: str) -> float:
        """The frozen fraction decided for the tenant at the last update."""
        state = self._states.get(key)
        return state.fraction if state is not None else 0.0

    def forget(self, key: str) -> None:
        """The tenant left the GPU: drop everything about it."""
        self._states.pop(key, None)

    # -- one update ---------------------------------------------------------------------------------

    def _observe(self, now: float, tenant: Tenant) -> _Decision:
        state = self._states.get(tenant.key)
        if state is None:
            state = self._states[tenant.key] = _TenantState()
        use = min(max(float(tenant.util_ratio), 0.0), 1.0)
        state.samples.append((now, use))
        self._prune(state, now)
        return _Decision(tenant=tenant, state=state, use=use, achieved=state.achieved())

    def _prune(self, state: _TenantState, now: float) -> None:
        horizon = now - self.window
        while state.samples and state.samples[0][0] <= horizon:
            state.samples.popleft()

    def _age_absent(self, now: float, present: set[str]) -> None:
        """A tenant missing from an update is not throttled; its state goes once its window is empty."""
        for key in [k for k in self._states if k not in present]:
            state = self._states[key]
            self._prune(state, now)
            if state.samples:
                state.reset()
            else:
                del self._states[key]

    def _classify(self, decisions: list[_Decision]) -> None:
        for d in decisions:
            d.active = d.achieved >= self.idle_threshold
        for d in decisions:
            share = d.tenant.share_ratio
            if share is None:
                continue
            share = min(max(float(share), 0.0), 1.0)
            others = [o for o in decisions if o is not d]
            if self.work_conserving:
                reserved = math.fsum(
                    max(o.achieved, o.tenant.share_ratio or 0.0) if o.active else o.achieved for o in others
                )
                d.allowance = max(share, 1.0 - reserved)
                d.limited = any(o.active for o in others)
            else:
                d.allowance = share
                d.limited = True
            d.error = d.use - d.allowance

    def _effective_error(self, d: _Decision, decisions: list[_Decision]) -> float:
        """The excess that is P's own to correct: 0 while a lower priority goes first (P is held)."""
        if d.error <= 0.0:
            return d.error
        deficit = 0.0
        for q in decisions:
            if q is d or not q.limited:
                continue
            if (q.tenant.priority < d.tenant.priority and q.error > self.tolerance
                    and q.state.fraction < self.max_frozen):
                return 0.0  # a lower-priority tenant is still over and can still be throttled more
            if q.state.fraction > 0.0 and q.error < 0.0:
                deficit += -q.error  # time we froze out of q: release q rather than throttle d
        return max(0.0, d.error - deficit)

    def _step(self, d: _Decision, error: float, dt: float) -> float:
        state = d.state
        if not d.limited:
            return self._release(state)
        if not state.engaged:
            over = error > self.tolerance
            engage = error > _ENGAGE_AT_ONCE * self.tolerance or (over and state.over)
            state.over = over
            if not engage:
                state.integral = state.fraction = state.running = 0.0
                return 0.0
            state.engaged = True
        running = min(max(d.use / (1.0 - state.fraction), _MIN_RUNNING_USE), 1.0)
        running, state.running = max(running, state.running), running
        normalized = error / running
        step = (1.0 - math.exp(-self.ki * dt)) * normalized
        if step > 0 and state.fraction >= self.max_frozen:
            step = 0.0  # saturated: no wind-up
        integral = min(max(state.integral + step, 0.0), self.max_frozen)
        fraction = min(max(self.kp * normalized + integral, 0.0), self.max_frozen)
        state.integral = integral
        state.fraction = fraction
        if integral <= 0.0 and fraction <= 0.0:
            state.engaged = state.over = False
            state.running = 0.0
        return fraction

    def _release(self, state: _TenantState) -> float:
        state.engaged = state.over = False
        state.running = 0.0
        state.integral *= _RELEASE_FACTOR
        if state.integral < _RELEASED:
            state.integral = 0.0
        state.fraction = state.integral
        return state.fraction


# -- the duty cycle -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Throttle(Generic[T]):
    targets: tuple[T, ...]
    fraction: float
    frozen: set[T] = field(default_factory=set)
    frozen_since: float | None = None


class DutyCycler(Generic[T]):
    """Freezes each throttled tenant's targets for ``fraction * period`` of every period, on the event loop.

    ``freeze(target)`` / ``thaw(target)`` do the work (``enforce.actions``); ``targets`` are hashable
    (cgroup paths). A fraction of 1 keeps the targets frozen across periods; the controller never asks
    for more than its ``max_frozen``.
    """

    def __init__(
        self,
        freeze: Callable[[T], object],
        thaw: Callable[[T], object],
        *,
        period: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        max_warned: int = 1024,
    ) -> None:
        if period <= 0:
            raise ValueError("period must be positive")
        self._freeze = freeze
        self._thaw = thaw
        self.period = period
        self._clock = clock
        self._sleep = sleep
        self._throttles: dict[str, _Throttle[T]] = {}
        self._seconds: dict[str, float] = {}
        self._warned: OrderedDict[T, None] = OrderedDict()  # targets whose failure was logged
        self._max_warned = max_warned
        self._running = False

    # -- what to throttle -----------------------------------------------------------------------------

    def set(self, key: str, targets: Sequence[T], fraction: float) -> None:
        """Throttle ``key`` (all its targets together) at ``fraction``; 0 (or no targets) thaws it now."""
        fraction = min(max(float(fraction), 0.0), 1.0)
        targets = tuple(dict.fromkeys(targets))
        throttle = self._throttles.get(key)
        if fraction <= 0.0 or not targets:
            if throttle is not None:
                self._thaw_key(key, throttle)
                self._throttles.pop(key, None)
            return
        if throttle is None:
            self._throttles[key] = _Throttle(targets, fraction)
            return
        gone = [t for t in throttle.frozen if t not in targets]
        if gone and not self._thaw_targets(key, throttle, gone):
            return
        throttle.targets = targets
        throttle.fraction = fraction

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
        """Thaw everything now and stop throttling (``set`` again to resume)."""
        for key, throttle in list(self._throttles.items()):
            self._thaw_key(key, throttle)
        self._throttles.clear()

    @property
    def frozen(self) -> set[T]:
        """The targets frozen at this instant."""
        return {t for throttle in self._throttles.values() for t in throttle.frozen}

    # -- the loop -------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled; whatever ends it (cancel, error), everything it froze is thawed."""
        if self._running:
            raise RuntimeError("DutyCycler.run is already running")
        self._running = True
        try:
            start = self._clock()
            while True:
                self._freeze_all(start)
                end = start + self.period
                while True:
                    now = self._clock()
                    wake = end
                    for key, throttle in list(self._throttles.items()):
                        if not throttle.frozen or throttle.fraction >= 1.0:
                            continue
                        deadline = start + throttle.fraction * self.period
                        if now >= deadline:
                            self._thaw_key(key, throttle)
                        else:
                            wake = min(wake, deadline)
                    if now >= end:
                        break
                    await self._sleep(wake - now)
                now = self._clock()
                start = end if now - end < self.period else now  # fell a whole period behind: resync
        finally:
            self._running = False
            self.stop_all()

    def _freeze_all(self, now: float) -> None:
        for key, throttle in list(self._throttles.items()):
            if throttle.fraction <= 0.0:
                continue
            for target in throttle.targets:
                if target in throttle.frozen:
                    continue  # no-op: still frozen (fraction 1)
                try:
                    self._freeze(target)
                except Exception as exc:  # a vanished cgroup, a permission error: drop the tenant
                    self._failed(key, target, "freeze", exc)
                    self._drop(key, throttle)
                    break
                if not throttle.frozen:
                    throttle.frozen_since = now
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

    def _failed(self, key: str, target: T, what: str, exc: Exception) -> None:
        if target in self._warned:
            return
        self._warned[target] = None
        if len(self._warned) > self._max_warned:
            self._warned.popitem(last=False)
        log.warning("%s %s of %s failed, no longer throttling it: %s", what, target, key, exc)
