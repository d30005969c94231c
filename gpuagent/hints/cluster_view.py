"""The extender's cluster view: every node's ``GPUNodeState``, kept by one list and watch.

This is kube-scheduler's own informer pattern: a cold start is one LIST, after which every node that has an
agent is judged on the first call; the watch then applies each change as it is written; a restart or a
failover loses nothing that the API server holds. The LIST is read in pages of ``PAGE_SIZE`` objects
(``reflector``: a consistent list, every page at the first page's version), each page decoded while the API
server prepares the next, so at 100,000 nodes no answer is a gigabyte and a list holds two pages' bytes
at most (the one decoded, the next arriving) beside what the view keeps. Nothing here
talks to an agent: the extender's answers depend on the API server alone, whose load is the agents' writes
(``hints.publisher``: on change, rate-limited, plus a heartbeat).

It offers the extender what ``AgentCache`` offers (``lookup``, ``counts``, ``start``/``run``/``close``), with
``AgentEntry`` records whose ``answered_at`` is the state's heartbeat on this process's monotonic clock: the
heartbeat's age by the agent's clock when first seen, by ours after that. So the extender's staleness rule
is the same for both sources: a node whose state is older than ``published_max_age`` is filtered out,
unresolvable, with the reason.

Generations: each object carries its agent's ``(epoch, sequence)``. A write older by both its generation and
its heartbeat is ignored, so a write left in flight by a replaced agent cannot roll a node back; a later
heartbeat is enough, so a forged sequence cannot hold a node's later writes off. Neither may come from the
future: a write whose heartbeat or epoch is ahead of this process's clock by more than the clock-skew bound
(``max_clock_skew``) is not applied and does not order later writes; the node is unresolvable, saying so,
until its agent writes again. So a forged generation or heartbeat pins a node's state for at most that
bound.

Unreadable objects: an object that cannot be read (too big, too deep, a wrong type, a figure out of its
physical range: ``hints.published.decode_state``) makes its node unresolvable with the reason, when its
name can still be read, and is counted; it is never the list's, the watch's or the process's problem. The
log names the node, once per node and reason; ``collector`` exports the counts.

Memory: nodes whose states have the same verdict key (``hints.verdict_key``: alike in everything the
extender's verdicts read) share one decoded copy and its index, so a fleet of alike idle nodes costs one
state. A node's hints here are therefore those of the first node seen in its state: what differs between
them (names, memory used, MIG instances) is what nothing of the extender reads. Objects are folded onto the
copy their key already has as each page is decoded, not once the list is complete, so a list of 100,000
alike nodes never holds 100,000 decoded copies at once. What a node costs beyond its state's copy is its
entry, its generation and its name (docs/scheduling.md, "The cluster view", has the bytes measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuagent.hints.agents import FRESH, STALE, STATES, UNREACHABLE, AgentEntry
from gpuagent.hints.ages import AgeBuckets
from gpuagent.hints.interned import shared_strings
from gpuagent.hints.published import (
    COLLECTION_PATH,
    GROUP,
    KIND,
    OBJECT_BOUNDS,
    PLURAL,
    Generation,
    PublishedState,
    decode_page,
    decode_state,
    identify,
)
from gpuagent.hints.score import NodeIndex, node_index
from gpuagent.hints.verdict_key import KindKeys, kind_keys
from gpuagent.kubeapi import ApiConnection
from gpuagent.reflector import Reflector, wire
from gpuagent.snapshot.hints import NodeHints

log = logging.getLogger(__name__)

UNKNOWN_REASON = "no GPUNodeState published for this node (no agent, or it cannot write to the API server)"
MAX_LOGGED_BAD = 1024  # nodes whose refusal is remembered for the log's once-per-node rule
MAX_NAMED = 200  # nodes named in the metric of unresolvable nodes (the count covers them all)
MAX_CLOCK_SKEW_S = 300.0  # how far ahead of ours a node's clock may be (NTP keeps them within a second)
PAGE_SIZE = 500  # objects a list answer holds (client-go's pager's default): 5 MB at most of 10 KB objects
# Outcomes of a write, for the metrics.
APPLIED, UNREADABLE, STALE_WRITE, AHEAD = "applied", "unreadable", "stale", "ahead_of_clock"


@dataclass(frozen=True, slots=True)
class _Meta:
    resourceVersion: str


@dataclass(slots=True)
class SharedState:
    """One state's decoded hints, index and keys, and how many nodes are in it. Its keys per kind are
    attributes of their own too (``shared``, ``exclusive``, ``mig``: the fields of ``KindKeys``), so the
    extender reads a node's key for a request's kind in one step from the node's state."""

    hints: NodeHints
    index: NodeIndex
    key: bytes  # the state's verdict key (one bytes object for all its nodes)
    keys: KindKeys  # its keys per kind of request, worked out once per state
    users: int = 0
    shared: bytes = field(init=False)
    exclusive: bytes = field(init=False)
    mig: bytes = field(init=False)
    columns: int = -1  # where the extender's columns hold this state (``fitcolumns.StateColumns.kept_slots``)

    def __post_init__(self) -> None:
        self.shared, self.exclusive, self.mig = self.keys


@dataclass(frozen=True, slots=True)
class _Item:
    """One decoded object: its state, or why it could not be read."""

    metadata: _Meta
    node: str
    state: PublishedState | None
    error: str = ""


class ClusterView(Reflector):
    """Every node's published GPU state; see the module docstring."""

    path = COLLECTION_PATH
    resource = PLURAL
    api_group = GROUP
    what = "published GPU states"
    cluster_wide = True
    max_depth = OBJECT_BOUNDS.max_depth + 1  # a watch event: its object is one level down
    page_size = PAGE_SIZE

    def __init__(
        self,
        *,
        connection: ApiConnection | None = None,
        kubeconfig_path: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sync_timeout: float = 1.0,
        max_clock_skew: float = MAX_CLOCK_SKEW_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(None, log=log, connection=connection, kubeconfig_path=kubeconfig_path,
                         clock=monotonic, **kwargs)
        self._monotonic = monotonic
        self._wall = wall_clock
        self.sync_timeout = sync_timeout
        self.max_clock_skew = max_clock_skew
        self._entries: dict[str, AgentEntry] = {}
        # node -> the generation and heartbeat of its last write applied (kept while a later write is refused)
        self._seen: dict[str, tuple[Generation, float]] = {}
        self._shared: dict[bytes, SharedState] = {}  # verdict key -> the one copy of that state
        self._listed: dict[bytes, NodeHints] = {}  # while a list is read: the copy of each key decoded so far
        self._synced_event = asyncio.Event()
        self._logged: dict[str, str] = {}  # node -> the refusal last logged for it
        self.outcomes = dict.fromkeys((APPLIED, UNREADABLE, STALE_WRITE, AHEAD), 0)  # writes, for metrics
        self.version = 0  # counts the changes to the view: an answer computed at one version holds until it
        self._states: dict[str, SharedState] = {}  # node -> its state, for the nodes that can be judged
        self._ages = AgeBuckets()  # the nodes' heartbeats, for ``expiry``
        self.unknown_reason = UNKNOWN_REASON

    # -- what the reflector asks of a view -----------------------------------------------------------------
    def _decode_list(self, body: bytes) -> tuple[list[Any], str]:
        decode, rv, _ = self._decode_page(body)
        return decode(), rv

    def _decode_page(self, body: bytes) -> tuple[Callable[[], list[Any]], str, str]:
        try:
            page = decode_page(body)
        except ValueError as exc:  # the reflector reports a protocol failure and lists again
            raise wire().DecodeError(str(exc)) from None

        def decode() -> list[Any]:
            return [self._listed_item(self._decode(raw, page.depth_checked)) for raw in page.items]

        return decode, page.resource_version, page.continue_token

    def _listed_item(self, item: _Item) -> _Item:
        """A listed object holding the copy of its state decoded before it (the view's, else the list's
        first), its own copy dropped at once."""
        state = item.state
        if state is None:
            return item
        hints = self._listed.get(state.key)
        if hints is None:
            shared = self._shared.get(state.key)
            hints = self._listed[state.key] = shared.hints if shared is not None else state.hints
        if hints is state.hints:
            return item
        return dataclasses.replace(item, state=dataclasses.replace(state, hints=hints))

    def _decode_object(self, raw: Any) -> _Item:
        return self._decode(raw, True)  # the reflector counted its event's depth within max_depth

    def _decode_cut_object(self, raw: Any) -> _Item:
        return self._decode(raw, False)  # cut to max_depth: still one level too deep, so refused

    def _decode(self, raw: Any, depth_checked: bool) -> _Item:
        try:
            state = decode_state(raw, depth_checked=depth_checked)
        except ValueError as exc:
            name, rv = identify(raw)
            return _Item(_Meta(rv), name, None, str(exc)[:300])
        return _Item(_Meta(state.resource_version), state.node, state)

    def _replace(self, items: list[Any]) -> None:
        listed = {item.node for item in items if item.node}
        for node in self._entries.keys() - listed:  # deleted while the watch was down
            self._forget(node)
        for item in items:
            self._put(item)  # the generation check applies across a re-list too
        self._listed.clear()
        gc.freeze()  # thousands of long-lived objects: kept out of every later collection
        self._synced_event.set()
        self.version += 1

    def _put(self, obj: Any) -> None:
        item: _Item = obj
        state = item.state
        if state is None:
            self.outcomes[UNREADABLE] += 1
            self._refuse(item.node, f"its {KIND} cannot be read: {item.error}")
            return
        node = state.node
        ahead = max(state.heartbeat_unix, state.generation.epoch / 1e9) - self._wall()
        if ahead > self.max_clock_skew:  # not applied, and not the generation later writes are held to
            self.outcomes[AHEAD] += 1
            self._refuse(node, f"its {KIND} was written {ahead:.0f}s ahead of the extender's clock, beyond "
                         f"the {self.max_clock_skew:g}s clock-skew bound (heartbeatTime or agent.epoch)")
            return
        seen = self._seen.get(node)
        if seen is not None and not _newer(state.generation, state.heartbeat_unix, *seen):
            self.outcomes[STALE_WRITE] += 1
            return
        self.outcomes[APPLIED] += 1
        self._seen[node] = (state.generation, state.heartbeat_unix)
        self._logged.pop(node, None)
        self.version += 1
        previous = self._entries.get(node)
        age = max(0.0, self._wall() - state.heartbeat_unix)
        answered_at = self._monotonic() - age
        self._ages.add(answered_at)
        if previous is not None and previous.answered_at is not None:
            self._ages.remove(previous.answered_at)
        if previous is not None and previous.key == state.key:  # the same objects: the per-node memo holds
            self._entries[node] = dataclasses.replace(previous, answered_at=answered_at)
            return
        if previous is not None:
            self._release(previous.key)
        shared = self._acquire(state.key, state.hints)
        self._entries[node] = AgentEntry(node=node, url=None, hints=shared.hints, index=shared.index,
                                         answered_at=answered_at, key=shared.key, keys=shared.keys)
        self._states[node] = shared

    def _refuse(self, node: str, reason: str) -> None:
        """The node's latest write cannot be judged: the node is unresolvable, saying why, until a write of
        its own is applied (an object whose name cannot be read is only counted and logged)."""
        if self._logged.get(node) != reason and (node in self._logged or len(self._logged) < MAX_LOGGED_BAD):
            self._logged[node] = reason
            log.warning("%s of node %r refused (the node is unresolvable until its agent writes again): %s",
                        KIND, node or "(no readable name)", reason)
        if not node:
            return
        previous = self._entries.get(node)
        if previous is not None and previous.unreadable == reason:
            return
        if previous is not None:
            self._let_go(previous)
        self._entries[node] = AgentEntry(node=node, url=None, unreadable=reason)
        self.version += 1

    def _drop(self, obj: Any) -> None:
        item: _Item = obj
        if item.node:
            self._forget(item.node)

    def _forget(self, node: str) -> None:
        entry = self._entries.pop(node, None)
        self._seen.pop(node, None)
        self._logged.pop(node, None)
        if entry is not None:
            self._let_go(entry)
            self.version += 1

    def _let_go(self, entry: AgentEntry) -> None:
        """What the view held for a node's entry that is replaced or forgotten: its state, age and keys."""
        self._release(entry.key)
        self._states.pop(entry.node, None)
        if entry.answered_at is not None:
            self._ages.remove(entry.answered_at)

    def _acquire(self, key: bytes, hints: NodeHints) -> SharedState:
        """The hints, index and keys kept for ``key``: nodes in the same state share one copy."""
        shared = self._shared.get(key)
        if shared is None:
            hints = shared_strings(hints)
            shared = self._shared[key] = SharedState(hints, node_index(hints), key, kind_keys(hints, key))
        shared.users += 1
        return shared

    def _release(self, key: bytes | None) -> None:
        shared = self._shared.get(key) if key is not None else None
        if shared is not None:
            shared.users -= 1
            if shared.users <= 0:
                del self._shared[key]  # type: ignore[arg-type]

    def _size(self) -> int:
        return len(self._entries)

    @property
    def bad_objects(self) -> int:
        """Writes refused as unreadable."""
        return self.outcomes[UNREADABLE]

    @property
    def stale_writes(self) -> int:
        """Writes ignored for an older generation and heartbeat."""
        return self.outcomes[STALE_WRITE]

    # -- what the extender asks of a node source ----------------------------------------------------------
    def get(self, node: str) -> AgentEntry | None:
        return self._entries.get(node)

    def by_node(self) -> Mapping[str, AgentEntry]:
        """Node -> its entry: the view's own mapping, read only (the extender looks a call's names up in it,
        one C-speed ``get`` a name where ``get`` here is a Python call: 1.7 against 5.7 ms at 20,000)."""
        return self._entries

    def states_by_node(self) -> Mapping[str, SharedState]:
        """Node -> its state (hints, index, keys), for the nodes whose state can be judged: read only. The
        extender's common call maps its names through it at C speed, one lookup a name, and judges the
        states new to a request from what it gives; a dict slot a node (the states are the view's own)."""
        return self._states

    def knows(self, node: str) -> bool:
        """Whether ``node`` has published a state (an unknown name is never anything else here)."""
        return node in self._entries

    def entries(self) -> Iterable[AgentEntry]:
        return self._entries.values()

    def __len__(self) -> int:
        return len(self._entries)

    def expiry(self, max_age_seconds: float) -> float:
        """A monotonic time by which no state now known has turned older than ``max_age_seconds``: until
        then, and while the version holds, every verdict stands. At most ``ages.BUCKET_SECONDS`` before the
        first state ages out (``ages.AgeBuckets``: no pass over the nodes)."""
        return self._ages.oldest() + max_age_seconds

    def counts(self, max_age_seconds: float) -> dict[str, int]:
        now = self._monotonic()
        counts = dict.fromkeys(STATES, 0)
        for entry in self._entries.values():
            if entry.answered_at is None:  # refused: nothing to judge it by
                counts[UNREACHABLE] += 1
            else:
                counts[FRESH if now - entry.answered_at <= max_age_seconds else STALE] += 1
        return counts

    def unresolvable(self) -> dict[str, str]:
        """Node -> why its latest write is refused (unreadable, or ahead of the clock)."""
        return {node: e.unreadable for node, e in self._entries.items() if e.unreadable is not None}

    def collector(self) -> Collector:
        """The view's own metrics, computed at scrape time (no I/O)."""
        return _ViewCollector(self)

    async def lookup(self, nodes: Iterable[str], *, deadline_seconds: float | None = None
                     ) -> dict[str, AgentEntry]:
        """The entries of ``nodes`` (unknown nodes are left out); before the first list has answered, waits
        for it for at most ``deadline_seconds`` (default ``sync_timeout``)."""
        if not self._synced_event.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._synced_event.wait(), deadline_seconds or self.sync_timeout)
        entries = self._entries
        return {node: entry for node in nodes if (entry := entries.get(node)) is not None}

    def set_fetch_observer(self, observer: object) -> None:
        """No agent is fetched: nothing to observe (the extender's metrics call this on every source)."""

    async def start(self) -> None:
        """Nothing to open before ``run``: the reflector opens its connection there."""

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch until ``stop`` is set."""
        task = asyncio.create_task(super().run(), name="cluster-view")
        try:
            await stop.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.aclose()


def _newer(generation: Generation, heartbeat: float, held: Generation, held_heartbeat: float) -> bool:
    """Whether a write may replace the one held: a later write of the same agent or a later agent (by
    epoch), or a later heartbeat (the node's clock went back across a restart; or the generation held was
    forged, which a heartbeat can outrun since neither may be ahead of the clock by more than the skew)."""
    later = (generation.epoch, generation.sequence) >= (held.epoch, held.sequence)
    return later or heartbeat > held_heartbeat


class _ViewCollector(Collector):
    """Writes by outcome, and the nodes whose latest write is refused (named, up to ``MAX_NAMED``)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        writes = CounterMetricFamily(
            "gpuagent_extender_published_writes",
            "GPUNodeState writes seen by the cluster view, by outcome: applied, unreadable (refused: the "
            "node unresolvable), stale (an older generation and heartbeat, ignored), ahead_of_clock "
            "(refused: written beyond the clock-skew bound).", labels=["outcome"])
        for outcome, count in self._view.outcomes.items():
            writes.add_metric([outcome], count)
        yield writes
        refused = self._view.unresolvable()
        nodes = GaugeMetricFamily(
            "gpuagent_extender_published_refused_nodes",
            "Nodes whose latest GPUNodeState write is refused (unresolvable until their agent writes again).",
            value=len(refused))
        yield nodes
        named = GaugeMetricFamily(
            "gpuagent_extender_published_refused_node_info",
            f"The first {MAX_NAMED} nodes whose latest GPUNodeState write is refused, and why "
            "(unreadable, ahead_of_clock); the log has the full reason.", labels=["node", "reason"])
        for node, reason in sorted(refused.items())[:MAX_NAMED]:
            named.add_metric([node, AHEAD if "clock-skew bound" in reason else UNREADABLE], 1)
        yield named
