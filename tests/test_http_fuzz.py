"""Bad HTTP input of every shape gets a clear 4xx JSON error (or the page, for harmless extras), never a 5xx,
and the agent keeps serving."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshots import two_gpu_node

from gpuagent.api.app import MAX_REQUEST_BYTES, build_app
from gpuagent.export import build_registry

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
