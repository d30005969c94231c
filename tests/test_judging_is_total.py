"""Judging a node never fails the call (issue 28, items 2, 11 and 13): the fit is total over hostile hints.

One node's figures (``schedulable_share_ratio: 1e308``, a negative memory, a zero GPU count) once made the
fit raise ``OverflowError``, and filter and prioritize answered a plain-text 500 for every call that listed
that node; with ``ignorable: true`` kube-scheduler then placed GPU pods with no GPU awareness at all. Here:

- property tests over hostile ``NodeHints`` (huge, zero, negative and non-finite figures, edge ratios,
  hostile names) and every kind of request: ``score_node`` (``/v1/hints/score``) and the extender's fast
  path always answer a verdict, a score in range and, when it does not fit, a reason; pod and score
  request bodies of any shape are a request or a ``RequestError``/``MalformedPod``, never another error;
- the extender over HTTP: such a node is judged (200, JSON), an exception while judging one node fails
  that node alone with a reason, any other exception is a JSON 500, and control characters in a hostile
  object's names reach kube-scheduler's ``FailedNodes`` escaped.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fixture_files import filter_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender import NODES, FakeClock, Harness, all_free, gpu, node_hints

from gpuagent.hints import extender as extender_module
from gpuagent.hints import extender_verdict
from gpuagent.hints.agents import AgentEntry
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_app, build_registry
from gpuagent.hints.extender_verdict import MAX_REASON_CHARS, REASON_PREFIX, entry_verdict
from gpuagent.hints.malformed import MalformedPod
from gpuagent.hints.podrequest import PodRequestError, pod_fit_request
from gpuagent.hints.score import (
    MAX_GPUS,
    FitRequest,
    RequestError,
    fit_node,
    node_index,
    parse_fit_request,
    score_node,
)
from gpuagent.hints.verdict_key import kind_keys
from gpuagent.quantities import MEMORY_MAX_BYTES
from gpuagent.snapshot.hints import GpuHints, MigProfileHint, NodeHints, TenantHint
from gpuagent.untrusted import has_unsafe

pytestmark = pytest.mark.long  # property tests of several seconds: handed out early (conftest.py)

GIB = 2**30

# --- hostile values -----------------------------------------------------------------------------------------

EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-9, 0.05, 0.5, 1.0 - 1e-16, 1.0, 1.0 + 1e-9, 2.0, -1.0, 1e18, 1e300,
               1e308, 1.7976931348623157e308, -1e308]
NON_FINITE = [math.inf, -math.inf, math.nan]  # the decoders refuse them: judging must not depend on that
FLOATS = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(NON_FINITE))
EDGE_INTS = [0, 1, -1, 7, 8, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30), 10**400, -(10**400)]
INTS = st.one_of(st.sampled_from(EDGE_INTS), st.integers())
BYTES = st.one_of(INTS, st.integers(0, 80 * GIB))
RATIOS = st.one_of(FLOATS, st.floats(0.0, 1.0))
HOSTILE_NAMES = ["ns/\x1b[2J", "ns/\x1b]0;owned\x07", "a\r\nFake: line", "ns/\u202eevil", "\x00", "\ud800",
                 "x" * 5000, ""]
NAMES = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=20))
UUIDS = ("GPU-a", "GPU-b", "GPU-c", "", "GPU-\x1b[2J")
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")

tenant_hints = st.builds(
    TenantHint, name=NAMES, kind=st.sampled_from(["pod", "unknown", "\x1b[31m"]),
    share_ratio=st.none() | RATIOS, memory_limit_bytes=st.none() | BYTES, memory_used_bytes=BYTES,
    sm_util_ratio=st.none() | RATIOS,
)
mig_profile_hints = st.builds(
    MigProfileHint, profile=st.sampled_from(PROFILES) | NAMES, slice_count=INTS,
    memory_bytes=st.none() | BYTES, creatable_count=INTS,
    idle_instances=st.lists(st.sampled_from(["MIG-1", "MIG-2", "MIG-\x1b"]), max_size=3).map(tuple),
)


@st.composite
def hostile_gpus(draw: st.DrawFn) -> GpuHints:
    return GpuHints(
        uuid=draw(st.sampled_from(UUIDS)), index=draw(st.sampled_from([0, 1, 2, 1 << 30]) | INTS),
        model="sim", health=draw(st.sampled_from(["ok", "ok", "ok", "lost", "\x1b[2J"])), pci_bus_id="",
        numa_node=draw(st.none() | INTS), memory_total_bytes=draw(st.none() | BYTES),
        memory_used_bytes=draw(st.none() | BYTES), memory_allocated_bytes=draw(BYTES),
        memory_free_bytes=draw(BYTES), sm_util_ratio=draw(st.none() | RATIOS), sm_util_short_ratio=None,
        sm_util_long_ratio=draw(st.none() | RATIOS), schedulable_share_ratio=draw(RATIOS),
        sharing_mode=draw(st.sampled_from(["none", "exclusive", "time_sliced", "mps", "mig"])),
        compute_mode=draw(st.sampled_from([None, "default", "exclusive_process", "prohibited"])),
        mig_enabled=draw(st.booleans()), tenants=tuple(draw(st.lists(tenant_hints, max_size=4))),
        free_mig_profiles=tuple(draw(st.lists(mig_profile_hints, max_size=3))),
        nvlink_peers=tuple(draw(st.lists(st.sampled_from(UUIDS), max_size=3))), stale=draw(st.booleans()),
    )


@st.composite
def hostile_nodes(draw: st.DrawFn) -> NodeHints:
    gpus = tuple(draw(st.lists(hostile_gpus(), max_size=5)))
    return NodeHints(
        hostname="node", taken_at_unix=draw(st.sampled_from([1000.0]) | FLOATS), gpus=gpus,
        gpu_count=draw(INTS), healthy_gpu_count=draw(st.sampled_from([len(gpus)]) | INTS),
        free_gpu_count=draw(INTS), memory_total_bytes=draw(BYTES), memory_free_bytes=draw(BYTES),
        schedulable_share_gpus=draw(FLOATS),
    )


@st.composite
def fit_requests(draw: st.DrawFn) -> FitRequest:
    """Any request the parser admits, edges included."""
    kind = draw(st.sampled_from(["shared", "exclusive", "mig"]))
    return FitRequest(
        gpus=draw(st.sampled_from([1, 2, MAX_GPUS]) | st.integers(1, MAX_GPUS)),
        memory_bytes=draw(st.none() | st.sampled_from([1, GIB, MEMORY_MAX_BYTES]) | st.integers(1, MEMORY_MAX_BYTES)),
        share=draw(st.none() | st.sampled_from([5e-324, 1e-9, 0.5, 1.0]) | st.floats(0.0, 1.0, exclude_min=True))
        if kind == "shared" else None,
        mig_profile=draw(st.sampled_from(PROFILES)) if kind == "mig" else None,
        exclusive=kind == "exclusive",
        policy=draw(st.sampled_from(["binpack", "spread"])),
    )


# --- the fit is total ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hints=hostile_nodes(), request=fit_requests())
def test_score_and_the_fast_path_answer_every_hostile_node(hints: NodeHints, request: FitRequest) -> None:
    result = score_node(hints, request, now=1000.0, max_age_seconds=30.0)
    assert 0 <= result.score <= 100
    assert result.fits == (result.score > 0)
    if not result.fits:
        assert result.reasons, "a node that does not fit says why"
    json.dumps(result.to_jsonable(), allow_nan=False)  # what /v1/hints/score answers
    fit = fit_node(node_index(hints), request)
    assert 0 <= fit.score <= 100 and fit.fits == (fit.score > 0)
    verdict = entry_verdict(AgentEntry(node="node", url=None, hints=hints, index=node_index(hints)), request)
    assert 0 <= verdict.score <= 10
    assert all(isinstance(key, bytes) for key in kind_keys(hints))  # the cluster view keys every state
    if not verdict.fits:
        assert verdict.reason.startswith(REASON_PREFIX) and len(verdict.reason) <= MAX_REASON_CHARS
        assert not has_unsafe(verdict.reason), verdict.reason


JSON = st.recursive(
    st.none() | st.booleans() | FLOATS | INTS | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
SCORE_KEYS = st.sampled_from(["gpus", "memory", "share", "mig_profile", "exclusive", "policy"])


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(JSON, st.dictionaries(SCORE_KEYS, JSON, max_size=6)))
def test_any_score_body_is_a_request_or_a_request_error(body: Any) -> None:
    try:
        request = parse_fit_request(body)
    except RequestError as err:
        assert isinstance(err.field, str) and err.message  # the field is the body's key, "" included
        return
    assert 1 <= request.gpus <= MAX_GPUS


POD_RESOURCES = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-\x1b[2J",
                                 "nvidia.com/mig-", "cpu"])
ANNOTATIONS = st.sampled_from(["gpuagent.io/gpu-share", "gpuagent.io/gpu-memory", "gpuagent.io/placement"])


@st.composite
def hostile_pods(draw: st.DrawFn) -> Any:
    quantity = st.one_of(JSON, st.sampled_from(["1", "2", "+3", " 4 ", "1e3", "0", "-1", "99999999999"]))
    resources = draw(st.dictionaries(st.sampled_from(["requests", "limits"]),
                                     st.dictionaries(POD_RESOURCES, quantity, max_size=3) | JSON, max_size=2))
    container = draw(st.just({"resources": resources}) | st.fixed_dictionaries({"resources": JSON}) | JSON)
    init = draw(st.none() | st.lists(st.fixed_dictionaries(
        {"resources": st.just(resources)}, optional={"restartPolicy": st.sampled_from(["Always", 3])}),
        max_size=2))
    annotations = draw(st.dictionaries(ANNOTATIONS, st.sampled_from(
        ["30", "30%", "0", "101", "8Gi", "8GB", "binpack", "SPREAD", "\x1b[2J", "1e999"]) | JSON, max_size=3)
        | JSON)
    spec: dict[str, Any] = {"containers": [container]}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": {"annotations": annotations}, "spec": spec}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=hostile_pods() | JSON)
def test_any_pod_is_a_request_none_or_a_named_error(pod: Any) -> None:
    try:
        request = pod_fit_request(pod)
    except (PodRequestError, MalformedPod) as err:
        assert err.field and err.message
        return
    assert request is None or 1 <= request.gpus <= MAX_GPUS


# --- the cases, one by one --------------------------------------------------------------------------


@pytest.mark.parametrize("request_", [FitRequest(share=0.3), FitRequest(exclusive=True),
                                      FitRequest(gpus=2, share=0.1, policy="spread")])
@pytest.mark.parametrize("where", ["gpu", "node"])
def test_a_huge_share_is_judged_as_the_whole_gpu_it_can_at_most_be(request_: FitRequest, where: str) -> None:
    """``schedulable_share_ratio: 1e308`` (or the node's ``schedulable_share_gpus``): OverflowError before."""
    honest = node_hints("n", (gpu(0), gpu(1)))
    hostile = (replace(honest, gpus=(replace(gpu(0), schedulable_share_ratio=1e308), gpu(1)),
                       schedulable_share_gpus=1e308 + 1.0) if where == "gpu"
               else replace(honest, schedulable_share_gpus=1e308))
    result = score_node(hostile, request_, now=honest.taken_at_unix)
    assert result == score_node(honest, request_, now=honest.taken_at_unix)


def test_figures_out_of_range_score_as_the_range_they_must_lie_in() -> None:
    honest = node_hints("n", (gpu(0, share=0.0, free_gib=0), gpu(1, share=1.0)))
    negative = replace(honest, gpus=(replace(honest.gpus[0], schedulable_share_ratio=-1e308,
                                             memory_free_bytes=-(10**400)), honest.gpus[1]),
                       memory_free_bytes=-1, healthy_gpu_count=-5, memory_total_bytes=10**400)
    for request in (FitRequest(share=0.5, memory_bytes=GIB), FitRequest(exclusive=True), FitRequest(gpus=2)):
        result = score_node(negative, request, now=honest.taken_at_unix)
        assert 0 <= result.score <= 100
        assert result.fits == score_node(honest, request, now=honest.taken_at_unix).fits


# --- the extender over HTTP ---------------------------------------------------------------------------------
#
# On an in-memory node source: the hints reach the extender as they are, whatever the decoders in front of
# it refuse (judging must not depend on them).


class MemorySource:
    """A node source holding decoded hints, fresh at the extender's clock (what ``AgentCache`` holds)."""

    def __init__(self, hints: dict[str, NodeHints]) -> None:
        self.hints = hints

    def __len__(self) -> int:
        return len(self.hints)

    def knows(self, node: str) -> bool:
        return node in self.hints

    def counts(self, max_age_seconds: float) -> dict[str, int]:
        return {"fresh": len(self.hints), "stale": 0, "unreachable": 0}

    def set_fetch_observer(self, observer: Any) -> None:
        pass

    async def lookup(self, nodes: Any) -> dict[str, AgentEntry]:
        return {n: AgentEntry(node=n, url=None, hints=h, index=node_index(h), answered_at=0.0)
                for n in nodes if (h := self.hints.get(n)) is not None}


@pytest.fixture
async def serve_nodes() -> AsyncIterator[Callable[[dict[str, NodeHints]], Awaitable[Harness]]]:
    clients: list[TestClient] = []

    async def make(hints: dict[str, NodeHints]) -> Harness:
        clock = FakeClock()
        clock.now = 0.0
        extender = Extender(MemorySource(hints), monotonic=clock)  # type: ignore[arg-type]
        client = TestClient(TestServer(build_app(extender, build_registry(extender), prefix="/gpu"),
                                       host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return Harness(None, extender, client, clock)  # type: ignore[arg-type]

    yield make
    for client in clients:
        await client.close()


def hostile(name: str) -> NodeHints:
    """The issue's node: one number far out of range in an otherwise honest state."""
    hints = all_free(name)
    return replace(hints, schedulable_share_gpus=1e308,
                   gpus=(replace(hints.gpus[0], schedulable_share_ratio=1e308), *hints.gpus[1:]))


async def test_a_node_with_a_huge_figure_is_judged_and_the_call_answered(serve_nodes: Any) -> None:
    h = await serve_nodes({NODES[0]: hostile(NODES[0]), NODES[1]: all_free(NODES[1])})
    body = filter_request()  # one exclusive GPU
    body["NodeNames"] = list(NODES[:2])
    status, reply = await h.post("filter", body)
    assert status == 200, reply
    assert reply["NodeNames"] == list(NODES[:2])  # 1e308 of a GPU's time is at most all of it
    status, scores = await h.post("prioritize", body)
    assert status == 200, scores
    assert scores[0]["Score"] == scores[1]["Score"] > 0  # judged as the honest node it is at most


async def test_an_exception_judging_one_node_fails_that_node_alone(
    serve_nodes: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    h = await serve_nodes({node: all_free(node) for node in NODES[:2]})
    real = extender_verdict.fit_node

    def breaks_on_node_1(index: Any, request: FitRequest) -> Any:
        if index.hints.hostname == NODES[0]:
            raise ZeroDivisionError("\x1b[2Jsomething no node should cause")
        return real(index, request)

    monkeypatch.setattr(extender_verdict, "fit_node", breaks_on_node_1)
    body = filter_request()
    body["NodeNames"] = list(NODES[:2])
    with caplog.at_level(logging.WARNING, logger=extender_module.__name__):
        status, reply = await h.post("filter", body)
        assert status == 200, reply
        assert reply["NodeNames"] == [NODES[1]]
        reason = reply["FailedAndUnresolvableNodes"][NODES[0]]
        assert reason == f"{REASON_PREFIX}its GPU state could not be judged (ZeroDivisionError)"
        status, scores = await h.post("prioritize", body)
        assert status == 200 and scores[0] == {"Host": NODES[0], "Score": 0} and scores[1]["Score"] > 0
    logged = [r for r in caplog.records if NODES[0] in r.getMessage()]
    # judged once per state and request: the prioritize that follows reuses the filter's verdict
    assert len(logged) == 1 and logged[0].exc_info is not None
    metrics = (await (await h.client.get("/metrics")).read()).decode()
    assert 'gpuagent_extender_judge_errors_total{verb="filter"} 1.0' in metrics
    assert 'gpuagent_extender_judge_errors_total{verb="prioritize"}' not in metrics


async def test_any_other_exception_is_a_json_500(serve_nodes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    h = await serve_nodes({})

    async def lookup(nodes: Any) -> Any:
        raise RuntimeError("the cache broke")

    monkeypatch.setattr(h.extender.cache, "lookup", lookup)
    for verb in ("filter", "prioritize"):
        response = await h.client.post(f"/gpu/{verb}", json=filter_request())
        assert response.status == 500
        assert response.content_type == "application/json"
        reply = await response.json()
        assert reply == {"error": "internal error (RuntimeError): the extender's log has the details"}
    metrics = (await (await h.client.get("/metrics")).read()).decode()
    assert 'gpuagent_extender_requests_total{outcome="error",verb="filter"} 1.0' in metrics


@pytest.mark.parametrize("name", HOSTILE_NAMES[:5])
async def test_hostile_names_reach_failed_nodes_escaped(serve_nodes: Any, name: str) -> None:
    held = node_hints(NODES[0], (replace(gpu(0), sharing_mode="time_sliced", tenants=(
        TenantHint(name=name, kind="pod", share_ratio=0.5, memory_limit_bytes=None, memory_used_bytes=0,
                   sm_util_ratio=None),)),))
    h = await serve_nodes({NODES[0]: held})
    body = filter_request()  # an exclusive GPU: the reason names the tenants
    body["NodeNames"] = [NODES[0]]
    status, reply = await h.post("filter", body)
    assert status == 200
    reason = reply["FailedNodes"][NODES[0]]
    assert "not free for exclusive use: 1 tenant(s)" in reason
    assert not has_unsafe(reason), reason


def test_a_bad_pod_value_is_escaped_in_the_reason_every_node_gets() -> None:
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-\x1b[2J": "1",
                                                              "nvidia.com/gpu": "1"}}}]}}
    with pytest.raises(PodRequestError) as caught:
        pod_fit_request(pod)
    assert has_unsafe(f"{caught.value.field}: {caught.value.message}")  # the pod's own name, raw
    reason = extender_verdict.shown_reason(f"{caught.value.field}: {caught.value.message}")
    assert not has_unsafe(reason) and "\\x1b[2J" in reason
