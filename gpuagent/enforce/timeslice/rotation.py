"""The rotation's controller: which tenants take turns on one GPU, and how long each turn is.

Feed-forward first. Under the exclusive rotation (``plans.RotationPlan``) a throttled tenant runs alone in
its slot, so the slot's length *is* its share of the GPU's time, whatever NVML reports; NVML's per-process
view (about 5 samples a second, each crediting mostly one context: some 20 points of noise per 1 s poll)
is only used, slowly, to correct what the slots cannot know (a queue that runs on past its slot; a neighbour
that is never frozen). Each update, for one GPU:

- **active**: a tenant whose mean use over the last ``window`` seconds, plus its standard error, is at
  least ``idle_threshold`` (as ``ShareController``); a member, which runs in its slot only (and whose
  readings are 0 in most polls when its slot is short), while its mean use over ``window / slot`` seconds
  (10 at most) is at least ``idle_threshold * slot``;
- **members**: with ``work_conserving`` (the default), active tenants with a share while two or more
  tenants are active (a tenant alone is never throttled); without, active tenants with a share. A tenant
  joins unless its use (plus two standard errors) is under its share of what all the tenants use together
  (1 on a GPU they fill), so one that could not use more (an MPS client held to fewer SMs, a light tenant)
  is never throttled, and a member leaves once clearly under half its slot of that. Tenants without a
  share are never members: never frozen, they run through every slot;
- **targets**: the members' part of the GPU is what the others do not use (an active non-member keeps
  ``max(its use, its share or 0)``, an idle one its use). Each member gets its share; what is left of that
  part goes to the members of the highest priority, in proportion to their shares (so a lower priority is
  held to its share first), except a member clearly using under half its target (it keeps its share);
  when the shares ask for more than there is, the lowest priorities give it up first. Without
  ``work_conserving`` the members get their shares only;
- **correction**: for each member, the running mean (over the polls since the members or their targets last
  changed) of its part of the members' measured use less its part of the slots in force: a bias the slots
  did not foresee (a queue running on past its slot). Only what is beyond two standard errors of that
  mean is corrected (half a target at most):
  readings this noisy would otherwise move the slots more than any bias they hold;
- **fraction**: each member is frozen ``1 - slot`` of the period, where its ``slot`` is its corrected target
  (the slots summing to the targets' sum); the open rest of the period has every member frozen.

Tenants absent from an update are dropped. Why this design and what it was compared against: docs/shares.md.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuagent.enforce.timeslice.controller import Tenant

_NOISE_POLLS = 20  # readings kept for the noise estimate
_BIAS_SIGMAS = 2.0  # a bias is corrected beyond this many standard errors of its mean
_MAX_CORRECTION = 0.5  # of a member's target
_MIN_SLOT = 0.02  # of the period: a member's slot never shrinks below this
_LIGHT = 0.5  # a member using under this part of its target (clearly) gets no leftover
_REGIME_CHANGE = 0.005  # a target moving more than this restarts the correction's mean
_MEMBER_WINDOW = 10.0  # seconds: the longest a member's use is averaged over to call it idle


@dataclass(slots=True)
class _State:
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time, use) within the window
    uses: deque[float] = field(default_factory=lambda: deque(maxlen=_NOISE_POLLS))
    member: bool = False
    target: float = 0.0
    slot: float = 0.0
    bias_sum: float = 0.0
    bias_squares: float = 0.0
    bias_polls: int = 0

    def achieved(self, since: float = -math.inf) -> float:
        """Mean use of the readings after ``since``."""
        uses = [u for t, u in self.samples if t > since]
        return math.fsum(uses) / len(uses) if uses else 0.0

    def noise(self) -> float:
        """Standard deviation of one reading, from the differences of successive readings."""
        uses = list(self.uses)
        if len(uses) < 3:
            return 0.0
        diffs = [(b - a) ** 2 for a, b in itertools.pairwise(uses)]
        return math.sqrt(math.fsum(diffs) / len(diffs) / 2.0)

    def restart_bias(self) -> None:
        self.bias_sum = self.bias_squares = 0.0
        self.bias_polls = 0


class RotationController:
    """One GPU: each member's frozen fraction under the exclusive rotation."""

    def __init__(self, *, window: float = 2.0, work_conserving: bool = True, idle_threshold: float = 0.05,
                 correct: bool = True) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        self.work_conserving = work_conserving
        self.idle_threshold = idle_threshold
        self.correct = correct
        self._states: dict[str, _State] = {}

    # -- what the enforcer reads ----------------------------------------------------------------------

    def achieved(self, key: str) -> float:
        """The tenant's mean use over the last ``window`` seconds."""
        state = self._states.get(key)
        if state is None or not state.samples:
            return 0.0
        return state.achieved(state.samples[-1][0] - self.window)

    def fraction(self, key: str) -> float:
        state = self._states.get(key)
        return 1.0 - state.slot if state is not None and state.member else 0.0

    def slot(self, key: str) -> float:
        """The member's slot, a part of the period (0 for a tenant not in the rotation)."""
        state = self._states.get(key)
        return state.slot if state is not None and state.member else 0.0

    def correction(self, key: str) -> float | None:
        """How much the member's slot is shortened (a part of the period; negative: lengthened) for what
        NVML's view shows it getting beyond its slot; None for a tenant not in the rotation."""
        state = self._states.get(key)
        if state is None or not state.member:
            return None
        return state.target - state.slot

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    # -- one update -----------------------------------------------------------------------------------

    def update(self, now: float, tenants: Sequence[Tenant]) -> dict[str, float]:
        """Feed one poll's uses; key -> frozen fraction of the members (others are not throttled)."""
        present = {t.key for t in tenants}
        for key in [k for k in self._states if k not in present]:
            del self._states[key]
        rows = []
        for tenant in tenants:
            state = self._states.setdefault(tenant.key, _State())
            use = min(max(float(tenant.util_ratio), 0.0), 1.0)
            state.samples.append((now, use))
            while state.samples and state.samples[0][0] <= now - _MEMBER_WINDOW:
                state.samples.popleft()
            state.uses.append(use)
            achieved = state.achieved(now - self.window)
            recent = sum(1 for t, _ in state.samples if t > now - self.window)
            stderr = state.noise() / math.sqrt(max(recent, 1))
            if state.member and state.slot > 0.0:  # it runs in its slot only: judged over enough slots
                is_active = state.achieved(now - min(_MEMBER_WINDOW, self.window / state.slot)) \
                    >= self.idle_threshold * state.slot
            else:
                is_active = achieved + stderr >= self.idle_threshold
            rows.append((tenant, state, use, achieved, is_active, stderr))
        active = sum(1 for r in rows if r[4])
        contended = active >= 2 or not self.work_conserving
        busy = min(1.0, max(math.fsum(r[3] for r in rows), self.idle_threshold))  # what the tenants use
        members = [r for r in rows if contended and r[4] and self._takes_turns(r, busy)]
        member_keys = {r[0].key for r in members}
        reserved = math.fsum(
            (max(achieved, t.share_ratio or 0.0) if is_active else achieved)
            for t, _, _, achieved, is_active, _ in rows if t.key not in member_keys)
        targets = self._targets(members, max(0.0, 1.0 - reserved))
        changed = any(not r[1].member or abs(r[1].target - targets[r[0].key]) > _REGIME_CHANGE
                      for r in members)
        for tenant, state, *_ in rows:
            if tenant.key not in member_keys:
                state.member, state.target, state.slot = False, 0.0, 0.0
                state.restart_bias()
        if changed:
            for _, state, *_ in members:
                state.restart_bias()
        self._observe_bias(members, changed)
        for tenant, state, *_ in members:
            state.member = True
            state.target = targets[tenant.key]
        self._slots(members)
        return {r[0].key: 1.0 - r[1].slot for r in members}

    @staticmethod
    def _takes_turns(row: tuple, busy: float) -> bool:
        """A tenant with a share joins the rotation unless its use is clearly under its share of what the
        tenants use together (``busy``: under 1 where something else shares the device) — it could not use
        more: an MPS client held to fewer SMs, a light tenant — and leaves it once clearly under half its
        slot of that."""
        tenant, state, _, achieved, _, stderr = row
        if tenant.share_ratio is None:
            return False
        share = min(max(float(tenant.share_ratio), 0.0), 1.0)
        if state.member:
            return achieved + _BIAS_SIGMAS * stderr >= _LIGHT * min(state.slot, share) * busy
        return achieved + _BIAS_SIGMAS * stderr >= share * busy

    def _targets(self, members: list, room: float) -> dict[str, float]:
        """Each member's share, then the room left to the highest priority (see the module)."""
        shares = {t.key: min(max(float(t.share_ratio), 0.0), 1.0) for t, *_ in members}
        targets: dict[str, float] = {}
        left = room
        for level in sorted({t.priority for t, *_ in members}, reverse=True):  # oversubscribed: the lowest
            keys = [t.key for t, *_ in members if t.priority == level]  # priorities give up what is not there
            asked = math.fsum(shares[k] for k in keys)
            scale = min(1.0, max(0.0, left) / asked) if asked > 0 else 0.0
            for key in keys:
                targets[key] = shares[key] * scale
            left -= asked * scale
        if left <= 1e-12 or not members or not self.work_conserving:
            return targets  # not work-conserving: each member is held to its share
        top = max(t.priority for t, *_ in members)
        takers = [(t, state, achieved, stderr) for t, state, _, achieved, _, stderr in members
                  if t.priority == top
                  and not (state.member and achieved + 2.0 * stderr < _LIGHT * state.target)]
        weight = math.fsum(shares[t.key] for t, *_ in takers)
        for t, *_ in takers:
            targets[t.key] += left * (shares[t.key] / weight if weight > 0 else 1.0 / len(takers))
        return targets

    def _observe_bias(self, members: list, changed: bool) -> None:
        """Each member's part of the members' use, less its part of the slots in force during the poll."""
        if changed or not self.correct or len(members) < 2:
            return
        used = math.fsum(r[2] for r in members)
        planned = math.fsum(r[1].slot for r in members)
        if used <= 0.0 or planned <= 0.0:
            return
        for _, state, use, *_ in members:
            error = use / used - state.slot / planned
            state.bias_sum += error
            state.bias_squares += error * error
            state.bias_polls += 1

    def _slots(self, members: list) -> None:
        """Targets less each member's significant bias, rescaled to the targets' sum."""
        planned = math.fsum(s.target for _, s, *_ in members)
        raw = {}
        for tenant, state, *_ in members:
            raw[tenant.key] = state.target - self._correction(state) * planned
        total = math.fsum(raw.values())
        for tenant, state, *_ in members:
            slot = raw[tenant.key] * planned / total if total > 0 else state.target
            state.slot = min(max(slot, _MIN_SLOT), 1.0)

    def _correction(self, state: _State) -> float:
        n = state.bias_polls
        if n < 3:
            return 0.0
        mean = state.bias_sum / n
        variance = max(0.0, state.bias_squares / n - mean * mean)
        beyond = abs(mean) - _BIAS_SIGMAS * math.sqrt(variance / n)
        if beyond <= 0.0:
            return 0.0
        planned_part = state.target  # capped at half the member's own target
        return math.copysign(min(beyond, _MAX_CORRECTION * planned_part), mean)
