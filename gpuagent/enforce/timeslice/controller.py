"""The PI share controller of ``share_scheme: duty``: each tenant's frozen fraction from NVML's view.

One :class:`ShareController` per GPU closes the loop on the measured per-tenant SM use at every poll: a
tenant over its allowance (its share, or what idle neighbours leave it) is throttled by a PI step on its
error normalized by its running use, engaged by a CUSUM test that its noise (estimated online) cannot
trigger, with anti-windup, priorities (the lowest throttled first) and work conservation. It trusts the
view: on a real GPU, under a fixed duty cycle, that view is one phase of the cycle, not its average, and
the shares it holds are not the work done (docs/shares.md, the H200's evidence); the rotation
(``rotation.py``) is the default for that reason. The rules, the gains and their derivation:
[docs/shares.md, the duty scheme's controller](../../../docs/shares.md#the-duty-schemes-pi-controller).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpuagent.frozen import faster_init

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Hashable)

_MIN_RUNNING_USE = 0.1  # floor of the running-use estimate: bounds the loop gain for a light tenant
_RELEASE_FACTOR = 0.25  # the integral's decay per update when a tenant is released
_RELEASED = 0.02  # below this, a decaying fraction is 0
_FIRST_DT = 0.5  # seconds assumed for the poll before a controller's first update
_ENGAGE_AT_ONCE = 4.0  # an excess over this many tolerances engages at the first poll that shows it
_NOISE_POLLS = 20  # the noise estimate's window, in poll-to-poll differences
_DRIFT_SIGMAS = 0.25  # the CUSUM tests' allowance for noise, per poll, in standard deviations
_ENGAGE_SIGMAS = 5.0  # the CUSUM tests' threshold for noise, in standard deviations
_WAKE_SIGMAS = 1.0  # a dormant tenant is throttled again once its integral is this many standard errors up
_RELEASE_SIGMAS = 2.0  # an engaged tenant is released once its integral is this many standard errors below


@faster_init  # one per tenant per poll (gpuagent/frozen.py)
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
    dormant: bool = False  # engaged, its integral fell to 0: not throttled until it is clearly above 0 again
    running: float = 0.0  # the smoothed estimate of its use while not frozen (0: none yet)
    polls: int = 0  # readings the integral has averaged since it engaged
    cusum: float = 0.0  # the engage (or change) test's sum of excesses
    cusum_low: float = 0.0  # the change test's sum of deficits
    run: int = 0  # polls in the engage test's current run (since its sum was last 0)
    run_error: float = 0.0  # the sum of the errors over that run
    last_raw: float | None = None  # the last poll's raw running use (for the noise estimate)
    diffs: deque[float] = field(default_factory=lambda: deque(maxlen=_NOISE_POLLS))  # squared differences
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=_NOISE_POLLS))  # recent use - allowance
    mean: float | None = None  # achieved() of the samples as they are; None once they changed

    def achieved(self) -> float:
        if self.mean is None:
            self.mean = math.fsum([u for _, u in self.samples]) / len(self.samples) if self.samples else 0.0
        return self.mean

    def noise(self) -> float:
        """Standard deviation of one poll's measured use (0 until three differences are known).

        From the poll-to-poll differences of the running use ``use / (1 - f)``, which the tenant's own
        fraction does not move; the largest difference of the window is left out, so one real step (a
        neighbour's change, a queue's tail) does not read as noise.
        """
        diffs = self.diffs
        if len(diffs) < 3:
            return 0.0
        # fsum is exact then rounded once, so the sum with the largest taken back out is the float the sum
        # of all but the largest gives, without sorting the window every poll
        return math.sqrt(math.fsum([*diffs, -max(diffs)]) / (len(diffs) - 1) / 2.0) * (1.0 - self.fraction)

    def reset(self) -> None:
        self.integral = self.fraction = self.running = self.cusum = self.cusum_low = self.run_error = 0.0
        self.polls = self.run = 0
        self.engaged = self.dormant = False
        self.errors.clear()


@dataclass(slots=True)
class _Decision:
    """One tenant's figures at one update, before its PI step."""

    tenant: Tenant
    state: _TenantState
    use: float
    achieved: float
    noise: float = 0.0  # standard deviation of one poll's measured use
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
        errors = self._effective_errors(decisions)
        for d, error in zip(decisions, errors, strict=True):
            self._step(d, error, dt)
        self._drop_common_slice(decisions)
        return {d.tenant.key: d.state.fraction for d in decisions if d.state.fraction > 0}

    def achieved(self, key: str) -> float:
        """The tenant's mean use over the window (0 for an unknown tenant)."""
        state = self._states.get(key)
        return state.achieved() if state is not None else 0.0

    def fraction(self, key: str) -> float:
        """The frozen fraction decided for the tenant at the last update."""
        state = self._states.get(key)
        return state.fraction if state is not None else 0.0

    def noise(self, key: str) -> float:
        """The estimated standard deviation of one poll's measured use of the tenant (0 while unknown)."""
        state = self._states.get(key)
        return state.noise() if state is not None else 0.0

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
        state.mean = None
        self._prune(state, now)
        raw = use / (1.0 - state.fraction)
        if state.last_raw is not None:
            state.diffs.append((raw - state.last_raw) ** 2)
        state.last_raw = raw
        return _Decision(tenant, state, use, state.achieved(), state.noise())

    def _prune(self, state: _TenantState, now: float) -> None:
        horizon = now - self.window
        while state.samples and state.samples[0][0] <= horizon:
            state.samples.popleft()
            state.mean = None

    def _age_absent(self, now: float, present: set[str]) -> None:
        """A tenant missing from an update is not throttled; its state goes once its window is empty."""
        for key in [k for k in self._states if k not in present]:
            state = self._states[key]
            self._prune(state, now)
            if state.samples:
                state.reset()
                state.last_raw = None
            else:
                del self._states[key]

    def _classify(self, decisions: list[_Decision]) -> None:
        for d in decisions:
            # idle only when its window's mean is below the threshold by more than its standard error
            stderr = d.noise / math.sqrt(max(len(d.state.samples), 1))
            d.active = d.achieved + stderr >= self.idle_threshold
        # What the others reserve is the sum over all tenants less one's own: every tenant's sum at once.
        reserved = _SumsOfOthers([
            max(o.achieved, o.tenant.share_ratio or 0.0) if o.active else o.achieved for o in decisions
        ]) if self.work_conserving else None
        active = sum(1 for d in decisions if d.active)
        for index, d in enumerate(decisions):
            share = d.tenant.share_ratio
            if share is None:
                continue
            share = min(max(float(share), 0.0), 1.0)
            if reserved is not None:
                d.allowance = max(share, 1.0 - reserved.without(index))
                d.limited = active - d.active > 0  # another tenant is active
            else:
                d.allowance = share
                d.limited = True
            d.error = d.use - d.allowance
            d.state.errors.append(d.error)

    def _effective_errors(self, decisions: list[_Decision]) -> list[float]:
        """Each tenant's excess that is its own to correct: its error less the deficits of the other
        throttled tenants (time we froze out of them: releasing them comes first), and 0 while a tenant of
        lower priority goes first (it is held)."""
        holding = [  # limited tenants still over and still able to be throttled more
            q.tenant.priority for q in decisions
            if q.limited and q.error > self.tolerance and q.state.fraction < self.max_frozen
        ]
        lowest_holding = min(holding) if holding else None
        deficits = _SumsOfOthers([
            self._deficit(q) if q.limited and q.state.fraction > 0.0 else 0.0 for q in decisions
        ])
        errors = []
        for index, d in enumerate(decisions):
            if d.error <= 0.0:
                errors.append(d.error)
            elif lowest_holding is not None and lowest_holding < d.tenant.priority:
                errors.append(0.0)  # a lower-priority tenant is still over and can still be throttled more
            else:
                errors.append(max(0.0, d.error - deficits.without(index)))
        return errors

    def _drop_common_slice(self, decisions: list[_Decision]) -> None:
        """Work-conserving, with every active tenant throttled: the slice of the period in which all of
        them are frozen only idles the GPU, so it comes off every fraction (and integral)."""
        active = [d for d in decisions if d.active]
        if not self.work_conserving or len(active) < 2:
            return
        common = min(d.state.fraction for d in active)
        if common <= 0.0:
            return
        for d in active:
            d.state.fraction = max(0.0, d.state.fraction - common)
            d.state.integral -= common

    def _deficit(self, q: _Decision) -> float:
        """How far q is below its allowance: its mean error over enough recent polls that the mean's
        noise is about the tolerance (the last poll alone without noise), less that noise."""
        wanted = math.ceil((q.noise / self.tolerance) ** 2) if self.tolerance > 0.0 else len(q.state.errors)
        recent = list(q.state.errors)[-max(1, wanted):]
        mean = math.fsum(recent) / len(recent)
        return max(0.0, -mean - q.noise / math.sqrt(len(recent)))

    def _engages(self, d: _Decision, error: float) -> bool:
        """The engage test: a one-sided CUSUM of the excess over the tolerance, scaled by the noise."""
        state = d.state
        state.cusum = max(0.0, state.cusum + error - self.tolerance - _DRIFT_SIGMAS * d.noise)
        if state.cusum <= 0.0:
            state.run, state.run_error = 0, 0.0
            return False
        state.run += 1
        state.run_error += error
        return state.cusum > (_ENGAGE_AT_ONCE - 1.0) * self.tolerance + _ENGAGE_SIGMAS * d.noise

    def _changed(self, d: _Decision, error: float, gain: float, dt: float) -> bool:
        """Under noise (a gain below the full one), a two-sided CUSUM of the engaged tenant's error."""
        state = d.state
        if gain >= 1.0 - math.exp(-self.ki * dt):
            state.cusum = state.cusum_low = 0.0
            state.run, state.run_error = 0, 0.0
            return False
        drift = self.tolerance + _DRIFT_SIGMAS * d.noise
        state.cusum = max(0.0, state.cusum + error - drift)
        state.cusum_low = max(0.0, state.cusum_low - error - drift)
        if state.cusum <= 0.0 and state.cusum_low <= 0.0:
            state.run, state.run_error = 0, 0.0
            return False
        state.run += 1
        state.run_error += error
        threshold = (_ENGAGE_AT_ONCE - 1.0) * self.tolerance + _ENGAGE_SIGMAS * d.noise
        return max(state.cusum, state.cusum_low) > threshold

    def _gain(self, d: _Decision, dt: float) -> float:
        """The integral's step: ``1 - exp(-ki dt)``, lowered under noise to what the readings support."""
        full = 1.0 - math.exp(-self.ki * dt)
        if d.noise <= 0.0 or d.state.polls <= 1:
            return full
        rho = (self.tolerance / d.noise) ** 2
        budget = 2.0 * rho / (1.0 + rho)  # feeds back noise of about ``tolerance`` into the use
        return min(full, max(budget, 1.0 / d.state.polls))

    def _step(self, d: _Decision, error: float, dt: float) -> float:
        state = d.state
        if not d.limited:
            return self._release(state)
        if not state.engaged:
            if not self._engages(d, error):
                state.integral = state.fraction = state.running = 0.0
                return 0.0
            error = state.run_error / state.run  # the mean excess over the evidence
            state.engaged = True
            state.dormant = False
            state.polls = state.run
            state.cusum = state.cusum_low = 0.0
            state.run, state.run_error = 0, 0.0
            gain = 1.0 - math.exp(-self.ki * dt)
        else:
            state.polls += 1
            gain = self._gain(d, dt)
            if self._changed(d, error, gain, dt):
                error = state.run_error / state.run  # the mean error since the change
                state.polls = state.run
                state.cusum = state.cusum_low = 0.0
                state.run, state.run_error = 0, 0.0
                gain = 1.0 - math.exp(-self.ki * dt)
        full = 1.0 - math.exp(-self.ki * dt)
        scale = gain / full if full > 0.0 else 1.0
        raw = min(max(d.use / (1.0 - state.fraction), _MIN_RUNNING_USE), 1.0)
        previous = state.running
        smoothed = raw if previous <= 0.0 else previous + scale * (raw - previous)
        running, state.running = max(smoothed, previous), smoothed
        normalized = error / running
        step = gain * normalized
        if step > 0 and state.fraction >= self.max_frozen:
            step = 0.0  # saturated: no wind-up
        stderr = d.noise / running / math.sqrt(max(state.polls, 1))
        integral = min(max(state.integral + step, -self.max_frozen), self.max_frozen)
        if integral <= 0.0:
            state.dormant = True
        elif integral >= _WAKE_SIGMAS * stderr:
            state.dormant = False
        fraction = min(max(self.kp * scale * normalized + integral, 0.0), self.max_frozen)
        if state.dormant:
            fraction = 0.0
        state.integral = integral
        state.fraction = fraction
        # the integral estimates the fraction needed; released once that is below 0 by more than two of
        # its standard errors (at once without noise)
        if integral <= -_RELEASE_SIGMAS * stderr and fraction <= 0.0:
            state.integral = 0.0
            self._disengage(state)
        return fraction

    @staticmethod
    def _disengage(state: _TenantState) -> None:
        state.engaged = state.dormant = False
        state.running = state.cusum = state.cusum_low = state.run_error = 0.0
        state.polls = state.run = 0

    def _release(self, state: _TenantState) -> float:
        self._disengage(state)
        state.integral *= _RELEASE_FACTOR
        if state.integral < _RELEASED:
            state.integral = 0.0
        state.fraction = state.integral
        return state.fraction


class _SumsOfOthers:
    """For values ``v``, ``without(i)`` is ``math.fsum`` of every value but ``v[i]``, each in O(1): the
    values are summed once exactly as integers (a finite float is a multiple of 2**-1074) and a sum is
    rounded once, as ``fsum`` rounds (int / int is correctly rounded, half to even), so it is the float
    ``fsum`` gives. What makes a controller's update linear in its tenants, not quadratic. An infinite or
    NaN value (never met: uses and shares are clamped to [0, 1]) falls back to ``fsum`` itself."""

    __slots__ = ("_exact", "_total", "_values")

    def __init__(self, values: list[float]) -> None:
        self._values = values
        self._exact: list[int] | None
        try:
            self._exact = [_exact_units(v) for v in values]
        except (OverflowError, ValueError):
            self._exact = None
        self._total = sum(self._exact) if self._exact is not None else 0

    def without(self, index: int) -> float:
        if self._exact is None:
            return math.fsum(v for i, v in enumerate(self._values) if i != index)
        return (self._total - self._exact[index]) / _UNITS_PER_ONE


_UNITS_PER_ONE = 1 << 1074  # 2**-1074 is the smallest float step (subnormal), so every float is an integer


def _exact_units(value: float) -> int:
    """``value`` in units of 2**-1074, exactly (``as_integer_ratio`` gives a power-of-two denominator)."""
    if not value:
        return 0  # most deficits: a tenant not throttled
    numerator, denominator = float(value).as_integer_ratio()
    return numerator << (1075 - denominator.bit_length())
