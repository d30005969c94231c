"""The node-wide budget of writes to the API server (``kubeapi.WriteBudget``) that both the evictions and
the idle-GPU Events spend: a burst at once, then one per refill interval, never more than the burst saved,
and a clock that goes back refills nothing."""

from __future__ import annotations

import pytest

from gpuagent.kubeapi import WriteBudget


def test_a_burst_then_one_per_refill_interval() -> None:
    budget = WriteBudget(3, 10.0)
    assert [budget.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not budget.take(9.0)  # 0.9 of a token
    assert budget.take(10.0)
    assert not budget.take(10.0)


def test_an_idle_budget_saves_no_more_than_its_burst() -> None:
    budget = WriteBudget(2, 1.0)
    assert budget.take(0.0) and budget.take(0.0)
    assert [budget.take(1000.0) for _ in range(3)] == [True, True, False]


def test_a_clock_going_back_refills_nothing() -> None:
    budget = WriteBudget(1, 5.0)
    assert budget.take(100.0)
    assert not budget.take(50.0)  # back in time: nothing refilled, and the refill is not counted from 50
    assert not budget.take(104.0)
    assert budget.take(105.0)


@pytest.mark.parametrize(("burst", "refill"), [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_a_budget_that_could_never_write_is_refused(burst: int, refill: float) -> None:
    with pytest.raises(ValueError, match="burst >= 1 and refill_seconds > 0"):
        WriteBudget(burst, refill)
