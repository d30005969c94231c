"""Busy time of tenants sharing a GPU: exact at every poll for steady loads, settled exactly for changing ones.

Per-process utilization is read every ``process_utilization_interval`` (10 s) on a GPU the share
controller does not act on; between readings each tenant is counted by its latest figure, scaled down to
the GPU's own utilization (read every poll) when that is less (``gpuagent/accounting/rates.py``), and each
reading settles its window (``gpuagent/accounting/busy.py``). The simulated node runs the real device
code under a hand-moved clock, two and three tenants per GPU, constant and changing.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from simclock import FakeClock
from test_accounting import WALL, NamedTenants, sim_agent

from gpuagent.snapshot.processes import Workload

STEADY = {"a2": 30, "b2": 10, "a3": 30, "b3": 20, "c3": 10}  # GPU 0: two tenants; GPU 1: three
# GPU 2: a steady tenant beside one that rises, falls and stops; GPU 3: three, one ramping up and down
CHANGING = {
    "steady2": 30,
    "stepper": {"steps": [[0, 10], [45, 50], [95, 0], [140, 20]]},
    "steady3": 25,
    "ramp": {"points": [[0, 5], [60, 45], [120, 5]], "repeat": True},
    "flat3": 15,
}
SCENARIO = {
    "version": 1,
    "name": "accounting-shared-exact",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 4}],
    "processes": [
        {"name": name, "gpu": gpu, "sm_util": use, "memory": 1024**3}
        for gpu, names in enumerate((("a2", "b2"), ("a3", "b3", "c3"), ("steady2", "stepper"),
                                     ("steady3", "ramp", "flat3")))
        for name in names
        for use in [{**STEADY, **CHANGING}[name]]
    ],
}
START, END = 3.0, 243.0  # per-process readings at 3, 13, ..., 243


def use_of(name: str, t: float) -> float:
    """The SM use (0-1) of a tenant at scenario time ``t`` as the simulator reports it (whole percents)."""
    curve = {**STEADY, **CHANGING}[name]
    if isinstance(curve, int):
        return curve / 100
    if "steps" in curve:
        return [v for at, v in curve["steps"] if at <= t][-1] / 100
    t = t % 120
    for (t0, v0), (t1, v1) in itertools.pairwise(curve["points"]):
        if t0 <= t <= t1:
            return round(v0 + (v1 - v0) * (t - t0) / (t1 - t0)) / 100
    raise AssertionError(t)


def read_busy(name: str, t: float) -> float:
    """What the per-process readings from START to ``t`` (a reading) say the tenant was busy, in
    GPU-seconds: the simulator's reading gives the use at the moment it is read for the whole window (a
    real driver's mean of its samples is tested on the ledger, ``test_accounting_busy.py``)."""
    reads = [START + 10 * k for k in range(1, round((t - START) / 10) + 1)]
    return sum(use_of(name, r) * 10 for r in reads)


@pytest.fixture(scope="module")
def polls(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[float, dict[str, tuple[float, float]], dict]]:
    """(time, {tenant: (allocated, busy) GPU-seconds}, {GPU index: per-process read time}) at every poll, all
    times on the simulated clock."""
    async def run() -> list[tuple[float, dict[str, tuple[float, float]], dict]]:
        clock = FakeClock()
        agent, _ = sim_agent(tmp_path_factory.mktemp("shared"), SCENARIO, clock)
        names = [p["name"] for p in SCENARIO["processes"]]
        agent.pods = NamedTenants({n: Workload(kind="systemd_service", name=n)  # type: ignore[assignment]
                                   for n in names})
        seen = []
        try:
            clock.t = START
            while clock.t <= END:
                snap = await agent.poll_once()
                assert snap.accounting is not None
                seen.append((clock.t,
                             {u.name: (u.allocated_gpu_seconds_total, u.busy_gpu_seconds_total or 0.0)
                              for u in snap.accounting.usage if u.level == "workload"},
                             {g.info.index: g.process_util_read_at_unix - WALL  # type: ignore[operator]
                              for g in snap.gpus}))
                clock.advance(1.0)
        finally:
            await agent.devices.close()
        return seen

    return asyncio.run(run())


def ranges(polls: list, lo: float, hi: float, *, within: tuple[float, float] = (0.0, 1e9)):
    """Every (first, last) pair of polls from the first reading window on, ``lo``..``hi`` seconds apart,
    both inside ``within``."""
    for i, (t0, first, _) in enumerate(polls):
        if t0 < START + 10 or t0 < within[0]:
            continue
        for t1, last, _ in polls[i:]:
            if lo <= t1 - t0 <= hi and t1 <= within[1]:
                yield t0, t1, first, last


def test_steady_tenants_of_two_and_three_sharing_a_gpu_are_exact_over_every_minute(polls: list) -> None:
    """The issue's 30 % beside 10 %: over every 60-70 s range from every poll, busy / allocated is the use
    within 1 % (10 s lumps made it 0.322 for 0.300)."""
    checked = 0
    for _, _, first, last in ranges(polls, 60, 70):
        for name, use in STEADY.items():
            allocated = last[name][0] - first[name][0]
            busy = last[name][1] - first[name][1]
            assert busy / allocated == pytest.approx(use / 100, rel=0.01), name
            checked += 1
    assert checked > 2000


def test_a_steady_tenant_is_exact_beside_a_rising_one_and_every_range_settles_to_the_truth(polls: list) -> None:
    # beside a tenant whose use rises (10 -> 50 % at 45 s, 0 -> 20 % at 140 s, a ramp), a steady one stays
    # exact: the rise is nobody's figure until the reading says whose it is
    for _, _, first, last in ranges(polls, 60, 70, within=(45, 95)):
        ratio = (last["steady2"][1] - first["steady2"][1]) / (last["steady2"][0] - first["steady2"][0])
        assert ratio == pytest.approx(0.30, rel=0.01)
    # at every reading after the first, each tenant's counter is the integral of its use within what it
    # was counted ahead (a tenant whose use fell; paid off by what it is counted next), never below it
    read_times = {at for _, _, reads in polls for at in reads.values()}
    checked = 0
    for t, used, _ in polls[1:]:
        if t not in read_times:
            continue
        checked += 1
        for name in CHANGING:
            truth = read_busy(name, t)
            assert used[name][1] >= truth - 1e-9 * t, (name, t)
            assert used[name][1] <= truth + 10 * 0.5, (name, t)  # at most one window's fall, 10 s x 50 %
    assert checked == 24
    # over the whole run (at a reading), every tenant's busy is the integral of its use within 1 %
    t_end, last, _ = polls[-1]
    assert t_end in read_times
    for name in (*STEADY, *CHANGING):
        assert last[name][1] == pytest.approx(read_busy(name, t_end), rel=0.01), name


def test_counters_never_go_down_and_the_per_process_tier_is_unchanged(polls: list) -> None:
    for (_, before, _), (_, after, _) in itertools.pairwise(polls):
        for name in before:
            assert after[name][1] >= before[name][1], name
            assert after[name][0] >= before[name][0], name
    # the processes' utilization is still read every 10 s on every shared GPU, not every poll
    for gpu in range(4):
        reads = sorted({reads[gpu] for _, _, reads in polls})
        assert len(reads) == pytest.approx((END - START) / 10, abs=1)
        assert all(b - a == pytest.approx(10.0) for a, b in itertools.pairwise(reads))
