"""The extender's HTTP app: kube-scheduler's verbs, the probes and ``/metrics``, and the registry behind it.

``build_app`` routes ``POST <prefix>/filter`` and ``<prefix>/prioritize`` to the ``Extender``
(``hints.extender``), which judges the call and writes the reply; this module reads the request and
answers it. Malformed JSON is a 400 naming the field, never a 5xx: with ``ignorable: true`` the scheduler
then goes on without the extender. Any other exception in a handler is a JSON 500 (``_internal_errors``),
never aiohttp's plain-text page. Bodies are read within bounds (``gpuagent.httpbody``: size before and
after inflation, time, JSON depth and values), at most ``BODIES_AT_ONCE`` at a time so memory stays
bounded whatever is sent. ``build_registry`` puts the extender's metrics (``hints.extender_metrics``) on
the registry ``/metrics`` serves. It is apart from the judging because speaking HTTP to hostile clients is
one job and judging nodes another; serving it (TLS, the connection guard) is ``hints.extender_serve``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_metrics import AgentsCollector, ExtenderMetrics
from gpuagent.hints.extender_protocol import ArgsError
from gpuagent.httpbody import BodyError, BodyLimits, error_response, parse_json, read_body
from gpuagent.httperrors import Handler, json_error, json_errors

# The extender's log lines keep the one logger name they had when it was one module (operators filter on it).
log = logging.getLogger("gpuagent.hints.extender")

MAX_BODY_BYTES = 8 * 1024 * 1024  # NodeNames of 5,000 nodes and a pod: ~0.2 MB; ~600 full Node objects
BODY_TIMEOUT_SECONDS = 10.0
BODIES_AT_ONCE = 2  # scheduler calls read, parsed and answered at once (kube-scheduler makes one at a time)


_EXTENDER = web.AppKey("extender", Extender)
_REGISTRY = web.AppKey("registry", CollectorRegistry)


_LIMITS = web.AppKey("body_limits", BodyLimits)
_BODY_SLOTS = web.AppKey("body_slots", asyncio.Semaphore)
_VERBS_NEED_CERT = web.AppKey("verbs_need_client_cert", bool)


def _verb(verb: str) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        if request.app[_VERBS_NEED_CERT] and not _client_certificate(request):
            return json_error(403, "the scheduler verbs need a client certificate signed by the web "
                              "config's client_ca_file (kube-scheduler's tlsConfig certFile and keyFile)",
                              "certificate")
        extender = request.app[_EXTENDER]
        limits = request.app[_LIMITS]
        metrics = extender.metrics
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with request.app[_BODY_SLOTS]:  # bodies in memory at once: bounded
                try:
                    body = parse_json(await read_body(request, limits), limits)
                except BodyError as err:
                    outcome = "bad_request"
                    return error_response(err)
                try:
                    reply = await extender.reply(verb, body)
                except ArgsError as err:
                    outcome = "bad_request"
                    log.info("%s: bad ExtenderArgs: %s", verb, err)
                    return json_error(400, err.message, err.field)
                return web.Response(body=reply, content_type="application/json")
        except Exception:
            outcome = "error"
            raise
        finally:
            if metrics is not None:
                metrics.requests.labels(verb, outcome).inc()
                metrics.duration.labels(verb).observe(time.perf_counter() - started)

    return handle


@web.middleware
async def _internal_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Any exception of a handler (a bug: a node's data cannot cause one, see ``Extender._judge``) is a JSON
    500 naming its type, as every error of the extender is JSON; the traceback goes to the log."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise  # aiohttp's own answers: ``json_errors`` words them
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return json_error(500, f"internal error ({type(exc).__name__}): the extender's log has the details")


def _client_certificate(request: web.Request) -> bool:
    """Whether the connection presented a client certificate (verified by the TLS handshake)."""
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


async def _healthz(request: web.Request) -> web.Response:
    extender = request.app[_EXTENDER]
    return web.json_response({"status": "ok", "agents": extender.cache.counts(extender.max_age_seconds)})


async def _readyz(request: web.Request) -> web.Response:
    """200 once the node source can judge nodes: the cluster view after its first list (a Deployment's
    readiness probe keeps kube-scheduler's calls away until then); the agents' cache at once."""
    source = request.app[_EXTENDER].cache
    if getattr(source, "synced", True):
        return web.json_response({"status": "ready", "nodes": len(source)})
    return web.json_response({"status": "waiting for the first list of GPUNodeStates"}, status=503)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(request.app[_REGISTRY]), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def build_app(
    extender: Extender, registry: CollectorRegistry, *, prefix: str = "",
    max_body_bytes: int = MAX_BODY_BYTES, verbs_need_client_cert: bool = False,
) -> web.Application:
    """The extender's routes: ``<prefix>/filter``, ``<prefix>/prioritize``, ``/healthz``, ``/readyz``,
    ``/metrics``.

    ``verbs_need_client_cert``: the verbs answer 403 to a connection that presented no (verified) client
    certificate; the probes and ``/metrics`` do not ask (the kubelet's probes have no certificate). The TLS
    listener verifies a certificate that is given (``client_auth_type: VerifyClientCertIfGiven``)."""
    app = web.Application(middlewares=[json_errors, _internal_errors], client_max_size=max_body_bytes)
    app[_EXTENDER] = extender
    app[_REGISTRY] = registry
    app[_LIMITS] = BodyLimits(max_bytes=max_body_bytes, timeout_seconds=BODY_TIMEOUT_SECONDS)
    app[_BODY_SLOTS] = asyncio.Semaphore(BODIES_AT_ONCE)
    app[_VERBS_NEED_CERT] = verbs_need_client_cert
    prefix = prefix.rstrip("/")
    app.router.add_post(f"{prefix}/filter", _verb("filter"))
    app.router.add_post(f"{prefix}/prioritize", _verb("prioritize"))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


def build_registry(extender: Extender) -> CollectorRegistry:
    """A registry with the extender's metrics; sets ``extender.metrics`` and the cache's fetch observer."""
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(registry)
    extender.metrics = metrics
    extender.cache.set_fetch_observer(metrics.observe_fetch)
    registry.register(AgentsCollector(extender.cache, extender.max_age_seconds))
    if isinstance(extender.cache, ClusterView):  # its writes by outcome and the nodes it refuses
        registry.register(extender.cache.collector())
    return registry

