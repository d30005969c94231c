"""The cluster view: agents publish GPUNodeStates, the extender reads them with one list and watch.

Against the fake API server (list, watch with resourceVersions, server-side apply): what is published and
when (projection, hysteresis, rate limit, heartbeat), that a cold extender judges every node on its first
call, that changes arrive through the watch, that a stale generation or heartbeat is handled by the
documented rule, and that a restarted extender loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fake_apiserver import FakeApiServer, eventually
from fixture_files import PUBLISHED, filter_request
from test_extender import all_free, all_held, gpu, node_hints
from test_hostile_objects import nullable_to_jsonschema

from gpuagent.export.exposition import generate_text
from gpuagent.hints.cluster_view import UNKNOWN_REASON, ClusterView
from gpuagent.hints.codec import hints_from_jsonable
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_config import load_options
from gpuagent.hints.extender_serve import from_options
from gpuagent.hints.published import (
    Generation,
    decode_state,
    project,
    same_state,
    state_object,
)
from gpuagent.hints.publisher import PublishPolicy, StatePublisher
from gpuagent.hints.verdict_key import verdict_key
from gpuagent.kubeapi import ApiConnection
from gpuagent.snapshot.hints import GpuHints, NodeHints

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "deploy" / "gpunodestate-crd.yaml"
GiB = 2**30
MiB = 2**20


def moved(hints: NodeHints, **changes: Any) -> NodeHints:
    """``hints`` with GPU 0's fields changed."""
    first = dataclasses.replace(hints.gpus[0], **changes)
    return dataclasses.replace(hints, gpus=(first, *hints.gpus[1:]))


# --- what is published ----------------------------------------------------------------------------------------


def test_moving_figures_are_held_until_they_move_a_whole_step() -> None:
    published = project(all_free("n1"), None)
    small = moved(all_free("n1"), memory_free_bytes=80 * GiB - 100 * MiB, schedulable_share_ratio=0.97)
    assert same_state(project(small, published), published)
    big = moved(all_free("n1"), memory_free_bytes=79 * GiB)
    changed = project(big, published)
    assert not same_state(changed, published)
    assert changed.gpus[0].memory_free_bytes == 79 * GiB
    assert changed.memory_free_bytes == sum(g.memory_free_bytes for g in changed.gpus)
    share = project(moved(all_free("n1"), schedulable_share_ratio=0.94), published)
    assert share.gpus[0].schedulable_share_ratio == pytest.approx(0.94)
    assert share.schedulable_share_gpus == pytest.approx(3.94)


def test_what_decides_a_fit_always_changes_the_state() -> None:
    published = project(all_free("n1"), None)
    for change in ({"health": "lost"}, {"stale": True}, {"sharing_mode": "exclusive"}, {"mig_enabled": True}):
        assert not same_state(project(moved(all_free("n1"), **change), published), published), change
    assert not same_state(project(all_held("n1"), published), published)


def test_what_the_extender_never_reads_is_left_out() -> None:
    hints = dataclasses.replace(all_free("n1"), taken_at_unix=5.0)
    published = project(hints, None)
    assert published.network is None
    assert {(g.sm_util_ratio, g.sm_util_short_ratio, g.sm_util_long_ratio) for g in published.gpus} == \
        {(None, None, None)}
    assert all(t.sm_util_ratio is None for g in project(all_held("n1"), None).gpus for t in g.tenants)
    busy = moved(hints, sm_util_ratio=0.9, sm_util_short_ratio=0.1, sm_util_long_ratio=0.5)
    assert same_state(project(busy, published), published)
    assert same_state(project(dataclasses.replace(hints, taken_at_unix=99.0), published), published)


def test_the_object_round_trips_and_bad_objects_name_the_problem() -> None:
    hints = project(all_free("n1"), None)
    body = state_object("n1", hints, Generation(7, 3), 1_800_000_000.25)
    state = decode_state(json.dumps(body).encode())
    assert (state.node, state.generation, state.hints) == ("n1", Generation(7, 3), hints)
    assert state.heartbeat_unix == pytest.approx(1_800_000_000.25)
    wrong = json.loads(json.dumps(body))
    wrong["hints"]["gpus"][1]["memory_free_bytes"] = "lots"
    with pytest.raises(ValueError, match=r"gpus\[1\]\.memory_free_bytes"):
        decode_state(json.dumps(wrong).encode())
    with pytest.raises(ValueError, match="no hints"):
        decode_state(json.dumps({**body, "hints": None}).encode())
    with pytest.raises(ValueError, match="not RFC 3339"):
        decode_state(json.dumps({**body, "heartbeatTime": "yesterday"}).encode())
    with pytest.raises(ValueError, match="bad GPUNodeState"):
        decode_state(b"{not json")


@pytest.mark.parametrize("name", ["h100-8x-64proc", "a100-mig"])
def test_an_object_an_earlier_agent_wrote_still_decodes(name: str) -> None:
    """Agents and extenders of two versions coexist during an upgrade: the stored objects (as the API server
    lists them, managed fields and all) were written by the agent of the previous version."""
    raw = (PUBLISHED / f"gpunodestate-{name}.json").read_bytes()
    stored = json.loads(raw)
    state = decode_state(raw)
    assert (state.node, state.resource_version) == (name, "187342")
    assert state.generation == Generation(1795000000123456789, 42)
    assert state.heartbeat_unix == pytest.approx(1795000300.5)
    assert state.hints == hints_from_jsonable(stored["hints"])  # as the agents' own codec reads them
    assert state.key == verdict_key(state.hints)
    # and today's agent still writes that format: the same object from the same hints
    written = state_object(name, state.hints, state.generation, state.heartbeat_unix)
    assert {k: v for k, v in stored.items() if k != "metadata"} == \
        {k: v for k, v in written.items() if k != "metadata"}


def test_the_object_is_valid_under_the_shipped_crd() -> None:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["plural"] == "gpunodestates" and crd["spec"]["scope"] == "Cluster"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    body = state_object("n1", project(all_held("n1"), None), Generation(1, 1), time.time())
    schema = nullable_to_jsonschema(schema)  # OpenAPI's nullable, as JSON Schema says it
    jsonschema.validate(body, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "agent": {"epoch": "x", "sequence": 1}}, schema)


# --- when it is published --------------------------------------------------------------------------------------


def test_the_policy_writes_first_on_change_coalesced_and_on_heartbeat() -> None:
    policy = PublishPolicy(min_interval=10.0, heartbeat=300.0)
    first = policy.decide(all_free("n1"), 0.0)
    assert first is not None and first.why == "first"
    policy.tried(0.0)
    policy.written(first, 0.0)
    assert policy.decide(all_free("n1"), 5.0) is None  # unchanged
    assert policy.decide(all_held("n1"), 5.0) is None  # changed, but within min_interval of the last try
    due = policy.decide(all_held("n1"), 10.0)
    assert due is not None and due.why == "changed" and same_state(due.hints, project(all_held("n1"), None))
    policy.tried(10.0)
    policy.written(due, 10.0)
    assert policy.decide(all_held("n1"), 309.0) is None
    heartbeat = policy.decide(all_held("n1"), 310.0)
    assert heartbeat is not None and heartbeat.why == "heartbeat"


def test_a_failed_write_is_tried_again_after_min_interval() -> None:
    policy = PublishPolicy(min_interval=10.0, heartbeat=300.0)
    assert policy.decide(all_free("n1"), 0.0) is not None
    policy.tried(0.0)  # and it failed: nothing written
    assert policy.decide(all_free("n1"), 9.0) is None
    again = policy.decide(all_free("n1"), 10.0)
    assert again is not None and again.why == "first"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_publisher_applies_the_object_and_the_server_keeps_it(api: FakeApiServer) -> None:
    clock = Clock()
    publisher = StatePublisher("n1", ApiConnection(config=api.kubeconfig()), min_interval=10.0,
                               heartbeat=300.0, monotonic=clock, wall_clock=time.time)
    try:
        publisher.offer(all_free("n1"))
        assert await publisher.publish_once() == "written"
        write = api.state_writes[-1]
        assert write.method == "PATCH" and write.query["fieldManager"] == "gpuagent"
        stored = api.states["state-n1"]
        assert stored["agent"]["sequence"] == 1
        assert decode_state(json.dumps(stored).encode()).hints == project(all_free("n1"), None)
        clock.now += 30
        assert await publisher.publish_once() is None  # unchanged: nothing written
        publisher.offer(all_held("n1"))
        assert await publisher.publish_once() == "written"
        assert api.states["state-n1"]["agent"]["sequence"] == 2
        assert len(api.state_writes) == 2
        api.fail_next(403)
        clock.now += 30
        publisher.offer(all_free("n1"))
        assert await publisher.publish_once() == "failed"
        assert publisher.outcomes == {"written": 2, "failed": 1}
    finally:
        await publisher.close()


async def test_an_api_server_that_is_down_costs_a_count_not_the_poll() -> None:
    async with FakeApiServer() as gone:
        config = gone.kubeconfig()
    publisher = StatePublisher("n1", ApiConnection(config=config, request_timeout=0.5), min_interval=1.0,
                               heartbeat=300.0)
    try:
        publisher.offer(all_free("n1"))
        assert await publisher.publish_once() == "unreachable"
    finally:
        await publisher.close()


async def test_nothing_is_published_before_a_poll_has_seen_a_gpu(api: FakeApiServer, tmp_path: Path) -> None:
    """Was: while NVML was still loading (the faults scenario's first 5 s) the agent published a state of 0
    GPUs, and for about 10 s the node was a plain 'does not fit', which invites preemption there; with no
    state the extender says unresolvable. The faults scenario's own agent, its clock stepped past the load."""
    from simclock import FakeClock
    from test_agent_sim import FAULTS, make_agent

    clock = FakeClock(start=0.0)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    agent, _ = make_agent(FAULTS, clock, pod_resources_socket=None, kubernetes_api="off", idle_events="off",
                          publish_state="on", kubeconfig=str(kubeconfig), hostname="gpu-faulty-03")
    try:
        publisher = agent.publisher
        assert publisher is not None
        snapshot = await agent.poll_once()
        assert not snapshot.sources[0].ok and snapshot.hints is not None and snapshot.hints.gpu_count == 0
        assert await publisher.publish_once() is None and api.state_writes == []
        clock.t = 6.0  # the driver has loaded
        snapshot = await agent.poll_once()
        assert snapshot.sources[0].ok and snapshot.hints is not None and snapshot.hints.gpu_count == 4
        assert await publisher.publish_once() == "written"
        assert len(api.states["state-gpu-faulty-03"]["hints"]["gpus"]) == 4
    finally:
        await agent.aclose()


async def test_a_gpu_lost_after_the_first_poll_is_still_published(api: FakeApiServer) -> None:
    clock = Clock()
    publisher = StatePublisher("n1", ApiConnection(config=api.kubeconfig()), min_interval=1.0,
                               heartbeat=300.0, monotonic=clock)
    try:
        publisher.offer(dataclasses.replace(all_free("n1"), gpus=(), gpu_count=0))
        assert await publisher.publish_once() is None
        publisher.offer(all_free("n1"))
        assert await publisher.publish_once() == "written"
        clock.now += 10
        publisher.offer(dataclasses.replace(all_free("n1"), gpus=(), gpu_count=0))  # once seen: offered
        assert await publisher.publish_once() == "written"
        assert api.states["state-n1"]["hints"]["gpus"] == []
    finally:
        await publisher.close()


# --- the extender's side ----------------------------------------------------------------------------------------


def publish(api: FakeApiServer, node: str, hints: NodeHints, *, epoch: int = 1, sequence: int = 1,
            heartbeat: float | None = None) -> None:
    api.put_state(state_object(node, project(hints, None), Generation(epoch, sequence),
                               time.time() if heartbeat is None else heartbeat))


@pytest.fixture
async def view(api: FakeApiServer) -> AsyncIterator[ClusterView]:
    made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=5.0)
    stop = asyncio.Event()
    task = asyncio.create_task(made.run(stop))
    yield made
    stop.set()
    await task
    await made.close()


def gpu_pod_filter(nodes: list[str]) -> dict[str, Any]:
    body = filter_request()
    body["NodeNames"] = nodes
    return body


async def test_a_cold_extender_judges_every_node_on_its_first_call(api: FakeApiServer,
                                                                   view: ClusterView) -> None:
    nodes = [f"node-{i}" for i in range(200)]
    for i, node in enumerate(nodes):
        publish(api, node, all_free(node) if i % 2 else all_held(node))
    extender = Extender(view, max_age_seconds=900.0)
    reply = await extender.filter(gpu_pod_filter([*nodes, "node-without-agent"]))
    assert len(api.lists) == 1
    passing = set(reply["NodeNames"])
    assert passing == {n for i, n in enumerate(nodes) if i % 2}
    assert set(reply["FailedNodes"]) == {n for i, n in enumerate(nodes) if not i % 2}
    assert reply["FailedAndUnresolvableNodes"] == {"node-without-agent": "gpuagent: " + UNKNOWN_REASON}


async def test_changes_arrive_through_the_watch(api: FakeApiServer, view: ClusterView) -> None:
    publish(api, "n1", all_held("n1"))
    extender = Extender(view, max_age_seconds=900.0)
    assert (await extender.filter(gpu_pod_filter(["n1"])))["NodeNames"] == []
    publish(api, "n1", all_free("n1"), sequence=2)
    await eventually(lambda: view.get("n1") is not None and view.get("n1").hints.free_gpu_count == 4, 5.0)
    assert (await extender.filter(gpu_pod_filter(["n1"])))["NodeNames"] == ["n1"]
    api.delete_state("n1")
    await eventually(lambda: view.get("n1") is None, 5.0)
    assert len(api.lists) == 1  # one list, then only the watch


async def test_a_stale_generation_is_ignored(api: FakeApiServer, view: ClusterView) -> None:
    now = time.time()
    publish(api, "n1", all_free("n1"), epoch=5, sequence=10, heartbeat=now)
    extender = Extender(view, max_age_seconds=900.0)
    await extender.filter(gpu_pod_filter(["n1"]))
    publish(api, "n1", all_held("n1"), epoch=5, sequence=9, heartbeat=now - 10)  # an old write, landed late
    publish(api, "n1", all_held("n1"), epoch=4, sequence=99, heartbeat=time.time() - 60)  # the old agent
    await eventually(lambda: view.stale_writes == 2, 5.0)
    assert view.get("n1").hints.free_gpu_count == 4
    publish(api, "n1", all_held("n1"), epoch=6, sequence=1)  # a restarted agent
    await eventually(lambda: view.get("n1").hints.free_gpu_count == 0, 5.0)


async def test_a_state_past_its_age_is_filtered_with_the_reason(api: FakeApiServer, view: ClusterView) -> None:
    publish(api, "old", all_free("old"), heartbeat=time.time() - 1000)
    publish(api, "new", all_free("new"))
    extender = Extender(view, max_age_seconds=900.0)
    reply = await extender.filter(gpu_pod_filter(["old", "new"]))
    assert reply["NodeNames"] == ["new"]
    assert "older than the 900s staleness bound" in reply["FailedAndUnresolvableNodes"]["old"]


async def test_an_unreadable_object_makes_its_node_unresolvable_until_its_agent_writes_again(
        api: FakeApiServer, view: ClusterView, caplog: pytest.LogCaptureFixture) -> None:
    """Was: the node kept its last good state, though the API server no longer held it; and a node only ever
    seen unreadable was 'no GPUNodeState published', though one was. Now the reason says what is wrong."""
    publish(api, "n1", all_free("n1"), sequence=1)
    await view.lookup(["n1"])
    bad = state_object("n1", project(all_held("n1"), None), Generation(1, 2), time.time())
    bad["hints"]["gpus"][0]["index"] = "zero"
    api.put_state(bad)
    never_good = state_object("n2", project(all_free("n2"), None), Generation(1, 1), time.time())
    never_good["hints"]["gpus"][1]["schedulable_share_ratio"] = 7.5
    api.put_state(never_good)
    await eventually(lambda: view.bad_objects == 2, 5.0)
    reply = await Extender(view, max_age_seconds=900.0).filter(gpu_pod_filter(["n1", "n2"]))
    assert reply["NodeNames"] == []
    refused = reply["FailedAndUnresolvableNodes"]
    assert "GPUNodeState cannot be read" in refused["n1"] and "gpus[0].index" in refused["n1"]
    assert "gpus[1].schedulable_share_ratio" in refused["n2"] and UNKNOWN_REASON not in refused["n2"]
    assert "'n1'" in caplog.text and "'n2'" in caplog.text  # the log names the node
    publish(api, "n1", all_free("n1"), sequence=3)
    await eventually(lambda: view.get("n1").hints is not None, 5.0)
    assert view.unresolvable().keys() == {"n2"}


async def test_a_restarted_extender_loses_no_decision(api: FakeApiServer) -> None:
    nodes = [f"node-{i}" for i in range(50)]
    for i, node in enumerate(nodes):
        publish(api, node, all_free(node) if i % 3 else all_held(node))
    answers = []
    for _ in range(2):  # the second is a new process's view: one list, the same answers
        made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=5.0)
        stop = asyncio.Event()
        task = asyncio.create_task(made.run(stop))
        answers.append(await Extender(made, max_age_seconds=900.0).filter(gpu_pod_filter(nodes)))
        stop.set()
        await task
        await made.close()
    assert answers[0] == answers[1]
    assert len(answers[0]["NodeNames"]) == len([n for i, n in enumerate(nodes) if i % 3])


async def test_the_options_choose_the_cluster_view_with_api_access(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    on, no_lister = from_options(load_options(None, env={}, overrides={"kubeconfig": str(kubeconfig)}))
    assert isinstance(on.cache, ClusterView) and on.max_age_seconds == 900.0
    assert no_lister is None  # the view knows the nodes that publish: no node list
    off, lister = from_options(load_options(None, env={}, overrides={"kubeconfig": str(kubeconfig),
                                                                    "cluster_view": "off"}))
    assert not isinstance(off.cache, ClusterView) and off.max_age_seconds == 30.0 and lister is not None
    await on.cache.close()
    await on.claims.close()
    await off.claims.close()


async def test_an_agent_publishes_its_node_for_the_extender(api: FakeApiServer, tmp_path: Path) -> None:
    """The whole path: a simulated agent's poll, its publisher, the fake API server, the extender's view."""
    from gpuagent.agent import Agent
    from gpuagent.config import load_config

    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(ROOT / "examples" / "scenarios" / "a100-mig.yaml"),
        "pod_resources_socket": None, "kubernetes_api": "off", "idle_events": "off",
        "publish_state": "on", "kubeconfig": str(kubeconfig), "hostname": "sim-node",
    })
    agent = Agent(config)
    try:
        assert agent.publisher is not None
        snapshot = await agent.poll_once()
        assert await agent.publisher.publish_once() == "written"
        metrics = (await agent.poll_once(), generate_text(agent.registry))[1].decode()
        assert 'gpuagent_state_publish_writes_total{Hostname="sim-node",outcome="written"} 1' in metrics
        assert 'gpuagent_state_publish_writes_total{Hostname="sim-node",outcome="failed"} 0' in metrics
        assert "gpuagent_state_publish_last_write_timestamp_seconds{" in metrics
        assert f'gpuagent_state_publish_object_bytes{{Hostname="sim-node"}} {agent.publisher.last_bytes}' in metrics
        made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=5.0)
        entries = await made.lookup(["sim-node"], deadline_seconds=0.1)  # not listed yet: nothing known
        assert entries == {}
        stop = asyncio.Event()
        task = asyncio.create_task(made.run(stop))
        entries = await made.lookup(["sim-node"])
        assert entries["sim-node"].hints == project(snapshot.hints, None)
        stop.set()
        await task
        await made.close()
    finally:
        await agent.aclose()



# --- judging many nodes ----------------------------------------------------------------------------------------


async def test_nodes_in_the_same_state_are_judged_once_a_request(api: FakeApiServer, view: ClusterView) -> None:
    for i in range(30):  # three states: ten idle nodes, ten held, ten with one GPU of their own each
        hints = all_free(f"n{i}") if i < 10 else all_held(f"n{i}") if i < 20 else \
            moved(all_free(f"n{i}"), memory_free_bytes=(i - 19) * GiB)
        publish(api, f"n{i}", hints)
    extender = Extender(view, max_age_seconds=900.0)
    nodes = [f"n{i}" for i in range(30)]
    reply = await extender.filter(gpu_pod_filter(nodes))
    assert sum(extender.states_judged.values()) == 1 + 1 + 10  # once per distinct state
    assert set(reply["NodeNames"]) == {f"n{i}" for i in range(10)} | {f"n{i}" for i in range(20, 30)}
    failed = {reply["FailedNodes"][f"n{i}"] for i in range(10, 20)}
    assert len(failed) == 1  # the same state, the same reason


async def test_nodes_running_pods_of_their_own_are_judged_once_for_a_shared_pod(
        api: FakeApiServer, view: ClusterView) -> None:
    """Each node's time-sliced GPUs hold its own pods: an exclusive pod's reasons name them ("not free for
    exclusive use"), a shared pod's never do, so the shared pod is judged once for all of them."""
    for i in range(10):
        gpus = tuple(replace_tenant_names(gpu(g, tenants=1, free_gib=40, share=0.5), f"team/job-{i}-{g}")
                     for g in range(4))
        publish(api, f"n{i}", node_hints(f"n{i}", gpus))
    extender = Extender(view, max_age_seconds=900.0)
    judged = extender.states_judged
    nodes = [f"n{i}" for i in range(10)]
    shared = gpu_pod_filter(nodes)
    shared["Pod"]["metadata"]["annotations"]["gpuagent.io/gpu-share"] = "30%"
    reply = await extender.filter(shared)
    assert len(reply["NodeNames"]) == 10 and sum(judged.values()) == 1
    judged.update(dict.fromkeys(judged, 0))
    reply = await extender.filter(gpu_pod_filter(nodes))  # exclusive: each node's reason names its pods
    assert sum(judged.values()) == 10 and len(reply["FailedNodes"]) == 10
    assert "team/job-3-0" in reply["FailedNodes"]["n3"]


def replace_tenant_names(gpu: GpuHints, name: str) -> GpuHints:
    return dataclasses.replace(gpu, tenants=tuple(dataclasses.replace(t, name=name) for t in gpu.tenants))


async def test_a_repeated_answer_is_reused_until_a_state_changes_or_ages_out(api: FakeApiServer) -> None:
    clock = Clock()
    made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=5.0, monotonic=clock,
                       wall_clock=lambda: clock.now)
    publish(api, "a", all_free("a"), heartbeat=clock.now)
    publish(api, "b", all_free("b"), heartbeat=clock.now - 500)
    stop = asyncio.Event()
    task = asyncio.create_task(made.run(stop))
    try:
        extender = Extender(made, max_age_seconds=900.0, monotonic=clock)
        first = await extender.filter(gpu_pod_filter(["a", "b"]))
        assert first["NodeNames"] == ["a", "b"]
        assert await extender.filter(gpu_pod_filter(["a", "b"])) == first
        clock.now += 401  # b's state, 500 s old when published, is now past 900 s
        aged = await extender.filter(gpu_pod_filter(["a", "b"]))
        assert aged["NodeNames"] == ["a"] and "b" in aged["FailedAndUnresolvableNodes"]
        publish(api, "a", all_held("a"), sequence=2, heartbeat=clock.now)
        await eventually(lambda: made.get("a").hints.free_gpu_count == 0, 5.0)
        changed = await extender.filter(gpu_pod_filter(["a", "b"]))
        assert changed["NodeNames"] == [] and "a" in changed["FailedNodes"]
    finally:
        stop.set()
        await task
        await made.close()


async def test_the_extender_is_ready_once_the_first_list_has_answered(api: FakeApiServer) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gpuagent.hints.extender_app import build_app, build_registry

    publish(api, "n1", all_free("n1"))
    made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=5.0)
    extender = Extender(made, max_age_seconds=900.0)
    async with TestClient(TestServer(build_app(extender, build_registry(extender)))) as client:
        waiting = await client.get("/readyz")
        assert waiting.status == 503 and "first list" in (await waiting.json())["status"]
        stop = asyncio.Event()
        task = asyncio.create_task(made.run(stop))
        await eventually(lambda: made.synced, 5.0)
        ready = await client.get("/readyz")
        assert ready.status == 200 and (await ready.json()) == {"status": "ready", "nodes": 1}
        stop.set()
        await task
    await made.close()


async def test_nodes_in_the_same_state_share_one_copy_of_it(api: FakeApiServer, view: ClusterView) -> None:
    for i in range(3):
        publish(api, f"n{i}", all_free(f"n{i}"))
    await view.lookup(["n0"])
    assert view.get("n0").hints is view.get("n1").hints is view.get("n2").hints
    publish(api, "n0", all_held("n0"), sequence=2)
    api.delete_state("n1")
    await eventually(lambda: view.get("n1") is None and view.get("n0").hints.free_gpu_count == 0, 5.0)
    assert view.get("n2").hints.free_gpu_count == 4 and view.get("n2").hints is not view.get("n0").hints
    publish(api, "n1", all_held("n1"))
    await eventually(lambda: view.get("n1") is not None, 5.0)
    assert view.get("n1").hints is view.get("n0").hints
