"""JSON error answers for every HTTP server of the project (the agent's API and the extender), and the
words for a failed request of its HTTP clients (the extender's and ``gpuagent top``'s, both aiohttp).

Errors are ``{"error": ..., "field": ...}`` with a 4xx/5xx status, never an HTML page; the middleware turns
aiohttp's own 404/405/413 into the same shape, and a refusal that leaves a request's body unread closes the
connection once answered (the body is never read into memory: aiohttp drains it for at most its lingering
time). A request aiohttp cannot even parse never reaches the app: :class:`JsonErrorRequestHandler`
answers it with the same JSON shape instead of aiohttp's plain text, and it is logged as one line
(:func:`server_logger`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(
    status: int, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    body: dict[str, str] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404/405/413 pages become JSON errors like ours."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = json_error(exc.status, exc.reason or "error")
        if "Allow" in exc.headers:  # a 405 says which methods the path takes (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        if request.body_exists and not request.content.is_eof():
            response.force_close()  # an unknown path or method: its body is not read, nor the next request
        return response


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering a request it cannot parse (a bad request line, a header over
    the limits) with a JSON error like the app's, not aiohttp's plain text. aiohttp builds such answers in
    ``handle_error`` outside the app, so no middleware sees them; ``adopt`` gives a handler this class."""

    __slots__ = ()

    @classmethod
    def adopt(cls, handler: web.RequestHandler) -> web.RequestHandler:
        """``handler`` (made by aiohttp's ``Server``, which has no option for its class) as this class: the
        same slots, one method more."""
        if type(handler) is web.RequestHandler:
            handler.__class__ = cls
        return handler

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own logs it (one line through server_logger) and raises if an answer is under way.
        super().handle_error(request, status, exc, message)
        response = json_error(status, protocol_error_text(status, exc), "request")
        response.force_close()
        return response


def protocol_error_text(status: int, exc: BaseException | None) -> str:
    """What a request aiohttp could not handle gets told: the status's phrase, and for a 4xx what aiohttp
    found wrong (one line, clipped); a 5xx says nothing of the server's insides."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    detail = getattr(exc, "message", None) if status < 500 else None
    if not isinstance(detail, str) or not detail.strip():
        return phrase
    return f"{phrase}: {' '.join(detail.split())}"[:200]


def client_error_text(exc: aiohttp.ClientError) -> str:
    """A failed client request in a few words, for logs and views ("cannot connect: connection refused")."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"cannot connect: unknown host {exc.host}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "cannot connect: connection refused"
        return (
            f"cannot connect: {exc.os_error.strerror or exc.os_error}" if exc.os_error else "cannot connect"
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the agent closed the connection"
    return f"{type(exc).__name__}: {exc}"[:300]


async def read_body(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body of a client response, or None when it is over ``limit`` bytes (then not all read).

    ``response.content.read(n)`` would return whatever part has arrived: a body in several segments would be
    cut short."""
    if response.content_length is not None and response.content_length > limit:
        return None
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a 100 KB header line, a malformed request line) with its
    whole traceback at ERROR: anyone who can connect fills the log. Such a record becomes one WARNING line
    naming the client and what was wrong (its outside bytes escaped by the handler's formatter); any other
    record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "bad request from %s: %d %s: %.120s", (
                remote, exc.code, type(exc).__name__, str(exc.message).replace("\n", " "))
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def server_logger(name: str = "gpuagent.http") -> logging.Logger:
    """The logger an aiohttp ``AppRunner`` (``logger=``) logs its request errors to: as aiohttp's own, but a
    request it could not parse is one line."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _OneLineBadRequests) for f in logger.filters):
        logger.addFilter(_OneLineBadRequests())
    return logger
