"""The exclusive rotation: its controller, its plan and its cycler, in virtual time.

The controller is fed readings by hand (exact ones, or a seeded noise around a plan's truth); the cycler
runs on the fake clock of ``test_timeslice`` with a recorder that rejects no-op writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import pytest
from snapshots import two_gpu_node
from test_timeslice import FakeTime, Recorder

from gpuagent.assembly import build_enforcer
from gpuagent.config import ConfigError, load_config
from gpuagent.enforce.timeslice import (
    Cycler,
    DutyPlan,
    RotationController,
    RotationPlan,
    ShareController,
    Tenant,
    desired,
    make_plan,
)


def update(controller: RotationController, now: float, uses: dict[str, float],
           shares: dict[str, float | None], priorities: dict[str, int] | None = None) -> dict[str, float]:
    return controller.update(now, [Tenant(k, u, shares[k], (priorities or {}).get(k, 0)) for k, u in uses.items()])


# -- the controller --------------------------------------------------------------------------------------


def test_two_busy_tenants_take_turns_in_proportion_to_their_shares() -> None:
    c = RotationController()
    # at 50/50, b is over its share and takes turns with an open slot, where a runs alone
    assert update(c, 0.0, {"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.3}) == pytest.approx({"b": 0.7})
    fractions = {}
    for t in range(1, 4):  # then a is over its own: both take turns
        fractions = update(c, float(t), {"a": 0.85, "b": 0.15}, {"a": 0.7, "b": 0.3})
    assert fractions == pytest.approx({"a": 0.3, "b": 0.7})
    assert c.slot("a") == pytest.approx(0.7) and c.slot("b") == pytest.approx(0.3)
    assert c.correction("a") == 0.0 and c.correction("nobody") is None


def test_a_tenant_alone_is_never_throttled() -> None:
    c = RotationController()
    for t in range(5):
        assert update(c, float(t), {"a": 1.0, "b": 0.0}, {"a": 0.3, "b": 0.7}) == {}
    assert c.fraction("a") == 0.0 and c.slot("a") == 0.0


def test_without_work_conservation_a_lone_tenant_is_held_to_its_share() -> None:
    c = RotationController(work_conserving=False)
    assert update(c, 0.0, {"a": 1.0}, {"a": 0.3}) == pytest.approx({"a": 0.7})


def test_an_idle_tenants_share_goes_to_the_busy_ones() -> None:
    c = RotationController()
    fractions = update(c, 0.0, {"a": 0.5, "b": 0.5, "c": 0.0}, {"a": 0.5, "b": 0.3, "c": 0.2})
    # the 20 % left goes to a and b in proportion to their shares: 0.5 + 0.2 * 5/8, 0.3 + 0.2 * 3/8
    assert fractions == pytest.approx({"a": 1 - 0.625, "b": 1 - 0.375})


def test_a_tenant_without_a_share_is_never_throttled_and_keeps_what_it_uses() -> None:
    c = RotationController()
    fractions = update(c, 0.0, {"a": 0.4, "b": 0.4, "x": 0.2}, {"a": 0.4, "b": 0.4, "x": None})
    assert "x" not in fractions and c.fraction("x") == 0.0
    assert fractions == pytest.approx({"a": 0.6, "b": 0.6})  # 0.4 slots each of the 0.8 x leaves


def test_a_tenant_clearly_under_its_share_is_never_throttled() -> None:
    """An MPS client held to fewer SMs than its share, or a light tenant: it could not use more, so it does
    not take turns; its share stays reserved for it (the busy one is held to the rest)."""
    c = RotationController()
    for t in range(5):
        fractions = update(c, float(t), {"a": 0.1, "b": 0.9}, {"a": 0.5, "b": 0.5})
        assert fractions == pytest.approx({"b": 0.5}) and c.fraction("a") == 0.0


def test_lower_priority_is_held_to_its_share_first() -> None:
    c = RotationController()
    fractions = update(c, 0.0, {"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.2}, {"a": 1, "b": 0})
    assert fractions == pytest.approx({"a": 0.2, "b": 0.8})  # the 30 % left goes to the higher priority
    c = RotationController()  # oversubscribed (x keeps its 40 %): the lower priority gives up what is not there
    fractions = update(c, 0.0, {"a": 0.4, "b": 0.4, "x": 0.4}, {"a": 0.4, "b": 0.4, "x": None}, {"a": 1})
    assert fractions == pytest.approx({"a": 0.6, "b": 0.8})


def test_equal_priorities_share_what_is_left_in_proportion() -> None:
    c = RotationController()
    fractions = update(c, 0.0, {"a": 0.5, "b": 0.5}, {"a": 0.4, "b": 0.2})
    assert fractions == pytest.approx({"a": 1 - 0.4 / 0.6, "b": 1 - 0.2 / 0.6})


def test_a_tenant_that_leaves_is_dropped_and_the_other_released() -> None:
    c = RotationController()
    update(c, 0.0, {"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.3})
    assert update(c, 1.0, {"a": 1.0}, {"a": 0.7}) == {}
    assert c.slot("b") == 0.0 and c.achieved("b") == 0.0


def test_noise_alone_moves_no_slot() -> None:
    """Readings as NVML gives them under the rotation (5 samples a poll, each crediting the tenant whose
    slot it fell in): about 20 points of noise a poll around the true 70/30, and no bias to correct."""
    worst = 0.0
    for seed in range(8):
        rng = random.Random(seed)
        c = RotationController()
        for t in range(60):
            a = sum(rng.random() < 0.7 for _ in range(5)) / 5
            update(c, float(t), {"a": a, "b": 1.0 - a}, {"a": 0.7, "b": 0.3})
        worst = max(worst, abs(c.slot("a") - 0.7))
    assert worst <= 0.02


def test_a_persistent_bias_shortens_the_slot_of_the_tenant_it_favours() -> None:
    """b's queue runs on 10 points past its slot every period: the readings show it, the slot pays for it."""
    rng = random.Random(1)
    c = RotationController()
    for t in range(60):
        b_part = c.slot("b") + 0.1 if c.slot("b") else 0.3
        b = sum(rng.random() < b_part for _ in range(5)) / 5
        update(c, float(t), {"a": 1.0 - b, "b": b}, {"a": 0.7, "b": 0.3})
    assert 0.2 <= c.slot("b") < 0.28 and c.correction("b") == pytest.approx(0.3 - c.slot("b"))


def test_the_controller_rejects_a_bad_window() -> None:
    with pytest.raises(ValueError, match="window"):
        RotationController(window=0)


# -- the plan -------------------------------------------------------------------------------------------


def test_the_rotation_gives_disjoint_slots_in_proportion_and_an_open_rest() -> None:
    plan = RotationPlan(1.0, dither=0.0, seed=3)
    period = plan.next_period({"a": 0.5, "b": 0.8})  # slots 0.5 and 0.2; 0.3 open
    assert period.length == 1.0
    (a0, a1), (b0, b1) = period.windows["a"], period.windows["b"]
    assert a1 - a0 == pytest.approx(0.5) and b1 - b0 == pytest.approx(0.2)
    assert a1 <= b0 + 1e-12 or b1 <= a0 + 1e-12  # one after the other
    frozen, _ = desired(period, (a0 + a1) / 2)
    assert frozen == {"b"}


def test_slots_asking_for_more_than_the_period_are_scaled_to_it() -> None:
    period = RotationPlan(2.0, dither=0.0, seed=0).next_period({"a": 0.2, "b": 0.4})  # 0.8 + 0.6
    spans = sorted(period.windows.values())
    assert spans[0][0] == 0.0 and spans[-1][1] == pytest.approx(2.0)
    assert {k: (e - s) / 2.0 for k, (s, e) in period.windows.items()} == pytest.approx({"a": 0.8 / 1.4,
                                                                                       "b": 0.6 / 1.4})


def test_groups_rotate_side_by_side() -> None:
    period = RotationPlan(1.0, dither=0.0, seed=1).next_period(
        {"a": 0.5, "b": 0.5, "x": 0.5, "y": 0.5}, {"a": "gpu0", "b": "gpu0", "x": "gpu1", "y": "gpu1"})
    for first, second in (("a", "b"), ("x", "y")):
        (s0, e0), (s1, e1) = period.windows[first], period.windows[second]
        assert e0 <= s1 + 1e-12 or e1 <= s0 + 1e-12
    assert sum(e - s for s, e in period.windows.values()) == pytest.approx(2.0)  # two GPUs' worth


def test_the_period_is_dithered_within_its_bounds_and_the_order_shuffled() -> None:
    plan = RotationPlan(1.0, dither=0.3, seed=7)
    periods = [plan.next_period({"a": 0.5, "b": 0.5}) for _ in range(200)]
    lengths = [p.length for p in periods]
    assert min(lengths) >= 0.7 and max(lengths) <= 1.3 and max(lengths) - min(lengths) > 0.4
    firsts = {min(p.windows, key=lambda k: p.windows[k][0]) for p in periods}
    assert firsts == {"a", "b"}


def test_the_duty_plan_thaws_every_tenant_at_its_fraction() -> None:
    period = DutyPlan(0.1).next_period({"a": 0.3, "b": 1.0})
    assert period.windows["a"] == pytest.approx((0.03, 0.1)) and period.windows["b"] == pytest.approx((0.1, 0.1))
    assert desired(period, 0.05) == ({"b"}, pytest.approx(0.1))
    assert desired(period, 0.0) == ({"a", "b"}, pytest.approx(0.03))


def test_plans_reject_bad_settings() -> None:
    with pytest.raises(ValueError, match="period"):
        RotationPlan(0.0)
    with pytest.raises(ValueError, match="dither"):
        DutyPlan(0.1, dither=1.0)
    with pytest.raises(ValueError, match="share scheme"):
        make_plan("lottery")
    assert make_plan("rotation").period == 1.0 and make_plan("duty").period == 0.1
    assert make_plan("rotation", 0.5).dither == 0.3 and make_plan("duty").dither == 0.0


# -- the cycler applying it ------------------------------------------------------------------------------


def rotation_cycler(seed: int = 0) -> tuple[Cycler[str], FakeTime, Recorder]:
    clock = FakeTime()
    recorder = Recorder(clock)
    return Cycler(recorder.freeze, recorder.thaw, plan=RotationPlan(1.0, seed=seed), clock=clock,
                  sleep=clock.sleep), clock, recorder


async def test_at_most_one_throttled_tenant_is_thawed_at_a_time() -> None:
    cycler, clock, rec = rotation_cycler()
    targets = {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1"]}
    for key, fraction in (("a", 0.5), ("b", 0.7), ("c", 0.8)):
        cycler.set(key, targets[key], fraction, group="gpu0")
    thawed_time = dict.fromkeys(targets, 0.0)

    def check(now: float, seconds: float) -> None:
        if now < 1.5:  # the first period throttles nobody (set before it began: from the next one)
            return
        thawed = [k for k, ts in targets.items() if not set(ts) & rec.frozen]
        assert len(thawed) <= 1, (now, rec.frozen)
        for key in thawed:
            thawed_time[key] += seconds

    clock.on_sleep = check
    task = asyncio.create_task(cycler.run())
    while clock.t < 40.0:
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert rec.frozen == set()  # cancelled: everything thawed
    total = sum(thawed_time.values())
    parts = {k: v / total for k, v in thawed_time.items()}
    assert parts == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2}, abs=0.02)


class LateTime(FakeTime):
    """A starved event loop: every sleep overruns by up to ``late`` seconds (seeded)."""

    def __init__(self, late: float, seed: int) -> None:
        super().__init__()
        self.late = late
        self.rng = random.Random(seed)

    async def sleep(self, seconds: float) -> None:
        await super().sleep(max(0.0, seconds) + self.rng.uniform(0.0, self.late))


async def test_a_late_event_loop_still_gives_each_tenant_its_part() -> None:
    """Every wake up to 150 ms late (a slot of 0.2 s is often overrun by most of its length): the time each
    tenant is thawed still follows its slot, since each window ends at its planned instant (a late end
    lengthens one slot and shortens the next)."""
    clock = LateTime(0.15, seed=4)
    rec = Recorder(clock)
    cycler = Cycler(rec.freeze, rec.thaw, plan=RotationPlan(1.0, seed=4), clock=clock, sleep=clock.sleep)
    slots = {"a": 0.5, "b": 0.3, "c": 0.2}
    for key, slot in slots.items():
        cycler.set(key, [key], 1.0 - slot, group="gpu0")
    task = asyncio.create_task(cycler.run())
    while clock.t < 120.0:
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    begun = min(t for t, op, _ in rec.events if op == "freeze")  # the rotation's first period
    thawed = {k: clock.t - begun - sum(e - s for s, e in rec.intervals(k)) for k in slots}
    total = sum(thawed.values())
    assert {k: v / total for k, v in thawed.items()} == pytest.approx(slots, abs=0.02)


async def test_cancel_mid_slot_thaws_everything_and_an_error_thaws_too() -> None:
    cycler, clock, rec = rotation_cycler(seed=2)
    cycler.set("a", ["a1"], 0.5)
    cycler.set("b", ["b1"], 0.5)
    task = asyncio.create_task(cycler.run())
    while clock.t < 2.4:
        await asyncio.sleep(0)
    assert len(rec.frozen) == 1  # one of them in its slot, the other frozen
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rec.frozen == set()

    def boom(now: float, seconds: float) -> None:
        if now > 1.5:
            raise RuntimeError("the loop broke")

    cycler, clock, rec = rotation_cycler(seed=3)
    cycler.set("a", ["a1"], 0.5)
    cycler.set("b", ["b1"], 0.5)
    clock.on_sleep = boom
    with pytest.raises(RuntimeError, match="the loop broke"):
        await cycler.run()
    assert rec.frozen == set()


# -- the configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("scheme", "period", "plan", "controller"), [
    ("rotation", None, RotationPlan, RotationController),
    ("duty", None, DutyPlan, ShareController),
    ("rotation", 2.5, RotationPlan, RotationController),
])
def test_share_scheme_picks_the_plan_and_the_controller(
    tmp_path: Path, scheme: str, period: float | None, plan: type, controller: type
) -> None:
    overrides: dict[str, object] = {"mode": "audit", "share_scheme": scheme, "journal_path": str(tmp_path / "j")}
    if period is not None:
        overrides["share_period"] = period
    enforcer = build_enforcer(load_config(None, env={}, overrides=overrides))
    assert enforcer is not None and enforcer._cycler is not None
    assert isinstance(enforcer._cycler.plan, plan)
    assert enforcer._cycler.period == (period or (1.0 if scheme == "rotation" else 0.1))
    assert isinstance(enforcer._new_controller(), controller)
    state = enforcer.update(two_gpu_node())
    assert state.share_scheme == scheme and state.share_period_seconds == enforcer._cycler.period


def test_a_bad_share_scheme_or_period_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="share-scheme: expected one of rotation, duty"):
        load_config(None, env={}, overrides={"share_scheme": "lottery"})
    with pytest.raises(ConfigError, match=r"share-period: expected a number > 0\.01 and <= 10, or null"):
        load_config(None, env={}, overrides={"share_period": 0})
    assert load_config(None, env={"GPUAGENT_SHARE_PERIOD": "null"}).enforce.share_period is None
