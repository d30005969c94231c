"""The latency class's sensing as shipped (issue 29): when the agent reads a latency pod's CPU, and how it
reads a request's end.

A request's start read late costs the service a few milliseconds of a shared GPU; its end read late idles
the GPU (its neighbours are held frozen for nothing). So :meth:`LatencyController.period` is short while a
hold is on (and for one reading after it ends) and long otherwise; without the ticks' grid a hold ends once
the counter stood still longer than a scheduler tick (the kernel charges a running task only at its ticks;
with the grid: ``test_latency_ticks.py``); ``ended`` (measured,
off by default) would end it at a reading that moved under a part of the usual rate. The figures that
chose them: docs/shares.md, the latency class. Deterministic: readings at given instants, fake counters.
"""

from __future__ import annotations

import math

import pytest
from test_latency_class import FakeCounter, rotation_cycler

from gpuagent.devices.sim.workloads import Tenant as WorkloadTenant
from gpuagent.enforce.timeslice import LatencyController, Preemption, Tenant
from gpuagent.enforce.timeslice.ticks import STILL_S, kernel_tick, still_for

FAST, IDLE = 0.002, 0.02


def service(**settings: float) -> LatencyController:
    """A GPU's controller after one poll: ``svc`` (latency, well under its 30 % share) beside ``t0``."""
    controller = LatencyController({"svc"}, **{"sense_s": FAST, "idle_sense_s": IDLE, **settings})
    controller.update(0.0, [Tenant("svc", 0.1, 0.3), Tenant("t0", 0.6, 0.7)])
    return controller


class Readings:
    """The service's CPU counter and the instants the controller is read at, each after its period."""

    def __init__(self, controller: LatencyController) -> None:
        self.controller = controller
        self.now = 1.0
        self.cpu = 0.0
        controller.sense(self.now, {"svc": self.cpu})

    def next(self, busy: float) -> float:
        """The next reading, its CPU having moved ``busy`` of the interval; the interval's length."""
        interval = self.controller.period()
        self.now += interval
        self.cpu += busy * interval
        self.controller.sense(self.now, {"svc": self.cpu})
        return interval


def test_it_reads_slowly_while_idle_fast_while_it_holds_and_once_after() -> None:
    controller = service()
    read = Readings(controller)
    assert controller.period() == IDLE and read.next(0.0) == IDLE  # idle: the slow period
    assert controller.frozen() == frozenset() and controller.period() == IDLE
    assert read.next(0.3) == IDLE  # a request began in the last 30 % of a slow interval
    assert controller.frozen() == {"t0"} and controller.period() == FAST
    for _ in range(5):
        assert read.next(1.0) == FAST and controller.frozen() == {"t0"}
    read.next(0.0)
    read.next(0.0)  # still 4 ms: a tick's length, not yet an end
    assert controller.frozen() == {"t0"}
    read.next(0.0)  # still 6 ms: it ended
    assert controller.frozen() == frozenset()
    assert controller.period() == FAST  # one more fast reading: it may have stopped between two requests
    read.next(0.0)
    assert controller.period() == IDLE


def test_a_fixed_period_stays_fixed_through_a_long_hold() -> None:
    controller = service(sense_s=0.005, idle_sense_s=0.005)
    read = Readings(controller)
    read.next(0.5)
    assert [read.next(1.0) for _ in range(20)] == [0.005] * 20


def test_a_counter_that_moves_only_at_the_scheduler_tick_keeps_the_hold() -> None:
    """The kernel charges a running task at each tick (4 ms at HZ=250): read every 2 ms, a spinning
    service's counter stands still every other reading, and jumps 4 ms at the next."""
    controller = service()
    read = Readings(controller)
    read.next(0.3)
    for step in range(20):
        read.next(2.0 if step % 2 else 0.0)
        assert controller.frozen() == {"t0"}, step


def test_with_ended_a_request_ending_within_an_interval_ends_the_hold_at_that_reading() -> None:
    controller = service(ended=0.5, still_s=0.0)
    read = Readings(controller)
    read.next(0.5)  # began
    read.next(1.0)  # through a whole interval: its usual rate, one core
    assert controller.frozen() == {"t0"}
    read.next(0.4)  # it stopped after 40 % of the interval: under half its rate
    assert controller.frozen() == frozenset()
    read.next(1.0)  # a next request (read fast): held again at once
    assert controller.frozen() == {"t0"}


def test_without_ended_the_end_is_read_only_once_the_counter_stood_still() -> None:
    controller = service(ended=0.0, still_s=0.0)
    read = Readings(controller)
    read.next(0.5)
    read.next(1.0)
    read.next(0.4)
    assert controller.frozen() == {"t0"}  # still held: it moved
    read.next(0.0)
    assert controller.frozen() == frozenset()


def test_with_ended_a_starved_service_learns_its_rate() -> None:
    """A service that gets 0.4 of a core (a loaded node) is let go at its first readings, then keeps its
    holds once its usual rate is learned: its requests are not cut into freezes and thaws."""
    controller = service(ended=0.5, still_s=0.0)
    read = Readings(controller)
    read.next(0.2)
    read.next(1.0)  # usual: one core
    let_go = []
    for _ in range(20):  # a request in hand all along, at 0.4 of a core
        read.next(0.4)
        let_go.append(controller.frozen() == frozenset())
    assert let_go[0] and not any(let_go[-10:])


def test_a_service_over_its_share_preempts_no_one_and_is_read_slowly() -> None:
    controller = LatencyController({"svc"}, sense_s=FAST, idle_sense_s=IDLE)
    read = Readings(controller)
    for poll in range(12):  # NVML reads it far over its share, three standard errors and more
        controller.update(float(poll), [Tenant("svc", 0.9, 0.3), Tenant("t0", 0.1, 0.7)])
    assert read.next(1.0) == IDLE and read.next(1.0) == IDLE
    assert controller.frozen() == frozenset() and controller.period() == IDLE


def test_a_capped_service_is_judged_on_the_seconds_it_was_thawed_whatever_the_periods() -> None:
    """Saturation is counted in seconds, not readings: a saturated service read at uneven intervals (its
    CPU still through the short ones, longer than a tick) stays capped, though half its readings did not
    move."""
    controller = LatencyController({"svc"}, sense_s=FAST, idle_sense_s=IDLE)
    now, cpu = 0.0, 0.0

    def second(short: float, use: float = 0.5) -> None:
        """About one second: readings after 200 ms its CPU moved through, each followed by one after
        ``short`` that did not move; then a poll reading it at ``use`` (over its share by default)."""
        nonlocal now, cpu
        end = now + 1.0
        while now < end:
            now += 0.2
            cpu += 0.2
            controller.sense(now, {"svc": cpu}, {"svc", "t0"})
            now += short
            controller.sense(now, {"svc": cpu}, {"svc", "t0"})
        controller.update(now, [Tenant("svc", use, 0.3), Tenant("t0", 1.0 - use, 0.7)])

    for _ in range(10):
        second(0.006)
    assert controller.capped("svc")
    for _ in range(11):  # busy 97 % of its seconds in 50 % of its readings: saturated
        second(0.006)
    assert controller.capped("svc")
    for _ in range(11):  # busy 50 % of its seconds: not (and NVML reads it under its share)
        second(0.2, use=0.2)
    assert not controller.capped("svc")


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        LatencyController({"svc"}, sense_s=0.01, idle_sense_s=0.005)
    with pytest.raises(ValueError):
        LatencyController({"svc"}, ended=1.0)
    with pytest.raises(ValueError):
        LatencyController({"svc"}, still_s=-0.001)


def test_the_preemption_reads_at_the_shortest_period_of_what_it_watches() -> None:
    cycler, _, recorder = rotation_cycler()
    counters = {"svc1": FakeCounter(), "svc2": FakeCounter()}
    preemption = Preemption(cycler, lambda targets: [counters[t] for t in targets])
    assert preemption.period() == math.inf  # nothing watched: the thread waits
    one, two = service(), service()
    preemption.watch("gpu0", one, {"svc": ["svc1"]}, {"t0": ["t01"]})
    preemption.watch("gpu1", two, {"svc": ["svc2"]}, {"t0": ["t11"]})
    assert preemption.period() == IDLE
    preemption.sense(1.0)
    counters["svc2"].value += 0.01
    for group in preemption.sense(1.02):
        preemption.apply(group)
    assert recorder.frozen == {"t11"} and preemption.period() == FAST  # gpu1 holds: both read fast
    assert preemption.readings == 2
    preemption.stop()


def test_the_models_counter_moves_at_the_tick_and_when_the_cpu_stops() -> None:
    """The plant's ``cpu.stat`` as the kernel keeps it: a running tenant charged at each tick, one that
    stops charged up to that instant, one that starts again not until its next tick."""
    tenant = WorkloadTenant.of("t0", "matmul")
    tick, phase = 0.004, 0.001

    def counter(now: float) -> float:
        tenant.touch(now)
        return tenant.counter(now, tick, phase)

    tenant.touch(0.0)
    assert counter(0.0105) == pytest.approx(0.009)  # ticks at 0.001, 0.005, 0.009
    assert tenant.counter(0.0105, 0.0, phase) == pytest.approx(0.0105)  # no tick: the exact counter
    tenant.frozen = True  # it stops at 0.0107: charged up to then
    assert counter(0.0107) == pytest.approx(0.0107)
    assert counter(0.0115) == pytest.approx(0.0107)
    tenant.frozen = False  # it runs again from 0.012
    assert counter(0.012) == pytest.approx(0.0107)
    assert counter(0.0125) == pytest.approx(0.0107)  # no tick since it started
    assert counter(0.0135) == pytest.approx(0.0107 + 0.001)  # the tick at 0.013


def test_the_still_time_outlasts_this_kernels_tick() -> None:
    """A running task's CPU reaches cpu.stat at a tick: the still time that ends a request is the tick and
    1 ms, the tick read from the coarse clock's resolution (HZ=250 here: 4 ms, as the model's counter)."""
    tick = kernel_tick()
    assert 0.0001 <= tick <= 0.02
    assert still_for(0.004) == pytest.approx(STILL_S)  # the model's tick: the shipped constant
    assert still_for(0.01) == pytest.approx(0.011) and still_for(0.001) == pytest.approx(0.002)
    assert still_for(tick) > tick
