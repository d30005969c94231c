"""Time-slice shares on one GPU: a controller that decides frozen fractions, and the duty cycle applying them.

Physics. Freezing a tenant's cgroups stops its CPU threads, so it stops submitting GPU work; kernels already
queued still run, so its measured SM use decays over its queue depth (a few hundred ms) rather than
dropping at once. The controller therefore never assumes what a freeze achieved: it closes the loop on the
*measured* per-tenant SM use NVML reports at each poll. Freezing a tenant for a fraction ``f`` of every
period removes about ``f`` of the use it has while running (``use = (1 - f) * r``), and the others take
the time it leaves. Throttling the tenant *over* its share is what works: freezing the one below its share
cannot raise it.

Measurement noise. On a time-sliced GPU NVML samples each process about every 200 ms and each sample
belongs to one context, so a 1 s poll's per-process use is the share of ~5 samples a tenant held: readings
come in 20-point steps and swing 20 points around the truth. Every rule below therefore takes the
tenant's **noise** ``s``, the standard deviation of one poll's reading, estimated online from the
poll-to-poll differences of its running use ``use / (1 - f)`` over the last 20 polls (which its own
fraction does not move; the largest difference is left out, so one real step does not read as noise;
0 until three differences are known). With ``s`` near 0 every rule is the noise-free one.

:class:`ShareController` (one per GPU) at every poll, for every tenant (a pod, or another workload):

- **use** is ``Tenant.util_ratio``, its SM use over the last poll (summed over its processes);
  **achieved** is the mean of its uses over the last ``window`` seconds (exported as the achieved share).
  A tenant is **active** when its achieved use plus its standard error (``s / sqrt(samples)``) is at
  least ``idle_threshold``: a few noisy zero readings of a light tenant do not make it idle.
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
  deficits of the *other throttled* tenants below their allowance, since that time is ours, frozen out of
  them; releasing them comes first. A deficit is Q's mean error over its last ``(s_Q / tolerance)^2``
  polls (at most 20; the last one alone without noise) less that mean's standard error, so one noisy
  low reading of Q does not cancel P's excess. And the error counts as 0 while the priority rule below
  holds the tenant back.
- **engage**: a tenant not throttled starts being throttled on a one-sided CUSUM of its excess:
  ``S = max(0, S + e - tolerance - s/4)``, engaged once ``S > 3 * tolerance + 5 * s``. Without noise
  that is an excess over ``4 * tolerance`` at one poll, or a smaller one summing to it over a few; with
  noise a tenant sitting at its allowance (in a full split every tenant is) is not throttled by noise
  alone, while a real excess of half a standard deviation engages in about 10-20 polls. The first
  correction uses the mean excess over the CUSUM's run, not the last reading.
- **PI** on the error normalized by the tenant's running use ``r = use / (1 - f)`` (``f`` the fraction in
  force during that poll; clamped to [0.1, 1]): ``en = e / r`` is the part of its running time it must
  lose, whatever the neighbours (``r`` is about 1/2 next to one burner, 1/3 next to two, 1 alone), so one
  set of gains fits every mix. ``I += g * en``, ``f = kp * (g / g_full) * en + I``; ``f`` clamped to
  ``[0, max_frozen]``, ``I`` kept in ``[-max_frozen, max_frozen]`` and not integrated upward while ``f`` is
  at ``max_frozen`` (anti-windup). The step ``g`` is ``g_full = 1 - exp(-ki * dt)`` without noise; under
  noise the integral is an average of the noisy corrections: ``g = min(g_full, max(1 / n, g_noise))``
  with ``n`` the polls it has averaged since it engaged (the running mean, the best estimate of a constant
  from ``n`` readings), and ``g_noise = 2 q / (1 + q)``, ``q = (tolerance / s)^2``, the step at which the
  noise fed back moves the use by about ``tolerance`` (an integral of step ``g`` on noise ``s`` moves it by
  ``s * sqrt(g / (2 - g))``): 1 point of noise leaves ``g_full`` as it is, 20 points give 0.02. A
  two-sided CUSUM of the engaged tenant's error (same drift and threshold as engaging) detects a change
  (a neighbour came or went): the average then restarts from the mean error of the CUSUM's run. The
  running use is smoothed the same way (``r += (g / g_full) * (raw - r)``) so one noisy reading does not
  scale its own error; without noise it is the last poll's.
- **release**: a tenant at or below its allowance is released by the PI itself: a negative error drives
  ``I`` down. Once ``I`` reaches 0 the tenant is *dormant* (not throttled) until ``I`` is one standard
  error (``s / r / sqrt(n)``) above 0 again, and it is released once ``I`` is two standard errors below 0
  (at once without noise): a tenant needing a small fraction is not dropped on noise (re-engaging would
  take the CUSUM's 10-20 polls), and one engaged by noise at its allowance is not throttled on the
  integral's jitter. When the GPU stops being contended or the tenant loses its share, ``I`` shrinks to
  a quarter at each update (0 below 0.02): the others' activity is already a windowed figure, so this
  only smooths the hand-back over a few polls. A tenant absent from an update is not throttled; its
  state is dropped once its window is empty (or at once by :meth:`ShareController.forget`).
- **common slice**: with ``work_conserving``, when every active tenant (two or more) is throttled, the
  smallest of their fractions comes off every fraction and integral: the duty cycle freezes all from the
  start of the period, so that slice has everyone frozen and only idles the GPU. This also breaks the
  tie noise can leave: tenants all at their allowances (a full split) throttled by the same amount hold
  their shares whatever that amount is, so without it nothing would pull them back to 0.
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
poll, which moves the use by under 1 point. With NVML's sampling noise (the binomial plant of the tests,
1 s polls, 60 s runs, the mean over the last 45 s, 48 seeds) the worst tenant's error is 2.2 points in
the median at 70/30, 1.3-1.5 at 90/10 and 10/90, 4.4 at 50/30/20 (two throttled tenants whose needed
fractions move with each other's); the noise's own mean over those 45 polls has a standard deviation of
about 3.5 points, which no controller acting on these readings alone can remove, so single runs reach
7-12 points (without these rules: 8-11 points in the median, up to 16). Figures:
``bench/bench_timeslice.py`` (``--noise-model binomial``).

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


# -- the duty cycle -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Throttle(Generic[T]):
    targets: tuple[T, ...]
    fraction: float
    frozen: set[T] = field(default_factory=set)
    frozen_since: float | None = None


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
