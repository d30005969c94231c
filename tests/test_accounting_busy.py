"""Busy time when per-process utilization is read every few polls: each reading's averages count for the
window it closes, exactly once, whatever the cadence (``gpuagent/accounting/busy.py``)."""

from __future__ import annotations

import itertools

import pytest

from gpuagent.accounting.ledger import Ledger
from gpuagent.accounting.rates import GpuRates, Owner, Rate

A, B = Owner("pod", "ns", "a", None), Owner("pod", "ns", "b", None)


def use_of_a(t: float) -> float:
    """The true SM use of ``a`` over the second ending at ``t``: a step, then a ramp."""
    return 0.2 if t <= 12 else min(1.0, 0.2 + 0.05 * (t - 12))


def gpu(read_at: float, busy: dict[Owner, float | None]) -> GpuRates:
    rates = GpuRates(uuid="GPU-0", index=0, usable=True, energy_joules_total=None, busy_read_at=read_at)
    for owner, ratio in busy.items():
        rates.units[(owner, None)] = Rate(allocated=1.0, busy=ratio)
    return rates


def busy_of(ledger: Ledger, name: str) -> float | None:
    return next(s.busy_gpu_seconds for k, s in ledger if k.level == "pod" and k.name == name)


def test_every_second_is_counted_once_across_changes_of_cadence() -> None:
    # reads at 0, 5, 10 (slow), every poll 11..16 (the GPU became shared), then 21, 26 (slow again)
    reads = [0, 5, 10, 11, 12, 13, 14, 15, 16, 21, 26]
    ledger = Ledger()
    last_read = 0
    for t in range(27):
        if t in reads and t > 0:
            window = range(last_read + 1, t + 1)
            rate = sum(use_of_a(s) for s in window) / len(window)  # NVML's mean since the last read
            last_read = t
        elif t == 0:
            rate = 0.5  # the first read: whatever the driver's buffer held; nothing is integrated before it
        held = rate
        ledger.update({"GPU-0": gpu(float(last_read), {A: held})}, float(t), 1.0)
    truth = sum(use_of_a(s) for s in range(1, 27))
    assert busy_of(ledger, "a") == pytest.approx(truth, rel=1e-12)


def test_nothing_is_counted_before_the_reading_that_covers_it() -> None:
    ledger = Ledger()
    ledger.update({"GPU-0": gpu(0.0, {A: 0.9})}, 0.0, 1.0)
    for t in range(1, 10):
        ledger.update({"GPU-0": gpu(0.0, {A: 0.9})}, float(t), 1.0)  # held figures of the read at 0
    assert busy_of(ledger, "a") == 0.0
    ledger.update({"GPU-0": gpu(10.0, {A: 0.3})}, 10.0, 1.0)
    assert busy_of(ledger, "a") == pytest.approx(0.3 * 10)


def test_a_tenant_that_leaves_between_readings_takes_its_last_rate_and_a_new_one_its_first() -> None:
    ledger = Ledger()
    ledger.update({"GPU-0": gpu(0.0, {A: 0.4})}, 0.0, 1.0)
    for t in range(1, 4):
        ledger.update({"GPU-0": gpu(0.0, {A: 0.4})}, float(t), 1.0)
    for t in range(4, 8):  # a left at 3.5 (the trapezoid of its presence); b came, not measured yet
        ledger.update({"GPU-0": gpu(0.0, {B: None})}, float(t), 1.0)
    ledger.update({"GPU-0": gpu(10.0, {B: 0.6})}, 8.0, 1.0)
    assert busy_of(ledger, "a") == pytest.approx(0.4 * 3.5)
    assert busy_of(ledger, "b") == pytest.approx(0.6 * 4.5)  # present from 3.5 to 8


def test_idle_held_time_is_judged_over_the_reading_window() -> None:
    ledger = Ledger(idle_threshold_ratio=0.05)
    for t in range(0, 11):
        ledger.update({"GPU-0": gpu(0.0 if t < 10 else 10.0, {A: 0.5 if t < 10 else 0.01})}, float(t), 1.0)
    (series,) = [s for k, s in ledger if k.level == "pod"]
    assert series.allocated_gpu_seconds == pytest.approx(10)
    assert series.busy_gpu_seconds == pytest.approx(0.1)
    assert series.idle_allocated_gpu_seconds == pytest.approx(10)  # the whole window was idle, held


def test_a_gap_adds_no_busy_and_the_reading_after_it_settles_what_came_before() -> None:
    ledger = Ledger()
    ledger.update({"GPU-0": gpu(0.0, {A: 1.0})}, 0.0, 1.0)
    ledger.update({"GPU-0": gpu(0.0, {A: 1.0})}, 1.0, 1.0)
    ledger.update({"GPU-0": gpu(30.0, {A: 0.5})}, 30.0, 1.0)  # 29 s gap: not integrated
    assert busy_of(ledger, "a") == pytest.approx(0.5 * 1)  # only 0 -> 1, at the rate that covers it
    ledger.update({"GPU-0": gpu(31.0, {A: 0.5})}, 31.0, 1.0)
    assert busy_of(ledger, "a") == pytest.approx(0.5 * 2)
    assert ledger.gpus["GPU-0"].gap_seconds == pytest.approx(29.0)


def shared(read_at: float, busy: dict[Owner, tuple[float | None, float | None]]) -> GpuRates:
    """A shared GPU whose tenants have (their latest reading's figure, their estimate at this poll)."""
    rates = GpuRates(uuid="GPU-0", index=0, usable=True, energy_joules_total=None, busy_read_at=read_at)
    for owner, (ratio, estimate) in busy.items():
        rates.units[(owner, None)] = Rate(allocated=0.5, busy=ratio, busy_estimate=estimate)
    return rates


def test_between_readings_the_estimate_is_counted_and_the_reading_adds_what_it_differs_by() -> None:
    ledger = Ledger()
    seen = []
    for t in range(0, 11):  # a at 0.4 steadily; b estimated at 0.2 but the reading at 10 says 0.3
        read_at = 0.0 if t < 10 else 10.0
        b = (0.2, 0.2) if t < 10 else (0.3, 0.3)
        ledger.update({"GPU-0": shared(read_at, {A: (0.4, 0.4), B: b})}, float(t), 1.0)
        seen.append((busy_of(ledger, "a"), busy_of(ledger, "b")))
    assert [a for a, _ in seen] == pytest.approx([0.4 * t for t in range(11)])  # every poll, exact
    assert seen[9][1] == pytest.approx(0.2 * 9)  # b's estimate so far
    assert seen[10][1] == pytest.approx(0.3 * 10)  # settled to the reading's figure


def test_a_count_past_the_reading_is_held_and_paid_off_never_taken_back() -> None:
    ledger = Ledger()
    busy = []
    for t in range(0, 21):  # a estimated at 0.5 until 10, but its reading at 10 says 0.2 throughout
        read_at = 0.0 if t < 10 else 10.0 if t < 20 else 20.0
        rate = (0.5, 0.5) if t < 10 else (0.2, 0.2)
        ledger.update({"GPU-0": shared(read_at, {A: rate})}, float(t), 1.0)
        busy.append(busy_of(ledger, "a"))
    assert all(b >= a for a, b in itertools.pairwise(busy))  # a counter: never down
    assert busy[10] == pytest.approx(0.5 * 9 + 0.35)  # counted 4.85 where the reading says 2.0: held
    assert busy[20] == busy[10]  # the next 0.2 a second pays the 2.85 excess off first: flat
    assert ledger._busy["GPU-0"].ahead == {(A, None): pytest.approx(0.85)}  # (the 2nd reading agreed: 2.0)
    ledger.update({"GPU-0": shared(30.0, {B: (0.1, 0.1)})}, 21.0, 1.0)  # a left: its excess goes with it
    assert ledger._busy["GPU-0"].ahead == {}
    assert busy_of(ledger, "a") == busy[20]
