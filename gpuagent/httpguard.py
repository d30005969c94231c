"""The HTTP listeners' defence against slow and many clients: a header timeout, a connection cap that keeps
room for scrapes and probes, and evictions instead of running out of file descriptors.

aiohttp bounds the request line and headers (``max_line_size``, ``max_field_size``, ``max_headers``) and
closes idle keep-alive connections (``keepalive_timeout``), but has no connection cap and, before 3.14, no
bound on a request head sent a byte at a time. So each accepted connection is wrapped (``GuardedSite``
makes the listener with ``ConnectionGuard``'s protocol factory):

- a connection that has not finished its request head ``header_timeout_seconds`` after it opened, or after
  the first byte of its next request, is closed (slowloris); TLS handshakes get the same bound;
- at ``max_connections`` open, a new connection closes the oldest one that is not being answered (a client
  that sent nothing, or half a head, or is idle between requests) rather than being refused, so a scrape
  always gets in however many slow clients there are, and the process never holds more sockets than the
  cap (sized below the unit's ``LimitNOFILE``, and lowered to fit a smaller open-file limit: no EMFILE,
  no accept-error storm);
- requests being answered count against the cap minus ``reserved``, except those for ``priority_paths``
  (``/metrics``, ``/healthz``, ``/readyz``): past it, other requests get a 503 with ``Retry-After``, and
  the reserved slots stay free for the scraper and the kubelet's probes.

Body reads are bounded where bodies are read (``gpuagent.httpbody``, which also inflates them: aiohttp's
own inflation is off, so the rest of a body refused at a cap is read raw and dropped for at most
``lingering_time``, never inflated, and the client still reads the answer).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from ssl import SSLContext
from typing import Any

from aiohttp import web

from gpuagent.httperrors import Handler, json_error

log = logging.getLogger(__name__)

PROBES_AND_SCRAPES = frozenset({"/metrics", "/healthz", "/readyz"})
# The listen backlog, which is also how many connections asyncio accepts in one go, before any is counted.
BACKLOG = 64
# Open files left to the process itself (NVML, /proc reads, sockets to the kubelet: 256) and to accepts in
# flight: a burst reaches connection_made two or three loop iterations after it is accepted, and an evicted
# socket is closed one or two after its abort (measured: 2,000 at once peak at the cap + ~450).
FILES_KEPT = 256 + 6 * BACKLOG
MIN_CONNECTIONS = 16


@dataclass(frozen=True)
class ServerLimits:
    """What one listener allows; see the module docstring."""

    max_connections: int = 512
    reserved: int = 16
    header_timeout_seconds: float = 5.0
    keepalive_seconds: float = 15.0
    priority_paths: frozenset[str] = field(default=PROBES_AND_SCRAPES)

    def runner_options(self) -> dict[str, Any]:
        """aiohttp's own options, for ``web.AppRunner``: idle keep-alive, request line and header sizes,
        the time an unread body is drained, and no inflation (``gpuagent.httpbody`` inflates, bounded)."""
        return {"keepalive_timeout": self.keepalive_seconds, "max_line_size": 8190, "max_field_size": 8190,
                "lingering_time": self.header_timeout_seconds, "auto_decompress": False}


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind a timer and the guard's bookkeeping."""

    __slots__ = ("busy", "guard", "handler", "timer", "transport")

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self.guard = guard
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.guard._opened(self)
        self.handler.connection_made(transport)
        if self.transport is not None and not self.transport.is_closing():
            self.arm()

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.timer is None:
            self.arm()  # the first byte of a request: its head must be in within the timeout
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.guard._closed(self)
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def arm(self) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout_seconds, self._too_slow)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        if not self.busy:
            self.guard.timed_out += 1
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def fitted(limits: ServerLimits, open_files: int | None) -> ServerLimits:
    """``limits`` with a connection cap that fits ``open_files`` (the process's soft RLIMIT_NOFILE; None:
    unlimited), leaving ``FILES_KEPT`` for the process's own files, and never below ``MIN_CONNECTIONS``."""
    if open_files is None or open_files - FILES_KEPT >= limits.max_connections:
        return limits
    cap = max(MIN_CONNECTIONS, open_files - FILES_KEPT)
    return replace(limits, max_connections=cap, reserved=min(limits.reserved, cap // 4))


def _open_files() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class ConnectionGuard:
    """Counts, times and evicts one listener's connections; ``install(app)`` before ``runner.setup()``.
    The cap is lowered to fit the process's open-file limit (logged), so connections never exhaust it."""

    def __init__(self, limits: ServerLimits | None = None, *, open_files: int | None = -1) -> None:
        wanted = limits or ServerLimits()
        self.limits = fitted(wanted, _open_files() if open_files == -1 else open_files)
        if self.limits.max_connections < wanted.max_connections:
            log.warning("the open-file limit leaves room for %d connections, not %d: raise it (LimitNOFILE) "
                        "for the full cap", self.limits.max_connections, wanted.max_connections)
        self._waiting: OrderedDict[_Connection, None] = OrderedDict()  # not being answered, oldest first
        self._by_handler: dict[Any, _Connection] = {}
        self._answering_others = 0  # requests for paths other than the priority ones, being answered
        self.open = 0
        self.evicted = 0  # closed to make room for a new connection
        self.timed_out = 0  # closed for a request head not in within the timeout
        self.refused = 0  # closed at once: every connection was being answered
        self.busy_refused = 0  # requests answered 503 to keep the reserved slots free

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._middleware)

    def protocol_factory(self, server: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        def make() -> asyncio.Protocol:
            return _Connection(self, server())

        return make

    def _opened(self, conn: _Connection) -> None:
        self.open += 1
        self._by_handler[conn.handler] = conn
        self._waiting[conn] = None
        if self.open <= self.limits.max_connections:
            return
        oldest = next(iter(self._waiting))
        if oldest is conn:  # every other connection is being answered
            self.refused += 1
        else:
            self.evicted += 1
        oldest.close()

    def _closed(self, conn: _Connection) -> None:
        if self._by_handler.pop(conn.handler, None) is not None:
            self.open -= 1
        self._waiting.pop(conn, None)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self._by_handler.get(request.protocol)
        if conn is None:  # not through this guard's listener
            return await handler(request)
        conn.busy = True
        conn.disarm()
        self._waiting.pop(conn, None)
        other = request.path not in self.limits.priority_paths
        try:
            if other:
                if self._answering_others >= self.limits.max_connections - self.limits.reserved:
                    self.busy_refused += 1
                    return json_error(503, "too many requests at once; slots are kept for /metrics and "
                                      "the probes", headers={"Retry-After": "1", "Connection": "close"})
                self._answering_others += 1
            try:
                return await handler(request)
            finally:
                if other:
                    self._answering_others -= 1
        finally:
            conn.busy = False
            if conn.handler in self._by_handler:
                self._waiting[conn] = None  # idle again: evictable, timed from its next byte


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with ``guard``'s protocol factory; ``port`` is the bound port once started."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, *,
        ssl_context: SSLContext | None = None, reuse_address: bool | None = None, backlog: int = BACKLOG,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self._reuse_address = reuse_address

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, reuse_address=self._reuse_address,
            ssl_handshake_timeout=self._guard.limits.header_timeout_seconds if self._ssl_context else None,
        )
        if self._server.sockets:
            self._port = self._server.sockets[0].getsockname()[1]
