"""The fit over columns (``hints.fitcolumns``) answers exactly what ``fit_node`` answers, state by state.

The extender judges the states new to a request over columns, many at once; the verdicts must be the ones
``extender_verdict.entry_verdict`` (``fit_node`` and its reason) gives each state alone: fits, the 0-10 score and the
one-line reason, equal, not close. Checked on batches of random states drawn to tie (equal shares, equal
free memory, repeated GPU indexes: the choice's tie-breaks), of hostile ones (``test_judging_is_total``'s
strategies: huge and negative figures), and through the extender: a failure of the columns costs the call
nothing (every state is judged one by one), a forgotten column is written again, and the reply is the
same JSON whichever writer wrote it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_judging_is_total import hostile_nodes

from gpuagent.hints import fitcolumns
from gpuagent.hints.agents import AgentEntry
from gpuagent.hints.cluster_view import SharedState
from gpuagent.hints.extender import WRITTEN_ANSWERS, Extender
from gpuagent.hints.extender_verdict import Verdict, entry_verdict
from gpuagent.hints.fit import fit_node
from gpuagent.hints.fitcolumns import FAILS, FITS, NOT_COLUMNAR, PLACE, Outcome, StateColumns
from gpuagent.hints.fitrequest import FitRequest
from gpuagent.hints.nodeindex import node_index
from gpuagent.hints.verdict_key import kind_keys, verdict_key
from gpuagent.snapshot.hints import GpuHints, NodeHints, TenantHint

pytestmark = pytest.mark.long  # property tests of several seconds: handed out early (conftest.py)

GIB = 2**30
FREE = st.sampled_from([0, 8 * GIB, 20 * GIB, 40 * GIB, 80 * GIB]) | st.integers(0, 80 * GIB)
SHARES = st.sampled_from([0.0, 1e-10, 0.3, 0.5, 0.7000000000000001, 1.0]) | st.floats(0.0, 1.0)


@st.composite
def gpus(draw: st.DrawFn, pos: int) -> GpuHints:
    tenants = tuple(TenantHint(name=f"team/job-{draw(st.integers(0, 3))}", kind="pod", share_ratio=0.2,
                               memory_limit_bytes=None, memory_used_bytes=0, sm_util_ratio=None)
                    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))))
    return GpuHints(
        uuid=draw(st.sampled_from([f"GPU-{pos}"] * 12 + ["GPU-0", ""])),
        index=draw(st.sampled_from([pos, pos, 0, 3, -1])), model="sim",
        health=draw(st.sampled_from(["ok"] * 9 + ["lost"])), pci_bus_id="", numa_node=None,
        memory_total_bytes=draw(st.sampled_from([None, 0, 40 * GIB, 80 * GIB])), memory_used_bytes=None,
        memory_allocated_bytes=0, memory_free_bytes=draw(FREE), sm_util_ratio=None, sm_util_short_ratio=None,
        sm_util_long_ratio=None, schedulable_share_ratio=draw(SHARES),
        sharing_mode=draw(st.sampled_from(["none", "time_sliced", "time_sliced", "mps", "exclusive"])),
        compute_mode=draw(st.sampled_from([None, "default", "default", "exclusive_process", "prohibited"])),
        mig_enabled=draw(st.sampled_from([False] * 9 + [True])), tenants=tenants, free_mig_profiles=(),
        nvlink_peers=(), stale=draw(st.sampled_from([False] * 9 + [True])),
    )


@st.composite
def states(draw: st.DrawFn) -> NodeHints:
    count = draw(st.integers(0, 8))
    drawn = tuple(draw(gpus(pos)) for pos in range(count))
    return NodeHints(
        hostname="node", taken_at_unix=1000.0, gpus=drawn, gpu_count=count,
        healthy_gpu_count=draw(st.sampled_from([count, 0, 1, 9])), free_gpu_count=0,
        memory_total_bytes=draw(st.sampled_from([0, sum(g.memory_total_bytes or 0 for g in drawn), 640 * GIB])),
        memory_free_bytes=draw(st.sampled_from([0, sum(g.memory_free_bytes for g in drawn), 3 * GIB])),
        schedulable_share_gpus=draw(st.sampled_from([0.0, sum(g.schedulable_share_ratio for g in drawn), 2.5])),
    )


@st.composite
def requests(draw: st.DrawFn) -> FitRequest:
    exclusive = draw(st.booleans())
    return FitRequest(
        gpus=draw(st.sampled_from([1, 1, 1, 2, 3])),
        memory_bytes=draw(st.sampled_from([None, None, 1, 8 * GIB, 8 * GIB, 20 * GIB, 40 * GIB, 2**63 - 1])
                          | st.integers(1, 80 * GIB)),
        share=None if exclusive else draw(st.sampled_from([None, 0.1, 0.3, 0.5]) | SHARES.filter(lambda s: s > 0)),
        exclusive=exclusive, policy=draw(st.sampled_from(["binpack", "spread"])),
    )


def outcomes(batch: list[NodeHints], request: FitRequest, columns: StateColumns | None = None
             ) -> list[Outcome | None]:
    """Each state's outcome over one columns call; None for a state the columns leave to fit_node."""
    columns = columns if columns is not None else StateColumns()
    slots = columns.slots((verdict_key(hints), node_index(hints)) for hints in batch)
    judged = iter(columns.judge([slot for slot in slots if slot != NOT_COLUMNAR], request).outcomes())
    return [next(judged) if slot != NOT_COLUMNAR else None for slot in slots]


def entry(hints: NodeHints) -> AgentEntry:
    return AgentEntry(node=hints.hostname, url=None, hints=hints, index=node_index(hints), answered_at=0.0,
                      key=verdict_key(hints), keys=kind_keys(hints))


def judged_together(batch: list[NodeHints], request: FitRequest) -> list[Verdict]:
    """The extender's verdicts of the states of ``batch``, judged in one call (``_judge_states``)."""
    extender = Extender(Source({}), max_age_seconds=900.0)
    by_state: dict[bytes, Verdict] = {}
    extender._judge_states("filter", request, {e.key: e for e in map(entry, batch)}, by_state,  # type: ignore[misc]
                           lambda key: "node")
    return [by_state[verdict_key(hints)] for hints in batch]


def one_by_one(hints: NodeHints, request: FitRequest) -> Verdict:
    return entry_verdict(AgentEntry(node="node", url=None, hints=hints, index=node_index(hints)), request)


def assert_same(batch: list[NodeHints], request: FitRequest) -> int:
    """Columns and fit_node agree on every state of ``batch``; how many the columns answered."""
    answered = 0
    for hints, outcome in zip(batch, outcomes(batch, request), strict=True):
        if outcome is None:
            continue
        answered += 1
        fit = fit_node(node_index(hints), request)
        assert (outcome.fits != FAILS, outcome.available) == (fit.fits, fit.available), (hints, request)
        if outcome.fits == FITS:  # one GPU: the same 0-100 score, so the same choice's loads
            assert outcome.score == fit.score, (hints, request)
        if outcome.fits == PLACE:  # several GPUs: fit_node places it
            assert request.gpus > 1, (hints, request)
    assert judged_together(batch, request) == [one_by_one(hints, request) for hints in batch]
    return answered


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(states(), min_size=1, max_size=6), request=requests())
def test_columns_give_each_state_the_verdict_fit_node_gives_it(batch: list[NodeHints],
                                                                request: FitRequest) -> None:
    assert_same(batch, request)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(hostile_nodes() | states(), min_size=1, max_size=5), request=requests())
def test_hostile_states_are_judged_alike_or_left_to_fit_node(batch: list[NodeHints], request: FitRequest) -> None:
    assert_same(batch, request)


def node(name: str, *gpus_: GpuHints) -> NodeHints:
    return NodeHints(hostname=name, taken_at_unix=1000.0, gpus=gpus_, gpu_count=len(gpus_),
                     healthy_gpu_count=len(gpus_), free_gpu_count=0,
                     memory_total_bytes=sum(g.memory_total_bytes or 0 for g in gpus_),
                     memory_free_bytes=sum(g.memory_free_bytes for g in gpus_),
                     schedulable_share_gpus=sum(g.schedulable_share_ratio for g in gpus_))


def gpu(pos: int, free_gib: int, share: float, **changes: Any) -> GpuHints:
    fields = dict(uuid=f"GPU-{pos}", index=pos, model="sim", health="ok", pci_bus_id="", numa_node=None,
                  memory_total_bytes=80 * GIB, memory_used_bytes=None, memory_allocated_bytes=0,
                  memory_free_bytes=free_gib * GIB, sm_util_ratio=None, sm_util_short_ratio=None,
                  sm_util_long_ratio=None, schedulable_share_ratio=share, sharing_mode="time_sliced",
                  compute_mode="default", mig_enabled=False, tenants=(), free_mig_profiles=(),
                  nvlink_peers=(), stale=False)
    return GpuHints(**{**fields, **changes})


def test_the_columns_answer_the_common_states_and_leave_the_rest() -> None:
    """An agent's states are columnar; a figure past 2**53 or two GPUs with one key are not (fit_node)."""
    request = FitRequest(memory_bytes=20 * GIB, share=0.3)
    common = [node("a", gpu(0, 40, 0.5), gpu(1, 10, 1.0)), node("b", gpu(0, 10, 0.2)), node("c")]
    assert assert_same(common, request) == 3
    huge = node("d", gpu(0, 40, 0.5, memory_total_bytes=2**60))
    twins = node("e", gpu(0, 40, 0.5), gpu(1, 40, 0.5, uuid="GPU-0"))
    assert outcomes([huge, twins], request) == [None, None]
    assert assert_same([huge, twins, *common], request) == 3
    reasons = judged_together(common, request)
    assert reasons[1].reason == ("gpuagent: needs 1 GPUs, 0 can take it; GPU 0: needs a 30% share of SM time, "
                                 "20% schedulable")
    assert reasons[2].reason == "gpuagent: no GPUs"


def test_states_that_fail_alike_share_one_verdict_and_the_reasons_stay_their_own() -> None:
    """The reasons are written once per what they read: two nodes short of memory on the same GPU figures
    share a verdict; one with another figure, or whose first GPU is another, has its own."""
    request = FitRequest(memory_bytes=50 * GIB)
    batch = [node("a", gpu(0, 40, 1.0, uuid="GPU-a"), gpu(1, 10, 1.0, uuid="GPU-a1")),
             node("b", gpu(0, 40, 1.0, uuid="GPU-b"), gpu(1, 10, 1.0, uuid="GPU-b1")),
             node("c", gpu(0, 30, 1.0)), node("d", gpu(0, 40, 1.0, index=4, uuid=""))]
    verdicts = judged_together(batch, request)
    assert verdicts[0] is verdicts[1] and verdicts[2] is not verdicts[0]
    assert verdicts == [one_by_one(hints, request) for hints in batch]
    assert "GPU 4" in verdicts[3].reason and "40.0 GiB free" in verdicts[3].reason


def test_forgotten_columns_are_written_again() -> None:
    columns = StateColumns()
    request = FitRequest(memory_bytes=20 * GIB, share=0.3)
    batch = [node(f"n{i}", gpu(0, 10 + i, 0.5)) for i in range(40)]
    first = outcomes(batch, request, columns)
    columns.forget_if_over(live_states=100)
    assert len(columns) == 40  # under the bound: kept
    columns.forget_if_over(live_states=-2048)  # 40 > 2 * -2048 + 4096 = 0
    assert len(columns) == 0
    assert outcomes(batch, request, columns) == first and len(columns) == 40


class Source:
    """The cluster view as the extender reads it: entries keyed by state, a version, an expiry."""

    version = 1

    def __init__(self, states: dict[str, NodeHints]) -> None:
        self.entries = {name: entry(hints) for name, hints in states.items()}

    async def lookup(self, nodes: Any) -> dict[str, AgentEntry]:
        return {n: e for n in nodes if (e := self.entries.get(n)) is not None}

    def by_node(self) -> dict[str, AgentEntry]:
        return self.entries

    def states_by_node(self) -> dict[str, SharedState]:
        return {name: SharedState(e.hints, e.index, e.key, e.keys)  # type: ignore[arg-type]
                for name, e in self.entries.items() if e.keys is not None}

    def knows(self, node: str) -> bool:
        return node in self.entries

    def expiry(self, max_age: float) -> float:
        return max_age

    def __len__(self) -> int:
        return len(self.entries)


def fleet() -> dict[str, NodeHints]:
    return {f"n{i}": node(f"n{i}", gpu(0, i % 50, (i % 7) / 6), gpu(1, 20, 0.4)) for i in range(60)}


def args(names: list[str], memory: str = "20Gi") -> dict[str, Any]:
    from fixture_files import filter_request

    body = filter_request()
    body["Pod"]["metadata"]["annotations"].update({"gpuagent.io/gpu-share": "30%",
                                                   "gpuagent.io/gpu-memory": memory})
    body["NodeNames"] = names
    return body


async def test_a_failure_of_the_columns_costs_the_call_nothing(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    states = fleet()
    names = [*states, "ghost"]
    expected = await Extender(Source(states), max_age_seconds=900.0, monotonic=lambda: 1.0).filter(args(names))
    assert Source(states).entries and expected["FailedAndUnresolvableNodes"].keys() == {"ghost"}

    def broken(self: StateColumns, slots: Any, request: Any) -> Any:
        raise FloatingPointError("a bug of the columns")

    monkeypatch.setattr(fitcolumns.StateColumns, "judge", broken)
    extender = Extender(Source(states), max_age_seconds=900.0, monotonic=lambda: 1.0)
    with caplog.at_level(logging.WARNING):
        assert await extender.filter(args(names)) == expected
    assert extender.states_judged == {"columns": 0, "per_state": 60}
    assert any("over columns raised" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_the_reply_is_the_json_of_the_answer_and_written_once_per_answer() -> None:
    states = fleet()
    extender = Extender(Source(states), max_age_seconds=900.0, monotonic=lambda: 1.0)
    names = list(states)
    written = await extender.reply("filter", args(names))
    assert json.loads(written) == await extender.filter(args(names))
    assert await extender.reply("filter", args(names)) is written  # the same view, the same bytes
    assert extender.states_judged["columns"] == 60 and extender.states_judged["per_state"] == 0
    scores = json.loads(await extender.reply("prioritize", args(names)))
    assert scores == await extender.prioritize(args(names)) and {s["Score"] for s in scores} - {0}
    odd = "\ud800node"  # a name sent as a lone surrogate's escape: written back escaped, as json writes it
    reply = json.loads(await extender.reply("filter", args([odd])))
    assert reply["FailedAndUnresolvableNodes"].keys() == {odd}


def test_ties_go_to_the_lower_gpu_index_then_position_as_min_over_the_options() -> None:
    """An exclusive request ties every free GPU on load: fit_node takes the lowest index (not the first
    position), and the node's load after it (so the score) depends on which GPU that was."""
    request = FitRequest(exclusive=True, policy="spread")
    hints = node("a", gpu(0, 70, 1.0, index=3), gpu(1, 10, 1.0, index=1), gpu(2, 30, 1.0, index=1))
    hints = replace(hints, memory_free_bytes=80 * GIB)
    (outcome,) = outcomes([hints], request)
    fit = fit_node(node_index(hints), request)
    assert fit.positions == (1,) and outcome is not None and outcome.score == fit.score
    other = replace(hints, gpus=(hints.gpus[0], replace(hints.gpus[1], index=4), hints.gpus[2]))
    assert fit_node(node_index(other), request).score != fit.score  # the choice shows in the score


async def test_only_the_last_answers_keep_their_replies_written() -> None:
    """A written reply is kept for a repeat over an unchanged view, but only the last few: at 20,000 names a
    filter's reply is 1.6 MB, and every distinct request keeps its answer."""
    states = fleet()
    extender = Extender(Source(states), max_age_seconds=900.0, monotonic=lambda: 1.0)
    for gib in range(1, 8):
        await extender.reply("filter", args(list(states), memory=f"{gib}Gi"))
    answers = [memo.answer for memo in extender._memo.values() if memo.answer is not None]
    assert len(answers) == 7 and sum(1 for answer in answers if answer.replies) == WRITTEN_ANSWERS
    assert all(answer.replies for answer in answers[-WRITTEN_ANSWERS:])


def test_a_failing_states_reason_is_written_once_per_distinct_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of failing states read a few dozen figures: the reasons are worded once per distinct
    reading (its GPU counts, first GPU's label, why and figure), not once per state."""
    from gpuagent.hints import extender as extender_module

    asked: list[tuple[Any, ...]] = []
    worded = extender_module.failed_verdict

    def counted(request: FitRequest, *reading: Any) -> Verdict:
        asked.append(reading)
        return worded(request, *reading)

    monkeypatch.setattr(extender_module, "failed_verdict", counted)
    request = FitRequest(memory_bytes=50 * GIB)
    # 40 states of their own (each its own second GPU), failing on two readings of their first GPU
    batch = [node(f"n{i}", gpu(0, 40 if i % 2 else 30, 1.0), gpu(1, 1, 1.0, memory_free_bytes=GIB + i * 2**20))
             for i in range(40)]
    verdicts = judged_together(batch, request)
    assert len({verdict_key(hints) for hints in batch}) == 40 and len(asked) == len(set(asked)) == 2
    assert verdicts == [one_by_one(hints, request) for hints in batch]


def test_states_keep_their_slot_until_the_columns_start_again() -> None:
    """The cluster view's states keep their columns' slot (one C-speed pass a call instead of a lookup by
    a key of kilobytes each): the slots are those found by key, kept across calls, and found again by key
    after the columns start over (another generation), never read from the one before."""
    batch = [node(f"n{i}", gpu(0, 10 + i, 0.5)) for i in range(6)]
    states = [SharedState(hints, node_index(hints), verdict_key(hints), kind_keys(hints)) for hints in batch]
    columns = StateColumns()
    found = columns.kept_slots(states)
    assert found == list(range(6)) and all(state.columns >= 0 for state in states)
    by_key = StateColumns()
    assert by_key.slots((s.key, s.index) for s in reversed(states)) == list(range(6))  # another order
    lookups: list[int] = []
    looked_up = columns.slots
    columns.slots = lambda pairs: lookups.append(1) or looked_up(pairs)  # type: ignore[method-assign]
    assert columns.kept_slots(states[::-1]) == found[::-1] and not lookups  # kept: no lookup
    columns.clear()
    assert columns.kept_slots(states[3:]) == [0, 1, 2] and lookups == [1]  # written again, in this order
    request = FitRequest(memory_bytes=12 * GIB, share=0.3)
    assert columns.judge(columns.kept_slots(states), request).outcomes() == \
        by_key.judge(by_key.slots((s.key, s.index) for s in states), request).outcomes()


def test_two_columns_over_the_same_states_never_read_each_others_slots() -> None:
    """Two extenders over one view keep their slots on the same states: each finds its own, by key,
    whichever wrote last (another order of writing, other slots)."""
    batch = [node(f"n{i}", gpu(0, 10 + i, 0.5)) for i in range(4)]
    states = [SharedState(hints, node_index(hints), verdict_key(hints), kind_keys(hints)) for hints in batch]
    first, second = StateColumns(), StateColumns()
    assert first.kept_slots(states) == [0, 1, 2, 3]
    assert second.kept_slots(states[::-1]) == [0, 1, 2, 3]  # the last state is the second's first
    assert first.kept_slots(states) == [0, 1, 2, 3] and second.kept_slots(states) == [3, 2, 1, 0]
