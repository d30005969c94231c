"""List, then watch, one kind of Kubernetes object: the loop under every API-server view gpuagent keeps.

The pods of this node (``pods.metadata``), its DRA ResourceSlices (``pods.dra.slices``) and, in the
extender, every node's published GPU state (``hints.cluster_view``) are kept the way client-go's reflector
keeps an informer's store: list (for a node's objects, field selector ``spec.nodeName=<node>``; for a
cluster-wide view, no selector), then watch from the list's ``resourceVersion``.
A subclass says what it lists (``path``, ``resource``), decodes only the
fields it keeps and maintains its own view (``_replace`` after a list, ``_put``/``_drop`` per event).

Choices that matter on thousands of nodes:
- The first list asks for ``resourceVersion=0`` (served from the API server's watch cache, like the
  kubelet's own list); a re-list after a broken watch asks for the last version seen (never older data);
  only after 410 Gone does it ask for a consistent list (no ``resourceVersion``).
- A view of the whole cluster (``page_size`` set: the extender's view of every node's state) lists in pages
  of ``page_size`` objects (``limit`` and ``continue``), so no answer is the whole fleet at once (at 100,000
  nodes one answer was 0.7-0.9 GB). Its lists ask for no ``resourceVersion``: the watch cache ignores
  ``limit`` on ``resourceVersion=0``, while a list without one is consistent, every page at the first
  page's version (also the version the watch then starts from), and never older than what was seen. Each
  page's continue token is read before its objects are decoded, so the API server prepares the next page
  while this one is decoded; the view is replaced once the last page is in. A continue that has expired
  (410: the first page's version was compacted away while the pages were read) lists again from the first
  page, as any 410 does.
- The watch asks for bookmarks, so a quiet node keeps a fresh ``resourceVersion`` and resumes a watch
  without a re-list, and for a server-side timeout spread over [T, 2T) so agents do not reconnect in step.
  A connection silent past that timeout is dead (no FIN from a vanished peer): it is dropped and resumed.
- lightkube supplies the configuration (in-cluster service account with token rotation, kubeconfig, exec
  plugins, TLS) through ``gpuagent.kubeapi``; the requests are plain GETs on its HTTP client, so the watch
  parameters, the 410 handling and the timeouts are ours. Nothing of lightkube is imported before ``run``.
  Sources given one ``ApiConnection`` share its client (one configuration, one connection pool).

Objects are other parties' bytes: a watch event nested deeper than ``max_depth`` is cut to it
(``boundedjson.shallow``) before msgspec reads it, so the subclass refuses that one object (msgspec recurses,
and a ``RecursionError`` would have broken the watch, and the list after it, for every object). A bookmark
moves the resourceVersion whatever else its object says.

Failures never end :meth:`Reflector.run`: the view is kept and ``status`` says what is wrong. A watch that
had been healthy and breaks is resumed at once; failures back off exponentially up to ``max_backoff``; 401
and 403 (RBAC) retry every ``max_backoff``. Each failure is logged once per change of kind, and the return to
health once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpuagent import boundedjson
from gpuagent.kubeapi import ApiConnection

if TYPE_CHECKING:
    import httpx2
    import lightkube

WATCH_IDLE_MARGIN_S = 30.0  # silence past the server's own timeout plus this means a dead connection
_READ_LIMIT = 64 * 1024  # bytes of an error body kept for its message


@functools.cache
def wire() -> SimpleNamespace:
    """Decoders of what every list and watch carries (msgspec comes with lightkube), built on first use."""
    import msgspec

    event = msgspec.defstruct("WatchEvent", [("type", str, ""), ("object", msgspec.Raw, msgspec.Raw(b"{}"))])
    api_status = msgspec.defstruct("Status", [("code", int, 0), ("reason", str, ""), ("message", str, "")])
    meta = msgspec.defstruct("BookmarkMeta", [("resourceVersion", str, "")])
    bookmark = msgspec.defstruct("Bookmark", [("metadata", meta, msgspec.field(default_factory=meta))])
    return SimpleNamespace(
        event=msgspec.json.Decoder(event),
        status=msgspec.json.Decoder(api_status),
        bookmark=msgspec.json.Decoder(bookmark),
        DecodeError=msgspec.DecodeError,
    )


def list_decoder(item: Any) -> Any:
    """A decoder of a ``<Kind>List`` body whose items are ``item`` structs (``metadata.resourceVersion`` and
    ``items`` only)."""
    import msgspec

    list_meta = msgspec.defstruct("ListMeta", [("resourceVersion", str, "")])
    body = msgspec.defstruct("List", [
        ("metadata", list_meta, msgspec.field(default_factory=list_meta)), ("items", list[item] | None, None),
    ])
    return msgspec.json.Decoder(body)


class _Expired(Exception):
    """410 Gone: the resourceVersion is older than the server keeps; list again."""


@dataclass
class _Failure(Exception):
    kind: str  # the state logged once: "forbidden", "unauthorized", "unreachable", "http 500", ...
    message: str
    relist: bool = True  # list again before watching (False: resume the watch from the last version)
    slow: bool = False  # retry only every max_backoff (credentials and RBAC do not fix themselves quickly)

    def __str__(self) -> str:
        return self.message


class Reflector:
    """Lists and watches ``path`` for one node (field selector ``spec.nodeName=<node>``), or for the whole
    cluster when ``node_name`` is None (``cluster_wide`` set by the subclass).

    ``connection`` (a :class:`gpuagent.kubeapi.ApiConnection`, shared and left open), ``client`` (a
    ``lightkube.AsyncClient``, whose pool and credentials are then shared) or ``config`` (a lightkube
    ``KubeConfig`` or ``SingleConfig``) says where the API server is; with none, ``kubeconfig_path`` or
    lightkube's ``KubeConfig.from_env()``: the in-cluster service account, else ``$KUBECONFIG``, else
    ``~/.kube/config``. ``watch_timeout`` is the server-side watch timeout (spread over [T, 2T)).
    """

    path = ""  # relative to the server (kept under a server URL with a path, as API proxies have)
    resource = ""  # the plural name, for messages and the RBAC hint
    api_group = ""  # "" for the core group, for the RBAC hint
    what = ""  # what the view is, for log lines ("pod metadata", "DRA ResourceSlices")
    cluster_wide = False  # True: every object of the kind, no node selector (node_name is then None)
    max_depth = 64  # a watch event nested deeper is cut to this depth before it is parsed
    page_size = 0  # objects a list answer holds at most (limit/continue); 0: one answer (see above)

    def __init__(
        self,
        node_name: str | None,
        *,
        log: logging.Logger,
        connection: ApiConnection | None = None,
        client: lightkube.AsyncClient | None = None,
        config: lightkube.KubeConfig | lightkube.SingleConfig | None = None,
        kubeconfig_path: str | None = None,
        relist_backoff: float = 1.0,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout: float = 300.0,
        request_timeout: float = 10.0,
    ) -> None:
        if not node_name and not self.cluster_wide:
            raise ValueError(f"node_name is required: the API server is asked for this node's "
                             f"{self.resource} only")
        self.node_name = node_name
        self._log = log
        self._selector = f"spec.nodeName={node_name}" if node_name else None
        self._scope = f"on node {node_name}" if node_name else "in the cluster"
        self._connection = connection
        self._client = client
        self._config = config
        self._kubeconfig_path = kubeconfig_path  # read on connecting: a bad file is a status, not a crash
        self._base = relist_backoff
        self._max = max_backoff
        self._clock = clock
        self._watch_timeout = watch_timeout
        self._request_timeout = request_timeout
        self._rv: str | None = None  # the version to watch from; None: list first
        self._list_rv = "0"  # "0": any (watch cache); a version: not older; "": consistent (after 410)
        self._synced = False
        self._status: tuple[bool, str] = (False, f"the {self.resource} of this node have not been listed yet")
        self._failure_kind = ""
        self._failures = 0  # in a row, for the backoff; cleared by a watch that proves healthy
        self._expiries = 0  # 410s in a row: the first re-lists at once, more back off
        self.lists = 0  # requests made, for tests and debugging
        self.pages = 0  # list answers read (a list of many pages counts each)
        self.watches = 0

    # -- what a subclass provides --------------------------------------------------------------------------
    def _decode_list(self, body: bytes) -> tuple[list[Any], str]:
        """(items, the list's resourceVersion); raises msgspec's DecodeError."""
        raise NotImplementedError

    def _decode_page(self, body: bytes) -> tuple[Callable[[], list[Any]], str, str]:
        """With ``page_size``: one page of a list, as (a function that decodes its items, the list's
        resourceVersion, its continue token, "" on the last page): the token is read first and cheaply, the
        items when the next page has been asked for. Raises msgspec's DecodeError."""
        raise NotImplementedError

    def _decode_object(self, raw: Any) -> Any:
        """One watch event's object (it has ``metadata.resourceVersion``); raises msgspec's DecodeError."""
        raise NotImplementedError

    def _decode_cut_object(self, raw: Any) -> Any:
        """The object of an event that was nested deeper than ``max_depth``, cut to it (a subclass whose
        objects have a depth bound of their own refuses it here)."""
        return self._decode_object(raw)

    def _replace(self, items: list[Any]) -> None:
        """The view becomes what a list returned."""
        raise NotImplementedError

    def _put(self, obj: Any) -> None:
        """ADDED or MODIFIED."""
        raise NotImplementedError

    def _drop(self, obj: Any) -> None:
        """DELETED (the object's last state)."""
        raise NotImplementedError

    def _size(self) -> int:
        """How many objects the view holds, for log lines."""
        raise NotImplementedError

    def _opened(self, http: httpx2.AsyncClient) -> None:
        """The HTTP client is open (a subclass may start work of its own on it)."""

    async def _closed(self) -> None:
        """``run`` ends: stop what ``_opened`` started."""

    # -- the view's state ----------------------------------------------------------------------------------
    @property
    def status(self) -> tuple[bool, str]:
        """(ok, error) for gpuagent_source_success."""
        return self._status

    @property
    def synced(self) -> bool:
        """True once a list has succeeded (the view is then kept through any later failure)."""
        return self._synced

    # -- the loop ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """List, then watch, forever. Returns never; raises only CancelledError."""
        http, owned = None, None
        try:
            while True:
                try:
                    if http is None:
                        http, owned = self._open()
                        self._opened(http)
                    if self._rv is None:
                        await self._list(http)
                    healthy = await self._watch(http)
                    if not healthy:  # closed at once without a word: do not hammer the server
                        self._failures += 1
                        await asyncio.sleep(self._delay())
                except _Expired:
                    self._rv, self._list_rv = None, ""
                    self._expiries += 1
                    self._log.debug("%s watch %s: resourceVersion expired (410); listing again",
                                    self.resource, self._scope)
                    if self._expiries > 1:
                        await asyncio.sleep(self._delay(self._expiries - 1))
                except _Failure as failure:
                    self._fail(failure)
                    await asyncio.sleep(self._max if failure.slow else self._delay())
                except Exception as exc:  # a bug must not end the source: report it, back off, go on
                    self._fail(_Failure("internal", f"internal error: {exc!r}"), exc_info=exc)
                    await asyncio.sleep(self._delay())
        finally:
            await self._closed()
            if owned is not None:
                await owned.aclose()

    def _delay(self, failures: int | None = None) -> float:
        n = self._failures if failures is None else failures
        delay = min(self._max, self._base * 2 ** max(0, n - 1))
        return delay * (0.75 + 0.25 * random.random())  # spread agents that failed together

    def _open(self) -> tuple[httpx2.AsyncClient, ApiConnection | None]:
        """The HTTP client, and the connection to close at the end when it is ours."""
        try:
            if self._client is not None:
                import httpx2

                inner = getattr(getattr(self._client, "_client", None), "_client", None)
                if not isinstance(inner, httpx2.AsyncClient):
                    raise TypeError(f"client: expected a lightkube.AsyncClient, got {type(self._client)!r}")
                return inner, None
            if self._connection is not None:
                return self._connection.open(), None
            owned = ApiConnection(config=self._config, kubeconfig_path=self._kubeconfig_path,
                                  request_timeout=self._request_timeout)
            return owned.open(), owned
        except Exception as exc:
            raise _Failure("config", f"no Kubernetes API configuration: {exc}", slow=True) from exc

    async def _get(self, http: httpx2.AsyncClient, params: dict[str, str]) -> bytes:
        """One list request's answer; raises the failure to report (``_Expired`` for 410)."""
        import httpx2

        self.lists += 1
        try:
            response = await http.get(self.path, params=params)
        except httpx2.RequestError as exc:
            raise self._transport_failure("list", exc) from exc
        if response.status_code != 200:
            raise self._http_failure("list", response.status_code, response.content)
        self.pages += 1
        return response.content

    async def _list(self, http: httpx2.AsyncClient) -> None:
        params = {"fieldSelector": self._selector} if self._selector else {}
        try:
            if self.page_size:
                items, rv = await self._list_pages(http, params)
            else:
                if self._list_rv:
                    params["resourceVersion"] = self._list_rv
                items, rv = self._decode_list(await self._get(http, params))
        except wire().DecodeError as exc:
            raise _Failure("protocol", f"{self._where('list')}: bad list: {exc}") from exc
        self._replace(items)
        self._rv = rv or None
        if self._rv is None:
            raise _Failure("protocol", f"{self._where('list')}: no resourceVersion")
        self._list_rv = self._rv
        if not self._synced:
            self._log.info("API server: %d %s %s", self._size(), self.resource, self._scope)
        self._synced = True
        self._healthy()

    async def _list_pages(self, http: httpx2.AsyncClient, params: dict[str, str]) -> tuple[list[Any], str]:
        """Every page of a consistent list (no resourceVersion: see the module docstring), the next one
        asked for before this one's objects are decoded; (items, the version of the first page)."""
        params = {**params, "limit": str(self.page_size)}
        items: list[Any] = []
        version = ""
        pending: asyncio.Task[bytes] | None = asyncio.ensure_future(self._get(http, params))
        try:
            while pending is not None:
                body = await pending
                pending = None
                decode, rv, token = self._decode_page(body)
                del body  # the page's objects keep what they need of it
                version = version or rv
                if token:
                    pending = asyncio.ensure_future(self._get(http, {**params, "continue": token}))
                items.extend(decode())
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
        return items, version

    async def _watch(self, http: httpx2.AsyncClient) -> bool:
        """Follows one watch connection; True when it ended after proving healthy (resume at once)."""
        import httpx2

        assert self._rv is not None
        server_timeout = int(self._watch_timeout * (1 + random.random())) or 1
        params = {
            "watch": "true",
            "resourceVersion": self._rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(server_timeout),
        }
        if self._selector:
            params["fieldSelector"] = self._selector
        timeout = httpx2.Timeout(self._request_timeout, read=server_timeout + WATCH_IDLE_MARGIN_S)
        self.watches += 1
        connected_at: float | None = None
        events = 0
        try:
            async with http.stream("GET", self.path, params=params, timeout=timeout) as response:
                if response.status_code != 200:
                    body = await _read_some(response)
                    raise self._http_failure("watch", response.status_code, body)
                connected_at = self._clock()
                self._healthy()
                async for line in response.aiter_lines():
                    if line.strip():
                        self._apply(line)
                        events += 1
                        self._failures = self._expiries = 0
        except httpx2.RequestError as exc:  # refused, reset, timed out, cut mid-stream
            if connected_at is None:
                raise self._transport_failure("watch", exc) from exc
            if events or self._clock() - connected_at >= self._max:
                self._log.debug("%s watch %s interrupted (%r); resuming", self.resource, self._scope, exc)
                self._failures = self._expiries = 0
                return True
            message = f"{self._where('watch')} interrupted: {exc!r}"
            raise _Failure("interrupted", message, relist=False) from exc
        assert connected_at is not None
        healthy = bool(events) or self._clock() - connected_at >= self._max
        if healthy:
            self._failures = self._expiries = 0
        return healthy

    def _apply(self, line: str) -> None:
        decode = wire()
        data = line.encode("utf-8", "surrogatepass")
        cut = boundedjson.depth(data, self.max_depth) is None
        if cut:
            data = boundedjson.shallow(data, self.max_depth)
        try:
            event = decode.event.decode(data)
            if event.type == "ERROR":
                status = decode.status.decode(event.object)
                if status.code == 410:
                    raise _Expired()
                raise self._api_failure("watch", status.code, status.reason, status.message)
            if event.type == "BOOKMARK":  # its object is only a resourceVersion: nothing to decode as one
                version = decode.bookmark.decode(event.object).metadata.resourceVersion
                if version:
                    self._rv = self._list_rv = version
                return
            obj = self._decode_cut_object(event.object) if cut else self._decode_object(event.object)
        except (decode.DecodeError, RecursionError) as exc:
            raise _Failure("protocol", f"{self._where('watch')}: bad event: {exc}") from exc
        if event.type in ("ADDED", "MODIFIED"):
            self._put(obj)
        elif event.type == "DELETED":
            self._drop(obj)
        else:
            self._log.debug("%s watch %s: ignoring event type %r", self.resource, self._scope, event.type)
        if obj.metadata.resourceVersion:
            self._rv = self._list_rv = obj.metadata.resourceVersion

    # -- health --------------------------------------------------------------------------------------------
    def _healthy(self) -> None:
        if self._failure_kind:
            self._log.info("API server answers again: watching %d %s %s", self._size(), self.resource,
                           self._scope)
            self._failure_kind = ""
        self._status = (True, "")

    def _fail(self, failure: _Failure, exc_info: BaseException | None = None) -> None:
        self._failures += 1
        if failure.relist:
            self._rv = None
        self._status = (False, failure.message)
        if failure.kind != self._failure_kind:
            kept = f"keeping the last {self._size()} {self.resource}" if self._synced else \
                f"no {self.resource} yet"
            self._log.warning("%s from the API server: %s (%s; retrying)", self.what, failure.message, kept,
                              exc_info=exc_info)
            self._failure_kind = failure.kind
        else:
            self._log.debug("%s from the API server: %s", self.what, failure.message)

    def _where(self, verb: str) -> str:
        return f"{self.resource} {verb} {self._scope}"

    def _transport_failure(self, verb: str, exc: Exception) -> _Failure:
        return transport_failure(self._where(verb), exc)

    def _http_failure(self, verb: str, code: int, body: bytes) -> _Failure | _Expired:
        decode = wire()
        reason = message = ""
        try:
            status = decode.status.decode(body)
            reason, message = status.reason, status.message
        except decode.DecodeError:
            message = body[:200].decode("utf-8", "replace").strip()
        if code == 410:
            return _Expired()
        return self._api_failure(verb, code, reason, message)

    def _api_failure(self, verb: str, code: int, reason: str, message: str) -> _Failure:
        group = f" (API group {self.api_group})" if self.api_group else ""
        return api_failure(self._where(verb), code, reason, message,
                           rbac=f"get, list and watch on {self.resource}{group}", path=self.path)


def transport_failure(where: str, exc: Exception) -> _Failure:
    """A request that got no answer: refused, reset, timed out."""
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        kind, what = "timeout", "API server did not answer in time"
    else:
        kind, what = "unreachable", "API server unreachable"
    detail = str(exc) or type(exc).__name__
    # A refused or timed-out connection says nothing of the data: resume the watch where it was.
    return _Failure(kind, f"{what}: {where}: {detail}", relist=False)


def api_failure(where: str, code: int, reason: str, message: str, *, rbac: str, path: str) -> _Failure:
    """The API server's answer ``code`` (not 200, not 410), as the failure to report; ``rbac`` is what the
    agent's service account must be allowed, for a 403."""
    if code == 403:
        return _Failure("forbidden", f"forbidden: {where}: RBAC must allow {rbac} for the agent's service "
                        f"account ({message or reason or 'HTTP 403'})", slow=True)
    if code == 401:
        return _Failure("unauthorized", f"unauthorized: {where}: the API server rejected the credentials "
                        f"(expired or invalid token): {message or reason or 'HTTP 401'}", slow=True)
    if code == 404:
        return _Failure("not found", f"{where}: HTTP 404: the API server does not serve {path} "
                        f"({message or reason or 'not found'})", slow=True)
    detail = ": ".join(p for p in (reason, message) if p)
    return _Failure(f"http {code}", f"{where}: HTTP {code}" + (f" ({detail})" if detail else ""))


async def _read_some(response: httpx2.Response) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= _READ_LIMIT:
            break
    return body
