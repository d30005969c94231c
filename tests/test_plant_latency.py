"""The contention plant's request-driven and PyTorch-style tenants (issue 29), and the latency class on it.

The plant's physics first (``gpuagent/devices/sim/workloads.py``): a service's requests wait for the ones
before them and for a thaw, its CPU is busy only while it has a request in hand, a trainer's queue runs
through a freeze; then what the share designs do to the service (``tests/latencyplant.py``): the rotation
freezes a service well under its share, the latency class does not, and what its preemption buys.
"""

from __future__ import annotations

import math
import statistics

import pytest
from latencyplant import SERVICE, Unenforced, run_beside

from gpuagent.devices.sim import contention
from gpuagent.devices.sim.workloads import Serve, Trainer, percentile
from gpuagent.enforce.timeslice import LatencyController, RotationPlan, Tenant


class FrozenHalf:
    """``who`` frozen for the first half of every second; records the CPU readings it senses."""

    sense_s = 0.01

    def __init__(self, who: str) -> None:
        self.who = who
        self.cpu: list[tuple[float, dict[str, float]]] = []

    def frozen_at(self, t: float) -> set[str]:
        return {self.who} if t % 1.0 < 0.5 - 1e-9 else set()

    def next_change(self, t: float) -> float:
        return math.floor(t * 2.0 + 1e-9) / 2.0 + 0.5

    def poll(self, t: float, readings: object) -> None:
        return None

    def sense(self, t: float, cpu: dict[str, float]) -> bool:
        self.cpu.append((t, dict(cpu)))
        return False


def test_a_lone_service_serves_its_load_and_a_request_waits_only_for_those_before_it() -> None:
    result = contention.run([(SERVICE, Serve(0.05))], Unenforced(), seconds=120, seed=1)
    latencies = [x for _, x in result.requests[SERVICE]]
    assert result.work[-1][SERVICE] / result.poll_times[-1] == pytest.approx(0.05, abs=0.01)
    assert min(latencies) >= 2 * 0.0016 - 1e-9  # its own kernels at least
    assert percentile(latencies, 0.5) == pytest.approx(0.0112, abs=0.003)  # the mean request, little queueing
    assert max(latencies) < 0.1


@pytest.mark.parametrize("arrivals", ["poisson", "bursts"])
def test_both_arrival_processes_carry_the_load_and_bursts_queue_longer(arrivals: str) -> None:
    poisson = contention.run([(SERVICE, Serve(0.3))], Unenforced(), seconds=120, seed=2)
    result = contention.run([(SERVICE, Serve(0.3, arrivals))], Unenforced(), seconds=120, seed=2)
    assert result.work[-1][SERVICE] / 120 == pytest.approx(0.3, abs=0.03)
    if arrivals == "bursts":  # four at once: the last of a burst waits for the three before it
        assert result.latency(SERVICE, 10)["p50"] > 2 * poisson.latency(SERVICE, 10)["p50"]


def test_a_request_arriving_while_its_pod_is_frozen_waits_for_the_thaw() -> None:
    scheme = FrozenHalf(SERVICE)
    result = contention.run([(SERVICE, Serve(0.1))], scheme, seconds=60, seed=3)
    in_freeze = [(arrived, latency) for arrived, latency in result.requests[SERVICE] if arrived % 1.0 < 0.5]
    assert len(in_freeze) > 100
    assert all(latency >= 0.5 - arrived % 1.0 for arrived, latency in in_freeze)
    assert result.frozen_s[SERVICE] == pytest.approx(30.0, abs=0.1)


def test_a_service_uses_cpu_only_with_a_request_in_hand_and_no_tenant_while_frozen() -> None:
    scheme = FrozenHalf("t")
    contention.run([("t", "matmul"), (SERVICE, Serve(0.1))], scheme, seconds=30, seed=4)
    (t0, first), (t1, last) = scheme.cpu[100], scheme.cpu[-1]
    assert (last["t"] - first["t"]) / (t1 - t0) == pytest.approx(0.5, abs=0.02)  # thawed half the time
    busy = (last[SERVICE] - first[SERVICE]) / (t1 - t0)
    assert 0.1 <= busy < 0.3  # its load, and the waits for its neighbour's kernels
    steps = [b[1][SERVICE] - a[1][SERVICE] for a, b in zip(scheme.cpu, scheme.cpu[1:], strict=False)]
    assert sum(1 for s in steps if s == 0.0) > len(steps) / 2  # idle between requests


def test_a_trainer_queues_its_iteration_and_a_freeze_stops_only_its_launching() -> None:
    alone = contention.run([("t", Trainer())], Unenforced(), seconds=20, seed=5)
    assert alone.work[-1]["t"] / alone.poll_times[-1] == pytest.approx(0.1 / 0.102, abs=0.01)  # one sync
    # frozen 70 ms of every 100 ms beside a synchronous tenant: its queued iteration runs on through it
    frozen = contention.run([("a", "matmul"), ("t", "trainer")], _Duty({"t": 0.7}), seconds=30, seed=5)
    assert frozen.truth(5)["t"] > 0.35


def test_the_arrivals_are_the_same_whatever_the_scheme() -> None:
    free = contention.run([("t", "deep"), (SERVICE, Serve(0.3))], Unenforced(), seconds=30, seed=6)
    held = contention.run([("t", "deep"), (SERVICE, Serve(0.3))], FrozenHalf(SERVICE), seconds=30, seed=6)
    assert sorted(a for a, _ in free.requests[SERVICE]) == sorted(a for a, _ in held.requests[SERVICE])


def test_unknown_arrivals_and_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown arrivals"):
        Serve(0.3, "uniform")
    with pytest.raises(ValueError, match="known: matmul, deep, trainer, serve"):
        contention.Plant([("a", "graph")])


# -- the designs ----------------------------------------------------------------------------------------


def test_the_rotation_freezes_a_service_well_under_its_share() -> None:
    """Issue 29: a pod at a third of its share still joined the rotation, frozen most of the time."""
    run = run_beside("rotation", "deep", 2, 0.1, seed=0, seconds=60, measured=45)
    assert run.got[SERVICE] < 0.2  # it asks for 10 %, its share is 30 %
    assert run.frozen > 0.4
    assert run.latency["p99"] > 0.5


@pytest.mark.parametrize("load", [0.1, 0.3])
def test_the_latency_class_never_freezes_a_service_under_its_share(load: float) -> None:
    for seed in range(3):
        run = run_beside("latency", "deep", 2, load, seed=seed, seconds=60, measured=45)
        assert run.frozen == 0.0, seed
        assert run.neighbour_error <= 0.02, (seed, run.neighbours)
        none = run_beside("none", "deep", 2, load, seed=seed, seconds=60, measured=45)
        assert run.latency["p99"] <= none.latency["p99"], seed


def test_preemption_holds_the_service_near_its_solo_latency_beside_synchronous_neighbours() -> None:
    """Freezing neighbours whose queue is one 1.6 ms kernel clears the GPU for the service within a few
    milliseconds: its p99 at 30 % load stays within 20 ms of its p99 alone (issue 29's bound)."""
    solo = contention.run([(SERVICE, Serve(0.3))], Unenforced(), seconds=60, seed=7)
    run = run_beside("latency", "matmul", 2, 0.3, seed=7, seconds=60, measured=45)
    none = run_beside("none", "matmul", 2, 0.3, seed=7, seconds=60, measured=45)
    assert run.latency["p99"] <= solo.latency(SERVICE, 15)["p99"] + 0.02
    assert none.latency["p99"] > 10 * run.latency["p99"]
    assert run.neighbour_error <= 0.02


@pytest.mark.parametrize(("neighbour", "count", "seed"), [("trainer", 2, 8), ("matmul", 1, 7)])
def test_a_saturated_service_is_capped_near_its_share_and_gets_it(neighbour: str, count: int, seed: int) -> None:
    """Also one its preemption serves at once (beside one `matmul`): at 60 % load it is then not saturated,
    but it is far over its share."""
    run = run_beside("latency", neighbour, count, 0.6, seed=seed, seconds=90, measured=60)
    assert run.frozen > 0.3  # it takes turns
    assert 0.3 - 0.02 <= run.got[SERVICE] <= 0.3 + 0.05 + 0.02, run.got  # its share, its tolerance
    assert run.neighbour_error <= 0.02


def test_the_controller_freezes_the_batch_tenants_while_the_service_has_work() -> None:
    controller = LatencyController({"svc"}, sense_s=0.005)
    tenants = [Tenant("svc", 0.2, 0.3), Tenant("a", 0.4, 0.35), Tenant("b", 0.4, 0.35), Tenant("free", 0.0, None)]
    fractions = controller.update(1.0, tenants)
    assert "svc" not in fractions and set(fractions) == {"a", "b"}
    assert sum(1.0 - f for f in fractions.values()) == pytest.approx(1.0)  # their slots fill the period
    assert controller.sense(1.000, {"svc": 0.0}) is False  # a first reading: nothing to compare
    assert controller.sense(1.005, {"svc": 0.003}) is True and controller.frozen() == {"a", "b"}
    assert controller.sense(1.010, {"svc": 0.003}) is True and controller.frozen() == frozenset()
    assert controller.sense(1.015, {"svc": 0.0032}) is False  # under busy_cpu of the interval: idle


def test_a_service_over_its_share_and_saturated_is_capped_and_released_once_it_no_longer_fills_its_slot(
) -> None:
    controller = LatencyController({"svc"}, sense_s=0.005)
    now, cpu = 0.0, 0.0

    def second(busy_every: int, use: float, thawed: set[str] | None) -> None:
        """One second of readings every 5 ms (its CPU moving in one interval of ``busy_every``), a poll."""
        nonlocal now, cpu
        for step in range(200):
            now += 0.005
            cpu += 0.005 if step % busy_every == 0 else 0.0
            controller.sense(now, {"svc": cpu}, thawed)
        controller.update(now, [Tenant("svc", use, 0.3), Tenant("a", 1.0 - use, 0.7)])

    for _ in range(9):  # over its share, its CPU busy all the time: saturated
        second(1, 0.5, None)
    assert not controller.capped("svc")  # ten polls at least
    second(1, 0.5, None)
    assert controller.capped("svc") and controller.frozen() == frozenset()  # a capped one preempts no one
    assert 0.3 - 1e-9 <= controller.rotation.slot("svc") <= 0.35 + 1e-9  # its share (and the tolerance)
    for _ in range(8):  # now busy in half the intervals it is thawed through: it asks for less than its slot
        second(2, 0.2, {"svc", "a"})
    assert controller.capped("svc")  # judged over 9-10 s
    second(2, 0.2, {"svc", "a"})
    second(2, 0.2, {"svc", "a"})
    assert not controller.capped("svc")


def test_a_service_over_its_share_busy_only_half_the_time_is_not_capped() -> None:
    """NVML's view of a service at its share swings over 40 % for half a minute now and then; its CPU,
    busy about half the time, says it is not saturated."""
    controller = LatencyController({"svc"}, sense_s=0.005)
    now, cpu = 0.0, 0.0
    for _ in range(40):
        for step in range(200):
            now += 0.005
            cpu += 0.005 if step % 2 else 0.0
            controller.sense(now, {"svc": cpu})
        controller.update(now, [Tenant("svc", 0.5, 0.3), Tenant("a", 0.5, 0.7)])
    assert not controller.capped("svc")


def test_a_rotation_slot_can_wait_two_dithered_periods_for_the_next() -> None:
    """Issue 29: the gap between two of a tenant's slots is up to ``2 * (1 + dither) * period * (1 - slot)``
    (its slot first in one period, last in the next), 2.3 s for a 10 % slot at 1 s +-30 %, not the 0.9 s
    docs/shares.md gave; the latency class does not depend on it (it is not in the rotation)."""
    plan = RotationPlan(1.0, dither=0.3, seed=0)
    start, gaps, last_end = 0.0, [], None
    for _ in range(2000):
        period = plan.next_period({"a": 0.1, "b": 0.9})  # slots of 0.9 and 0.1
        thaw, freeze = period.windows["b"]
        if last_end is not None:
            gaps.append(start + thaw - last_end)
        last_end = start + freeze
        start += period.length
    assert max(gaps) <= 2 * 1.3 * 0.9 + 1e-9
    assert max(gaps) > 2.0
    assert statistics.median(gaps) == pytest.approx(0.9, abs=0.1)


class _Duty:
    """``fractions`` frozen at the start of every 100 ms."""

    def __init__(self, fractions: dict[str, float]) -> None:
        self.fractions = fractions

    def frozen_at(self, t: float) -> set[str]:
        offset = t - math.floor(t / 0.1 + 1e-9) * 0.1
        return {k for k, f in self.fractions.items() if offset + 1e-9 < f * 0.1}

    def next_change(self, t: float) -> float:
        start = math.floor(t / 0.1 + 1e-9) * 0.1
        later = [start + f * 0.1 for f in self.fractions.values() if start + f * 0.1 > t + 1e-9]
        return min([*later, start + 0.1])

    def poll(self, t: float, readings: object) -> None:
        return None
