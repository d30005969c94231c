"""JSON error answers for every HTTP server of the project (the agent's API and the extender).

Errors are ``{"error": ..., "field": ...}`` with a 4xx/5xx status, never an HTML page; the middleware turns
aiohttp's own 404/405/413 into the same shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

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
