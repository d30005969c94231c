"""Running ``gpuagent extender``: the extender built from its options, served until told to stop.

``from_options`` builds the ``Extender`` (``hints.extender``) and its node source as the options say: the
cluster view of the agents' published GPUNodeStates where the API server is used, else the agents' cache
of ``/v1/hints`` over HTTP with the lister of the nodes it knows, and the reader of pods' ResourceClaims.
``serve`` starts them and the HTTP app (``hints.extender_app``) behind TLS when given and the connection
guard (``gpuagent.httpguard``: slow and many clients), tunes the garbage collector of a process holding
every node's state, and closes everything on the way out; ``run`` is the CLI entry (``gpuagent.cli``
imports it on demand). It is apart from the judging and the app because wiring a process together (its
options, listener, signals and lifetime) is one job and answering a call another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Callable

from aiohttp import web

from gpuagent import gctune
from gpuagent.hints.agents import AgentCache, AgentDirectory, AgentTLS
from gpuagent.hints.claim_reader import ClaimReader
from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import MAX_BODY_BYTES, build_app, build_registry
from gpuagent.hints.extender_config import ExtenderOptions
from gpuagent.hints.nodes import KnownNodes, NodeLister
from gpuagent.httpguard import (
    ConnectionGuard,
    GuardCollector,
    GuardedSite,
    ServerLimits,
    raise_open_file_limit,
)

# The extender's log lines keep the one logger name they had when it was one module (operators filter on it).
log = logging.getLogger("gpuagent.hints.extender")

# The garbage collector of the extender's process (``tune_garbage_collector``): its view holds every node's
# state for hours and each call makes a few objects per node; at CPython's thresholds the collections a
# call met added 15 ms to a never-seen pod's p99 over 5,000 nodes (48.6 against 33.8 ms with none).
GC_THRESHOLDS = (50_000, 20, 100)


async def serve(
    extender: Extender,
    *,
    host: str,
    port: int,
    prefix: str = "",
    ssl_context: ssl.SSLContext | None = None,
    stop: asyncio.Event | None = None,
    started: Callable[[int], None] | None = None,
    lister: NodeLister | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT when no event is given): the cache, its refresher,
    the node lister and the HTTP listener; everything is closed on the way out."""
    stop = stop or _stop_on_signals()
    registry = build_registry(extender)
    checks_certs = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
    app = build_app(extender, registry, prefix=prefix, max_body_bytes=max_body_bytes,
                    verbs_need_client_cert=checks_certs)
    raise_open_file_limit()  # before the guard fits its cap to it
    # Slow and many clients: docs/operations.md#security-model. Bodies in flight may hold four of the largest
    # at once: kube-scheduler's calls (a filter and a prioritize, a retry beside them) are never refused
    # unread for the budget while the extender stays within its memory limit (512 Mi).
    budget = max(ServerLimits.body_budget_bytes, 4 * max_body_bytes)
    guard = ConnectionGuard(ServerLimits(body_budget_bytes=budget))
    guard.install(app)
    registry.register(GuardCollector(guard))
    runner = web.AppRunner(app, access_log=None, **guard.limits.runner_options())  # cancels closed handlers
    await extender.cache.start()
    await runner.setup()
    tune_garbage_collector()
    listing = asyncio.create_task(lister.run(stop), name="node-list") if lister is not None else None
    try:
        site = GuardedSite(runner, host, port, guard, ssl_context=ssl_context, reuse_address=True)
        await site.start()
        bound = site.port
        log.info("extender listening on %s:%d%s (%d agents known)", host, bound, prefix, len(extender.cache))
        if started is not None:
            started(bound)
        await extender.cache.run(stop)
    finally:
        if listing is not None:
            listing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listing
        await runner.cleanup()
        await extender.cache.close()
        await extender.claims.close()
        log.info("extender stopped")


def tune_garbage_collector() -> None:
    """Once the extender is built (and again by the cluster view after each list, which freezes): see
    ``GC_THRESHOLDS``."""
    gctune.tune(*GC_THRESHOLDS)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class NoNodeSource(Exception):
    """Neither an agents file nor the API server: the extender would know no node."""


def from_options(
    options: ExtenderOptions, *, agent_ssl: ssl.SSLContext | None = None
) -> tuple[Extender, NodeLister | None]:
    """The extender, its node source and the lister of the nodes it knows, as ``options`` say (``serve``
    starts them): the cluster view of the agents' published GPUNodeStates where the API server is used
    (``cluster_view``; it knows the nodes that publish, no lister), else the agents' ``/v1/hints`` fetched
    over HTTP for the nodes it knows. Raises ``NoNodeSource`` when it could know no node."""
    claims = claim_reader(options)
    view = cluster_view(options)
    if view is not None:
        return Extender(view, max_age_seconds=options.published_max_age,
                        gpu_resource_names=options.gpu_resource_names, claims=claims), None
    directory = AgentDirectory(template=options.agent_url, urls=options.agent_urls)
    if agent_ssl is None and (options.agent_ca_file or options.agent_cert_file):
        agent_ssl = AgentTLS(options.agent_ca_file, options.agent_cert_file, options.agent_key_file).context()
    known = KnownNodes(options.agent_urls)
    lister = None
    if claims.connection is not None and options.agent_url is not None:
        lister = NodeLister(claims.connection, known, timeout=max(options.timeout, 10.0))
    elif not options.agent_urls:
        raise NoNodeSource(
            "the extender fetches the hints of the nodes it knows only, and knows none: give it an agents "
            "file (agents) or access to the API server's node list (kubernetes_api, kubeconfig)"
        )
    cache = AgentCache(
        directory,
        timeout_seconds=options.timeout,
        refresh_interval_seconds=options.refresh_interval,
        forget_after_seconds=options.forget_after,
        max_concurrent_fetches=options.max_concurrent_fetches,
        ssl_context=agent_ssl,
        known=known,
    )
    extender = Extender(cache, max_age_seconds=options.max_age, gpu_resource_names=options.gpu_resource_names,
                        claims=claims)
    return extender, lister


def cluster_view(options: ExtenderOptions) -> ClusterView | None:
    """The list-and-watch of GPUNodeStates: when asked, or (auto) with a kubeconfig or inside a cluster."""
    from gpuagent.kubeapi import ApiConnection, api_server_available

    if options.cluster_view == "off" or (
        options.cluster_view == "auto" and not (options.kubeconfig or api_server_available())
    ):
        return None
    connection = ApiConnection(kubeconfig_path=options.kubeconfig, request_timeout=max(options.timeout, 10.0))
    return ClusterView(connection=connection, sync_timeout=options.timeout)


def claim_reader(options: ExtenderOptions) -> ClaimReader:
    """Reads pods' ResourceClaims where the API server can be used: when asked (``kubernetes_api: on``), or
    (auto) with a kubeconfig or inside a cluster with a service account token."""
    from gpuagent.kubeapi import ApiConnection, api_server_available

    connection = None
    if options.kubernetes_api == "on" or (
        options.kubernetes_api == "auto" and (options.kubeconfig or api_server_available())
    ):
        connection = ApiConnection(kubeconfig_path=options.kubeconfig, request_timeout=options.timeout)
    return ClaimReader(connection, gpu_classes=options.gpu_device_classes,
                       mig_classes=options.mig_device_classes, timeout=options.timeout)


def run(options: ExtenderOptions, *, ssl_context: ssl.SSLContext | None = None) -> int:
    """``gpuagent extender``: serve until SIGTERM/SIGINT; the exit status."""
    try:
        extender, lister = from_options(options)
    except (ssl.SSLError, OSError) as exc:
        log.error(
            "cannot load the TLS files for the agents (agent_ca_file, agent_cert_file, agent_key_file): %s",
            exc,
        )
        return 2
    except NoNodeSource as exc:
        log.error("%s", exc)
        return 2
    asyncio.run(
        serve(
            extender,
            host=options.listen_host,
            port=options.listen_port,
            prefix=options.url_prefix,
            ssl_context=ssl_context,
            lister=lister,
            max_body_bytes=options.max_body_bytes,
        )
    )
    return 0
