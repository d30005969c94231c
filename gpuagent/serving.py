"""The agent's HTTP servers and its tasks, run together until a stop or the first failure, then shut down.

The API listener (TLS when the web config names a certificate, behind the connection guard that bounds
slow and many clients, with the soft open-file limit raised to the hard one first and the guard's counts
on ``/metrics``) and, when configured, the admin endpoints on their unix socket start first; then the
agent's tasks (the poller first, the watchers and writers after it). The first task to fail, or to end on
its own, is logged and stops the rest; ``stop`` being set (SIGTERM, SIGINT) ends them cleanly. Either way
the bounded shutdown runs (:mod:`gpuagent.shutdown`): the tasks cancelled, the HTTP servers drained, then
what the agent opened closed, in the order it gives. The agent (``gpuagent.agent``) says what to serve and
what to run; this module only runs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from gpuagent.api.admin import AdminActions, bind_admin_socket, build_admin_app
from gpuagent.api.app import app_registry
from gpuagent.api.tls import load_web_config, server_ssl_context
from gpuagent.config import ServerConfig
from gpuagent.httperrors import json_errors, server_logger
from gpuagent.httpguard import ConnectionGuard, GuardCollector, GuardedSite, raise_open_file_limit
from gpuagent.shutdown import Shutdown, Step

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

HTTP_DRAIN_SECONDS = 2.0  # at shutdown, requests in flight get this long (at most a quarter of the deadline)

TaskStarter = tuple[str, Callable[[], Coroutine[Any, Any, object]]]  # (task name, what it runs)


async def serve_until_stopped(
    server: ServerConfig,
    app: web.Application,
    *,
    admin: AdminActions | None,
    backend: str,
    poll_interval: float,
    poller: Callable[[], Coroutine[Any, Any, object]],
    tasks: Sequence[TaskStarter],
    stop: asyncio.Event,
    shutdown: Shutdown,
    closers: Sequence[tuple[str, Callable[[], Awaitable[object]]]],
) -> bool:
    """Serve ``app`` as ``server`` says (and the admin endpoints when ``admin`` and ``server.admin_socket``),
    run ``poller`` (every ``poll_interval``, which the serving line states) and ``tasks`` until ``stop`` is
    set or one of them fails or ends, then shut down with ``shutdown``: the HTTP servers first, then
    ``closers`` in order. True if the shutdown was clean."""
    from aiohttp import web

    drain = min(HTTP_DRAIN_SECONDS, server.shutdown_timeout / 4)
    raise_open_file_limit()  # before the guard fits its cap to it
    guard = ConnectionGuard()  # slow and many clients: docs/operations.md#security-model
    guard.install(app)
    app_registry(app).register(GuardCollector(guard))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=drain, logger=server_logger(),
                           **guard.limits.runner_options())
    await runner.setup()
    admin_runner = None
    if admin is not None and server.admin_socket:
        admin_runner = web.AppRunner(build_admin_app(admin, (json_errors,)), access_log=None,
                                     shutdown_timeout=drain, logger=server_logger())
    running: list[asyncio.Task[Any]] = []
    try:
        if admin_runner is not None:
            await admin_runner.setup()
            path = server.admin_socket
            await web.SockSite(admin_runner, bind_admin_socket(path)).start()
            log.info("serving the admin endpoints on unix socket %s (mode 0600)", path)
        web_config = server.web_config
        ssl_context = server_ssl_context(load_web_config(web_config)) if web_config else None
        host, port = server.listen_host, server.listen_port
        if admin is not None and server.admin_token_file and ssl_context is None:
            log.warning("the admin routes take their bearer token over plain HTTP on %s:%d: anyone on the "
                        "path can read it; serve TLS (web_config) or use the admin socket", host, port)
        site = GuardedSite(runner, host, port, guard, ssl_context=ssl_context)
        await site.start()
        log.info("serving on %s://%s:%d (backend %s, poll every %gs)", "https" if ssl_context else "http",
                 host, port, backend, poll_interval)
        running = [
            asyncio.create_task(poller(), name="poller"),
            asyncio.create_task(stop.wait(), name="stop"),
            *(asyncio.create_task(start(), name=name) for name, start in tasks),
        ]
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task.get_name() == "stop" or task.cancelled():
                continue
            if task.exception() is not None:
                log.error("task %s failed; stopping", task.get_name(), exc_info=task.exception())
                raise task.exception()  # type: ignore[misc]
            log.error("task %s ended on its own; stopping", task.get_name())
    finally:
        clean = await shutdown.run(running, [
            Step("http", runner.cleanup),
            *([Step("admin", admin_runner.cleanup)] if admin_runner is not None else []),
            *(Step(name, close) for name, close in closers),
        ])
        log.info("stopped" if clean else "stopped, leaving the above unfinished")
    return clean
