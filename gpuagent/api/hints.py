"""``GET /v1/hints``, ``POST /v1/hints/score`` and ``GET /openapi.json``.

Handlers read only the latest snapshot's ``NodeHints``: no I/O at request time. ``/v1/hints`` is serialised
once per snapshot; its strong ETag hashes the figures without the freshness timestamp, so a node whose
figures did not change answers a conditional GET (``If-None-Match``) with 304 however many polls went by;
a 200 carries ``taken_at_unix``, and a 304 says the figures are still those of the client's copy. Hints
older than ``/healthz``'s bound (the poller is stuck) are a 503, never a 304, so no cache keeps them fresh.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from gpuagent.hints.codec import hints_to_jsonable
from gpuagent.hints.score import RequestError, parse_fit_request, score_node
from gpuagent.httpbody import BodyError, BodyLimits, error_response, read_json
from gpuagent.httperrors import json_error
from gpuagent.snapshot.hints import NodeHints
from gpuagent.snapshot.node import NodeSnapshot

MAX_SCORE_BYTES = 64 * 1024
_SCORE_LIMITS = BodyLimits(max_bytes=MAX_SCORE_BYTES, timeout_seconds=10.0)
HINTS_PATH = "/v1/hints"
SCORE_PATH = "/v1/hints/score"
OPENAPI_PATH = "/openapi.json"

_LATEST = web.AppKey("hints_latest", object)
_CLOCK = web.AppKey("hints_clock", object)
_CACHE = web.AppKey("hints_cache", dict)
_OPENAPI = web.AppKey("openapi_body", bytes)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _max_age_seconds(snapshot: NodeSnapshot) -> float:
    """Older hints than this are stale even here (the poller is stuck): the same bound as ``/healthz``."""
    return max(30.0, 5 * snapshot.poll_interval_seconds)


def _current(request: web.Request) -> tuple[NodeSnapshot, NodeHints] | web.Response:
    snapshot: NodeSnapshot | None = request.app[_LATEST]()  # type: ignore[operator]
    if snapshot is None:
        return json_error(503, "no snapshot yet: the first poll has not finished")
    if snapshot.hints is None:
        return json_error(503, "no hints for the last snapshot: computing them failed (see the agent's log)")
    return snapshot, snapshot.hints


def if_none_match(header: str, etag: str) -> bool:
    """Whether an If-None-Match header matches ``etag`` (weak comparison, as RFC 9110 asks for GETs)."""
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))


async def get_hints(request: web.Request) -> web.Response:
    current = _current(request)
    if isinstance(current, web.Response):
        return current
    snapshot, hints = current
    age = request.app[_CLOCK]() - snapshot.taken_at_unix  # type: ignore[operator]
    if age > _max_age_seconds(snapshot):
        # A stuck poller must not look fresh to a cache revalidating with If-None-Match (a 304 would).
        return json_error(503, f"the hints are {age:.0f} s old: the agent's poller is stuck (see /healthz)")
    cache = request.app[_CACHE]
    if cache.get("snapshot") is not snapshot:
        body = hints_to_jsonable(hints)
        figures = {k: v for k, v in body.items() if k != "taken_at_unix"}
        cache["etag"] = '"' + hashlib.sha256(_dumps(figures)).hexdigest()[:32] + '"'
        cache["body"] = _dumps(body)
        cache["snapshot"] = snapshot
    etag: str = cache["etag"]
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match(request.headers.get("If-None-Match", ""), etag):
        return web.Response(status=304, headers=headers)
    return web.Response(body=cache["body"], content_type="application/json", headers=headers)


async def post_score(request: web.Request) -> web.StreamResponse:
    if request.content_type != "application/json":
        got = request.content_type or "none"
        return json_error(415, f"expected Content-Type application/json, got {got}", "Content-Type")
    try:
        body = await read_json(request, _SCORE_LIMITS)
    except BodyError as err:
        return error_response(err)
    try:
        fit = parse_fit_request(body)
    except RequestError as exc:
        return json_error(400, exc.message, exc.field)
    current = _current(request)
    if isinstance(current, web.Response):
        return current
    snapshot, hints = current
    now: float = request.app[_CLOCK]()  # type: ignore[operator]
    result = score_node(hints, fit, now=now, max_age_seconds=_max_age_seconds(snapshot))
    payload = {"node": hints.hostname, "taken_at_unix": hints.taken_at_unix, **result.to_jsonable()}
    return web.Response(body=_dumps(payload), content_type="application/json")


def openapi_document() -> bytes:
    """The agent's OpenAPI document as shipped in the package."""
    return resources.files("gpuagent.api").joinpath("openapi.json").read_bytes()


async def get_openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[_OPENAPI], content_type="application/json")


def add_routes(
    app: web.Application,
    latest: Callable[[], NodeSnapshot | None],
    *,
    clock: Callable[[], float] = time.time,
) -> None:
    """Register the hints endpoints and ``/openapi.json`` on ``app``."""
    app[_LATEST] = latest
    app[_CLOCK] = clock
    app[_CACHE] = {}
    app[_OPENAPI] = openapi_document()
    app.router.add_get(HINTS_PATH, get_hints)
    app.router.add_post(SCORE_PATH, post_score)
    app.router.add_get(OPENAPI_PATH, get_openapi)
