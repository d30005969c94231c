"""The extender's view of every node agent: where it is, and its last ``/v1/hints``.

kube-scheduler waits on the extender for every pod, with up to thousands of candidate nodes, so nothing on
that path talks to an agent it already knows: ``AgentCache`` keeps each agent's hints in memory and a
background task refreshes them all with conditional GETs (``If-None-Match``: an unchanged node costs a 304).
A node never seen before is fetched on demand, concurrently with the others and within one total deadline,
then cached like the rest, but only a node the extender knows (``known``: the agents file's nodes and the API
server's node list, ``gpuagent.hints.nodes``): any other name a caller sends is never fetched nor cached. A
node nobody asked about for ``forget_after_seconds`` is dropped (nodes leave clusters), and so is one no
longer known, unless the agents file names it; past ``max_entries`` the least recently asked about goes.

Freshness is judged on the extender's own monotonic clock (when the agent last answered), not on the agent's
wall clock, so a skewed node clock does not make its hints look stale or fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from gpuagent import boundedjson
from gpuagent.hints.codec import check_limits, hints_from_jsonable
from gpuagent.hints.extender_config import DEFAULT_AGENT_URL, NODE_PLACEHOLDER, valid_node_name
from gpuagent.hints.score import NodeIndex, node_index
from gpuagent.hints.verdict_key import KindKeys
from gpuagent.httperrors import client_error_text, read_body
from gpuagent.snapshot.hints import NodeHints

log = logging.getLogger(__name__)

HINTS_PATH = "/v1/hints"
MAX_HINTS_BYTES = 4 * 1024 * 1024  # an 8-GPU node's hints are a few KiB; a body this big is not hints
HINTS_BOUNDS = boundedjson.Bounds(max_bytes=MAX_HINTS_BYTES, max_depth=32)  # hints are 6 levels deep
MAX_ENTRIES = 50_000  # agents cached at most (a cluster has up to 5,000 nodes by Kubernetes' own limits)

# Entry states, as the extender's reasons and metrics name them.
FRESH, STALE, UNREACHABLE = "fresh", "stale", "unreachable"
STATES = (FRESH, STALE, UNREACHABLE)
# Outcomes of one fetch, for metrics.
MODIFIED, NOT_MODIFIED, FAILED = "modified", "not_modified", "error"


@dataclass(frozen=True)
class AgentDirectory:
    """Where each node's agent listens: the agents file's entry, else the URL template (None: neither)."""

    template: str | None = DEFAULT_AGENT_URL
    urls: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def url(self, node: str) -> str | None:
        url = self.urls.get(node)
        if url is not None:
            return url
        if self.template is None or not valid_node_name(node):
            return None
        return self.template.replace(NODE_PLACEHOLDER, node)


@dataclass(frozen=True, slots=True)
class AgentEntry:
    """What the extender knows of one node's agent."""

    node: str
    url: str | None  # None: no URL for this node (not in the agents file and no template)
    hints: NodeHints | None = None
    index: NodeIndex | None = None  # of ``hints``, built once when they arrive: what scoring reads
    etag: str | None = None
    answered_at: float | None = None  # monotonic time of the last 200 or 304
    error: str | None = None  # why the last fetch failed; None when it succeeded
    key: bytes | None = None  # the cluster view's: equal for nodes whose states schedule alike
    keys: KindKeys | None = None  # the cluster view's, per kind of request: equal where those schedule alike
    unreadable: str | None = None  # the cluster view's: why the node's latest object cannot be judged

    def state(self, now: float, max_age_seconds: float) -> str:
        if self.hints is None or self.answered_at is None:
            return UNREACHABLE
        if now - self.answered_at > max_age_seconds:
            return UNREACHABLE if self.error is not None else STALE
        return FRESH

    def reason(self, now: float, max_age_seconds: float) -> str:
        """Why this node cannot be judged (for a state other than fresh).

        No URL, node name or elapsed seconds in it: the scheduler groups identical reasons across nodes in
        the pod's event ("0/500 nodes are available: 500 <reason>"); the logs name the node and URL.
        """
        if self.unreadable is not None:
            return self.unreadable
        if self.url is None and self.hints is None:
            return "no agent URL for this node (not in the agents file, and no URL template)"
        if self.hints is None or self.answered_at is None:
            return f"node agent unreachable: {self.error or 'not fetched yet'}"
        if self.url is None:  # the cluster view's entry: a published state, never fetched
            return (f"its published GPU state (GPUNodeState) is older than the {max_age_seconds:g}s "
                    "staleness bound")
        if self.error is not None:
            return (
                f"node agent unreachable ({self.error}); its last hints are older than the "
                f"{max_age_seconds:g}s staleness bound"
            )
        return f"node agent's hints are older than the {max_age_seconds:g}s staleness bound"


@dataclass(frozen=True)
class AgentTLS:
    """TLS to the agents: the CA that signs their certificates, and a client certificate if they ask."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context; ``ssl.SSLError``/``OSError`` when the files are bad."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


FetchObserver = Callable[[str, float], None]  # (outcome, seconds)


class AgentCache:
    """Every known agent's last hints, refreshed in the background; see the module docstring."""

    def __init__(
        self,
        directory: AgentDirectory,
        *,
        timeout_seconds: float = 1.0,
        refresh_interval_seconds: float = 5.0,
        forget_after_seconds: float = 3600.0,
        max_concurrent_fetches: int = 128,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_fetch: FetchObserver | None = None,
        known: Container[str] | None = None,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        """``known``: the nodes that may be fetched; None: the agents file's only."""
        self.directory = directory
        self.known: Container[str] = known if known is not None else frozenset(directory.urls)
        self.max_entries = max_entries
        self.timeout_seconds = timeout_seconds
        self.refresh_interval_seconds = refresh_interval_seconds
        self.forget_after_seconds = forget_after_seconds
        self._max_concurrent = max_concurrent_fetches
        self._ssl = ssl_context
        self._clock = clock
        self._on_fetch = on_fetch
        self._entries: dict[str, AgentEntry] = {}
        # node -> monotonic time a scheduler call last asked about it, least recently asked first
        self._used: OrderedDict[str, float] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[AgentEntry]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        now = clock()
        for node in directory.urls:  # the agents file's nodes are refreshed from the start
            self._entries[node] = AgentEntry(node=node, url=directory.url(node))
            self._used[node] = now

    def set_fetch_observer(self, observer: FetchObserver | None) -> None:
        """Called with (outcome, seconds) after every fetch (metrics)."""
        self._on_fetch = observer

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_concurrent,
            ssl=self._ssl if self._ssl is not None else True,
            ttl_dns_cache=60,
            keepalive_timeout=max(30.0, 3 * self.refresh_interval_seconds),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            headers={"Accept": "application/json"},
            raise_for_status=False,
        )
        self._semaphore = asyncio.Semaphore(self._max_concurrent)

    async def close(self) -> None:
        for future in list(self._inflight.values()):
            future.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every known agent every ``refresh_interval_seconds`` until ``stop`` is set."""
        while not stop.is_set():
            started = self._clock()
            try:
                await self.refresh_all()
            except Exception:  # a bug in one round must not end the refreshing: log it, go on
                log.exception("refreshing the agents' hints failed")
            wait = max(0.0, self.refresh_interval_seconds - (self._clock() - started))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    # --- reads (no I/O) -------------------------------------------------------------------------------------

    def get(self, node: str) -> AgentEntry | None:
        return self._entries.get(node)

    def entries(self) -> Iterable[AgentEntry]:
        return self._entries.values()

    def __len__(self) -> int:
        return len(self._entries)

    def knows(self, node: str) -> bool:
        """Whether ``node`` may be fetched: in the agents file or the known nodes."""
        return node in self.directory.urls or node in self.known

    def counts(self, max_age_seconds: float) -> dict[str, int]:
        """How many known agents are in each state."""
        now = self._clock()
        counts = dict.fromkeys(STATES, 0)
        for entry in self._entries.values():
            counts[entry.state(now, max_age_seconds)] += 1
        return counts

    # --- fetching -------------------------------------------------------------------------------------------

    async def lookup(
        self, nodes: Iterable[str], *, deadline_seconds: float | None = None
    ) -> dict[str, AgentEntry]:
        """The entries of the known ones of ``nodes``, marked as used (unknown nodes are left out, never
        fetched); nodes never seen are fetched first, all at once, for at most ``deadline_seconds`` (default:
        the agent timeout). A node whose fetch did not finish in time is answered as unreachable now and
        cached when its fetch ends."""
        now = self._clock()
        found: dict[str, AgentEntry] = {}
        missing: list[str] = []
        entries, used = self._entries, self._used
        for node in nodes:
            entry = entries.get(node)
            if entry is None and not self.knows(node):
                continue
            used[node] = now
            used.move_to_end(node)
            if entry is None or (entry.hints is None and entry.error is None):  # never fetched yet
                missing.append(node)
            else:
                found[node] = entry
        if missing:
            found.update(await self._fetch_new(missing, deadline_seconds or self.timeout_seconds))
        return found

    async def _fetch_new(self, nodes: list[str], deadline: float) -> dict[str, AgentEntry]:
        futures: dict[str, asyncio.Future[AgentEntry]] = {}
        for node in nodes:
            future = self._inflight.get(node)
            if future is None:
                placeholder = AgentEntry(node=node, url=self.directory.url(node))
                future = self._inflight[node] = asyncio.ensure_future(self._fetch_first(placeholder))
            futures[node] = future
        await asyncio.wait(futures.values(), timeout=deadline)
        out: dict[str, AgentEntry] = {}
        for node, future in futures.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                out[node] = future.result()
            else:
                out[node] = AgentEntry(
                    node=node,
                    url=self.directory.url(node),
                    error=f"no answer yet (its first fetch is still running after {deadline:g}s)",
                )
        return out

    async def _fetch_first(self, placeholder: AgentEntry) -> AgentEntry:
        try:
            entry = await self._fetch(placeholder)
            if entry.node in self._used:  # not forgotten meanwhile
                self._entries[entry.node] = entry
                self._evict()
            return entry
        finally:
            self._inflight.pop(placeholder.node, None)

    async def refresh_all(self) -> None:
        """One round: drop forgotten nodes, then fetch every known agent (at most N at a time)."""
        now = self._clock()
        for node in list(self._entries):
            if node in self.directory.urls:
                continue
            if now - self._used.get(node, now) > self.forget_after_seconds or node not in self.known:
                del self._entries[node]
                self._used.pop(node, None)
        current = list(self._entries.values())
        results = await asyncio.gather(*(self._fetch(entry) for entry in current), return_exceptions=True)
        for entry, result in zip(current, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.error("fetching the hints of %s failed: %r", entry.node, result)
            elif entry.node in self._entries:  # not forgotten meanwhile
                self._entries[entry.node] = result

    def _evict(self) -> None:
        """Past ``max_entries``: drop the least recently asked about (never the agents file's nodes)."""
        used = self._used
        over = len(self._entries) - self.max_entries
        for node in list(used):
            if over <= 0:
                break
            if node in self.directory.urls or node not in self._entries:
                continue
            del self._entries[node]
            del used[node]
            over -= 1

    async def _fetch(self, entry: AgentEntry) -> AgentEntry:
        """One conditional GET of ``entry``'s hints; the updated entry (never raises for a bad agent)."""
        if entry.url is None:
            return dataclasses.replace(entry, error="no agent URL")
        if self._session is None or self._semaphore is None:
            raise RuntimeError("AgentCache.start() was not awaited")
        headers = {"If-None-Match": entry.etag} if entry.etag and entry.hints is not None else None
        started = self._clock()
        outcome, error = FAILED, None
        try:
            async with (
                self._semaphore,
                self._session.get(entry.url + HINTS_PATH, headers=headers) as response,
            ):
                if response.status == 304 and entry.hints is not None:
                    outcome = NOT_MODIFIED
                    return dataclasses.replace(entry, answered_at=self._clock(), error=None)
                if response.status != 200:
                    error = f"HTTP {response.status} from {HINTS_PATH}"
                    return self._failed(entry, error)
                body = await read_body(response, MAX_HINTS_BYTES)
                if body is None:
                    return self._failed(entry, f"{HINTS_PATH} body is over {MAX_HINTS_BYTES} bytes")
                hints = _decode(body)
                outcome = MODIFIED
                return dataclasses.replace(
                    entry,
                    hints=hints,
                    index=node_index(hints),
                    etag=response.headers.get("ETag"),
                    answered_at=self._clock(),
                    error=None,
                )
        except asyncio.TimeoutError:
            return self._failed(entry, f"no answer within {self.timeout_seconds:g}s")
        except aiohttp.ClientError as exc:
            return self._failed(entry, client_error_text(exc))
        except (ValueError, UnicodeDecodeError) as exc:
            return self._failed(entry, f"bad {HINTS_PATH} body: {exc}"[:300])
        finally:
            if self._on_fetch is not None:
                self._on_fetch(outcome, self._clock() - started)

    def _failed(self, entry: AgentEntry, error: str) -> AgentEntry:
        if entry.error is None:
            log.warning("agent of node %s (%s): %s", entry.node, entry.url, error)
        return dataclasses.replace(entry, error=error)


def _decode(body: bytes) -> NodeHints:
    """An agent's ``/v1/hints`` body, read once under ``HINTS_BOUNDS`` (size and depth before the parser,
    numbers finite) and then within the hints' limits; any refusal is a ``ValueError`` naming it."""
    hints = hints_from_jsonable(boundedjson.loads(body, HINTS_BOUNDS, HINTS_PATH))
    check_limits(hints, HINTS_PATH)
    return hints
