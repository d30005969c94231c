"""State-changing admin endpoints: ``POST /v1/admin/thaw`` and ``POST /v1/admin/reload-policies``.

Off by default: the routes exist only when the config enables them, in one or both of two ways:

- ``admin_token_file``: the routes are on the main listener and need ``Authorization: Bearer <token>``.
  The token is the file's content (surrounding whitespace stripped), re-read when the file changes
  (rotation needs no restart), compared in constant time (:func:`hmac.compare_digest`). No or a wrong
  token is a 401 with ``WWW-Authenticate: Bearer``; an unreadable or empty file refuses everyone (the file
  is read by :class:`gpuagent.api.tokens.TokenFile`; the agent refuses to start with an empty one).
- ``admin_socket``: the routes are served on a unix socket created with mode 0600, without a token: who
  can open the socket is the access control. With only the socket set, the TCP listener has no admin route.

The api layer does not know the enforcer or the agent: the agent hands in :class:`AdminActions`, two
callables. They run on the event loop, like the poll that also drives the enforcer.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpuagent.api.tokens import TokenFile
from gpuagent.config import ConfigError
from gpuagent.httpbody import BodyError, BodyLimits, parse_json, read_body
from gpuagent.httperrors import Handler, json_error

log = logging.getLogger(__name__)

THAW_PATH = "/v1/admin/thaw"
RELOAD_PATH = "/v1/admin/reload-policies"
MAX_PAUSE_SECONDS = 3600.0
MAX_ADMIN_BODY_BYTES = 4096
_LIMITS = BodyLimits(max_bytes=MAX_ADMIN_BODY_BYTES, timeout_seconds=10.0)
SOCKET_MODE = 0o600


@dataclass(frozen=True)
class AdminActions:
    """What the admin endpoints do, supplied by the agent.

    ``thaw(pause_seconds)`` thaws everything the enforcer froze, pauses throttling that long and returns
    the JSON answer; ``reload_policies()`` re-reads and applies the config file's ``policies:`` and
    returns the JSON answer, or raises :class:`ConfigError` (the old policies then stay).
    """

    thaw: Callable[[float], Mapping[str, Any]]
    reload_policies: Callable[[], Mapping[str, Any]]


def _guarded(handler: Handler, tokens: TokenFile | None) -> Handler:
    """``handler`` behind the bearer token (``tokens`` None: no token, the unix socket's case)."""
    if tokens is None:
        return handler

    async def checked(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if tokens.accepts(header):
            return await handler(request)
        challenge = 'Bearer realm="gpuagent admin"'
        if header:
            challenge += ', error="invalid_token"'
        message = "wrong bearer token" if header else "this endpoint needs Authorization: Bearer <token>"
        return json_error(401, message, "Authorization", headers={"WWW-Authenticate": challenge})

    return checked


async def _body(request: web.Request) -> dict[str, Any]:
    """The JSON object body; an empty body is ``{}``. Raises ``_BadRequest``."""
    try:
        raw = await read_body(request, _LIMITS)
        if not raw.strip():
            return {}
        value = parse_json(raw, _LIMITS)
    except BodyError as err:
        raise _BadRequest(err.status, err.message, err.field) from None
    if not isinstance(value, dict):
        raise _BadRequest(400, "the body must be a JSON object", "body")
    return value


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def parse_pause_seconds(body: Mapping[str, Any]) -> float:
    """``{"pause_seconds": N}`` with 0 <= N <= 3600 (default 0: thaw now, throttle again next poll)."""
    unknown = sorted(set(body) - {"pause_seconds"})
    if unknown:
        raise _BadRequest(400, f"unknown key {unknown[0]!r}; the only key is pause_seconds", unknown[0])
    value = body.get("pause_seconds", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_PAUSE_SECONDS:
        raise _BadRequest(400, f"expected a number of seconds from 0 to {MAX_PAUSE_SECONDS:g}, got {value!r}",
                          "pause_seconds")
    return float(value)


def _handlers(actions: AdminActions) -> tuple[Handler, Handler]:
    async def thaw(request: web.Request) -> web.Response:
        try:
            pause = parse_pause_seconds(await _body(request))
        except _BadRequest as bad:
            return json_error(bad.status, bad.message, bad.field)
        result = actions.thaw(pause)
        log.warning("admin: thawed everything, throttling paused for %gs (from %s)", pause,
                    request.remote or "the admin socket")
        return web.json_response(dict(result))

    async def reload(request: web.Request) -> web.Response:
        try:
            body = await _body(request)
        except _BadRequest as bad:
            return json_error(bad.status, bad.message, bad.field)
        if body:
            key = sorted(body)[0]
            return json_error(400, f"unknown key {key!r}; this endpoint takes no parameters", key)
        try:
            result = actions.reload_policies()
        except ConfigError as exc:
            log.warning("admin: policy reload rejected, old policies kept: %s", exc)
            return json_error(400, f"{exc.source}: {exc.message}; the previous policies are kept",
                          exc.key_path or "policies")
        log.warning("admin: policies reloaded (%s)", result)
        return web.json_response(dict(result))

    return thaw, reload


def add_admin_routes(app: web.Application, actions: AdminActions, *, token_file: str | None) -> None:
    """The admin routes on ``app``; behind the bearer token in ``token_file``, or open (``None``: only
    for the unix socket's app)."""
    tokens = TokenFile(token_file) if token_file else None
    thaw, reload = _handlers(actions)
    app.router.add_post(THAW_PATH, _guarded(thaw, tokens))
    app.router.add_post(RELOAD_PATH, _guarded(reload, tokens))


def build_admin_app(actions: AdminActions, middlewares: tuple[Any, ...] = ()) -> web.Application:
    """The unix socket's app: only the admin routes, no token."""
    app = web.Application(middlewares=list(middlewares), client_max_size=MAX_ADMIN_BODY_BYTES)
    add_admin_routes(app, actions, token_file=None)
    return app


def bind_admin_socket(path: str) -> socket.socket:
    """A listening unix socket at ``path`` with mode 0600, chmod-ed before ``listen()`` so nobody can
    connect while it is still open to others. A stale socket file is replaced; any other file is an error."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
        else:
            raise ConfigError("admin_socket", f"{path} exists and is not a socket", "config")
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, SOCKET_MODE)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
