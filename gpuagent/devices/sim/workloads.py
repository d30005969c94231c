"""The contention plant's tenants: their CPU side (what each kind launches, when, and what a freeze stops),
the request-driven and PyTorch-style kinds, and their latency figures.

``contention.py`` knows two synchronous kinds by name (``matmul``: one kernel then wait; ``deep``: 90 ms
queued then wait). Issue 29 asks what sharing does to a latency-sensitive service beside real trainers, so
the plant takes two more, described here and run by ``contention.Plant``:

- :class:`Trainer`, PyTorch-style: the CPU launches an iteration's kernels one after the other
  asynchronously (``launch_s`` of CPU each, far less than a kernel, so the queue grows to nearly the whole
  iteration), synchronises once at its end (waits for the queue to drain), spends ``step_s`` on the CPU
  (the data loader, the optimizer's host side) and starts the next. A freeze stops the launching where it
  is; what was queued drains.
- :class:`Serve`, request-driven: requests arrive as a Poisson process (``arrivals="poisson"``) or in bursts
  of ``burst`` at once (``"bursts"``, the bursts a Poisson process); one worker serves them in order, each
  a few kernels launched together (``kernels`` drawn uniformly, of ``kernel_s`` each: the H200's matmul,
  so 3.2-19.2 ms of GPU work), then a synchronisation and the reply. ``load`` is the GPU time it asks for
  against the GPU alone (the arrival rate is ``load`` over the mean request). A request's latency runs from
  its arrival to its reply: a request arriving while its pod is frozen waits for the thaw, and one whose
  kernels finish while the pod is frozen is answered only after it. Its CPU side is busy (cgroup
  ``cpu.stat`` moves) while a request is in hand, spinning in the synchronisation as CUDA's default does,
  and idle otherwise: what a scheme can read every few milliseconds to know the service has work.

Arrivals come from their own seeded stream, so two runs of one seed see the same requests whatever the
scheme does: designs are compared on common random numbers.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

ARRIVALS = ("poisson", "bursts")
KINDS = ("matmul", "deep")  # the saturated synchronous kinds the split tables of docs/shares.md run
TENANT_KINDS = (*KINDS, "trainer", "serve")


@dataclass(frozen=True)
class Trainer:
    """A PyTorch-style trainer: ``iteration_s`` of kernels queued asynchronously, one sync per iteration."""

    iteration_s: float = 0.1
    kernel_s: float = 0.0016
    launch_s: float = 0.00002  # CPU per launch
    step_s: float = 0.002  # CPU between an iteration's sync and the next one's first launch

    @property
    def kernels(self) -> int:
        return max(1, round(self.iteration_s / self.kernel_s))


@dataclass(frozen=True)
class Serve:
    """A request-driven service of ``load`` (0-1 of the GPU alone); see the module."""

    load: float = 0.3
    arrivals: str = "poisson"
    burst: int = 4  # requests per burst, with ``arrivals="bursts"``
    kernels: tuple[int, int] = (2, 12)  # a request's kernels, uniform over this range (inclusive)
    kernel_s: float = 0.0016

    def __post_init__(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"unknown arrivals {self.arrivals!r}; known: {', '.join(ARRIVALS)}")
        if not 0.0 < self.load < 1.0:
            raise ValueError("load must be in (0, 1)")
        if not 1 <= self.kernels[0] <= self.kernels[1] or self.burst < 1:
            raise ValueError("kernels must be a range of at least one kernel, burst at least 1")

    @property
    def mean_request_s(self) -> float:
        return (self.kernels[0] + self.kernels[1]) / 2.0 * self.kernel_s


TenantKind = str | Trainer | Serve  # a kind by name (its defaults), or a workload's settings


@dataclass
class Tenant:
    """One tenant on the plant: the plant's GPU runs its ``queued`` work; :meth:`launch` is its CPU."""

    name: str
    kind: str
    spec: Trainer | Serve | None = None
    queued: float = 0.0  # GPU seconds of work queued
    done: float = 0.0
    frozen: bool = False
    launch_due: float | None = None  # when its CPU launches next (None: waiting on the GPU, or idle)
    blocked: bool = False  # its launch came due while frozen: it launches ``gap`` after the thaw
    to_launch: int = 0  # trainer: kernels of this iteration not launched yet
    backlog: deque[tuple[float, float]] = field(default_factory=deque)  # serve: (arrival, work) waiting
    in_hand: float | None = None  # serve: the arrival of the request whose kernels are queued
    idle: bool = False  # serve: no request in hand, none waiting
    replies: list[tuple[float, float]] = field(default_factory=list)  # serve: (arrival, latency)
    cpu_s: float = 0.0  # CPU seconds used up to ``mark``
    frozen_s: float = 0.0  # seconds frozen up to ``mark``
    mark: float = 0.0
    cpu_on: bool = False
    on_since: float = 0.0  # when its CPU last went on

    @classmethod
    def of(cls, name: str, kind: TenantKind) -> Tenant:
        if isinstance(kind, Trainer):
            return cls(name, "trainer", kind)
        if isinstance(kind, Serve):
            return cls(name, "serve", kind, idle=True)
        if kind == "trainer":
            return cls(name, "trainer", Trainer())
        if kind == "serve":
            return cls(name, "serve", Serve(), idle=True)
        if kind not in KINDS:
            raise ValueError(f"unknown tenant kind {kind!r}; known: {', '.join(TENANT_KINDS)}")
        return cls(name, kind)

    def gap(self, gap_s: float, deep_gap_s: float) -> float:
        """CPU time from a drained queue or a thaw to its next launch."""
        if isinstance(self.spec, Trainer):
            return self.spec.launch_s if self.to_launch else self.spec.step_s
        return deep_gap_s if self.kind == "deep" else gap_s

    def launch(self, now: float, kernel_s: float, deep_queue_s: float) -> tuple[bool, float | None]:
        """Its CPU's launch at ``now`` (not frozen): queues its work; returns whether it queued any, and
        the instant of its next launch when it launches again without waiting on the GPU."""
        if self.kind == "matmul":
            self.queued += kernel_s
        elif self.kind == "deep":
            self.queued += deep_queue_s
        elif isinstance(self.spec, Trainer):
            if self.to_launch == 0:  # its sync returned: the next iteration
                self.to_launch = self.spec.kernels
            self.queued += self.spec.kernel_s
            self.to_launch -= 1
            return True, (now + self.spec.launch_s if self.to_launch else None)
        else:
            return self._serve(now), None
        return True, None

    def _serve(self, now: float) -> bool:
        """The reply to the request in hand (its kernels are done), then the next request's kernels."""
        if self.in_hand is not None:
            self.replies.append((self.in_hand, now - self.in_hand))
            self.in_hand = None
        if not self.backlog:
            self.idle = True
            self.touch(now)
            return False
        self.in_hand, work = self.backlog.popleft()
        self.queued += work
        return True

    def arrive(self, now: float, works: Sequence[float]) -> bool:
        """Requests arrive; True when its worker wakes and launches at once (it was idle, not frozen)."""
        self.backlog.extend((now, w) for w in works)
        if not self.idle:
            return False
        self.idle = False
        self.touch(now)
        if self.frozen:
            self.blocked = True
            return False
        self.launch_due = now
        return True

    def touch(self, now: float) -> None:
        """Account its CPU and frozen time up to ``now`` under its state before this instant's change."""
        if self.cpu_on:
            self.cpu_s += now - self.mark
        if self.frozen:
            self.frozen_s += now - self.mark
        self.mark = now
        on = not self.frozen and not (self.kind == "serve" and self.idle)
        if on and not self.cpu_on:
            self.on_since = now
        self.cpu_on = on

    def counter(self, now: float, tick_s: float, phase: float) -> float:
        """Its CPU seconds as its cgroup's ``cpu.stat`` shows them at ``now`` (after :meth:`touch`): the
        kernel charges a running task at each scheduler tick (every ``tick_s``, from ``phase``) and when it
        stops, so while its CPU is on the counter stands at the last tick (or where it went on)."""
        if not self.cpu_on or tick_s <= 0:
            return self.cpu_s
        tick = phase + math.floor((now - phase) / tick_s) * tick_s
        return self.cpu_s - (now - max(self.on_since, min(tick, now)))

    def answered(self, end: float) -> list[tuple[float, float]]:
        """Its replies, and the requests unanswered at ``end`` with the time they have waited."""
        waiting = ([self.in_hand] if self.in_hand is not None else []) + [a for a, _ in self.backlog]
        return [*self.replies, *((a, end - a) for a in waiting)]


class Requests:
    """The arrivals of one :class:`Serve` tenant, from their own seeded stream: ``next()`` gives the next
    arrival's instant and the GPU seconds of each request arriving then."""

    def __init__(self, spec: Serve, seed: int) -> None:
        self.spec = spec
        self._rng = random.Random(seed)
        per_arrival = spec.burst if spec.arrivals == "bursts" else 1
        self._rate = spec.load / spec.mean_request_s / per_arrival  # arrivals per second
        self._per_arrival = per_arrival
        self._at = 0.0

    def next(self) -> tuple[float, list[float]]:
        self._at += self._rng.expovariate(self._rate)
        low, high = self.spec.kernels
        return self._at, [self._rng.randint(low, high) * self.spec.kernel_s for _ in range(self._per_arrival)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0-1) of ``values`` by the nearest rank (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(latencies: Sequence[float]) -> dict[str, float]:
    """p50, p99 and p99.9 of ``latencies`` (seconds), and how many."""
    return {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
            "p999": percentile(latencies, 0.999), "n": float(len(latencies))}
