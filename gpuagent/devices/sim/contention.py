"""A GPU time-sliced between tenants' contexts, in virtual time: the plant the share schemes are judged on.

What the H200 showed (docs/shares.md): the controller held NVML's per-process view of two synchronous
tenants at 70/30 while their own iteration counts said 85/15. This model reproduces that failure from its
physics, deterministically from a seed, in well under a second of CPU per simulated minute:

- **the GPU** runs one context at a time, round-robin among the contexts with work: a context keeps the GPU
  until its kernel ends or its ``timeslice_s`` runs out while another waits; changing context costs
  ``switch_s`` of GPU time that does no one's work;
- **tenants**: ``matmul`` is synchronous (launch a ``kernel_s`` product, wait for it, ``gap_s`` of CPU,
  launch the next), so two of them alternate kernel by kernel; ``deep`` keeps ``deep_queue_s`` of work
  queued (it enqueues that much, waits for all of it, ``deep_gap_s`` of CPU, enqueues again); ``trainer``
  (PyTorch-style, an iteration's kernels queued asynchronously, one sync per iteration) and ``serve``
  (requests arriving at random, each a few kernels, its latency recorded) are ``workloads.py``'s, by name
  with their defaults or as a :class:`~gpuagent.devices.sim.workloads.Trainer` or ``Serve``;
- **the freezer** stops a tenant's CPU side only: what it has queued still runs and drains; a launch due
  while it is frozen happens ``gap`` after the thaw; a change lands up to ``freeze_latency_s`` after it
  was due (a timer on the agent's loop), one decided at a CPU reading up to ``hold_latency_s`` after it
  (the preemption's thread hands it to the loop at once: docs/shares.md, the latency class);
- **NVML's per-process samples** come on a fixed ``sample_period_s`` grid (200 ms, measured on the H200:
  the timestamps of ``all.report.json``'s probe sit on one grid to within a millisecond), each instant
  jittered by ``sample_jitter_s``; a sample credits the contexts that ran in the ``sample_window_s``
  before its instant, in proportion to their time there (so most samples credit one context whole, and
  those that straddle a context switch split, as the probe's 50/50 and 60/40 samples do); a poll's
  reading of a tenant is the mean of its credits over the samples since the last poll (what
  ``devices.procutil`` computes from NVML's answer);
- **truth** is each tenant's completed GPU work, the quantity its iteration count measures.

A scheme is any object with ``frozen_at(t) -> set of tenant names``, ``next_change(t) -> float`` (the next
instant its frozen set may change; ``inf`` for never) and ``poll(t, readings)`` (the agent's poll, with
each tenant's reading 0-1); :func:`run` drives it. A scheme with a ``sense_s`` attribute also gets
``sense(t, cpu) -> bool`` every ``sense_s`` seconds (read again after each call: a scheme may change it),
``cpu`` each tenant's CPU seconds so far as its cgroup's ``cpu.stat`` shows them (a tenant uses CPU unless
frozen, a ``serve`` one only while it has a request in hand; the kernel charges a running task at each
scheduler tick, every ``cpu_tick_s`` from one phase for all, and when it stops, so the counter moves in
steps); it returns whether its frozen set changed, which is then decided again (and lands after the
freezer's latency). Such a scheme with a ``cpu_ticks(tick_s, phase_s)`` method is first told the ticks.

The grid's ``phase`` (where within the share period the samples fall) is drawn from the seed unless
given: with a 100 ms duty cycle and a 200 ms grid every sample lands at the same phase of the cycle, which is
what the H200's runs show (docs/shares.md, calibration).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuagent.devices.sim.workloads import KINDS, TENANT_KINDS, Requests, Serve, Tenant, TenantKind, summary

__all__ = ["KINDS", "TENANT_KINDS", "Plant", "PlantSettings", "Result", "Scheme", "TenantKind", "run",
           "solo_rate"]


@dataclass(frozen=True)
class PlantSettings:
    """The physics; the defaults are calibrated on the H200's evidence (docs/shares.md)."""

    kernel_s: float = 0.0016  # one bf16 8192^2 product and its sum (matmul tenants)
    gap_s: float = 0.00005  # a synchronous tenant's CPU turnaround between kernels
    deep_queue_s: float = 0.0896  # 4 replays of a 16-product graph at 1.4 ms a product
    deep_iteration_s: float = 0.0224  # one replay: what a deep tenant's iteration counts
    deep_gap_s: float = 0.0002
    timeslice_s: float = 0.002  # the driver's time slice between contexts that both have work
    switch_s: float = 0.0002  # GPU time lost at each change of context
    freeze_latency_s: float = 0.004  # a freeze or thaw lands up to this long after it was due (event loop)
    # a change decided at a CPU reading (the latency class's preemption) lands up to this long after it: the
    # sensing thread's hand-off to the loop (0.07-0.11 ms at the median) and a v2 thaw (0.12 ms, p99 1.5)
    hold_latency_s: float = 0.001
    cpu_tick_s: float = 0.004  # a running task's cpu.stat moves at each scheduler tick (HZ=250; 0: exact)
    sample_period_s: float = 0.2
    sample_jitter_s: float = 0.0005
    sample_window_s: float = 0.0003
    poll_s: float = 1.0


class Scheme(Protocol):
    def frozen_at(self, t: float) -> set[str]: ...
    def next_change(self, t: float) -> float: ...
    def poll(self, t: float, readings: Mapping[str, float]) -> None: ...


@dataclass
class Result:
    """One run: per-poll readings and cumulative work, and the truth over a window."""

    names: tuple[str, ...]
    poll_times: list[float] = field(default_factory=list)
    readings: list[dict[str, float]] = field(default_factory=list)
    work: list[dict[str, float]] = field(default_factory=list)  # cumulative GPU seconds of work at each poll
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (instant, credits) of NVML
    solo_rate: float = 1.0  # GPU seconds of work per second one tenant of the kind gets alone
    requests: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # serve: (arrival, latency)
    frozen_s: dict[str, float] = field(default_factory=dict)  # seconds each tenant spent frozen

    def latency(self, name: str, after: float) -> dict[str, float]:
        """p50/p99/p99.9 (seconds) and count of the requests of ``name`` that arrived after ``after``; a
        request still unanswered at the end counts with the time it has waited (a lower bound)."""
        return summary([lat for arrived, lat in self.requests.get(name, []) if arrived > after])

    def truth(self, after: float) -> dict[str, float]:
        """Each tenant's share of the work done from ``after`` to the end."""
        done = self._done(after)
        total = sum(done.values())
        return {n: (d / total if total else 0.0) for n, d in done.items()}

    def view(self, after: float) -> dict[str, float]:
        """NVML's view over the same window: each tenant's mean reading, normalized to shares."""
        rows = [r for t, r in zip(self.poll_times, self.readings, strict=True) if t > after]
        sums = {n: sum(r.get(n, 0.0) for r in rows) for n in self.names}
        total = sum(sums.values())
        return {n: (s / total if total else 0.0) for n, s in sums.items()}

    def kept(self, after: float) -> float:
        """Work per second from ``after`` on, against what one tenant gets alone."""
        start = next(i for i, t in enumerate(self.poll_times) if t >= after)
        seconds = self.poll_times[-1] - self.poll_times[start]
        total = sum(self._done(after).values())
        return total / seconds / self.solo_rate if seconds > 0 else 0.0

    def _done(self, after: float) -> dict[str, float]:
        start = next(i for i, t in enumerate(self.poll_times) if t >= after)
        return {n: self.work[-1][n] - self.work[start][n] for n in self.names}


_GPU, _LAUNCH, _SCHEDULE, _SAMPLE, _POLL, _FREEZER, _ARRIVAL, _SENSE = range(8)


class Plant:
    """One simulated GPU and its tenants; :meth:`run` advances it under a scheme."""

    def __init__(self, tenants: Sequence[tuple[str, TenantKind]], settings: PlantSettings | None = None, *,
                 seed: int = 0, phase: float | None = None) -> None:
        self.s = settings or PlantSettings()
        self.rng = random.Random(seed)
        self.tenants = [Tenant.of(name, kind) for name, kind in tenants]
        self._requests = {t.name: Requests(t.spec, seed * 1009 + i) for i, t in enumerate(self.tenants)
                          if isinstance(t.spec, Serve)}
        self.by_name = {t.name: t for t in self.tenants}
        # the grid's offset: where the samples fall; a fraction of the sample period
        self.phase = self.rng.random() if phase is None else phase % 1.0
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._running: Tenant | None = None
        self._segment: tuple[float, float] | None = None  # (start, end) of the running slice
        self._recent: deque[tuple[float, float, str]] = deque(maxlen=16)  # (start, end, who) of past slices
        self._next = 0  # round-robin cursor
        self._credits: dict[str, float] = {t.name: 0.0 for t in self.tenants}
        self._samples = 0
        self._schedule_generation = 0
        self._freezer_order = 0  # the last freezer change applied: an older one arriving late is dropped
        # the ticks' phase, one for every CPU as on a kernel without skew_tick=1 (its own stream: the rest
        # unmoved)
        self.tick_phase = random.Random(seed * 7919 + 29).random() * self.s.cpu_tick_s

    # -- the event queue -----------------------------------------------------------------------------

    def _push(self, t: float, kind: int, what: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, what))

    def run(self, scheme: Scheme, seconds: float) -> Result:
        s = self.s
        result = Result(tuple(t.name for t in self.tenants))
        for tenant in self.tenants:
            if tenant.kind == "serve":
                tenant.idle = True
                self._arrive_next(tenant)
            else:
                tenant.launch_due = 0.0
                self._push(0.0, _LAUNCH, tenant)
            tenant.touch(0.0)
        sense_s = getattr(scheme, "sense_s", None)
        if sense_s and s.cpu_tick_s > 0 and hasattr(scheme, "cpu_ticks"):
            scheme.cpu_ticks(s.cpu_tick_s, self.tick_phase)  # type: ignore[attr-defined]
        if sense_s:
            self._push(sense_s, _SENSE, None)
        self._push(0.0, _SCHEDULE, 0)
        self._push(self.phase * s.sample_period_s, _SAMPLE, 0)
        poll_offset = self.rng.random() * s.poll_s
        self._push(poll_offset, _POLL)
        now = 0.0
        while self._events:
            now, _, kind, what = heapq.heappop(self._events)
            if now > seconds:
                break
            if kind == _GPU:
                self._slice_ends(now)
            elif kind == _LAUNCH:
                self._launch(now, what)  # type: ignore[arg-type]
            elif kind == _SCHEDULE:
                if what == self._schedule_generation:
                    self._decide(now, scheme)
            elif kind == _FREEZER:
                self._apply(now, what)  # type: ignore[arg-type]
            elif kind == _ARRIVAL:
                self._arrive(now, what)  # type: ignore[arg-type]
            elif kind == _SENSE:
                if scheme.sense(now, self._cpu(now)):  # type: ignore[attr-defined]
                    self._schedule_generation += 1
                    self._decide(now, scheme, s.hold_latency_s)
                self._push(now + scheme.sense_s, _SENSE, None)  # type: ignore[attr-defined]
            elif kind == _SAMPLE:
                result.samples.append((now, self._sample(now)))
                k = int(what) + 1  # type: ignore[call-overload]
                at = (self.phase + k) * s.sample_period_s + self.rng.gauss(0.0, s.sample_jitter_s)
                self._push(max(at, now), _SAMPLE, k)
            else:
                readings = {n: (c / self._samples if self._samples else 0.0)
                            for n, c in self._credits.items()}
                self._credits = dict.fromkeys(self._credits, 0.0)
                self._samples = 0
                result.poll_times.append(now)
                result.readings.append(readings)
                result.work.append(self._work_at(now))
                scheme.poll(now, readings)
                self._schedule_generation += 1
                self._push(now, _SCHEDULE, self._schedule_generation)
                self._push(now + s.poll_s, _POLL)
        self._finish(seconds, result)
        return result

    def _finish(self, end: float, result: Result) -> None:
        """The requests still waiting at the end count with the time they have waited; frozen time."""
        for tenant in self.tenants:
            tenant.touch(end)
            result.frozen_s[tenant.name] = tenant.frozen_s
            if tenant.kind == "serve":
                result.requests[tenant.name] = tenant.answered(end)

    def _cpu(self, now: float) -> dict[str, float]:
        for tenant in self.tenants:
            tenant.touch(now)
        tick, phase = self.s.cpu_tick_s, self.tick_phase
        return {t.name: t.counter(now, tick, phase) for t in self.tenants}

    def _work_at(self, now: float) -> dict[str, float]:
        work = {t.name: t.done for t in self.tenants}
        if self._running is not None and self._segment is not None:
            start, _ = self._segment
            work[self._running.name] += max(0.0, now - start)
        return work

    # -- the freezer ---------------------------------------------------------------------------------

    def _decide(self, now: float, scheme: Scheme, latency: float | None = None) -> None:
        """The scheme's frozen set now, landing after the freezer's latency (``latency``: another's); and
        when to look again."""
        self._seq += 1
        latency = self.s.freeze_latency_s if latency is None else latency
        delay = self.rng.uniform(0.0, latency) if latency > 0 else 0.0
        self._push(now + delay, _FREEZER, (self._seq, frozenset(scheme.frozen_at(now))))
        after = scheme.next_change(now)
        if math.isfinite(after):
            self._push(max(after, now + 1e-9), _SCHEDULE, self._schedule_generation)

    def _apply(self, now: float, change: tuple[int, frozenset[str]]) -> None:
        order, frozen = change
        if order < self._freezer_order:
            return
        self._freezer_order = order
        for tenant in self.tenants:
            tenant.touch(now)
            was, tenant.frozen = tenant.frozen, tenant.name in frozen
            tenant.touch(now)
            if was and not tenant.frozen and tenant.blocked:
                tenant.blocked = False
                tenant.launch_due = now + tenant.gap(self.s.gap_s, self.s.deep_gap_s)
                self._push(tenant.launch_due, _LAUNCH, tenant)

    # -- tenants' CPU side ---------------------------------------------------------------------------

    def _launch(self, now: float, tenant: Tenant) -> None:
        if tenant.launch_due is None or now < tenant.launch_due:
            return  # a stale launch
        tenant.launch_due = None
        if tenant.frozen:
            tenant.blocked = True
            return
        queued, again = tenant.launch(now, self.s.kernel_s, self.s.deep_queue_s)
        if again is not None:
            tenant.launch_due = again
            self._push(again, _LAUNCH, tenant)
        if queued and self._running is None:
            self._dispatch(now)

    def _arrive_next(self, tenant: Tenant) -> None:
        at, works = self._requests[tenant.name].next()
        self._push(at, _ARRIVAL, (tenant, works))

    def _arrive(self, now: float, what: tuple[Tenant, list[float]]) -> None:
        tenant, works = what
        if tenant.arrive(now, works):  # its worker woke (else it is busy, or frozen: it wakes at the thaw)
            self._launch(now, tenant)
        self._arrive_next(tenant)

    # -- the GPU -------------------------------------------------------------------------------------

    def _dispatch(self, now: float, previous: Tenant | None = None) -> None:
        """Give the GPU to the next context with work (round-robin), or leave it idle."""
        n = len(self.tenants)
        for step in range(n):
            tenant = self.tenants[(self._next + step) % n]
            if tenant.queued > 1e-12:
                self._next = (self._next + step + 1) % n
                start = now + (self.s.switch_s if previous is not None and previous is not tenant else 0.0)
                length = tenant.queued if tenant.kind == "matmul" else min(tenant.queued, self.s.timeslice_s)
                self._running = tenant
                self._segment = (start, start + length)
                self._push(start + length, _GPU)
                return
        self._running = None
        self._segment = None

    def _slice_ends(self, now: float) -> None:
        tenant, segment = self._running, self._segment
        if tenant is None or segment is None:
            return
        start, end = segment
        ran = end - start
        tenant.queued = max(0.0, tenant.queued - ran)
        tenant.done += ran
        self._recent.append((start, end, tenant.name))
        if tenant.queued <= 1e-12:  # its work is done: its CPU goes on (a trainer's once all is launched)
            tenant.queued = 0.0
            if tenant.to_launch == 0:
                tenant.launch_due = now + tenant.gap(self.s.gap_s, self.s.deep_gap_s)
                self._push(tenant.launch_due, _LAUNCH, tenant)
        others = any(t.queued > 1e-12 for t in self.tenants if t is not tenant)
        if tenant.queued > 0.0 and not others:  # alone: keeps the GPU, no switch
            length = min(tenant.queued, self.s.timeslice_s)
            self._segment = (now, now + length)
            self._push(now + length, _GPU)
            return
        self._dispatch(now, previous=tenant)

    # -- NVML ----------------------------------------------------------------------------------------

    def _sample(self, now: float) -> dict[str, float]:
        window = self.s.sample_window_s
        lo = now - window
        credit: dict[str, float] = {}
        pieces: list[tuple[float, float, str]] = list(self._recent)
        if self._running is not None and self._segment is not None:
            pieces.append((self._segment[0], min(now, self._segment[1]), self._running.name))
        for start, end, who in pieces:
            overlap = min(end, now) - max(start, lo)
            if overlap > 0:
                credit[who] = credit.get(who, 0.0) + overlap / window
        self._samples += 1
        for who, value in credit.items():
            credit[who] = min(value, 1.0)
            self._credits[who] += credit[who]
        return credit


def solo_rate(kind: TenantKind, settings: PlantSettings | None = None, seconds: float = 5.0) -> float:
    """GPU seconds of work per second one tenant of ``kind`` gets alone on the plant."""
    plant = Plant([("solo", kind)], settings)
    result = plant.run(_Never(), seconds)
    return result.work[-1]["solo"] / result.poll_times[-1] if result.poll_times else 0.0


class _Never:
    def frozen_at(self, t: float) -> set[str]:
        return set()

    def next_change(self, t: float) -> float:
        return math.inf

    def poll(self, t: float, readings: Mapping[str, float]) -> None:
        return None


def run(tenants: Iterable[tuple[str, TenantKind]], scheme: Scheme, *, seconds: float = 60.0, seed: int = 0,
        phase: float | None = None, settings: PlantSettings | None = None) -> Result:
    """One run of ``scheme`` on a fresh plant; its ``solo_rate`` is that of the first tenant's kind."""
    tenants = list(tenants)
    plant = Plant(tenants, settings, seed=seed, phase=phase)
    result = plant.run(scheme, seconds)
    result.solo_rate = solo_rate(tenants[0][1], settings)
    return result
