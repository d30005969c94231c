"""What ``gpuagent top`` knows of one agent: its last ``/v1/state``, how fresh it is, and why not.

One :class:`AgentWatch` per agent. ``refresh()`` asks ``/healthz`` (the agent's own verdict on its poller,
in its own clock, so a skewed laptop clock does not make a node look stale) and ``/v1/state`` with
``If-None-Match`` (a snapshot already held costs a 304). A failure never clears what was held: the view
keeps the last snapshot and says it is old and why, rather than showing zeros. Only aiohttp: no TUI here.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuagent import boundedjson
from gpuagent.httperrors import client_error_text, read_body
from gpuagent.top.errors import TopError
from gpuagent.untrusted import shown

STATE_PATH = "/v1/state"
HEALTH_PATH = "/healthz"
MAX_STATE_BYTES = 64 * 1024 * 1024  # an 8-GPU node's state is about 200 KB
# /v1/state is 7 levels deep (a MIG instance's tenants): 32 is room for the agent to grow, and no recursive
# parser ever sees a 100,000-level document, nor a NaN, an infinity or a 1e999.
STATE_BOUNDS = boundedjson.Bounds(max_bytes=MAX_STATE_BYTES, max_depth=32)
ERROR_BYTES = 4096  # an error answer's body: what is past this is not read as one
ERROR_BOUNDS = boundedjson.Bounds(max_bytes=ERROR_BYTES, max_depth=4)
DEFAULT_TIMEOUT_SECONDS = 3.0

# What the view says about an agent, worst last.
OK, STARTING, STALE, NO_ANSWER = "ok", "starting", "stale", "no answer"


def check_agent_url(url: str, what: str = "--agent") -> str:
    """``url`` as a base URL (no trailing slash), or a :class:`TopError` naming ``what``."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise TopError(f"{what}: expected an http:// or https:// URL like http://gpu-node-1:9402, "
                       f"got {url!r}")
    try:
        parsed.port  # noqa: B018 -- raises on a port that is not a number or out of range
    except ValueError as err:
        raise TopError(f"{what}: bad port in {url!r} ({err})") from None
    if parsed.query or parsed.fragment:
        raise TopError(f"{what}: expected a base URL without ?query or #fragment, got {url!r}")
    return url.strip().rstrip("/")


@dataclass(frozen=True)
class AgentStatus:
    """How fresh what the view shows of one agent is, in words fit for the header."""

    state: str  # OK, STARTING, STALE or NO_ANSWER
    message: str  # "" when OK
    snapshot_age_seconds: float | None  # of the snapshot held now, by the agent's clock; None: none held


class AgentWatch:
    """One agent's last snapshot and health; ``refresh()`` never raises for a bad or absent agent."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._timeout_seconds = timeout_seconds
        self._clock = clock
        self.state: dict[str, Any] | None = None  # the last /v1/state body
        self.etag: str | None = None
        self.state_changed = False  # the last refresh brought a new snapshot
        self.error: str | None = None  # why the last refresh failed; None when it succeeded
        self.health: dict[str, Any] | None = None  # the last /healthz body
        self.health_at: float | None = None  # our monotonic time of that answer
        self.answered_at: float | None = None  # our monotonic time of the last full answer
        self.starting = False  # the agent answered that its first poll has not finished

    async def refresh(self) -> None:
        """Ask the agent once (health, then the state, conditionally)."""
        self.state_changed = False
        try:
            health = await self._get_json(HEALTH_PATH, ok=(200, 503))
            self.health, self.health_at = health, self._clock()
            await self._refresh_state()
        except asyncio.TimeoutError:
            self.error = f"no answer within {self._timeout_seconds:g} s"
        except aiohttp.ClientError as exc:
            self.error = client_error_text(exc)
        except AgentAnswerError as exc:
            self.error = str(exc)
        else:
            self.error = None
            self.answered_at = self._clock()

    async def _refresh_state(self) -> None:
        headers = {"If-None-Match": self.etag} if self.etag and self.state is not None else {}
        get = self._session.get(self.url + STATE_PATH, headers=headers, timeout=self._timeout)
        async with get as response:
            if response.status == 304 and self.state is not None:
                return
            if response.status == 503:
                self.starting = True
                return
            body = await _read(response, STATE_PATH)
            if response.status != 200:
                raise AgentAnswerError(f"{STATE_PATH}: HTTP {response.status}{_error_text(body)}")
            state = _decode(body, STATE_PATH)
            if not isinstance(state.get("gpus"), list) or not isinstance(state.get("hostname"), str):
                raise AgentAnswerError(f"{STATE_PATH} is not a gpuagent snapshot (no hostname or gpus in it)")
            self.state, self.etag, self.starting = state, response.headers.get("ETag"), False
            self.state_changed = True

    async def _get_json(self, path: str, ok: tuple[int, ...]) -> dict[str, Any]:
        async with self._session.get(self.url + path, timeout=self._timeout) as response:
            body = await _read(response, path)
            if response.status not in ok:
                raise AgentAnswerError(f"{path}: HTTP {response.status}{_error_text(body)}")
            return _decode(body, path)

    def status(self) -> AgentStatus:
        """The view's verdict now: no answer, stale (the agent says its poller is stuck), starting, ok."""
        now = self._clock()
        age = self.snapshot_age_seconds()
        if self.error is not None:
            if self.answered_at is None:
                return AgentStatus(NO_ANSWER, f"no answer from {self.url}: {self.error}", age)
            since = now - self.answered_at
            return AgentStatus(NO_ANSWER, f"no answer for {since:.0f} s ({self.error}); "
                                          f"showing what it said then", age)
        if self.state is None:
            if self.starting:
                return AgentStatus(STARTING, "the agent has not finished its first poll", None)
            return AgentStatus(STARTING, "waiting for the agent's first answer", None)
        if self.health is not None and self.health.get("status") == "stuck":
            return AgentStatus(STALE, f"the agent's poller is stuck: its snapshot is {age or 0:.0f} s old",
                               age)
        return AgentStatus(OK, "", age)

    def snapshot_age_seconds(self) -> float | None:
        """The held snapshot's age by the agent's clock: /healthz's figure plus the time since it said it."""
        if self.state is None:
            return None
        said = self.health.get("snapshot_age_seconds") if self.health else None
        if isinstance(said, (int, float)) and self.health_at is not None:
            return max(0.0, float(said) + self._clock() - self.health_at)
        return None


class AgentAnswerError(Exception):
    """The agent answered, but not as gpuagent's API does."""


async def _read(response: aiohttp.ClientResponse, path: str) -> bytes:
    body = await read_body(response, MAX_STATE_BYTES)
    if body is None:
        raise AgentAnswerError(f"{path}: the answer is over {MAX_STATE_BYTES // 2**20} MiB")
    return body


def _decode(body: bytes, path: str) -> dict[str, Any]:
    """The body as a JSON object, read through the bounded reader: what the agent sent that no gpuagent
    sends (too deep, a NaN, an overflowing number, not JSON) is an :class:`AgentAnswerError` naming it."""
    try:
        value = boundedjson.loads(body, STATE_BOUNDS, path)
    except boundedjson.Unreadable as err:
        raise AgentAnswerError(f"{shown(str(err))} (is this a gpuagent?)") from None
    if not isinstance(value, dict):
        raise AgentAnswerError(f"{path} did not answer a JSON object (is this a gpuagent?)")
    return value


def _error_text(body: bytes) -> str:
    try:
        error = boundedjson.loads(body[:ERROR_BYTES], ERROR_BOUNDS, "error").get("error")
    except (ValueError, AttributeError):
        return ""
    return f" ({shown(error[:200])})" if isinstance(error, str) else ""


def new_session(*, limit: int = 64) -> aiohttp.ClientSession:
    """The HTTP session every watch of one ``gpuagent top`` shares (keep-alive to each agent)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=60),
        headers={"Accept": "application/json", "User-Agent": "gpuagent-top"},
        raise_for_status=False,
    )
