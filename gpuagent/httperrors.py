"""JSON error answers for every HTTP server of the project (the agent's API and the extender), and the
words for a failed request of its HTTP clients (the extender's and ``gpuagent top``'s, both aiohttp).

Errors are ``{"error": ..., "field": ...}`` with a 4xx/5xx status, never an HTML page; the middleware turns
aiohttp's own 404/405/413 into the same shape. A request aiohttp cannot even parse is answered 400 by
aiohttp and logged as one line (:func:`server_logger`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

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
        return response


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
