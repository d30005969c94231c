"""Bad HTTP input of every shape gets a clear 4xx JSON error (or the page, for harmless extras), never a 5xx,
and the agent and the extender keep serving; the request parsers raise their own errors and nothing else."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import zlib
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshots import two_gpu_node
from test_hints_score import H100, sim_snapshot

from gpuagent.api.app import MAX_REQUEST_BYTES, build_app
from gpuagent.export import build_registry
from gpuagent.hints.agents import AgentCache, AgentDirectory
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_app as build_extender_app
from gpuagent.hints.extender_app import build_registry as build_extender_registry
from gpuagent.hints.extender_protocol import ArgsError, parse_args
from gpuagent.hints.score import RequestError, parse_fit_request
from gpuagent.httpbody import MAX_JSON_DEPTH, BodyError, BodyLimits, json_depth, json_items, parse_json
from gpuagent.httpguard import ConnectionGuard, GuardedSite

pytestmark = pytest.mark.long  # property tests of many seconds: handed out early (conftest.py)

ROUTES = ["/metrics", "/healthz", "/readyz", "/v1/state"]
SNAPSHOT = two_gpu_node()

path_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
header_value = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200)


def request_strategy() -> st.SearchStrategy[tuple[str, str, dict[str, str], bytes]]:
    path = st.one_of(
        st.sampled_from(ROUTES),
        st.builds(lambda r, extra: r + extra, st.sampled_from(ROUTES), path_text),
        # Not "//...": aiohttp's test client takes that for an absolute URL and refuses to send it.
        path_text.map(lambda p: "/" + p.lstrip("/")),
    )
    query = st.dictionaries(path_text, path_text, max_size=4)
    headers = st.dictionaries(
        st.sampled_from(["Accept", "Accept-Encoding", "Content-Type", "X-Forwarded-For", "If-None-Match",
                         "User-Agent", "Range"]),
        header_value, max_size=4,
    )
    method = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    body = st.binary(max_size=2048)
    return st.tuples(method, st.builds(_with_query, path, query), headers, body)


def _with_query(path: str, query: dict[str, str]) -> tuple[str, dict[str, str]]:
    return path, query


async def _serve():
    latest = lambda: SNAPSHOT  # noqa: E731
    clock = lambda: SNAPSHOT.taken_at_unix + 1.0  # noqa: E731  (a fresh snapshot: /healthz 200)
    app = build_app(latest, build_registry(latest, clock=clock), clock=clock)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_strategy(), min_size=1, max_size=5))
def test_any_request_gets_a_clean_answer(requests) -> None:
    async def run() -> None:
        client = await _serve()
        try:
            for method, (path, query), headers, body in requests:
                try:
                    response = await client.request(method, path, params=query, headers=headers, data=body,
                                                     allow_redirects=False)
                except ValueError:
                    continue  # the client itself refuses to send it (e.g. a header it cannot encode)
                text = await response.read()
                assert response.status < 500, (method, path, query, headers, response.status, text[:200])
                if response.status >= 400 and method != "HEAD":
                    assert response.headers["Content-Type"].startswith("application/json"), text[:200]
                    assert b'"error"' in text
            assert (await client.get("/readyz")).status == 200  # still serving
        finally:
            await client.close()

    asyncio.run(run())


async def test_oversized_bodies_are_refused_with_a_json_error() -> None:
    client = await _serve()
    try:
        response = await client.post("/v1/state", data=b"x" * (MAX_REQUEST_BYTES + 1))
        assert 400 <= response.status < 500 and "error" in await response.json()
    finally:
        await client.close()


# --- the request parsers, and the extender's and the agent's POST inputs over HTTP ---------------------------
#
# Random JSON shapes, random bytes and random gzip, against the parsers themselves and against real listeners
# on loopback (the agent's app and the extender's, behind the connection guard with aiohttp's inflation off,
# as they are served): every answer is a 4xx JSON error or a 200, never a 5xx, and the listener keeps serving.

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda children: st.one_of(
    st.lists(children, max_size=6), st.dictionaries(st.text(max_size=12), children, max_size=6)), max_leaves=40)
extender_args = st.fixed_dictionaries({}, optional={
    "Pod": st.one_of(json_values, st.fixed_dictionaries({"metadata": json_values, "spec": st.fixed_dictionaries(
        {"containers": st.one_of(json_values, st.lists(st.fixed_dictionaries({"name": st.text(max_size=8)}, optional={
            "resources": st.fixed_dictionaries({}, optional={"limits": st.dictionaries(
                st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu"]),
                st.one_of(st.text(max_size=6), st.integers()), max_size=2)})}), max_size=3))})})),
    "NodeNames": st.one_of(json_values, st.lists(st.text(min_size=1, max_size=30), max_size=20)),
    "Nodes": json_values,
})
score_requests = st.fixed_dictionaries({}, optional={
    key: st.one_of(json_values, st.integers(-3, 10), st.text(max_size=8))
    for key in ("gpus", "memory", "share", "mig_profile", "exclusive", "policy")
})


def deep(depth: int, opener: bytes = b"[") -> bytes:
    return opener * depth


body_bytes = st.one_of(
    st.binary(max_size=2048),
    json_values.map(lambda v: json.dumps(v).encode()),
    extender_args.map(lambda v: json.dumps(v).encode()),
    score_requests.map(lambda v: json.dumps(v).encode()),
    st.integers(390, 5000).map(lambda d: deep(d) + b"]" * d),
    st.integers(390, 5000).map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
)
encodings = st.sampled_from([None, "gzip", "deflate", "br", "gzip-broken"])


def encode(body: bytes, encoding: str | None) -> tuple[bytes, dict[str, str]]:
    if encoding is None:
        return body, {}
    if encoding == "gzip":
        return gzip.compress(body), {"Content-Encoding": "gzip"}
    if encoding == "deflate":
        return zlib.compress(body), {"Content-Encoding": "deflate"}
    if encoding == "gzip-broken":
        return gzip.compress(body)[: max(1, len(body) // 2)], {"Content-Encoding": "gzip"}
    return body, {"Content-Encoding": encoding}


@settings(max_examples=300, deadline=None)
@given(body=body_bytes)
def test_the_body_parser_refuses_with_a_body_error_only(body: bytes) -> None:
    limits = BodyLimits(max_bytes=64 * 1024)
    try:
        value = parse_json(body, limits)
    except BodyError as err:
        assert 400 <= err.status < 500 and err.message
        return
    assert json_nesting(value) <= MAX_JSON_DEPTH


def json_nesting(value: object) -> int:
    """The reference depth, iteratively."""
    deepest, stack = 0, [(value, 1 if isinstance(value, (list, dict)) else 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (list, dict)))
    return deepest


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_the_depth_scan_is_exact_on_valid_json(value: object) -> None:
    raw = json.dumps(value).encode()
    assert json_depth(raw) == json_nesting(value)
    assert json_items(raw) >= sum(1 for _ in _walk(value))


def _walk(value: object):
    yield value
    if isinstance(value, dict):
        for child in value.values():
            yield from _walk(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk(child)


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(json_values, extender_args))
def test_the_extender_args_parser_raises_args_errors_only(body: object) -> None:
    try:
        args = parse_args(body)
    except ArgsError as err:
        assert err.field and err.message
        return
    assert all(isinstance(name, str) for name in args.node_names)


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(json_values, score_requests))
def test_the_score_request_parser_raises_request_errors_only(body: object) -> None:
    try:
        parse_fit_request(body)
    except RequestError as err:
        assert err.message  # the field may be the unknown key itself, "" included


@functools.cache
def hinted_snapshot() -> Any:
    """The simulated 8xH100 node's snapshot, with its hints (what /v1/hints/score scores against)."""
    return sim_snapshot(H100, 60.0, 61.0)


async def _guarded_listeners(snapshot: Any) -> tuple[web.AppRunner, int, web.AppRunner, int, AgentCache]:
    """The agent's app (serving ``snapshot``) and the extender's, each behind a ConnectionGuard with its
    runner options."""
    latest = lambda: snapshot  # noqa: E731
    clock = lambda: snapshot.taken_at_unix + 1.0  # noqa: E731
    cache = AgentCache(AgentDirectory(template="http://127.0.0.1:9/n/{node}"), known={"node-a"}, timeout_seconds=0.2)
    extender = Extender(cache)
    apps = [build_app(latest, build_registry(latest, clock=clock), clock=clock),
            build_extender_app(extender, build_extender_registry(extender), prefix="/gpu")]
    out: list[Any] = []
    for app in apps:
        guard = ConnectionGuard()
        guard.install(app)
        runner = web.AppRunner(app, access_log=None, **guard.limits.runner_options())
        await runner.setup()
        site = GuardedSite(runner, "127.0.0.1", 0, guard)
        await site.start()
        out += [runner, site.port]
    await cache.start()
    return (*out, cache)  # type: ignore[return-value]


POSTS = [("agent", "/v1/hints/score"), ("extender", "/gpu/filter"), ("extender", "/gpu/prioritize")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(st.sampled_from(POSTS), body_bytes, encodings,
                                st.sampled_from(["application/json", "text/plain", ""])), min_size=1, max_size=4))
def test_random_bodies_to_the_post_routes_never_get_a_5xx(calls) -> None:
    snapshot = hinted_snapshot()

    async def run() -> None:
        agent_runner, agent_port, extender_runner, extender_port, cache = await _guarded_listeners(snapshot)
        ports = {"agent": agent_port, "extender": extender_port}
        try:
            async with ClientSession(auto_decompress=False) as session:
                for (server, path), body, encoding, content_type in calls:
                    data, headers = encode(body, encoding)
                    if content_type:
                        headers["Content-Type"] = content_type
                    async with session.post(f"http://127.0.0.1:{ports[server]}{path}", data=data,
                                            headers=headers) as response:
                        text = await response.read()
                        assert response.status < 500, (server, path, encoding, body[:80], text[:300])
                        if response.status >= 400:
                            assert b'"error"' in text, text[:200]
                for server, port in ports.items():
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                        assert response.status == 200, server  # still serving
        finally:
            await cache.close()
            await agent_runner.cleanup()
            await extender_runner.cleanup()

    asyncio.run(run())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(
    st.binary(max_size=600),
    st.builds(lambda line, headers: line + headers + b"\r\n\r\n",
              st.sampled_from([b"GET / HTTP/1.1\r\n", b"POST /v1/hints/score HTTP/1.1\r\n", b"\x16\x03\x01\r\n",
                               b"GET /metrics HTTP/9.9\r\n", b"PRI * HTTP/2.0\r\n"]),
              st.binary(max_size=300)),
))
def test_random_bytes_as_a_request_never_stop_the_listener(raw: bytes) -> None:
    snapshot = hinted_snapshot()

    async def run() -> None:
        agent_runner, agent_port, extender_runner, extender_port, cache = await _guarded_listeners(snapshot)
        try:
            for port in (agent_port, extender_port):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                writer.write_eof()
                answer = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                assert not answer.startswith(b"HTTP/1.1 5"), answer[:200]
                async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as r:
                    assert r.status == 200
        finally:
            await cache.close()
            await agent_runner.cleanup()
            await extender_runner.cleanup()

    asyncio.run(run())
