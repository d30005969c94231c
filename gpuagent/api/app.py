"""The agent's HTTP API (aiohttp): metrics, probes and the snapshot as JSON.

Handlers only read the latest published snapshot: no NVML, no kubelet, no I/O at request time. Errors
are JSON ``{"error": ..., "field": ...}`` with a 4xx/5xx status, never an HTML page.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuagent.api.admin import AdminActions, add_admin_routes
from gpuagent.api.hints import add_routes as add_hint_routes
from gpuagent.api.hints import if_none_match
from gpuagent.export import scrape
from gpuagent.httperrors import json_error, json_errors
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.views import allocation_view, to_jsonable

LatestSnapshot = Callable[[], NodeSnapshot | None]

MAX_REQUEST_BYTES = 64 * 1024
NVML_SOURCE = "nvml"  # the device source's name in NodeSnapshot.sources
_LATEST = web.AppKey("latest", object)
_REGISTRY = web.AppKey("registry", CollectorRegistry)
_CLOCK = web.AppKey("clock", object)
_STATE_CACHE = web.AppKey("state_cache", dict)


async def metrics(request: web.Request) -> web.Response:
    """The body is built (and gzipped) by ``export.scrape``, cached per snapshot there."""
    headers_in = request.headers
    result = scrape(request.app[_REGISTRY], headers_in.get("Accept"), headers_in.get("Accept-Encoding"))
    headers = {"Content-Type": result.content_type, "Vary": "Accept, Accept-Encoding"}
    if result.gzipped:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=result.body, headers=headers)


def _latest(request: web.Request) -> NodeSnapshot | None:
    return request.app[_LATEST]()  # type: ignore[operator]


async def healthz(request: web.Request) -> web.Response:
    """Alive while the poller keeps publishing, even if every GPU is stale (that is not the agent's fault)."""
    snapshot = _latest(request)
    if snapshot is None:
        return web.json_response({"status": "starting"})
    age = request.app[_CLOCK]() - snapshot.taken_at_unix  # type: ignore[operator]
    limit = max(30.0, 5 * snapshot.poll_interval_seconds)
    if age > limit:
        return web.json_response(
            {"status": "stuck", "snapshot_age_seconds": round(age, 3), "limit_seconds": limit}, status=503
        )
    return web.json_response({"status": "ok", "snapshot_age_seconds": round(age, 3)})


async def readyz(request: web.Request) -> web.Response:
    """Ready once a snapshot is published and NVML answered its poll. NVML down (no driver, a driver
    being reinstalled) is unready with the reason: the agent keeps retrying, serves no GPU figures it did
    not read, and a rollout or a load balancer sees that this node is not being monitored."""
    snapshot = _latest(request)
    if snapshot is None:
        return web.json_response({"status": "waiting for the first poll"}, status=503)
    nvml = next((source for source in snapshot.sources if source.name == NVML_SOURCE), None)
    if nvml is not None and not nvml.ok:
        return web.json_response({"status": "NVML unavailable, retrying every poll", "reason": nvml.error,
                                  "backend": snapshot.backend}, status=503)
    return web.json_response({"status": "ready", "gpus": len(snapshot.gpus), "backend": snapshot.backend})


async def state(request: web.Request) -> web.Response:
    """The snapshot; its ETag names the poll, so a client asking faster than the agent polls (``gpuagent
    top``) gets a 304 for a snapshot it already has. Freshness is /healthz's to judge, not the ETag's."""
    snapshot = _latest(request)
    if snapshot is None:
        return json_error(503, "no snapshot yet: the first poll has not finished")
    cache = request.app[_STATE_CACHE]
    if cache.get("snapshot") is not snapshot:  # serialise each snapshot once, however many readers
        body = {**to_jsonable(snapshot), "allocation": allocation_view(snapshot)}
        cache["body"] = json.dumps(body, separators=(",", ":")).encode()
        cache["generation"] = generation = cache.get("generation", 0) + 1  # this app's snapshots, counted
        cache["etag"] = f'"{cache["instance"]}-{generation}"'
        cache["snapshot"] = snapshot
    headers = {"ETag": cache["etag"], "Cache-Control": "no-cache"}
    if if_none_match(request.headers.get("If-None-Match", ""), cache["etag"]):
        return web.Response(status=304, headers=headers)
    return web.Response(body=cache["body"], content_type="application/json", headers=headers)


def app_registry(app: web.Application) -> CollectorRegistry:
    """The registry ``app`` serves on ``/metrics`` (the server adds its own collectors to it)."""
    return app[_REGISTRY]


def build_app(
    latest: LatestSnapshot, registry: CollectorRegistry, *, clock: Callable[[], float] = time.time,
    admin: AdminActions | None = None, admin_token_file: str | None = None,
) -> web.Application:
    """The agent's app. The admin routes (``gpuagent.api.admin``) exist only with both ``admin`` and
    ``admin_token_file``: without a token they are served on the admin unix socket alone."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_REQUEST_BYTES)
    app[_LATEST] = latest
    app[_REGISTRY] = registry
    app[_CLOCK] = clock
    app[_STATE_CACHE] = {"instance": secrets.token_hex(4)}  # a restarted agent's ETags are new ones
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/state", state)
    add_hint_routes(app, latest, clock=clock)  # /v1/hints, /v1/hints/score, /openapi.json
    if admin is not None and admin_token_file:
        add_admin_routes(app, admin, token_file=admin_token_file)
    return app
