"""What a recommendation saves: GPU-hours a week and their cost (pure arithmetic; no I/O).

The range's allocated GPU-hours (the accounting counters' increase) are scaled to a week: a workload seen
for 3.5 days of a 7-day range counts what it held in those days, per week of range. After the change:

- release: only the time it was not idle (it holds a GPU while it works);
- share, MPS, MIG: the same time at the new size of a device over its size now (a share of 25 % of a
  whole GPU: a quarter of the GPU-hours; MIG 2g of 7 slices: 2/7);
- keep, needs more, too little history: unchanged (needing more is not counted as a saving or a cost).

The cost freed is the GPU-hours freed at the GPU-hour price of the workload's GPU model (``--prices``,
``--price-gpu-hour``, as ``gpuagent report``); energy follows use, not allocation, so no kWh is claimed.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuagent.prom.prices import Prices
from gpuagent.recommend.model import (
    SECONDS_PER_HOUR,
    SECONDS_PER_WEEK,
    Action,
    Recommendation,
    Row,
    Savings,
    Totals,
    WorkloadStats,
)


def savings(stats: WorkloadStats, recommendation: Recommendation, range_seconds: float,
            prices: Prices) -> Savings:
    if range_seconds <= 0:
        raise ValueError(f"range_seconds: expected > 0, got {range_seconds!r}")
    current = stats.allocated_gpu_seconds / SECONDS_PER_HOUR * SECONDS_PER_WEEK / range_seconds
    after = current
    if recommendation.action is Action.RELEASE:
        after = current * (1 - (stats.idle_ratio or 0.0))
    elif recommendation.action.resizes and recommendation.size is not None and stats.device_size > 0:
        after = current * min(1.0, recommendation.size / stats.device_size)
    cost = None
    if prices.prices_gpu_hours:
        price = prices.gpu_hour(stats.gpu_model)
        cost = None if price is None else (current - after) * price
    return Savings(current, after, cost)


def totals(rows: Iterable[Row], priced: bool) -> Totals:
    """Every row's savings added up; the cost None when prices were given and a row had none."""
    rows = list(rows)
    costs = [r.savings.cost_saved_week for r in rows]
    cost = None
    if priced and all(c is not None for c in costs):
        cost = sum(c for c in costs if c is not None)
    return Totals(len(rows), sum(r.savings.current_gpu_hours_week for r in rows),
                  sum(r.savings.recommended_gpu_hours_week for r in rows), cost)
