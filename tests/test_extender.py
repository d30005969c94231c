"""The kube-scheduler extender against virtual agents served in-process: protocol, verdicts, cache, metrics.

The virtual agents are one aiohttp app answering ``/n/<node>/v1/hints`` with an ETag and 304s, as an
agent's ``/v1/hints`` does; the extender reaches them through a URL template. The real-process test with
three ``gpuagent run`` agents is ``test_extender_agents.py``.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from fixture_files import filter_request, kubernetes_body
from test_tls import issue

from gpuagent.api.tls import load_web_config, server_ssl_context
from gpuagent.hints.agents import AgentCache, AgentDirectory, AgentTLS
from gpuagent.hints.codec import hints_to_jsonable
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_app, build_registry
from gpuagent.hints.extender_protocol import ArgsError, extender_score, parse_args
from gpuagent.hints.extender_serve import serve
from gpuagent.snapshot.hints import GpuHints, NodeHints, TenantHint

GiB = 2**30
NODES = ("gpu-a100-node-1", "gpu-a100-node-2", "gpu-h100-node-3")
KNOWN = frozenset((*NODES, "gpu-empty-node-4"))  # the cluster's node list, as the extender knows it


# --- hints builders -----------------------------------------------------------------------------------------


def gpu(index: int, *, tenants: int = 0, exclusive: bool = False, free_gib: int = 80, share: float = 1.0,
        health: str = "ok") -> GpuHints:
    held = tuple(
        TenantHint(name=f"ml/pod-{index}-{t}", kind="pod", share_ratio=None if exclusive else 0.25,
                   memory_limit_bytes=None, memory_used_bytes=4 * GiB, sm_util_ratio=0.3, allocated=True)
        for t in range(tenants)
    )
    mode = "none" if not tenants else "exclusive" if exclusive else "time_sliced"
    return GpuHints(
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", index=index, model="NVIDIA A100-SXM4-80GB",
        health=health, pci_bus_id=f"00000000:{index + 16:02X}:00.0", numa_node=0, memory_total_bytes=80 * GiB,
        memory_used_bytes=(80 - free_gib) * GiB, memory_allocated_bytes=0, memory_free_bytes=free_gib * GiB,
        sm_util_ratio=0.3 if tenants else 0.0, sm_util_short_ratio=0.3 if tenants else 0.0,
        sm_util_long_ratio=0.3 if tenants else 0.0, schedulable_share_ratio=0.0 if exclusive else share,
        sharing_mode=mode, tenants=held,
    )


def node_hints(name: str, gpus: tuple[GpuHints, ...], taken_at: float = 1.0e9) -> NodeHints:
    return NodeHints(
        hostname=name, taken_at_unix=taken_at, gpus=gpus, gpu_count=len(gpus),
        healthy_gpu_count=sum(g.health == "ok" for g in gpus),
        free_gpu_count=sum(not g.tenants for g in gpus),
        memory_total_bytes=sum(g.memory_total_bytes or 0 for g in gpus),
        memory_free_bytes=sum(g.memory_free_bytes for g in gpus),
        schedulable_share_gpus=sum(g.schedulable_share_ratio for g in gpus),
    )


def one_free_of_four(name: str) -> NodeHints:
    """Three GPUs held exclusively, one free: binpack likes it."""
    held = (gpu(i, tenants=1, exclusive=True, free_gib=10) for i in range(3))
    return node_hints(name, (*held, gpu(3)))


def all_free(name: str) -> NodeHints:
    return node_hints(name, tuple(gpu(i) for i in range(4)))


def all_held(name: str) -> NodeHints:
    return node_hints(name, tuple(gpu(i, tenants=1, exclusive=True, free_gib=10) for i in range(4)))


# --- virtual agents -----------------------------------------------------------------------------------------


@dataclass
class VirtualAgents:
    """Many agents' ``/v1/hints`` on one server: ``/n/<node>/v1/hints``, ETag and 304 like the agent."""

    hints: dict[str, NodeHints] = field(default_factory=dict)
    requests: list[tuple[str, int]] = field(default_factory=list)  # (node, status answered)
    delay_seconds: dict[str, float] = field(default_factory=dict)
    failing: dict[str, int] = field(default_factory=dict)  # node -> HTTP status to answer instead
    base_url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        node = request.match_info["node"]
        if node in self.delay_seconds:
            await asyncio.sleep(self.delay_seconds[node])
        if node in self.failing:
            self.requests.append((node, self.failing[node]))
            return web.json_response({"error": "failing on purpose"}, status=self.failing[node])
        hints = self.hints.get(node)
        if hints is None:
            self.requests.append((node, 404))
            return web.json_response({"error": "no such node"}, status=404)
        body = json.dumps(hints_to_jsonable(hints), separators=(",", ":")).encode()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        if request.headers.get("If-None-Match") == etag:
            self.requests.append((node, 304))
            return web.Response(status=304, headers={"ETag": etag})
        self.requests.append((node, 200))
        return web.Response(body=body, content_type="application/json", headers={"ETag": etag})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/n/{node}/v1/hints", self.handle)
        return app


@pytest.fixture
async def agents() -> AsyncIterator[VirtualAgents]:
    virtual = VirtualAgents()
    server = TestServer(virtual.app(), host="127.0.0.1")
    await server.start_server()
    virtual.base_url = str(server.make_url("")).rstrip("/")
    try:
        yield virtual
    finally:
        await server.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    agents: VirtualAgents
    extender: Extender
    client: TestClient
    clock: FakeClock

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        response = await self.client.post(f"/gpu/{verb}", json=body)
        return response.status, await response.json()


@pytest.fixture
async def harness(agents: VirtualAgents) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[AgentCache, TestClient]] = []

    async def make(urls: dict[str, str] | None = None, max_age: float = 30.0, timeout: float = 1.0) -> Harness:
        clock = FakeClock()
        directory = AgentDirectory(template=agents.base_url + "/n/{node}", urls=urls or {})
        cache = AgentCache(directory, timeout_seconds=timeout, refresh_interval_seconds=5.0, clock=clock,
                           known=KNOWN)
        extender = Extender(cache, max_age_seconds=max_age, monotonic=clock)
        registry = build_registry(extender)
        await cache.start()
        client = TestClient(TestServer(build_app(extender, registry, prefix="/gpu"), host="127.0.0.1"))
        await client.start_server()
        made.append((cache, client))
        return Harness(agents, extender, client, clock)

    yield make
    for cache, client in made:
        await client.close()
        await cache.close()


def fixture_nodes(agents: VirtualAgents) -> None:
    """node-1: one free GPU of four; node-2: all four held exclusively; node-3: no agent answering."""
    agents.hints[NODES[0]] = one_free_of_four(NODES[0])
    agents.hints[NODES[1]] = all_held(NODES[1])


DEAD = "http://127.0.0.1:9"  # discard port: nothing listens there


# --- the protocol -------------------------------------------------------------------------------------------


async def test_filter_answers_the_fixture_request_in_its_own_form(harness: Any) -> None:
    h = await harness(urls={NODES[2]: DEAD})
    fixture_nodes(h.agents)
    status, reply = await h.post("filter", filter_request())
    assert status == 200
    # Every key of ExtenderFilterResult, PascalCase, in the fixture response's shape.
    assert set(reply) == set(kubernetes_body("extender-filter-response.json"))
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == [NODES[0]]
    assert reply["Error"] == ""
    assert list(reply["FailedNodes"]) == [NODES[1]]
    assert reply["FailedNodes"][NODES[1]].startswith("gpuagent: needs 1 GPUs, 0 can take it; GPU 0: ")
    assert "held exclusively" in reply["FailedNodes"][NODES[1]] or "tenant" in reply["FailedNodes"][NODES[1]]
    assert list(reply["FailedAndUnresolvableNodes"]) == [NODES[2]]
    assert "unreachable" in reply["FailedAndUnresolvableNodes"][NODES[2]]
    assert "cannot connect" in reply["FailedAndUnresolvableNodes"][NODES[2]]


async def test_prioritize_scores_fitting_nodes_0_to_10(harness: Any) -> None:
    h = await harness(urls={NODES[2]: DEAD})
    fixture_nodes(h.agents)
    h.agents.hints["gpu-empty-node-4"] = all_free("gpu-empty-node-4")
    body = filter_request()
    body["NodeNames"] = [*NODES, "gpu-empty-node-4"]
    status, reply = await h.post("prioritize", body)
    assert status == 200
    assert isinstance(reply, list)
    assert [set(item) for item in reply] == [set(kubernetes_body("extender-prioritize-response.json")[0])] * 4
    scores = {item["Host"]: item["Score"] for item in reply}
    assert [item["Host"] for item in reply] == body["NodeNames"]
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores[NODES[1]] == scores[NODES[2]] == 0  # does not fit / unreachable
    # binpack: the node with three GPUs taken scores above the empty one
    assert scores[NODES[0]] > scores["gpu-empty-node-4"] > 0
    # spread prefers the empty node
    body["Pod"]["metadata"]["annotations"]["gpuagent.io/placement"] = "spread"
    _, reply = await h.post("prioritize", body)
    spread = {item["Host"]: item["Score"] for item in reply}
    assert spread["gpu-empty-node-4"] > spread[NODES[0]]


async def test_node_list_form_is_answered_with_the_same_node_objects(harness: Any) -> None:
    # nodeCacheCapable: false sends full Node objects in Nodes and NodeNames null.
    h = await harness(urls={NODES[2]: DEAD})
    fixture_nodes(h.agents)
    body = filter_request()
    items = [{"metadata": {"name": n, "labels": {"nvidia.com/gpu.present": "true"}},
              "status": {"allocatable": {"nvidia.com/gpu": "4"}}} for n in NODES]
    body["Nodes"] = {"metadata": {"resourceVersion": "7"}, "items": items}
    body["NodeNames"] = None
    status, reply = await h.post("filter", body)
    assert status == 200
    assert reply["NodeNames"] is None
    assert reply["Nodes"] == {"metadata": {"resourceVersion": "7"}, "items": [items[0]]}
    assert set(reply["FailedNodes"]) == {NODES[1]}
    assert set(reply["FailedAndUnresolvableNodes"]) == {NODES[2]}
    _, scores = await h.post("prioritize", body)
    assert [s["Host"] for s in scores] == list(NODES)


async def test_no_candidates_never_answers_both_null(harness: Any) -> None:
    h = await harness()
    body = filter_request()
    body["NodeNames"] = None
    status, reply = await h.post("filter", body)
    assert status == 200
    assert reply["NodeNames"] == [] and reply["Nodes"] is None
    body["NodeNames"] = []
    assert (await h.post("filter", body))[1]["NodeNames"] == []
    assert (await h.post("prioritize", body))[1] == []


async def test_a_pod_without_gpus_passes_everywhere_without_asking_agents(harness: Any) -> None:
    h = await harness()
    body = filter_request()
    body["Pod"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    body["Pod"]["metadata"]["annotations"] = {"gpuagent.io/gpu-share": "bogus"}  # not read: no GPU asked
    status, reply = await h.post("filter", body)
    assert status == 200
    assert reply["NodeNames"] == list(NODES)
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}
    _, scores = await h.post("prioritize", body)
    assert scores == [{"Host": n, "Score": 0} for n in NODES]
    assert h.agents.requests == []
    assert len(h.extender.cache) == 0


async def test_a_bad_annotation_filters_the_pod_from_every_node_naming_it(harness: Any) -> None:
    h = await harness()
    fixture_nodes(h.agents)
    body = filter_request()
    body["Pod"]["metadata"]["annotations"]["gpuagent.io/gpu-memory"] = "8GB"
    status, reply = await h.post("filter", body)
    assert status == 200
    assert reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == set(NODES)
    reason = reply["FailedAndUnresolvableNodes"][NODES[0]]
    assert 'Pod.metadata.annotations["gpuagent.io/gpu-memory"]' in reason
    assert "did you mean 8G or 8Gi?" in reason
    _, scores = await h.post("prioritize", body)
    assert {s["Score"] for s in scores} == {0}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"NodeNames": ["a"]}, "Pod"),
        ({"Pod": None, "NodeNames": ["a"]}, "Pod"),
        ({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "NodeNames": "a"}, "NodeNames"),
        ({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "NodeNames": ["a", 3]}, "NodeNames[1]"),
        ({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "Nodes": []}, "Nodes"),
        ({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "Nodes": {"items": {}}}, "Nodes.items"),
        ({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "Nodes": {"items": [{"metadata": {}}]}},
         "Nodes.items[0].metadata.name"),
        ({"Pod": {"metadata": {}}, "NodeNames": ["a"]}, "Pod.spec"),
        ({"Pod": {"spec": {"containers": None}}, "NodeNames": ["a"]}, "Pod.spec.containers"),
    ],
)
async def test_malformed_extender_args_are_a_400_naming_the_field(harness: Any, body: Any, field: str) -> None:
    h = await harness()
    for verb in ("filter", "prioritize"):
        status, reply = await h.post(verb, body)
        assert status == 400, reply
        assert reply["field"] == field
        assert reply["error"]


async def test_not_json_and_unknown_routes_are_json_errors(harness: Any) -> None:
    h = await harness()
    response = await h.client.post("/gpu/filter", data=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status == 400
    assert (await response.json())["field"] == "body"
    response = await h.client.post("/gpu/bind", json={})
    assert response.status == 404
    assert "error" in await response.json()
    response = await h.client.get("/gpu/filter")
    assert response.status == 405


async def test_keys_match_case_insensitively_as_gos_decoder_does() -> None:
    args = parse_args({"pod": {"spec": {}}, "nodenames": ["a", "b"], "NODES": None})
    assert args.node_names == ("a", "b") and args.names_sent
    with pytest.raises(ArgsError):
        parse_args({"pod": 1})


@pytest.mark.parametrize(("score", "priority"), [(0, 0), (4, 0), (5, 1), (14, 1), (15, 2), (95, 10), (100, 10),
                                                  (130, 10), (-3, 0)])
def test_extender_score_scales_0_100_to_0_10(score: int, priority: int) -> None:
    assert extender_score(score) == priority


# --- the cache ----------------------------------------------------------------------------------------------


async def test_refresh_uses_conditional_gets_and_keeps_unchanged_hints(harness: Any) -> None:
    h = await harness()
    fixture_nodes(h.agents)
    await h.post("filter", filter_request())  # node-1, node-2 fetched on demand (200); node-3 404
    first = h.extender.cache.get(NODES[0])
    assert first is not None and first.etag
    h.agents.requests.clear()
    await h.extender.cache.refresh_all()
    assert sorted(h.agents.requests) == [(NODES[0], 304), (NODES[1], 304), (NODES[2], 404)]
    assert h.extender.cache.get(NODES[0]).hints is first.hints  # type: ignore[union-attr]
    # A change on node-2 (a GPU freed) arrives as a 200 with a new ETag, and node-2 now fits.
    h.agents.hints[NODES[1]] = one_free_of_four(NODES[1])
    h.agents.requests.clear()
    await h.extender.cache.refresh_all()
    assert (NODES[1], 200) in h.agents.requests
    _, reply = await h.post("filter", filter_request())
    assert reply["NodeNames"] == [NODES[0], NODES[1]]
    text = await (await h.client.get("/metrics")).text()
    assert 'gpuagent_extender_agent_fetches_total{result="not_modified"} 3.0' in text
    assert 'gpuagent_extender_agents{state="fresh"} 2.0' in text
    assert 'gpuagent_extender_agents{state="unreachable"} 1.0' in text
    assert 'gpuagent_extender_requests_total{outcome="ok",verb="filter"} 2.0' in text
    assert "gpuagent_extender_request_duration_seconds_bucket" in text


async def test_an_agent_that_stops_answering_is_filtered_after_the_staleness_bound(harness: Any) -> None:
    h = await harness(max_age=30.0)
    fixture_nodes(h.agents)
    _, reply = await h.post("filter", filter_request())
    assert reply["NodeNames"] == [NODES[0]]
    h.agents.failing[NODES[0]] = 503
    h.clock.now += 10
    await h.extender.cache.refresh_all()
    _, reply = await h.post("filter", filter_request())
    assert reply["NodeNames"] == [NODES[0]], "within the bound its last hints still count"
    h.clock.now += 25  # 35 s since it last answered
    _, reply = await h.post("filter", filter_request())
    assert reply["NodeNames"] == []
    reason = reply["FailedAndUnresolvableNodes"][NODES[0]]
    assert reason == ("gpuagent: node agent unreachable (HTTP 503 from /v1/hints); its last hints are older "
                      "than the 30s staleness bound")
    # It answers again: fresh at the next refresh.
    del h.agents.failing[NODES[0]]
    await h.extender.cache.refresh_all()
    _, reply = await h.post("filter", filter_request())
    assert reply["NodeNames"] == [NODES[0]]


async def test_hints_not_refreshed_in_time_are_stale(harness: Any) -> None:
    h = await harness(max_age=30.0)
    fixture_nodes(h.agents)
    await h.post("filter", filter_request())
    h.clock.now += 31  # no refresh ran (the refresher is not started here)
    _, reply = await h.post("filter", filter_request())
    assert reply["FailedAndUnresolvableNodes"][NODES[0]] == (
        "gpuagent: node agent's hints are older than the 30s staleness bound")


async def test_new_nodes_are_fetched_within_one_deadline_then_cached(harness: Any) -> None:
    h = await harness(timeout=0.3)
    fixture_nodes(h.agents)
    h.agents.delay_seconds[NODES[1]] = 2.0  # far slower than the deadline
    started = asyncio.get_running_loop().time()
    _, reply = await h.post("filter", filter_request())
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed < 1.8, elapsed  # answered at the deadline, without waiting for the slow node
    assert reply["NodeNames"] == [NODES[0]]
    assert "first fetch is still running after 0.3s" in reply["FailedAndUnresolvableNodes"][NODES[1]]
    # The slow node's fetch was given up by the client's own timeout; it is cached as failing and
    # refreshed like the rest: once it answers quickly, it is judged.
    del h.agents.delay_seconds[NODES[1]]
    for _ in range(20):  # a refresh can still miss the 0.3 s timeout on a loaded machine: the next one is due
        await h.extender.cache.refresh_all()
        _, reply = await h.post("filter", filter_request())
        if NODES[1] in reply["FailedNodes"]:
            break
    assert NODES[1] in reply["FailedNodes"]  # reached now: all its GPUs are held


async def test_concurrent_calls_share_one_fetch_per_new_node(harness: Any) -> None:
    h = await harness()
    fixture_nodes(h.agents)
    h.agents.delay_seconds[NODES[0]] = 0.1
    await asyncio.gather(*(h.post("filter", filter_request()) for _ in range(5)))
    assert [r for r in h.agents.requests if r[0] == NODES[0]] == [(NODES[0], 200)]


async def test_nodes_nobody_asks_about_are_forgotten(harness: Any) -> None:
    h = await harness()
    fixture_nodes(h.agents)
    await h.post("filter", filter_request())
    assert len(h.extender.cache) == 3
    h.extender.cache.forget_after_seconds = 60
    h.clock.now += 61
    await h.extender.cache.refresh_all()
    assert len(h.extender.cache) == 0


async def test_bad_hints_bodies_mark_the_agent_unreachable_with_the_field(harness: Any, agents: VirtualAgents) -> None:
    h = await harness()
    broken = copy.deepcopy(hints_to_jsonable(all_free("x")))
    broken["gpus"][1]["memory_free_bytes"] = "lots"

    async def bad(request: web.Request) -> web.Response:
        return web.json_response(broken)

    app = web.Application()
    app.router.add_get("/v1/hints", bad)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        h.extender.cache.directory = AgentDirectory(template=None, urls={"bad-node": str(server.make_url("")).rstrip("/")})
        body = filter_request()
        body["NodeNames"] = ["bad-node"]
        _, reply = await h.post("filter", body)
        assert "gpus[1].memory_free_bytes: expected an integer" in reply["FailedAndUnresolvableNodes"]["bad-node"]
    finally:
        await server.close()


async def test_healthz_reports_the_agents(harness: Any) -> None:
    h = await harness(urls={NODES[2]: DEAD})
    fixture_nodes(h.agents)
    await h.post("filter", filter_request())
    response = await h.client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok", "agents": {"fresh": 2, "stale": 0, "unreachable": 1}}


async def test_agent_tls_with_client_certificates(tmp_path: Path) -> None:
    """HTTPS to an agent whose listener (the agent's own web-config TLS) requires a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    ca = issue(tmp_path, "ca")
    server, client = issue(tmp_path, "server", ca, server=True), issue(tmp_path, "client", ca)
    web_config = tmp_path / "web.yml"
    web_config.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": str(server.cert), "key_file": str(server.key), "client_ca_file": str(ca.cert),
        "client_auth_type": "RequireAndVerifyClientCert"}}))
    virtual = VirtualAgents(hints={"n1": all_free("n1")})
    runner = web.AppRunner(virtual.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(load_web_config(str(web_config))))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        for tls, ok in ((AgentTLS(str(ca.cert), str(client.cert), str(client.key)), True),
                        (AgentTLS(str(ca.cert)), False)):  # no client certificate: refused
            cache = AgentCache(AgentDirectory(template=f"https://127.0.0.1:{port}/n/{{node}}"),
                               ssl_context=tls.context(), known={"n1"})
            await cache.start()
            try:
                entry = (await cache.lookup(["n1"]))["n1"]
            finally:
                await cache.close()
            assert (entry.hints is not None) is ok, entry.error
    finally:
        await runner.cleanup()


async def test_plain_client_session_sees_prefix_routes_only(harness: Any) -> None:
    h = await harness()
    url = str(h.client.make_url("/filter"))
    async with ClientSession() as session, session.post(url, json=filter_request()) as response:
        assert response.status == 404  # the routes are under the configured prefix


async def test_serve_over_tls_until_stopped(tmp_path: Path, agents: VirtualAgents) -> None:
    """``serve``: the extender's own listener with the agent's web-config TLS; stops on its event."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    ca = issue(tmp_path, "ca")
    server = issue(tmp_path, "server", ca, server=True)
    web_config = tmp_path / "web.yml"
    web_config.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(server.cert),
                                                                 "key_file": str(server.key)}}))
    fixture_nodes(agents)
    cache = AgentCache(AgentDirectory(template=agents.base_url + "/n/{node}"), refresh_interval_seconds=0.2,
                       known=KNOWN)
    extender = Extender(cache)
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve(
        extender, host="127.0.0.1", port=0, prefix="/gpuagent", stop=stop,
        ssl_context=server_ssl_context(load_web_config(str(web_config))), started=bound.set_result,
    ))
    try:
        port = await asyncio.wait_for(bound, 10)
        client_context = ssl.create_default_context(cafile=str(ca.cert))
        async with ClientSession() as session:
            async with session.post(f"https://127.0.0.1:{port}/gpuagent/filter", json=filter_request(),
                                    ssl=client_context) as response:
                assert response.status == 200
                assert (await response.json())["NodeNames"] == [NODES[0]]
            await asyncio.sleep(0.5)  # the refresher runs: conditional GETs answered 304
            assert (NODES[0], 304) in agents.requests
            async with session.get(f"https://127.0.0.1:{port}/metrics", ssl=client_context) as response:
                text = await response.text()
                assert "gpuagent_extender_agent_fetches_total" in text
                assert "gpuagent_http_connections_open " in text  # the listener's guard counts too
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)
    assert serving.result() is None
