"""The extender under hostile calls, in process: bombs (gzip, deep JSON, too many values, huge lists and
strings), names that are not nodes, and the node list that says which names are.

Every answer is a 4xx JSON error naming the limit or the field, never a 5xx; a name the extender does not
know is never fetched, never cached and logged once for many. The real-process test with the shipped
memory limit is ``test_extender_bombs_process.py``.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from fixture_files import filter_request
from test_extender import NODES, agents, all_free, fixture_nodes, harness  # noqa: F401 (fixtures)

from gpuagent.hints import nodes as node_list
from gpuagent.hints.agents import AgentCache, AgentDirectory
from gpuagent.hints.extender_app import MAX_BODY_BYTES
from gpuagent.hints.extender_config import load_options
from gpuagent.hints.extender_protocol import MAX_CANDIDATES
from gpuagent.hints.extender_serve import NoNodeSource, from_options
from gpuagent.hints.nodes import KnownNodes, NodeLister
from gpuagent.httpbody import MAX_JSON_DEPTH, BodyError, BodyLimits, json_depth, parse_json
from gpuagent.kubeapi import ApiConnection

# --- bodies -------------------------------------------------------------------------------------------------


def gzip_stream(parts: Iterator[bytes]) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    return b"".join(compressor.compress(part) for part in parts) + compressor.flush()


def gzip_bomb(inflated_bytes: int) -> bytes:
    """Valid JSON once inflated: a pod and one node name ``inflated_bytes`` long (~1000:1 compressed)."""
    chunk = b"a" * (1 << 20)

    def parts() -> Iterator[bytes]:
        yield b'{"Pod": {"spec": {"containers": []}}, "NodeNames": ["'
        for _ in range(inflated_bytes // len(chunk)):
            yield chunk
        yield b'"]}'

    return gzip_stream(parts())


async def post_raw(h: Any, verb: str, body: bytes, **headers: str) -> tuple[int, Any]:
    response = await h.client.post(f"/gpu/{verb}", data=body,
                                   headers={"Content-Type": "application/json", **headers})
    return response.status, await response.json()


async def test_a_gzip_bomb_is_refused_at_the_inflated_cap(harness: Any) -> None:  # noqa: F811
    h = await harness()
    bomb = gzip_bomb(200 * 1024 * 1024)  # the issue's: ~200 KB on the wire, 200 MB of JSON
    assert len(bomb) < 256 * 1024
    for verb in ("filter", "prioritize"):
        status, reply = await post_raw(h, verb, bomb, **{"Content-Encoding": "gzip"})
        assert status == 413, reply
        assert reply["field"] == "body" and f"over the limit of {MAX_BODY_BYTES} bytes once inflated" in reply["error"]
    # a small gzip body is still read
    status, reply = await post_raw(h, "filter", gzip_stream(iter([json.dumps(filter_request()).encode()])),
                                   **{"Content-Encoding": "gzip"})
    assert status == 200, reply


async def test_bodies_over_the_wire_cap_and_broken_gzip_are_4xx(harness: Any) -> None:  # noqa: F811
    h = await harness()
    status, reply = await post_raw(h, "filter", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and str(MAX_BODY_BYTES) in reply["error"]
    status, reply = await post_raw(h, "filter", b"\x1f\x8b\x08\x00garbage" * 100, **{"Content-Encoding": "gzip"})
    assert 400 <= status < 500 and "error" in reply


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 2_000, 200_000])
async def test_deep_json_is_a_400_naming_the_depth_never_a_recursion_error(harness: Any, depth: int) -> None:  # noqa: F811
    h = await harness()
    nested = b"[" * depth + b"]" * depth
    bodies = (
        nested,
        b'{"Pod": ' + b'{"a": ' * depth + b"{}" + b"}" * depth + b', "NodeNames": []}',
        b"[" * depth,  # never closed
    )
    for verb in ("filter", "prioritize"):
        for body in bodies:
            status, reply = await post_raw(h, verb, body)
            assert status == 400, (verb, body[:40], reply)
            assert reply["field"] == "body" and f"limit of {MAX_JSON_DEPTH}" in reply["error"]


async def test_json_at_the_depth_limit_is_parsed() -> None:
    limits = BodyLimits(max_bytes=1 << 20)
    assert parse_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, limits) is not None
    with pytest.raises(BodyError, match="nested deeper than the limit of 400 levels"):
        parse_json(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), limits)


@pytest.mark.parametrize(("text", "depth"), [
    ('["[[[[", "]]]]]]]", [1]]', 2),
    (r'["\\", ["\"[[["]]', 2),
    (r'{"a": "\\\"[", "b": {"c": [[]]}}', 4),
    ('"{{{{"', 0),
    ('[[], [[]], "", ""]', 3),
])
def test_brackets_inside_strings_do_not_count(text: str, depth: int) -> None:
    json.loads(text)  # valid JSON, so the scan is exact
    assert json_depth(text.encode()) == depth


async def test_too_many_values_and_candidates_are_refused_before_per_name_work(harness: Any) -> None:  # noqa: F811
    h = await harness()
    status, reply = await post_raw(h, "filter", b"[" + b"[]," * 2_000_000 + b"[]]")
    assert status == 413 and "values" in reply["error"]
    names = json.dumps({"Pod": filter_request()["Pod"], "NodeNames": [str(i) for i in range(MAX_CANDIDATES + 1)]})
    status, reply = await post_raw(h, "filter", names.encode())
    assert status == 400 and reply["field"] == "NodeNames" and str(MAX_CANDIDATES) in reply["error"]


async def test_huge_strings_are_answered(harness: Any) -> None:  # noqa: F811
    h = await harness()
    fixture_nodes(h.agents)
    body = filter_request()
    body["Pod"]["metadata"]["name"] = "p" * (4 * 1024 * 1024)
    body["NodeNames"] = [*NODES, "n" * (1024 * 1024)]
    status, reply = await post_raw(h, "filter", json.dumps(body).encode())
    assert status == 200
    assert reply["NodeNames"] == [NODES[0]]
    assert "unknown node" in reply["FailedAndUnresolvableNodes"]["n" * (1024 * 1024)]


# --- names that are not nodes -------------------------------------------------------------------------------


async def test_invented_names_are_never_fetched_nor_cached_and_logged_once(
    harness: Any, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    h = await harness()
    fixture_nodes(h.agents)
    invented = [f"invented-{i}.example.com" for i in range(5_000)]
    body = filter_request()
    body["NodeNames"] = [*NODES, *invented]
    with caplog.at_level(logging.INFO, logger="gpuagent.hints.extender"):
        for verb in ("filter", "prioritize", "filter"):
            status, reply = await h.post(verb, body)
            assert status == 200
    fetched = {node for node, _ in h.agents.requests}
    assert fetched == set(NODES)  # the known ones only
    assert len(h.extender.cache) == len(NODES)
    assert len(h.extender.cache._used) == len(NODES)
    _, reply = await h.post("filter", body)
    assert set(reply["FailedAndUnresolvableNodes"]) == {NODES[2], *invented}
    assert reply["FailedAndUnresolvableNodes"][invented[0]] == (
        "gpuagent: unknown node: not in the API server's node list nor the agents file")
    lines = [r for r in caplog.records if "not nodes the extender knows" in r.getMessage()]
    assert len(lines) == 1 and "5000 candidate names" in lines[0].getMessage()
    metrics = await (await h.client.get("/metrics")).text()
    assert 'gpuagent_extender_unknown_nodes_total{verb="filter"} 15000.0' in metrics


async def test_the_cache_keeps_the_most_recently_asked_nodes_up_to_its_size(agents: Any) -> None:  # noqa: F811
    names = [f"node-{i}" for i in range(6)]
    for name in names:
        agents.hints[name] = all_free(name)
    cache = AgentCache(AgentDirectory(template=agents.base_url + "/n/{node}"), known=set(names), max_entries=3)
    await cache.start()
    try:
        for name in names:
            await cache.lookup([name])
        assert sorted(entry.node for entry in cache.entries()) == names[3:]
        await cache.lookup([names[0]])  # asked again: fetched again, the least recent goes
        assert sorted(entry.node for entry in cache.entries()) == [names[0], *names[4:]]
    finally:
        await cache.close()


# --- the node list ------------------------------------------------------------------------------------------


async def test_the_node_list_says_which_names_are_nodes(
    agents: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    monkeypatch.setattr(node_list, "PAGE", 2)  # several pages
    async with FakeApiServer() as api:
        api.node_names = [*NODES, "node-4", "node-5"]
        connection = ApiConnection(config=api.kubeconfig())
        known = KnownNodes({"from-the-agents-file"})
        lister = NodeLister(connection, known)
        try:
            assert await lister.list_once() == 5
            assert all(name in known for name in api.node_names) and "from-the-agents-file" in known
            assert "invented" not in known
            assert [r.query.get("continue", "") for r in api.node_lists] == ["", "2", "4"]
            api.node_names = [NODES[0]]  # nodes left the cluster
            await lister.list_once()
            assert NODES[1] not in known and NODES[0] in known
            cache = AgentCache(AgentDirectory(template=agents.base_url + "/n/{node}"), known=known)
            agents.hints[NODES[0]] = all_free(NODES[0])
            await cache.start()
            try:
                await cache.lookup([NODES[0]])
                api.node_names = []
                await lister.list_once()
                await cache.refresh_all()
                assert len(cache) == 0  # a node no longer listed is dropped
            finally:
                await cache.close()
            api.token = "another"  # the list fails now: the last names are kept, one warning per change
            with caplog.at_level(logging.WARNING, logger="gpuagent.hints.nodes"):
                api.node_names = ["ignored"]
                stop_after_two = _StopAfter(lister, 2)
                await lister.run(stop_after_two.event)
            assert "ignored" not in known and "from-the-agents-file" in known
            assert [r.levelname for r in caplog.records if r.name == "gpuagent.hints.nodes"] == ["WARNING"]
        finally:
            await connection.aclose()


class _StopAfter:
    """An event set after ``count`` lists (the lister's interval made short)."""

    def __init__(self, lister: NodeLister, count: int) -> None:
        import asyncio

        self.event = asyncio.Event()
        self._left = count
        lister._interval = 0.01
        original = lister.list_once

        async def counted() -> int:
            self._left -= 1
            if self._left <= 0:
                self.event.set()
            return await original()

        lister.list_once = counted  # type: ignore[method-assign]


def test_an_extender_that_could_know_no_node_refuses_to_start() -> None:
    options = load_options(None, env={}, overrides={"kubernetes_api": "off"})
    with pytest.raises(NoNodeSource, match="agents file"):
        from_options(options)


def test_with_api_access_the_extender_lists_nodes_and_knows_no_other(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    FakeApiServer(port=1).write_kubeconfig(kubeconfig)
    options = load_options(None, env={}, overrides={"kubernetes_api": "on", "kubeconfig": str(kubeconfig),
                                                    "cluster_view": "off"})  # the agents' hints over HTTP
    extender, lister = from_options(options)
    assert lister is not None
    assert not extender.cache.knows("anything.example.com")
