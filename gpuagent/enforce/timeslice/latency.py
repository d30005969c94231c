"""A latency class beside the rotation: a service that is never frozen while under its share (issue 29).

Under the rotation a pod with a 30 % share is frozen 70 % of every period, so a request arriving then waits
for its slot (p99 1.3-1.75 s on CPU tenants, ~1 s on the model). :class:`LatencyController` wraps a
:class:`RotationController` for one GPU and treats the keys of its ``latency`` set apart:

- **exempt while under its share**: a latency tenant is left out of the rotation (never frozen) unless it
  is clearly over its share and saturated: its mean use over ``window`` seconds (10 polls at least) less
  one standard error (the noise at least NVML's: 5 samples a poll, each crediting one context) over its
  share by more than ``tolerance``, and its CPU (read as for preemption) busy ``saturated`` of the last
  10 s; without CPU readings, three standard errors. NVML alone cannot tell a service at its share read
  high for half a minute from a saturated one time-slicing to 41-45 %; its CPU can (busy about half the
  time, and all of it);
- **capped**: one clearly over is handed to the rotation with its share plus ``tolerance`` and takes turns
  like any batch tenant (the latency of a saturated service is its own doing). It is released when the
  rotation drops it, or when over 10 s its CPU moved in under 95 % of the readings it was thawed through
  (a saturated service has a request in hand all through its slot; one capped on noise does not);
- **the others** rotate among themselves with their shares: an exempt tenant is not in the rotation's
  sums, so the slots fill the period (no open slot idling the GPU for a service that time-slices into
  every slot anyway), and each batch tenant loses to it in proportion to its slot;
- **preemption** (``preempt``): the agent reads each exempt tenant's CPU time (cgroup ``cpu.stat``)
  every :meth:`period`: ``idle_sense_s`` (20 ms) while nothing is held, ``sense_s`` (2 ms; the caller
  places the readings around the scheduler's ticks, ``ticks.py``) while a hold is on and once after one
  ends (a start read late costs the service a few milliseconds beside its neighbours; an end read late
  idles the GPU). A request begins at a reading whose interval moved by more than ``busy_cpu`` of it (a
  CUDA synchronisation spins) and lasts until the counter stood still through a tick, having last moved
  between two ticks or its tasks not waiting for a CPU (``ticked``: the kernel charges a running task
  only at its ticks, 4 ms at HZ=250, and when it stops, so a counter read faster than the tick stands
  still between ticks while the service spins; one that lost its CPU at a tick was charged there;
  :meth:`waited`: PSI), and at most until it stood still ``still_s`` (5 ms: the ticks not known, or the
  service pressed for CPU and its last movement at a tick). While any has a request in
  hand (and ``hold_s`` after), the batch tenants with a share are all frozen; not while it is over its
  share and ``tolerance`` by one standard error with its CPU saturated, or by three whatever its CPU
  (served at once by its preemption, a service at 60 % is not saturated).
  ``ended`` (off) would end a request at a reading that moved under that part of the usual rate: the
  model gains from it, a real loaded CPU cuts a busy service's holds with it. The freeze stops their CPU,
  not what they queued, so preemption bounds the latency only beside shallow queues.

Why each rule and threshold, the figures, and what cannot be met: docs/shares.md, the latency class.
:meth:`frozen` is what to freeze beyond the plan's windows; the plant of the tests drives it as the agent
does (``tests/latencyplant.py``). In the agent the enforcer wraps a GPU's rotation in one as soon as a
workload there is latency-sensitive (``policies[i].latency_sensitive``, ``gpuagent.io/latency-sensitive``:
``enforce/policy.py``), and ``preempt.py`` reads ``cpu.stat`` and applies :meth:`frozen` through the
cycler.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence

from gpuagent.enforce.timeslice.controller import Tenant
from gpuagent.enforce.timeslice.rotation import RotationController
from gpuagent.enforce.timeslice.ticks import STILL_S

_OVER_SIGMAS = 1.0  # a latency tenant is capped once its mean use is this many standard errors over its share
_OVER_SIGMAS_BLIND = 3.0  # the same, without CPU readings to confirm it is saturated
_SATURATED = 0.95  # a capped tenant busy in less than this part of its thawed intervals is released
_MIN_THAWED_S = 0.5  # seconds thawed, at least, a capped tenant's saturation is judged on
_RELEASE_S = 10.0  # seconds: how long a capped tenant's CPU is judged over
_MIN_POLLS = 10  # a latency tenant is capped only on this many readings at least
_SAMPLES_PER_POLL = 5  # NVML's per-process samples in a 1 s poll (a 200 ms grid): the noise's floor
# The sensing the agent ships (docs/shares.md, the latency class, has the figures that chose it):
SENSE_S = 0.002  # seconds between two readings while a hold is on, and once after it ends
IDLE_SENSE_S = 0.02  # seconds between two readings otherwise
ENDED = 0.0  # (off) a request ended within an interval its CPU moved under this part of its usual rate
_RATE_WEIGHT = 0.25  # the weight of a reading through a request in a service's usual CPU rate
_CALM = 0.01  # a service whose tasks waited for a CPU under this part of the last 10 s does not lose it


class LatencyController:
    """One GPU: latency tenants exempt while under their shares, the rest in a rotation (see the module)."""

    def __init__(self, latency: Iterable[str], *, rotation: RotationController | None = None,
                 preempt: bool = True, window: float = 30.0, sense_s: float = SENSE_S,
                 idle_sense_s: float = IDLE_SENSE_S, ended: float = ENDED, still_s: float = STILL_S,
                 busy_cpu: float = 0.1, tolerance: float = 0.05, saturated: float = 0.9,
                 hold_s: float = 0.0) -> None:
        if window <= 0 or sense_s <= 0 or idle_sense_s < sense_s or still_s < 0:
            raise ValueError("window and sense_s must be positive, idle_sense_s at least sense_s, "
                             "still_s not negative")
        if not 0.0 <= busy_cpu < 1.0 or not 0.0 <= ended < 1.0:
            raise ValueError("busy_cpu and ended must be in [0, 1)")
        self.latency = frozenset(latency)
        self.rotation = rotation or RotationController()
        self.preempt = preempt
        self.window = window
        self.sense_s = sense_s
        self.idle_sense_s = idle_sense_s
        self.ended = ended
        self.still_s = still_s
        self.busy_cpu = busy_cpu
        self.tolerance = tolerance
        self.saturated = saturated
        self.hold_s = hold_s
        self._last_busy: dict[str, float] = {}
        self._cpu_polls: dict[str, deque[tuple[float, float]]] = {}  # key -> (poll, CPU seconds then)
        self._uses: dict[str, deque[tuple[float, float]]] = {}
        self._capped: dict[str, deque[tuple[float, float, float]]] = {}  # key -> (poll, thawed, busy) since
        self._counts: dict[str, tuple[float, float]] = {}  # key -> seconds read thawed through, busy of them
        self._in_hand: set[str] = set()  # preempting keys with a request in hand at the last reading
        self._rate: dict[str, float] = {}  # key -> its CPU's rate (cores) through a request, smoothed
        self._moved_at: dict[str, float] = {}  # key -> the last reading its CPU moved at
        self._stopped: dict[str, bool] = {}  # key -> it last moved within a window known to hold no tick
        self._waited: dict[str, float] = {}  # key -> the part of the last 10 s its tasks waited for a CPU
        self._preemptions: dict[str, int] = {}  # key -> its requests that began a hold
        self._let_go = False  # a hold ended at the last reading: the next one comes soon (see period)
        self._thawed: frozenset[str] = frozenset()  # the keys thawed at the last reading
        self._preempting: set[str] = set()  # exempt latency keys within their shares: they may preempt
        self._batch: frozenset[str] = frozenset()  # keys with a share, outside the latency class
        self._cpu: dict[str, tuple[float, float]] = {}  # key -> (instant, CPU seconds) of the last reading
        self._busy: frozenset[str] = frozenset()
        self._sensed = -math.inf  # the instant of the last reading

    # -- what the enforcer reads ----------------------------------------------------------------------

    def capped(self, key: str) -> bool:
        """The latency tenant is over its share and takes turns in the rotation."""
        return key in self._capped

    def standing(self, key: str) -> str | None:
        """The tenant's standing in the class at the last poll: ``exempt`` (never frozen, its requests
        preempt the batch tenants), ``over`` (over its share: it preempts no one), ``capped`` (in the
        rotation at its share and ``tolerance``); None: not in the class."""
        if key not in self.latency:
            return None
        if key in self._capped:
            return "capped"
        return "exempt" if key in self._preempting else "over"

    def preemptions(self, key: str) -> int:
        """How many of the tenant's requests began with batch tenants to hold (each a preemption)."""
        return self._preemptions.get(key, 0)

    def busy(self) -> frozenset[str]:
        """The exempt latency tenants that had a request in hand at the last reading of their CPU."""
        return self._busy

    def frozen(self) -> frozenset[str]:
        """What preemption freezes now, beyond the plan's windows: every batch tenant while an exempt
        latency tenant is busy."""
        return self._batch if self.preempt and self._busy else frozenset()

    def batch(self) -> frozenset[str]:
        """The tenants a preemption freezes (with a share, outside the class or capped), at the last poll."""
        return self._batch

    def set_latency(self, keys: Iterable[str]) -> None:
        """The class changed (an annotation, a rule): a key that left it is forgotten, and rotates from the
        next poll on as a batch tenant."""
        keys = frozenset(keys)
        for key in self.latency - keys:
            self.forget(key)
        self.latency = keys

    def achieved(self, key: str) -> float:
        """The tenant's mean use over the rotation's window (a latency tenant's own readings while exempt)."""
        uses = self._uses.get(key)
        if uses and key not in self._capped:
            recent = [u for t, u in uses if t > uses[-1][0] - self.rotation.window]
            return math.fsum(recent) / len(recent)
        return self.rotation.achieved(key)

    def correction(self, key: str) -> float | None:
        """The rotation's correction of the member's slot (None for a tenant not in the rotation)."""
        return self.rotation.correction(key)

    def forget(self, key: str) -> None:
        self._uses.pop(key, None)
        self._cpu.pop(key, None)
        self._capped.pop(key, None)
        self._counts.pop(key, None)
        self._rate.pop(key, None)
        self._moved_at.pop(key, None)
        self._stopped.pop(key, None)
        self._waited.pop(key, None)
        self._preemptions.pop(key, None)
        self._in_hand.discard(key)
        self._cpu_polls.pop(key, None)
        self._last_busy.pop(key, None)
        self._preempting.discard(key)
        self.rotation.forget(key)

    # -- one poll -------------------------------------------------------------------------------------

    def update(self, now: float, tenants: Sequence[Tenant]) -> dict[str, float]:
        """Feed one poll's uses; key -> frozen fraction of the rotation's members."""
        present = {t.key for t in tenants}
        for key in [k for k in self._uses if k not in present]:
            self.forget(key)
        handed = []
        for tenant in tenants:
            if tenant.key not in self.latency or tenant.share_ratio is None:
                handed.append(tenant)
                continue
            uses = self._uses.setdefault(tenant.key, deque())
            uses.append((now, min(max(float(tenant.util_ratio), 0.0), 1.0)))
            while uses and uses[0][0] <= now - self.window:
                uses.popleft()
            share = float(tenant.share_ratio) + self.tolerance
            saturated = self._saturated(tenant.key, now)
            if tenant.key not in self._capped and self._clearly_over(uses, share, saturated):
                self._capped[tenant.key] = deque()
            if tenant.key in self._capped:
                handed.append(Tenant(tenant.key, tenant.util_ratio, min(1.0, share), tenant.priority))
                self._preempting.discard(tenant.key)
            elif self._over(uses, share, _OVER_SIGMAS if saturated else _OVER_SIGMAS_BLIND):
                self._preempting.discard(tenant.key)
            else:
                self._preempting.add(tenant.key)
        fractions = self.rotation.update(now, handed)
        for key, counts in list(self._capped.items()):
            if self.rotation.slot(key) == 0.0 or self._unsaturated(key, counts, now):
                del self._capped[key]  # over its share no more: exempt again
        self._batch = frozenset(t.key for t in tenants if t.share_ratio is not None
                                and (t.key not in self.latency or t.key in self._capped))
        self._busy = self._busy & self._preempting
        return fractions

    def _unsaturated(self, key: str, counts: deque[tuple[float, float, float]], now: float) -> bool:
        """Over the last ``_RELEASE_S``, it was busy in under ``_SATURATED`` of the time it was sensed
        thawed through (once it was thawed ``_MIN_THAWED_S`` at least)."""
        counts.append((now, *self._counts.get(key, (0.0, 0.0))))
        while len(counts) > 1 and counts[1][0] <= now - _RELEASE_S:
            counts.popleft()
        (first, thawed_then, busy_then), (last, thawed, busy) = counts[0], counts[-1]
        if last - first < _RELEASE_S * 0.9 or thawed - thawed_then < _MIN_THAWED_S:
            return False
        return busy - busy_then < _SATURATED * (thawed - thawed_then)

    def _saturated(self, key: str, now: float) -> bool | None:
        """Its CPU busy ``saturated`` of the last 10 s (None while under 10 polls of readings)."""
        cpu = self._cpu_polls.setdefault(key, deque())
        if key in self._cpu:
            cpu.append((now, self._cpu[key][1]))
        while len(cpu) > 1 and cpu[0][0] <= now - _RELEASE_S:
            cpu.popleft()
        if len(cpu) < _MIN_POLLS:
            return None
        (first, used_then), (last, used) = cpu[0], cpu[-1]
        return used - used_then >= self.saturated * (last - first)

    def _clearly_over(self, uses: deque[tuple[float, float]], share: float, saturated: bool | None) -> bool:
        """Its mean use clearly over ``share`` and its CPU saturated, or far over it without CPU readings
        (see the module)."""
        if len(uses) < _MIN_POLLS or saturated is False:
            return False
        return self._over(uses, share, _OVER_SIGMAS if saturated else _OVER_SIGMAS_BLIND)

    @staticmethod
    def _over(uses: deque[tuple[float, float]], share: float, sigmas: float) -> bool:
        """The mean of ``uses`` is over ``share`` by ``sigmas`` standard errors (two readings at least)."""
        if len(uses) < 2:
            return False
        values = [u for _, u in uses]
        mean = math.fsum(values) / len(values)
        variance = max(math.fsum((u - mean) ** 2 for u in values) / (len(values) - 1),
                       mean * (1.0 - mean) / _SAMPLES_PER_POLL)  # a few alike readings are no certainty
        return mean - sigmas * math.sqrt(variance / len(values)) > share

    # -- every few milliseconds -----------------------------------------------------------------------

    def period(self) -> float:
        """Seconds to the next reading: ``sense_s`` while a hold is on (its end, read late, idles the GPU)
        and for one reading after one ends, ``idle_sense_s`` otherwise (a start read late costs the service
        a few milliseconds of a shared GPU; docs/shares.md, the latency class)."""
        return self.sense_s if self._let_go or self.frozen() else self.idle_sense_s

    def waited(self, key: str, part: float | None) -> None:
        """The part of the last 10 s the latency tenant's tasks waited for a CPU (PSI; None: unknown). Under
        ``_CALM`` a still tick ends its request wherever it last moved: none lost its CPU at a tick."""
        if part is None:
            self._waited.pop(key, None)
        else:
            self._waited[key] = part

    def sense(self, now: float, cpu: Mapping[str, float], thawed: Collection[str] | None = None,
              ticked: bool | None = None) -> bool:
        """Each latency tenant's CPU seconds so far (``cpu.stat``), the keys the plan has thawed now
        (None: unknown; a capped tenant is then released only by the rotation), and whether a scheduler
        tick was surely charged since the last call (None: unknown; ``ticks.py``); True when :meth:`frozen`
        changed."""
        busy = set()
        thawed_now = frozenset(thawed) if thawed is not None else frozenset()
        sensed, self._sensed = self._sensed, now
        for key in self.latency:
            if key not in cpu:
                continue
            used = float(cpu[key])
            last = self._cpu.get(key)
            self._cpu[key] = (now, used)
            if last is None or now <= last[0]:
                continue
            interval = now - last[0]
            rate = (used - last[1]) / interval
            moved = rate > self.busy_cpu
            if moved:
                self._moved_at[key] = now
                self._stopped[key] = ticked is False and last[0] == sensed
            # still through a tick since the last reading, having last moved between two ticks (it stopped:
            # one that lost its CPU at a tick is charged at that tick): nothing of it ran at this tick; else
            # still longer than a tick at most (a running task is charged at its ticks: see the module)
            # (or anywhere, while its tasks have not been waiting for a CPU: none lost it at a tick)
            stopped = self._stopped.get(key, False) or self._waited.get(key, 1.0) < _CALM
            active = not (ticked and not moved and last[0] == sensed and stopped) \
                and now - self._moved_at.get(key, -math.inf) <= self.still_s
            if key in self._capped:
                if key in thawed_now and key in self._thawed:  # thawed through the interval
                    through, busy_in = self._counts.get(key, (0.0, 0.0))
                    self._counts[key] = (through + interval, busy_in + interval * active)
            elif key in self._preempting:
                if self._in_hand_through(key, rate, moved, active):
                    self._last_busy[key] = now
                if now - self._last_busy.get(key, -math.inf) <= self.hold_s:
                    busy.add(key)
        self._thawed = thawed_now
        before = self.frozen()
        if self.preempt and self._batch:
            for key in busy - self._busy:
                self._preemptions[key] = self._preemptions.get(key, 0) + 1
        self._busy = frozenset(busy)
        after = self.frozen()
        self._let_go = bool(before) and not after
        return after != before

    def _in_hand_through(self, key: str, rate: float, moved: bool, active: bool) -> bool:
        """Whether ``key`` still has a request in hand at this reading: one began when its CPU moved, and
        lasts while it moved within ``still_s``; and, through a request begun before (a hold's second
        reading on), a reading that moved under ``ended`` of its usual rate ends it: the CPU stopped within
        the interval (the kernel charges a task that stops at once), so its end is read now, not
        ``still_s`` later."""
        if not active:
            self._in_hand.discard(key)
            return False
        if key not in self._in_hand:
            if moved:  # a request began
                self._in_hand.add(key)
            return moved
        if moved:
            usual = self._rate.get(key)
            self._rate[key] = rate if usual is None else usual + _RATE_WEIGHT * (rate - usual)
            if usual is not None and rate < self.ended * usual:
                self._in_hand.discard(key)
                return False
        return True
