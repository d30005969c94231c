"""The HTTP listeners' defence against slow and many clients: a header timeout, a connection cap that keeps
room for scrapes and probes, a budget for request bodies in flight, and evictions instead of running out of
file descriptors or memory.

aiohttp bounds the request line and headers (``max_line_size``, ``max_field_size``, ``max_headers``) and
closes idle keep-alive connections (``keepalive_timeout``), but has no connection cap and, before 3.14, no
bound on a request head sent a byte at a time. So each accepted connection is wrapped (``GuardedSite``
makes the listener with ``ConnectionGuard``'s protocol factory):

- a connection that has not finished its request head ``header_timeout_seconds`` after it opened, or after
  the first byte of its next request, is closed (slowloris); TLS handshakes get the same bound;
- at ``max_connections`` open, a new connection closes the oldest one that is not being answered (a client
  that sent nothing, or half a head, or is idle between requests, or is being drained after a refusal, or
  is being sent an answer it does not read: aiohttp writes an answer after the handler returned it) rather
  than being refused, so a scrape always gets in however many slow clients there are, and the process
  never holds more sockets than the cap (sized below the unit's ``LimitNOFILE``, and lowered to fit a
  smaller open-file limit: no EMFILE, no accept-error storm; :func:`raise_open_file_limit` first raises
  the soft limit to the hard one, as Go programs do, since containerd gives containers a soft 1,024);
- a closed connection ends what aiohttp was doing for it (``handler_cancellation``): without it, a
  connection evicted while aiohttp drained the unread body of a refused request kept its task, buffers and
  timers for the whole ``lingering_time``, uncounted, and a flood that kept reconnecting piled them up
  (600 clients trickling bodies: 63 to 265 MB in 4 s, the shipped 256 MiB limit's OOM kill);
- an answer the client does not read closes the connection after ``send_timeout_seconds`` (slow
  readers). What a connection holds for its client is bounded: the kernel's send buffer is set to
  ``send_buffer_bytes`` (autotuned, it grows to 4 MiB a socket, charged to the pod's memory), and the
  transport's high-water mark to ``SEND_HIGH_WATER``, so aiohttp starts no pipelined answer while the last
  one waits; past ``send_budget_bytes`` waiting in all, the longest-waiting connection is closed;
- requests being answered count against the cap minus ``reserved``, except those for ``priority_paths``
  (``/metrics``, ``/healthz``, ``/readyz``): past it, other requests get a 503 with ``Retry-After``, and
  the reserved slots stay free for the scraper and the kubelet's probes;
- request bodies in flight share one budget (``body_budget_bytes``) per guard, i.e. per listener, and a
  process has one: a request that will read a body reserves its ``Content-Length`` (the route's largest
  body, ``client_max_size``, when chunked or compressed) when its handler starts, and returns it when the
  handler ends. A head alone reserves nothing, nor does a request for an unknown path or method (refused
  before its body is read, ``gpuagent.httperrors``); a body that does not fit is a 503 with
  ``Retry-After``, unread, and the connection closes.

What each refusal and eviction cost is counted (``gpuagent_http_*``, :class:`GuardCollector`). Body reads
are bounded where bodies are read (``gpuagent.httpbody``, which also inflates them: aiohttp's own inflation
is off, so the rest of a body refused at a cap is read raw and dropped for at most ``lingering_time``,
never inflated, and the client still reads the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from ssl import SSLContext
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuagent.httperrors import Handler, JsonErrorRequestHandler, json_error

log = logging.getLogger(__name__)

PROBES_AND_SCRAPES = frozenset({"/metrics", "/healthz", "/readyz"})
# The listen backlog, which is also how many connections asyncio accepts in one go, before any is counted.
BACKLOG = 64
# Open files left to the process itself (NVML, /proc reads, sockets to the kubelet: 256) and to accepts in
# flight: a burst reaches connection_made two or three loop iterations after it is accepted, and an evicted
# socket is closed one or two after its abort (measured: 2,000 at once peak at the cap + ~450).
FILES_KEPT = 256 + 6 * BACKLOG
MIN_CONNECTIONS = 16
SEND_HIGH_WATER = 16 * 1024  # the transport's: above it the answer being written waits (asyncio's: 64 KiB)


@dataclass(frozen=True)
class ServerLimits:
    """What one listener allows; see the module docstring."""

    max_connections: int = 512
    reserved: int = 16
    header_timeout_seconds: float = 5.0
    keepalive_seconds: float = 15.0
    send_timeout_seconds: float = 10.0
    send_buffer_bytes: int = 64 * 1024
    send_budget_bytes: int = 16 * 1024 * 1024
    body_budget_bytes: int = 16 * 1024 * 1024
    priority_paths: frozenset[str] = field(default=PROBES_AND_SCRAPES)

    def runner_options(self) -> dict[str, Any]:
        """aiohttp's own options, for ``web.AppRunner``: idle keep-alive, request line and header sizes,
        the time an unread body is drained, no inflation (``gpuagent.httpbody`` inflates, bounded), and a
        closed connection's handler cancelled (the handlers change nothing before their body is read)."""
        return {"keepalive_timeout": self.keepalive_seconds, "max_line_size": 8190, "max_field_size": 8190,
                "lingering_time": self.header_timeout_seconds, "auto_decompress": False,
                "handler_cancellation": True}


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind a timer and the guard's bookkeeping."""

    __slots__ = ("answer_bytes", "busy", "guard", "handler", "stall", "stalled_bytes", "timer", "transport")

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self.guard = guard
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None  # the request head's deadline
        self.stall: asyncio.TimerHandle | None = None  # the deadline for the client to read what it was sent
        self.stalled_bytes = 0  # what waited for the client when it stopped reading
        self.answer_bytes = 0  # the body of the answer being written, held until it is all sent
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.guard.limits.send_buffer_bytes)
        transport.set_write_buffer_limits(high=SEND_HIGH_WATER)  # type: ignore[attr-defined]
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
        self._unstall()
        self.guard._closed(self)
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.stall is None and self.transport is not None:
            self.stall = asyncio.get_running_loop().call_later(self.guard.limits.send_timeout_seconds,
                                                                self._not_reading)
            self.stalled_bytes = self.transport.get_write_buffer_size() + self.answer_bytes
            self.guard._stalling(self)
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self._unstall()
        self.handler.resume_writing()

    def _unstall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None
            self.guard._unstalled(self)

    def _not_reading(self) -> None:
        self.guard.send_timed_out += 1
        self.close()

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
        """Abort the connection; it is no one's victim again while its close is under way."""
        self.guard._waiting.pop(self, None)
        self._unstall()
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


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the process's soft RLIMIT_NOFILE to its hard limit, as Go's runtime does at start: the soft
    limit exists for programs that use ``select()``, which asyncio does not, and containerd 2 gives
    containers a soft 1,024 under a hard 524,288. Returns the soft limit (before, after); logged when raised.
    A hard limit of "unlimited" is left alone (the kernel caps open files at ``fs.nr_open`` and refuses
    more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and soft >= hard):
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft, soft
    log.info("raised the open-file limit from %d to its hard limit %d", soft, hard)
    return soft, hard


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
        self._stalled: OrderedDict[_Connection, None] = OrderedDict()  # client not reading, longest first
        self.stalled_bytes = 0  # what the stalled connections held when they stalled
        self._by_handler: dict[Any, _Connection] = {}
        self._answering_others = 0  # requests for paths other than the priority ones, being answered
        self.open = 0
        self.body_bytes = 0  # reserved by the bodies being read now
        self.evicted = 0  # closed to make room for a new connection
        self.timed_out = 0  # closed for a request head not in within the timeout
        self.send_timed_out = 0  # closed for an answer not read within the send timeout
        self.send_evicted = 0  # closed for holding the oldest unread answer when they were over the budget
        self.refused = 0  # closed at once: every connection was being answered
        self.busy_refused = 0  # requests answered 503 to keep the reserved slots free
        self.body_refused = 0  # requests answered 503 for want of room in the body budget

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._middleware)

    def protocol_factory(self, server: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        def make() -> asyncio.Protocol:
            return _Connection(self, JsonErrorRequestHandler.adopt(server()))

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

    def _stalling(self, conn: _Connection) -> None:
        """``conn``'s client stopped reading: past the send budget, those stalled longest go (a scraper
        reading its answer stops for moments, so it is not the oldest)."""
        self._stalled[conn] = None
        self.stalled_bytes += conn.stalled_bytes
        while self.stalled_bytes > self.limits.send_budget_bytes:
            self.send_evicted += 1
            next(iter(self._stalled)).close()

    def _unstalled(self, conn: _Connection) -> None:
        if conn in self._stalled:
            del self._stalled[conn]
            self.stalled_bytes -= conn.stalled_bytes

    def body_reservation(self, request: web.BaseRequest) -> int:
        """What ``request``'s body may cost while it is read: nothing without a body or for an unknown path
        or method (never read); its ``Content-Length``, up to the app's largest body; that largest body when
        the length is not known (chunked) or the body is compressed (inflated up to it)."""
        if not request.body_exists or request.match_info.http_exception is not None:
            return 0
        largest = request.client_max_size
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if request.content_length is None or encoding not in ("", "identity"):
            return largest
        return min(request.content_length, largest)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self._by_handler.get(request.protocol)
        if conn is None:  # not through this guard's listener
            return await handler(request)
        conn.busy = True
        conn.disarm()
        self._waiting.pop(conn, None)
        other = request.path not in self.limits.priority_paths
        body = self.body_reservation(request)
        try:
            if other and self._answering_others >= self.limits.max_connections - self.limits.reserved:
                self.busy_refused += 1
                return _refusal("too many requests at once; slots are kept for /metrics and the probes")
            if body > self.limits.body_budget_bytes - self.body_bytes:
                self.body_refused += 1
                return _refusal("too many request bodies being read at once", "body")
            self._answering_others += other
            self.body_bytes += body
            try:
                response = await handler(request)
            finally:
                self._answering_others -= other
                self.body_bytes -= body
            conn.answer_bytes = response.content_length or 0  # aiohttp writes it after this returns
            return response
        finally:
            conn.busy = False
            transport = conn.transport
            if conn.handler in self._by_handler and transport is not None and not transport.is_closing():
                self._waiting[conn] = None  # idle again: evictable, timed from its next byte


def _refusal(message: str, field: str | None = None) -> web.Response:
    """A 503 for a request refused unread: try again in a second, on a new connection."""
    response = json_error(503, message, field, headers={"Retry-After": "1"})
    response.force_close()
    return response


class GuardCollector:
    """``guard``'s connections, evictions and refusals as metric families (``gpuagent_http_*``), read live:
    what a flood of slow or many clients cost, and whom it turned away."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def collect(self) -> list[Metric]:
        guard = self._guard
        closed = CounterMetricFamily(
            "gpuagent_http_connections_closed", "Connections the listener closed itself, by reason: evicted "
            "(not being answered, to make room), refused (no room), "
            "header_timeout, send_timeout, send_budget (the longest unread answer, over the budget).",
            labels=["reason"])
        for reason, count in (("evicted", guard.evicted), ("refused", guard.refused),
                              ("header_timeout", guard.timed_out),
                              ("send_timeout", guard.send_timed_out), ("send_budget", guard.send_evicted)):
            closed.add_metric([reason], count)
        refused = CounterMetricFamily(
            "gpuagent_http_requests_refused", "Requests answered 503 unread, by reason: busy (the slots left "
            "are kept for /metrics and the probes), body_budget (too many bodies being read at once).",
            labels=["reason"])
        refused.add_metric(["busy"], guard.busy_refused)
        refused.add_metric(["body_budget"], guard.body_refused)
        return [
            GaugeMetricFamily("gpuagent_http_connections_open", "Connections open on the listener.",
                              value=guard.open),
            GaugeMetricFamily("gpuagent_http_connections_max", "The listener's connection cap (fitted to the "
                              "open-file limit).", value=guard.limits.max_connections),
            closed,
            refused,
            GaugeMetricFamily("gpuagent_http_body_reserved_bytes", "Bytes of the request-body budget held by "
                              "the bodies being read now.", value=guard.body_bytes),
            GaugeMetricFamily("gpuagent_http_body_budget_bytes", "The request-body budget.",
                              value=guard.limits.body_budget_bytes),
        ]


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
