"""Fit, GPU choice, score, rejection reasons and recommended mode on simulated nodes (hints/score.py), and the
hints engine on them (hints/engine.py): the 8xH100 busy node, the MIG A100 node, a node with a lost GPU."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from simclock import FakeClock

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.hints.codec import hints_from_jsonable, hints_to_jsonable
from gpuagent.hints.score import FitRequest, RequestError, parse_fit_request, score_node
from gpuagent.snapshot.hints import GpuHints, NodeHints
from gpuagent.snapshot.node import NodeSnapshot

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"
A100_MIG = ROOT / "examples" / "scenarios" / "a100-mig.yaml"
FAULTS = ROOT / "examples" / "scenarios" / "faults.yaml"
GIB = 2**30

# An A100 80GB partly partitioned: one 3g.40gb instance in use; room for more of most profiles.
PARTIAL_MIG = """
version: 1
name: a100-partial-mig
hostname: dgx-a100-partial
gpus:
  - model: A100-SXM4-80GB
    mig:
      instances: [{profile: 3g.40gb, id: 1}]
  - model: A100-SXM4-80GB
    mig:
      instances: [{profile: 3g.40gb, id: 1}, {profile: 2g.20gb, id: 5}]
processes:
  - {name: finetune, gpu: 0, mig_instance: 1, memory: 30Gi, sm_util: 80}
  - {name: finetune-2, gpu: 1, mig_instance: 1, memory: 30Gi, sm_util: 80}
  - {name: serve, gpu: 1, mig_instance: 5, memory: 10Gi, sm_util: 50}
"""


async def _poll(scenario: Path, times: tuple[float, ...]) -> NodeSnapshot:
    clock = FakeClock(start=times[0])
    settings = {"backend": "sim", "scenario": str(scenario), "poll_interval": 0.05, "slow_poll_interval": 0.05,
                "nvml_timeout": 2.0, "network": False}
    config = load_config(None, env={}, overrides=settings)
    nvml = SimulatedNvml(load_scenario(scenario), clock=clock)
    clock.t = clock.start
    agent = Agent(config, nvml=nvml, backend="sim")
    try:
        snapshot = await agent.poll_once()
        for t in times[1:]:
            clock.t = t
            snapshot = await agent.poll_once()
    finally:
        await agent.aclose()
    return snapshot


def sim_snapshot(scenario: Path, *times: float) -> NodeSnapshot:
    """The agent's snapshot (with hints) after polling the simulated node at scenario times ``times``."""
    return asyncio.run(_poll(scenario, times or (60.0, 61.0)))


def sim_hints(scenario: Path, *times: float) -> NodeHints:
    hints = sim_snapshot(scenario, *times).hints
    assert hints is not None
    return hints


@pytest.fixture(scope="module")
def h100() -> NodeHints:
    return sim_hints(H100, 60.0, 61.0)


@pytest.fixture(scope="module")
def a100_mig() -> NodeHints:
    return sim_hints(A100_MIG, 30.0, 31.0)


@pytest.fixture(scope="module")
def partial_mig(tmp_path_factory: pytest.TempPathFactory) -> NodeHints:
    path = tmp_path_factory.mktemp("scenario") / "partial.yaml"
    path.write_text(PARTIAL_MIG)
    return sim_hints(path, 10.0, 11.0)


@pytest.fixture(scope="module")
def lost_gpu() -> NodeHints:
    return sim_hints(FAULTS, 55.0, 70.0)  # GPU 3 falls off the bus at t = 61


def fit(hints: NodeHints, **request: object):
    return score_node(hints, parse_fit_request(request), now=hints.taken_at_unix + 1)


def by_uuid(hints: NodeHints) -> dict[str, GpuHints]:
    return {g.uuid: g for g in hints.gpus}


def _leftover(gpu: GpuHints, share: float, memory: int) -> float:
    """How much a shared GPU has left after a placement: what binpack minimises and spread maximises."""
    assert gpu.memory_total_bytes
    return (gpu.schedulable_share_ratio - share) + (gpu.memory_free_bytes - memory) / gpu.memory_total_bytes


# --- the busy 8xH100 node ----------------------------------------------------------------------------------


def test_busy_h100_hints_describe_every_gpu(h100: NodeHints) -> None:
    assert h100.hostname and h100.gpu_count == h100.healthy_gpu_count == 8
    for gpu in h100.gpus:
        assert gpu.model == "NVIDIA H100 80GB HBM3" and gpu.health == "ok" and not gpu.mig_enabled
        assert gpu.memory_total_bytes and 0 < gpu.memory_free_bytes < gpu.memory_total_bytes
        assert gpu.memory_used_bytes and gpu.memory_free_bytes <= gpu.memory_total_bytes - gpu.memory_used_bytes
        assert gpu.sm_util_ratio is not None and gpu.sm_util_short_ratio is not None
        assert 0 <= gpu.schedulable_share_ratio <= 1
        assert math.isclose(gpu.schedulable_share_ratio, 1 - gpu.sm_util_long_ratio, abs_tol=1e-3)
        assert gpu.tenants and gpu.sharing_mode == "time_sliced"  # processes nobody was allocated the GPU for
        assert len(gpu.nvlink_peers) == 7 and gpu.uuid not in gpu.nvlink_peers
        assert set(gpu.nvlink_peers) <= set(by_uuid(h100))  # peers named by UUID
        assert gpu.numa_node == (0 if gpu.index < 4 else 1)
        assert gpu.compute_mode == "default"
    assert h100.free_gpu_count == 0
    assert h100.memory_free_bytes == sum(g.memory_free_bytes for g in h100.gpus)


def test_binpack_takes_the_fullest_gpu_that_fits_and_spread_the_emptiest(h100: NodeHints) -> None:
    share, memory = 0.3, 20 * GIB
    fitting = [g for g in h100.gpus if g.schedulable_share_ratio >= share and g.memory_free_bytes >= memory]
    assert 2 <= len(fitting) < 8  # the node is busy: some GPUs fit, some do not
    binpack = fit(h100, memory="20Gi", share=0.3, policy="binpack")
    spread = fit(h100, memory="20Gi", share=0.3, policy="spread")
    assert binpack.fits and spread.fits and len(binpack.gpus) == len(spread.gpus) == 1
    fullest = min(fitting, key=lambda g: _leftover(g, share, memory))
    emptiest = max(fitting, key=lambda g: _leftover(g, share, memory))
    assert binpack.gpus == (fullest.uuid,) and spread.gpus == (emptiest.uuid,)
    assert fullest.uuid != emptiest.uuid
    # Each GPU that cannot take it says why, with the figures; the chosen ones have no reason.
    rejected = {g.uuid for g in h100.gpus} - {g.uuid for g in fitting}
    assert set(binpack.reasons) == rejected
    for uuid in rejected:
        gpu = by_uuid(h100)[uuid]
        assert f"{gpu.schedulable_share_ratio:.0%} schedulable" in binpack.reasons[uuid]
    assert 1 <= binpack.score <= 100 and 1 <= spread.score <= 100


def test_scores_rank_gpus_as_the_policy_says(h100: NodeHints) -> None:
    """On one node, binpack scores a small request higher than a big one fills less; spread the other way."""
    small = [fit(h100, memory="1Gi", share=0.05, policy=p).score for p in ("binpack", "spread")]
    big = [fit(h100, memory="16Gi", share=0.4, policy=p).score for p in ("binpack", "spread")]
    assert big[0] > small[0]  # binpack: the fuller the node after placing, the better
    assert big[1] < small[1]  # spread: the emptier, the better


def test_two_gpus_prefer_nvlink_peers(h100: NodeHints) -> None:
    result = fit(h100, gpus=2, memory="8Gi", share=0.1, policy="spread")
    assert result.fits and len(set(result.gpus)) == 2
    assert result.extra["nvlink_connected_ratio"] == 1.0


def test_exclusive_needs_a_gpu_without_tenants(h100: NodeHints) -> None:
    result = fit(h100, exclusive=True)
    assert not result.fits and result.score == 0 and result.gpus == ()
    assert result.reasons["node"] == "needs 1 GPUs, 0 can take it"
    assert all(result.reasons[g.uuid].startswith("not free for exclusive use: 1 tenant(s)") for g in h100.gpus)
    assert result.recommended_mode == "exclusive"


def test_more_gpus_than_fit(h100: NodeHints) -> None:
    result = fit(h100, gpus=9, memory="1Gi")
    assert not result.fits and result.reasons["node"] == "needs 9 GPUs, 8 can take it"


def test_memory_rejection_names_the_figures(h100: NodeHints) -> None:
    result = fit(h100, memory="60GB")
    assert not result.fits
    for gpu in h100.gpus:
        assert result.reasons[gpu.uuid] == (
            f"needs 55.9 GiB of memory, {gpu.memory_free_bytes / GIB:.1f} GiB free"
        )


def test_recommended_mode_adapts_to_the_request(h100: NodeHints) -> None:
    small = fit(h100, memory="4Gi", share=0.1)
    assert small.recommended_mode == "time_sliced" and "lightly loaded" in small.recommendation
    big = fit(h100, share=0.8)
    assert big.recommended_mode == "exclusive" and "most of a GPU" in big.recommendation
    whole = fit(h100)
    assert whole.recommended_mode == "exclusive" and "whole GPUs" in whole.recommendation


def test_stale_hints_do_not_fit(h100: NodeHints) -> None:
    request = FitRequest(gpus=1, memory_bytes=GIB)
    fresh = score_node(h100, request, now=h100.taken_at_unix + 5, max_age_seconds=30)
    stale = score_node(h100, request, now=h100.taken_at_unix + 45, max_age_seconds=30)
    assert fresh.fits
    assert not stale.fits and stale.score == 0
    assert stale.reasons == {"node": "hints are 45 s old, more than the 30 s allowed"}


# --- MIG --------------------------------------------------------------------------------------------------


def test_mig_node_hints(a100_mig: NodeHints) -> None:
    gpus = a100_mig.gpus
    assert [g.sharing_mode for g in gpus[:3]] == ["mig"] * 3 and gpus[3].sharing_mode == "time_sliced"
    assert [len(g.mig_instances) for g in gpus] == [3, 7, 2, 0]
    idle = [i for i in gpus[1].mig_instances if i.idle]
    assert len(idle) == 2 and {i.gpu_instance_id for i in idle} == {12, 13}
    assert [(p.profile, p.creatable_count, len(p.idle_instances)) for p in gpus[1].free_mig_profiles] == [
        ("1g.10gb", 0, 2)
    ]
    assert gpus[0].free_mig_profiles == () and gpus[2].free_mig_profiles == ()  # fully partitioned
    assert gpus[0].schedulable_share_ratio == 0.0 and gpus[2].schedulable_share_ratio == 0.0
    assert math.isclose(gpus[1].schedulable_share_ratio, 2 / 7, abs_tol=1e-5)
    assert gpus[1].memory_free_bytes == sum(i.memory_total_bytes or 0 for i in idle)
    assert gpus[0].sm_util_ratio is None  # no utilization on MIG without GPM, and none made up


def test_mig_profile_takes_an_idle_instance(a100_mig: NodeHints) -> None:
    gpu1 = a100_mig.gpus[1]
    result = fit(a100_mig, mig_profile="1g.10gb")
    assert result.fits and result.gpus == (gpu1.uuid,)
    assert result.mig_instances[0] in {i.uuid for i in gpu1.mig_instances if i.idle}
    assert result.recommended_mode == "mig" and result.recommended_mig_profile == "1g.10gb"
    two = fit(a100_mig, mig_profile="1g.10gb", gpus=2)
    assert two.fits and two.gpus == (gpu1.uuid, gpu1.uuid) and len(set(two.mig_instances)) == 2


def test_mig_rejections_say_why(a100_mig: NodeHints) -> None:
    gpus = a100_mig.gpus
    three = fit(a100_mig, mig_profile="1g.10gb", gpus=3)
    assert not three.fits and three.reasons["node"] == "needs 3 MIG instances, 2 can take it"
    other = fit(a100_mig, mig_profile="2g.20gb")
    assert not other.fits
    assert other.reasons[gpus[0].uuid] == "no free 2g.20gb instance and no room for one"
    assert other.reasons[gpus[1].uuid] == "no free 2g.20gb instance and no room for one (free: 1g.10gb x2)"
    assert other.reasons[gpus[3].uuid] == "MIG is not enabled"
    too_big = fit(a100_mig, mig_profile="1g.10gb", memory="12Gi")
    assert not too_big.fits and "a 1g.10gb instance has 9.5 GiB of memory, needs 12.0 GiB" in too_big.reasons.values()
    shared = fit(a100_mig, memory="4Gi", share=0.1)
    assert {shared.reasons[g.uuid] for g in gpus[:3]} == {"MIG is enabled: only a mig_profile request fits it"}


def test_small_request_on_a_busy_mig_node_is_recommended_mig(a100_mig: NodeHints) -> None:
    result = fit(a100_mig, memory="4Gi", share=0.1)
    assert result.recommended_mode == "mig" and result.recommended_mig_profile == "1g.10gb"


def test_mig_capacity_from_nvml_remaining_counts(partial_mig: NodeHints) -> None:
    first, second = partial_mig.gpus
    creatable = {p.profile: p.creatable_count for p in first.free_mig_profiles}
    assert creatable == {"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 1}
    assert {p.profile: p.creatable_count for p in second.free_mig_profiles} == {"1g.10gb": 1}
    assert math.isclose(first.schedulable_share_ratio, 3 / 7, abs_tol=1e-5)
    binpack = fit(partial_mig, mig_profile="1g.10gb", policy="binpack")
    spread = fit(partial_mig, mig_profile="1g.10gb", policy="spread")
    assert binpack.gpus == (second.uuid,) and spread.gpus == (first.uuid,)
    assert binpack.mig_instances == () and spread.mig_instances == ()  # to be created: none idle
    four = fit(partial_mig, mig_profile="1g.10gb", gpus=4)
    assert four.fits and sorted(four.gpus) == sorted([first.uuid] * 3 + [second.uuid])
    assert not fit(partial_mig, mig_profile="3g.40gb", gpus=2).fits


# --- a lost GPU -------------------------------------------------------------------------------------------


def test_lost_gpu_is_not_schedulable(lost_gpu: NodeHints) -> None:
    lost = lost_gpu.gpus[3]
    assert lost.health == "lost" and lost.uuid  # seen before it fell off the bus: still named
    assert lost.memory_free_bytes == 0 and lost.schedulable_share_ratio == 0.0 and lost.sm_util_ratio is None
    # GPU 2's double-bit ECC error (XID 48, t = 40) is a fatal fault by the health classification: not offered
    assert lost_gpu.gpus[2].health == "fatal" and lost_gpu.gpus[2].fault is not None
    assert lost_gpu.healthy_gpu_count == 2 and lost_gpu.gpu_count == 4
    assert lost_gpu.free_gpu_count == 1  # GPU 1: its only process stopped at t = 21
    four = fit(lost_gpu, gpus=4, memory="10Gi")
    assert not four.fits and four.reasons[lost.uuid] == "unhealthy (lost)"
    assert four.reasons["node"] == "needs 4 GPUs, 2 can take it"
    assert four.reasons[lost_gpu.gpus[2].uuid] == "unhealthy (fatal)"
    three = fit(lost_gpu, gpus=3, memory="10Gi")
    assert not three.fits
    two = fit(lost_gpu, gpus=2, memory="10Gi")
    assert two.fits and lost.uuid not in two.gpus and lost_gpu.gpus[2].uuid not in two.gpus
    exclusive = fit(lost_gpu, exclusive=True)
    assert exclusive.fits and exclusive.gpus == (lost_gpu.gpus[1].uuid,)


def test_gpu_lost_before_it_was_ever_read_is_named_by_index() -> None:
    hints = sim_hints(FAULTS, 70.0, 71.0)
    lost = hints.gpus[3]
    assert lost.health == "lost" and lost.uuid == ""
    result = fit(hints, gpus=4)
    assert result.reasons["GPU 3"] == "unhealthy (lost)"


# --- the codec round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100", "a100_mig", "partial_mig", "lost_gpu"])
def test_hints_round_trip_through_json(name: str, request: pytest.FixtureRequest) -> None:
    hints: NodeHints = request.getfixturevalue(name)
    text = json.dumps(hints_to_jsonable(hints))
    decoded = hints_from_jsonable(json.loads(text))
    assert decoded == hints
    for req in ({"gpus": 2, "memory": "8Gi", "share": 0.1}, {"mig_profile": "1g.10gb"}, {"exclusive": True}):
        assert fit(decoded, **req) == fit(hints, **req)  # the extender scores what the agent would


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("hostname"), "hostname: missing"),
    (lambda d: d["gpus"][1].update(memory_free_bytes="lots"), "gpus[1].memory_free_bytes: expected an integer"),
    (lambda d: d["gpus"][0]["tenants"][0].update(share_ratio=[1]), "gpus[0].tenants[0].share_ratio: expected a finite"),
    (lambda d: d.update(gpus={}), "gpus: expected a list"),
    (lambda d: d["gpus"][0].update(stale=1), "gpus[0].stale: expected true or false"),
])
def test_bad_hints_json_names_the_field(h100: NodeHints, mutate, message: str) -> None:
    data = json.loads(json.dumps(hints_to_jsonable(h100)))
    mutate(data)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        hints_from_jsonable(data)


def test_unknown_keys_are_ignored(h100: NodeHints) -> None:
    data = hints_to_jsonable(h100)
    data["from_the_future"] = {"x": 1}
    data["gpus"][0]["new_figure"] = 3
    assert hints_from_jsonable(data) == h100


# --- request parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "expected"), [
    ({}, FitRequest()),
    ({"gpus": 2, "memory": 1024, "policy": "spread"}, FitRequest(gpus=2, memory_bytes=1024, policy="spread")),
    ({"memory": "20Gi"}, FitRequest(memory_bytes=20 * GIB)),
    ({"memory": "20GiB"}, FitRequest(memory_bytes=20 * GIB)),
    ({"memory": "20GB"}, FitRequest(memory_bytes=20 * 10**9)),
    ({"memory": "512KB"}, FitRequest(memory_bytes=512_000)),
    ({"share": 0.25}, FitRequest(share=0.25)),
    ({"share": "30%"}, FitRequest(share=0.3)),
    ({"share": 1}, FitRequest(share=1.0)),
    ({"mig_profile": "1g.10gb+me"}, FitRequest(mig_profile="1g.10gb+me")),
    ({"exclusive": True, "memory": None}, FitRequest(exclusive=True)),
])
def test_valid_requests(body: dict, expected: FitRequest) -> None:
    assert parse_fit_request(body) == expected


@pytest.mark.parametrize(("body", "field", "message"), [
    ([], "body", "expected a JSON object"),
    ({"gpus": "2"}, "gpus", "got a string"),
    ({"gpus": True}, "gpus", "got a boolean"),
    ({"gpus": 0}, "gpus", "from 1 to 64, got 0"),
    ({"gpus": 65}, "gpus", "got 65"),
    ({"memory": -5}, "memory", "> 0"),
    ({"memory": 0}, "memory", "> 0"),
    ({"memory": "-1Gi"}, "memory", "> 0"),
    ({"memory": "20 gigs"}, "memory", "expected a Kubernetes memory quantity"),
    ({"memory": 2.5}, "memory", "got a number"),
    ({"share": 0}, "share", "(0, 1]"),
    ({"share": -0.5}, "share", "(0, 1]"),
    ({"share": 1.5}, "share", "(0, 1]"),
    ({"share": float("nan")}, "share", "(0, 1]"),
    ({"share": "150%"}, "share", "percent in (0, 100]"),
    ({"share": [0.5]}, "share", "got a list"),
    ({"mig_profile": "5g.10gb"}, "mig_profile", "unknown MIG profile '5g.10gb'"),
    ({"mig_profile": "big"}, "mig_profile", "unknown MIG profile"),
    ({"mig_profile": 1}, "mig_profile", "got an integer"),
    ({"exclusive": "yes"}, "exclusive", "expected true or false"),
    ({"policy": "random"}, "policy", "binpack, spread, got 'random'"),
    ({"polcy": "spread"}, "polcy", "did you mean policy?"),
    ({"exclusive": True, "share": 0.5}, "share", "whole GPU"),
    ({"mig_profile": "1g.10gb", "exclusive": True}, "exclusive", "isolated already"),
    ({"mig_profile": "1g.10gb", "share": 0.5}, "share", "its slices"),
])
def test_invalid_requests_name_the_field(body: object, field: str, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_fit_request(body)
    assert caught.value.field == field
    assert message in caught.value.message


def test_scoring_is_pure(h100: NodeHints) -> None:
    request = FitRequest(gpus=2, memory_bytes=4 * GIB, share=0.1, policy="spread")
    before = replace(h100)
    first = score_node(h100, request, now=h100.taken_at_unix)
    assert score_node(h100, request, now=h100.taken_at_unix) == first and h100 == before
