"""The agent's OpenAPI document: valid, complete (every route, every hints field), real responses conform to
it, and a schemathesis fuzz of the running API from it finds no 5xx and no answer outside the document."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from referencing import Registry, Resource
from test_hints_score import A100_MIG, FAULTS, H100, sim_snapshot

from gpuagent.api.app import build_app
from gpuagent.api.hints import openapi_document
from gpuagent.export import build_registry
from gpuagent.snapshot import hints as model
from gpuagent.snapshot.node import NodeSnapshot

DOC: dict[str, Any] = json.loads(openapi_document())
HINT_CLASSES = ("NodeHints", "GpuHints", "TenantHint", "MigInstanceHint", "MigProfileHint", "NetworkHints",
                "LinkHint", "PodNetworkHint")


def test_the_document_is_valid_openapi() -> None:
    validate(DOC)
    assert DOC["openapi"].startswith("3.1")


def _admin(tmp_dir: str) -> dict[str, Any]:
    """build_app's admin arguments: the admin routes on, behind a token nobody here knows."""
    import os
    import secrets

    from gpuagent.api.admin import AdminActions

    token_file = os.path.join(tmp_dir, "admin-token")
    with open(token_file, "w") as stream:
        stream.write(secrets.token_hex(16))
    unreachable = AdminActions(thaw=lambda _: {}, reload_policies=lambda: {})  # behind the token: never called
    return {"admin": unreachable, "admin_token_file": token_file}


def test_every_route_is_documented_and_nothing_else(tmp_path: Any) -> None:
    app = build_app(lambda: None, build_registry(lambda: None), **_admin(str(tmp_path)))
    routes = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(path, method) for path, item in DOC["paths"].items() for method in item}
    assert routes == documented
    for path in ("/metrics", "/healthz", "/readyz", "/v1/state", "/v1/hints", "/v1/hints/score", "/openapi.json"):
        assert path in DOC["paths"]


@pytest.mark.parametrize("name", HINT_CLASSES)
def test_hint_schemas_list_every_model_field(name: str) -> None:
    schema = DOC["components"]["schemas"][name]
    fields = [f.name for f in dataclasses.fields(getattr(model, name))]
    assert list(schema["properties"]) == fields
    assert schema["required"] == fields


def _draft() -> Any:
    from referencing.jsonschema import DRAFT202012

    return DRAFT202012


def _response_schema(path: str, method: str, status: int) -> dict[str, Any]:
    return DOC["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]


def _validate(body: Any, schema: dict[str, Any]) -> None:
    resource = Resource.from_contents(DOC, default_specification=_draft())
    registry: Registry = Registry().with_resource("urn:gpuagent", resource)
    rebased = json.loads(json.dumps(schema).replace('"#/components', '"urn:gpuagent#/components'))
    jsonschema.Draft202012Validator(rebased, registry=registry).validate(body)


@pytest.fixture(scope="module")
def nodes() -> list[NodeSnapshot]:
    return [sim_snapshot(H100, 60.0, 61.0), sim_snapshot(A100_MIG, 30.0, 31.0), sim_snapshot(FAULTS, 55.0, 70.0)]


async def test_real_responses_conform(nodes: list[NodeSnapshot]) -> None:
    holder: dict[str, Any] = {"snapshot": None}
    latest = lambda: holder["snapshot"]  # noqa: E731
    clock = lambda: holder["snapshot"].taken_at_unix + 1 if holder["snapshot"] else 0.0  # noqa: E731
    app = build_app(latest, build_registry(latest, clock=clock), clock=clock)
    async with TestClient(TestServer(app)) as client:
        for path in ("/v1/hints", "/v1/state"):
            response = await client.get(path)
            assert response.status == 503
            _validate(await response.json(), _response_schema(path, "get", 503))
        for path in ("/healthz", "/readyz"):
            response = await client.get(path)
            _validate(await response.json(), _response_schema(path, "get", response.status))
        for snapshot in nodes:
            holder["snapshot"] = snapshot
            hints = await client.get("/v1/hints")
            _validate(await hints.json(), _response_schema("/v1/hints", "get", 200))
            state = await client.get("/v1/state")
            _validate(await state.json(), _response_schema("/v1/state", "get", 200))
            for path in ("/healthz", "/readyz"):
                response = await client.get(path)
                assert response.status == 200
                _validate(await response.json(), _response_schema(path, "get", 200))
            for body in ({"gpus": 2, "memory": "8Gi", "share": "10%"}, {"mig_profile": "1g.10gb", "gpus": 2},
                         {"exclusive": True, "policy": "spread"}, {"gpus": 64}):
                response = await client.post("/v1/hints/score", json=body)
                assert response.status == 200
                _validate(await response.json(), _response_schema("/v1/hints/score", "post", 200))
            bad = await client.post("/v1/hints/score", json={"gpus": 0})
            _validate(await bad.json(), _response_schema("/v1/hints/score", "post", 400))
        spec = await client.get("/openapi.json")
        assert spec.status == 200 and await spec.json() == DOC


# --- schemathesis -------------------------------------------------------------------------------------------


class _Server:
    """The agent's app on a real port, on its own event loop in a thread (schemathesis calls it over HTTP)."""

    def __init__(self, snapshot: NodeSnapshot) -> None:
        self.snapshot = snapshot
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        latest = lambda: self.snapshot  # noqa: E731
        clock = lambda: self.snapshot.taken_at_unix + 1  # noqa: E731
        import tempfile

        self._tmp = tempfile.TemporaryDirectory()
        app = build_app(latest, build_registry(latest, clock=clock), clock=clock, **_admin(self._tmp.name))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> _Server:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._tmp.cleanup()


@pytest.fixture(scope="module")
def server(nodes: list[NodeSnapshot]) -> Iterator[_Server]:
    with _Server(nodes[1]) as server:  # the MIG node: every path of the scoring code is reachable
        yield server


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


schema = schemathesis.openapi.from_dict(DOC)


@pytest.mark.integration
@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzz_the_api_from_its_document(case, server: _Server, session: requests.Session) -> None:
    """No 5xx, and every answer (status, content type, headers, body) is one the document allows.

    Schema-valid bodies may still get a 400: rules across fields (exclusive with share, a zero quantity
    like "0Gi") are the parser's, not the document's; so positive_data_acceptance is left out.
    """
    case.call_and_validate(base_url=server.url, session=session,
                           excluded_checks=[schemathesis.checks.positive_data_acceptance])
