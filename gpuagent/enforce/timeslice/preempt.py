"""The latency class's preemption in the agent: a latency pod's CPU read every few milliseconds, and its
GPU's batch pods frozen through the cycler while it has a request in hand (``latency.py``).

The enforcer :meth:`~Preemption.watch`-es each GPU whose controller is a :class:`LatencyController`, at every
poll: the controller, the latency workloads' freeze targets (whose cgroups' CPU counters are opened once and
kept: ``enforce/cpustat.py``) and the batch workloads' targets. A thread of its own reads every counter,
feeds :meth:`LatencyController.sense`, and sleeps the shortest of the controllers' :meth:`period`-s (2 ms
while one holds its batch pods, 20 ms otherwise); when what it freezes changed, the event loop is asked
(``call_soon_threadsafe``) to apply it with :meth:`Cycler.hold`, so every freeze and thaw is still the
cycler's, on the loop, journaled through ``enforce.actions`` (audit mode counts them and freezes nothing),
and everything held is thawed when the cycler stops. The thread sleeps while nothing is watched.

Why a thread, and why its period changes: the cost of a sensing loop is its wake-ups, not its reads (3 us
a ``pread`` and the controller's step together against 40-180 us a wake-up on the 2-core VM of the tests,
more per wake-up the longer the sleep); an asyncio task on the event loop cost twice a thread's. A request's
end read late idles the GPU, its start read late only shares it for a few milliseconds, so the thread reads
fast only while a hold is on. ``bench/bench_preemption.py`` measures the whole (the process's CPU time
while a real spinning service is watched, at 10/30/60 % load and always busy) and the hand-off from a
reading to the loop's applying it; docs/isolation.md, the latency class, has the figures.
The lock is held for the reads and the controller's step (microseconds); the enforcer
takes it for the controller's poll.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from gpuagent.enforce.cpustat import system_waited
from gpuagent.enforce.timeslice.cycler import Cycler
from gpuagent.enforce.timeslice.latency import LatencyController
from gpuagent.enforce.timeslice.ticks import KernelTicks

log = logging.getLogger(__name__)

_PRESSURE_S = 1.0  # seconds between two readings of the latency workloads' CPU pressure (a 10 s average)

T = TypeVar("T", bound=Hashable)


class Counter(Protocol):
    def seconds(self) -> float | None: ...

    def waited(self) -> float | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Watch(Generic[T]):
    controller: LatencyController
    latency: Mapping[str, tuple[T, ...]]  # latency key -> its targets (what its counters were opened for)
    counters: Mapping[str, tuple[Counter, ...]]
    batch: Mapping[str, tuple[T, ...]]  # batch key -> its targets (what a preemption freezes)


class Preemption(Generic[T]):
    """Reads the latency workloads' CPU every ``period_s`` on a thread; holds their GPUs' batch workloads
    frozen through ``cycler`` while :meth:`LatencyController.frozen` says (see the module)."""

    def __init__(self, cycler: Cycler[T], open_counters: Callable[[Sequence[T]], Sequence[Counter]], *,
                 clock: Callable[[], float] = time.monotonic,
                 ticks: KernelTicks | Literal["kernel"] | None = "kernel") -> None:
        self.readings = 0  # how many times the thread has read the counters (bench/bench_preemption.py)
        # "kernel": the kernel's ticks, learnt beside the monotonic clock (none beside another: a test's);
        # None: none, a request ends once its CPU stood still longer than a tick (ticks.py)
        if ticks == "kernel":
            ticks = KernelTicks(clock=clock) if clock is time.monotonic else None
        self.ticks = ticks
        self.lock = threading.Lock()  # the controllers' state and the counters: the thread and the loop
        self._cycler = cycler
        self._open = open_counters
        self._clock = clock
        self._watches: dict[Hashable, _Watch[T]] = {}  # replaced, never changed in place
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopped = False
        self._pressure_due = -math.inf  # when the thread next reads the workloads' CPU pressure

    @property
    def watched(self) -> frozenset[Hashable]:
        return frozenset(self._watches)

    # -- from the event loop, each poll -----------------------------------------------------------------

    def watch(self, group: Hashable, controller: LatencyController, latency: Mapping[str, Sequence[T]],
              batch: Mapping[str, Sequence[T]]) -> None:
        """Sense ``group``'s latency workloads (key -> freeze targets) to hold its ``batch`` ones; with no
        latency target or no batch one, stop watching it."""
        latency = {k: tuple(sorted(set(v), key=str)) for k, v in latency.items() if v}
        batch = {k: tuple(sorted(set(v), key=str)) for k, v in batch.items() if v}
        if not latency or not batch:
            self.unwatch(group)
            return
        with self.lock:
            old = self._watches.get(group)
            counters = {}
            for key, targets in latency.items():
                kept = old.counters.get(key) if old is not None and old.latency.get(key) == targets else None
                counters[key] = kept if kept is not None else tuple(self._open(targets))
            if old is not None:
                self._close(old, keep=counters)
            self._watches = {**self._watches, group: _Watch(controller, latency, counters, batch)}
        self._wake.set()
        self.apply(group)

    def unwatch(self, group: Hashable) -> None:
        """Stop sensing ``group`` and let go of what its preemption holds."""
        with self.lock:
            old = self._watches.get(group)
            if old is None:
                return
            self._watches = {g: w for g, w in self._watches.items() if g != group}
            self._close(old, keep={})
        self._cycler.hold(group, {})

    def forget(self, key: str) -> None:
        """``key`` is released (the memory ladder signals it, or it left): no watch holds it until the next
        poll's :meth:`watch` names it again."""
        for group, watch in list(self._watches.items()):
            if key in watch.batch:
                with self.lock:
                    batch = {k: v for k, v in watch.batch.items() if k != key}
                    self._watches = {**self._watches, group: _Watch(watch.controller, watch.latency,
                                                                    watch.counters, batch)}
                self.apply(group)

    def unwatch_all(self) -> None:
        for group in list(self._watches):
            self.unwatch(group)

    def stop(self) -> None:
        """No more holds (shutdown): stop the thread, let go of every hold, close every counter."""
        self._stopped = True
        self._stop.set()
        self._wake.set()
        self.unwatch_all()

    # -- the sensing ------------------------------------------------------------------------------------

    def period(self) -> float:
        """Seconds to the next reading: the shortest of the watched controllers' (fast while one holds)."""
        return min((w.controller.period() for w in self._watches.values()), default=math.inf)

    def sense(self, now: float, ticks: KernelTicks | None = None) -> list[Hashable]:
        """One reading of every watched counter fed to its controller (with ``ticks``, begun at ``now``:
        whether a tick lies since the last reading); the groups whose hold changed."""
        changed = []
        self.readings += 1
        with self.lock:
            frozen = self._cycler.frozen_keys
            read_now = []
            for watch in self._watches.values():
                cpu = {}
                for key, counters in watch.counters.items():
                    values = [c.seconds() for c in counters]
                    read = [v for v in values if v is not None]
                    if read:
                        cpu[key] = sum(read)
                read_now.append(cpu)
            ticked = ticks.end() if ticks is not None else None
            for (group, watch), cpu in zip(self._watches.items(), read_now, strict=True):
                thawed = [k for k in watch.controller.latency if k not in frozen]
                if watch.controller.sense(now, cpu, thawed, ticked):
                    changed.append(group)
        return changed

    def pressure(self) -> None:
        """Each latency workload's CPU pressure (the most of its cgroups', else the node's: PSI's ``some
        avg10``) to its controller, where a still tick then ends a request wherever it last moved."""
        node: list[float | None] = []  # read once, where a workload has no pressure of its own
        with self.lock:
            for watch in self._watches.values():
                for key, counters in watch.counters.items():
                    parts = [part for c in counters if (part := c.waited()) is not None]
                    if not parts and not node:
                        node.append(system_waited())
                    watch.controller.waited(key, max(parts) if parts else node[0])

    def apply(self, group: Hashable) -> None:
        """On the loop: hold what the group's controller freezes now."""
        if self._stopped:
            return
        with self.lock:
            watch = self._watches.get(group)
            held = {} if watch is None else {
                key: watch.batch[key] for key in watch.controller.frozen() if key in watch.batch}
        self._cycler.hold(group, held)

    async def run(self) -> None:
        """The sensing thread, until cancelled (then everything held is let go)."""
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._stopped = False
        thread = threading.Thread(target=self._thread, args=(loop,), name="gpuagent-preemption", daemon=True)
        thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.stop()
            thread.join(timeout=1.0)

    def _thread(self, loop: asyncio.AbstractEventLoop) -> None:
        last = self._clock()
        while not self._stop.is_set():
            if not self._watches:
                self._wake.clear()
                if not self._watches:
                    self._wake.wait()
                last = self._clock()
                continue
            ticks = self.ticks
            try:
                began = ticks.begin() if ticks is not None else self._clock()
                changed = self.sense(began, ticks)
            except Exception:  # a bug must not stop the loop's work; the holds stay as they were
                log.exception("the latency class's sensing failed; preemption stopped")
                loop.call_soon_threadsafe(self.stop)
                return
            if began >= self._pressure_due:
                self._pressure_due = began + _PRESSURE_S
                self.pressure()
            try:
                for group in changed:
                    loop.call_soon_threadsafe(self.apply, group)
            except RuntimeError:  # the loop is closed: the agent is gone
                return
            period = self.period()
            if math.isinf(period):  # nothing watched any more: wait at the top
                continue
            if ticks is not None and period >= 2.0 * ticks.tick and ticks.due(began):
                ticks.calibrate()  # while slow: a tick's spin at most, once a minute (ticks.py)
            grid = ticks.grid if ticks is not None else None
            if grid is None or period >= 2.0 * grid.tick:  # counted from the last reading's start
                last = last + period
            else:  # fast: around the ticks (ticks.py)
                last = began + grid.delay(began, period)
            last = max(last, self._clock())  # fell behind (a starved process): no burst of readings
            time.sleep(max(0.0, last - self._clock()))

    @staticmethod
    def _close(watch: _Watch[T], *, keep: Mapping[str, tuple[Counter, ...]]) -> None:
        kept = {id(c) for counters in keep.values() for c in counters}
        for counters in watch.counters.values():
            for counter in counters:
                if id(counter) not in kept:
                    counter.close()
