"""The quarantine budget's Lease as another party may have written it (issue 28, item 7).

One forged or skewed slot must not block every node's quarantine: a stamp in the far future (``1e300``,
``Infinity``, now + 1e9) expires like an old one, a number too long to be a time is no slot (and raises
nothing), and an agent writes, renews and removes only its own key, leaving every other annotation as it
read it (what ``deploy/admission-lease.yaml`` enforces on the API server's side).
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_apiserver import FakeApiServer

from gpuagent.health.budget import (
    LEASE_NAME,
    SLOT_SUFFIX,
    STAMP,
    BudgetError,
    QuarantineBudget,
    live_slots,
    slot_key,
    stamp,
)
from gpuagent.kubeapi import ApiConnection

NOW = 1_764_400_000.0
TTL, SKEW = 900.0, 300.0


def _live(annotations: dict[str, Any], now: float = NOW) -> dict[str, float]:
    return live_slots(annotations, now, ttl=TTL, max_skew=SKEW)


@pytest.mark.parametrize("value", [
    "1e300", "Infinity", "-Infinity", "NaN", "inf", "-5", "1" * 400, "1" * 13, "1764400000.1234567",
    "+1764400000", " 1764400000", "1764400000 ", "0x69300000", "1_764_400_000", "", "١٧٦٤٤٠٠٠٠٠",
])
def test_a_value_that_is_not_a_stamp_holds_no_slot_and_raises_nothing(value: str) -> None:
    assert _live({slot_key("forged"): value}) == {}


@pytest.mark.parametrize("value", [1e300, float("inf"), 10 ** 400, None, ["1764400000"], {"at": 1}])
def test_a_value_that_is_not_a_string_holds_no_slot(value: Any) -> None:
    assert _live({slot_key("forged"): value}) == {}


@pytest.mark.parametrize(("offset", "live"), [
    (0.0, True), (-TTL + 1, True), (-TTL, False), (-TTL - 1e6, False),  # renewed within ttl, or not
    (SKEW, True), (SKEW + 0.001, False),  # a clock ahead by up to the skew bound counts; beyond it, expired
    (1e9, False), (99_999_999_999 - NOW, False),  # stamped far in the future: never "fresh for ever"
])
def test_a_slot_is_live_from_ttl_before_now_to_the_skew_bound_after_it(offset: float, live: bool) -> None:
    assert (_live({slot_key("gpu-1"): stamp(NOW + offset)}) != {}) is live


def test_only_keys_of_the_slot_form_are_slots() -> None:
    annotations = {slot_key("gpu-1"): stamp(NOW), "gpuagent.io/quarantined": '{"gpu-2": 1764400000}',
                   "quarantine.gpuagent.io/slot": stamp(NOW), "other": stamp(NOW)}
    assert _live(annotations) == {"gpu-1": NOW}


def test_stamps_are_what_the_reader_and_the_admission_policy_accept() -> None:
    for unix in (0.0, NOW, NOW + 0.0004, 999_999_999_999.5, -1.0, 1e300):
        assert STAMP.fullmatch(stamp(unix)), stamp(unix)
    assert float(stamp(NOW + 0.125)) == NOW + 0.125


@pytest.mark.parametrize("node", ["", "Upper", "a_b", "-a", "a" * 231, "a/b", "a..b"])
def test_a_node_name_no_annotation_key_can_carry_is_refused_by_name(node: str) -> None:
    with pytest.raises(BudgetError, match="cannot name a slot"):
        slot_key(node)


def test_the_longest_node_name_makes_a_valid_key() -> None:
    prefix = slot_key("a" * 230).split("/")[0]
    assert len(prefix) == 253 and slot_key("a" * 230).endswith(SLOT_SUFFIX)


# --- against the (fake) API server ---------------------------------------------------------------------------


def _seed(api: FakeApiServer, annotations: dict[str, Any]) -> None:
    api.cluster.leases[("gpuagent", LEASE_NAME)] = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": "gpuagent", "resourceVersion": "7",
                     "annotations": annotations},
        "spec": {}}


def _annotations(api: FakeApiServer) -> dict[str, Any]:
    return api.cluster.leases[("gpuagent", LEASE_NAME)]["metadata"]["annotations"]


@pytest.mark.integration
@pytest.mark.parametrize("forged", [
    stamp(NOW + 1e9),  # the now+1e9: a valid stamp, far beyond the skew bound
    "1e300", "Infinity", "1" * 400,
    stamp(NOW + SKEW + 60),  # a node whose clock runs far ahead
])
async def test_one_forged_or_skewed_slot_does_not_block_the_fleet_and_stays_as_written(forged: str) -> None:
    hostile = {slot_key("ghost"): forged, "team": "ml"}
    async with FakeApiServer() as api:
        _seed(api, dict(hostile))
        connection = ApiConnection(config=api.kubeconfig())
        try:
            budget = QuarantineBudget(connection, "gpu-1", namespace="gpuagent", limit=1, clock=lambda: NOW)
            assert await budget.acquire() is True and budget.holders == ("gpu-1",)
            assert _annotations(api) == {**hostile, slot_key("gpu-1"): stamp(NOW)}  # the rest as read
            await budget.release()
            assert _annotations(api) == hostile and budget.held is False
        finally:
            await connection.aclose()


@pytest.mark.integration
async def test_a_live_slot_of_another_node_is_respected_and_never_rewritten() -> None:
    other = {slot_key("gpu-2"): stamp(NOW - 30)}
    async with FakeApiServer() as api:
        _seed(api, dict(other))
        connection = ApiConnection(config=api.kubeconfig())
        try:
            budget = QuarantineBudget(connection, "gpu-1", namespace="gpuagent", limit=1, clock=lambda: NOW)
            assert await budget.acquire() is False and budget.holders == ("gpu-2",)
            assert _annotations(api) == other and api.cluster.lease_writes == []
            await budget.release()  # holds nothing: writes nothing
            assert api.cluster.lease_writes == []
        finally:
            await connection.aclose()


@pytest.mark.integration
async def test_an_expired_key_of_its_own_is_removed_on_release_and_a_dead_nodes_key_is_left() -> None:
    seeded = {slot_key("gpu-1"): stamp(NOW - 5 * TTL), slot_key("deleted-node"): stamp(NOW - 50 * TTL)}
    async with FakeApiServer() as api:
        _seed(api, dict(seeded))
        connection = ApiConnection(config=api.kubeconfig())
        try:
            budget = QuarantineBudget(connection, "gpu-1", namespace="gpuagent", limit=1, clock=lambda: NOW)
            await budget.release()
            assert _annotations(api) == {slot_key("deleted-node"): stamp(NOW - 50 * TTL)}
        finally:
            await connection.aclose()


@pytest.mark.integration
async def test_a_clock_that_went_back_renews_instead_of_trusting_the_old_renewal() -> None:
    now = [NOW]
    async with FakeApiServer() as api:
        connection = ApiConnection(config=api.kubeconfig())
        try:
            budget = QuarantineBudget(connection, "gpu-1", namespace="gpuagent", limit=1, clock=lambda: now[0])
            assert await budget.acquire()
            now[0] = NOW - 3600  # an NTP step back: "renewed 1 h in the future" must not count as recent
            assert await budget.acquire()
            assert _annotations(api) == {slot_key("gpu-1"): stamp(NOW - 3600)}
        finally:
            await connection.aclose()
