"""``gpuagent extender``: a kube-scheduler extender (filter, prioritize) answering from the agents' hints.

kube-scheduler calls ``POST <prefix>/filter`` and ``<prefix>/prioritize`` for every pod that requests a
managed resource, with the candidate nodes, and waits. The answers come from memory: ``AgentCache`` holds
every agent's ``/v1/hints`` (refreshed in the background) and each node is judged by ``score_node``, the
code that serves the agents' own ``/v1/hints/score``, so the extender and an agent never disagree.

Per node, in order:

- the pod requests no GPU: every node passes, every score is 0, no agent is asked;
- the pod asks for GPUs through DRA ResourceClaims that cannot be judged (``gpuagent.hints.claims``: read,
  when they can be, by ``ClaimReader``): every node passes, score 0, and the reason is logged and counted
  (kube-scheduler's own DRA plugin still filters the nodes and allocates the devices);
- the pod's GPU request cannot be read (a bad ``gpuagent.io/*`` value): every node fails, unresolvable,
  with the reason naming the annotation;
- a node the extender does not know (not in the API server's node list nor the agents file,
  ``gpuagent.hints.nodes``): the node fails, unresolvable, "unknown node", and nothing is fetched for it;
- no hints, or the agent has not answered for ``max_age`` seconds: the node fails, unresolvable (evicting
  pods there would not help), with the reason;
- otherwise ``score_node``: a node the request does not fit fails with its reasons (preemption may help);
  a node it fits passes, and prioritize scores it 0-10 (the 0-100 fit score, divided by 10).

What a call costs is what its names' distinct states cost (issue 31). With the cluster view each name is
one lookup and its state's key for the request's kind (``verdict_key.kind_keys``); a state already judged
for this request (the last ``MEMO_REQUESTS`` requests are remembered) is its verdict, and the states new
to it are judged together: a request for whole GPUs over columns of every state's GPUs at once
(``hints.fitcolumns``, numpy, the same arithmetic as ``fit_node``: equal verdicts), MIG requests, the
placement of several GPUs and the rare state the columns cannot hold exactly by ``fit_node`` one state at a
time. A failing state's one-line reason is written once per call for all the states whose reasons read the
same figures. A repeated call over an unchanged view gets the same answer, and over HTTP the same bytes
(the last ``WRITTEN_ANSWERS`` answers keep them). Replies are written by msgspec. With the agents' cache
(no cluster view) each node is judged alone, its verdict kept while its hints are the same object.

Judging one node never fails the call: an exception while judging a node (a state no agent writes, or a
bug it meets) fails that node alone, unresolvable, with the reason ``fitreasons.unjudgeable`` words; the
traceback is logged once per state and request and counted (``gpuagent_extender_judge_errors_total``).
Every reason reaches kube-scheduler (its events and logs) with control and bidi characters shown as escapes
(``untrusted.shown``): tenant and resource names are anyone's.

Malformed JSON is a 400 naming the field, never a 5xx: with ``ignorable: true`` the scheduler then goes on
without the extender. Any other exception in a handler is a JSON 500 (``_internal_errors``), never
aiohttp's plain-text page. Bodies are read within bounds (``gpuagent.httpbody``: size before and after
inflation, time, JSON depth and values), at most ``BODIES_AT_ONCE`` at a time so memory stays bounded
whatever is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from gpuagent import gctune
from gpuagent.hints import fitcolumns
from gpuagent.hints.agents import STATES, AgentCache, AgentDirectory, AgentEntry, AgentTLS
from gpuagent.hints.claim_reader import ClaimReader
from gpuagent.hints.claims import Unjudged
from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.extender_config import ExtenderOptions
from gpuagent.hints.extender_protocol import (
    ArgsError,
    ExtenderArgs,
    extender_score,
    filter_result,
    host_priority_list,
    parse_args,
)
from gpuagent.hints.fit import NodeFit, fit_node
from gpuagent.hints.fitcolumns import FITS, NOT_COLUMNAR, PLACE, STATIC, StateColumns
from gpuagent.hints.fitreasons import MEMORY_SHORT, SHARE_SHORT, node_reason, size_reason, unjudgeable
from gpuagent.hints.fitrequest import FitRequest, kind_name
from gpuagent.hints.malformed import MalformedPod
from gpuagent.hints.nodeindex import NO_INDEX, NodeIndex, node_index
from gpuagent.hints.nodes import KnownNodes, NodeLister
from gpuagent.hints.podrequest import PodRequestError, pod_fit_request, pod_name
from gpuagent.hints.verdict_key import KindKeys
from gpuagent.httpbody import BodyError, BodyLimits, error_response, parse_json, read_body
from gpuagent.httperrors import Handler, json_error, json_errors
from gpuagent.httpguard import (
    ConnectionGuard,
    GuardCollector,
    GuardedSite,
    ServerLimits,
    raise_open_file_limit,
)
from gpuagent.snapshot import NodeHints
from gpuagent.untrusted import shown

log = logging.getLogger(__name__)

NodeSource = AgentCache | ClusterView  # where node states come from: the agents over HTTP, or Kubernetes

REASON_PREFIX = "gpuagent: "
MAX_REASON_CHARS = 300
MAX_BODY_BYTES = 8 * 1024 * 1024  # NodeNames of 5,000 nodes and a pod: ~0.2 MB; ~600 full Node objects
BODY_TIMEOUT_SECONDS = 10.0
BODIES_AT_ONCE = 2  # scheduler calls read, parsed and answered at once (kube-scheduler makes one at a time)
UNKNOWN_NODE = "unknown node: not in the API server's node list nor the agents file"
UNKNOWN_LOG_SECONDS = 60.0
MEMO_REQUESTS = 32  # distinct pod requests whose per-node verdicts are kept
WRITTEN_ANSWERS = 4  # answers whose replies are kept written (1.6 MB for a filter of 20,000 names)
LOGGED_UNJUDGED = 1024  # (pod, reason) pairs already logged
# The garbage collector of the extender's process (``tune_garbage_collector``): its view holds every node's
# state for hours and each call makes a few objects per node; at CPython's thresholds the collections a
# call met added 15 ms to a never-seen pod's p99 over 5,000 nodes (48.6 against 33.8 ms with none).
GC_THRESHOLDS = (50_000, 20, 100)
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _RequestMemo:
    """One request's verdicts: by state key (the cluster view's ``kind_keys``, the request's kind's), by node
    while its hints are the same object (the agents' cache), and the last whole answer."""

    __slots__ = ("answer", "nodes", "states")

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[NodeHints, Verdict]] = {}
        self.states: dict[bytes, Verdict] = {}
        self.answer: _Judged | None = None  # the cluster view's last whole answer


@dataclass(slots=True)
class _Judged:
    """A call's verdicts, one per candidate name in the order sent, and what answers them."""

    verdicts: list[Verdict]
    passed: int
    version: int | None = None  # the cluster view's, when these verdicts were worked out from it
    until: float = 0.0  # monotonic time they hold until (the first state to age out)
    nodes: tuple[str, ...] = ()
    replies: dict[str, bytes] = field(default_factory=dict)  # verb -> the reply written (NodeNames form)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer for one pod."""

    fits: bool
    score: int = 0  # 0-10
    reason: str = ""
    unresolvable: bool = False


class ExtenderMetrics:
    """The extender's own metrics, on its own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gpuagent_extender_requests_total",
            "Scheduler calls by verb and outcome (ok, bad_request, error).",
            ["verb", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "gpuagent_extender_request_duration_seconds",
            "Time to answer a scheduler call, by verb.",
            ["verb"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.nodes = Counter(
            "gpuagent_extender_nodes_total",
            "Candidate nodes judged, by verb and verdict.",
            ["verb", "verdict"],
            registry=registry,
        )
        self.fetches = Counter(
            "gpuagent_extender_agent_fetches_total",
            "Requests for an agent's /v1/hints by result (modified, not_modified, error).",
            ["result"],
            registry=registry,
        )
        self.unknown = Counter(
            "gpuagent_extender_unknown_nodes_total",
            "Candidate names that are not nodes the extender knows (filtered, never fetched), by verb.",
            ["verb"],
            registry=registry,
        )
        self.unjudged = Counter(
            "gpuagent_extender_pods_unjudged_total",
            "Calls for pods whose GPU ResourceClaims could not be judged (passed on every node), by verb and "
            "reason (no_api, unreadable, allocated, all_devices, first_available, mig_profile).",
            ["verb", "reason"],
            registry=registry,
        )
        self.judge_errors = Counter(
            "gpuagent_extender_judge_errors_total",
            "Nodes whose judging raised (failed, unresolvable, with the exception's type as the reason), by "
            "verb; counted once per node state and pod request.",
            ["verb"],
            registry=registry,
        )
        self.fetch_duration = Histogram(
            "gpuagent_extender_agent_fetch_duration_seconds",
            "Time of one /v1/hints request to an agent.",
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )

    def observe_fetch(self, outcome: str, seconds: float) -> None:
        self.fetches.labels(outcome).inc()
        self.fetch_duration.observe(seconds)


class _AgentsCollector(Collector):
    """Agents known by state, computed at scrape time from the cache (no I/O)."""

    def __init__(self, cache: NodeSource, max_age_seconds: float) -> None:
        self._cache = cache
        self._max_age = max_age_seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpuagent_extender_agents",
            "Node agents the extender knows, by state (fresh, stale, unreachable).",
            labels=["state"],
        )
        try:
            counts = self._cache.counts(self._max_age)
        except Exception:  # a failing collector must not fail the scrape
            log.exception("counting the agents failed")
            return
        for state in STATES:
            family.add_metric([state], counts[state])
        yield family


class Extender:
    """Filter and prioritize from the cache; pure apart from the cache's on-demand fetch of new nodes."""

    def __init__(
        self,
        cache: NodeSource,
        *,
        max_age_seconds: float = 30.0,
        gpu_resource_names: Sequence[str] = ("nvidia.com/gpu",),
        claims: ClaimReader | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        metrics: ExtenderMetrics | None = None,
    ) -> None:
        self.cache = cache
        self._unknown_reason = getattr(cache, "unknown_reason", "agent not known")
        self._unknown_verdict = Verdict(False, reason=_reason(getattr(cache, "unknown_reason", UNKNOWN_NODE)),
                                        unresolvable=True)
        self.max_age_seconds = max_age_seconds
        self.gpu_resource_names = tuple(gpu_resource_names)
        self.claims = claims if claims is not None else ClaimReader(None)
        self._logged_unjudged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self.metrics = metrics
        # request -> the verdicts of the last MEMO_REQUESTS distinct requests: per node, reused while a
        # node's hints are the same object (a refresh that got a 304 keeps it), which serves the prioritize
        # that follows each filter and the replicas of one workload, which ask alike; and per state key
        # (the cluster view's ``kind_keys``, the request's kind's), so nodes in the same state (idle nodes of
        # one model, say) are judged once for a request never seen.
        self._memo: OrderedDict[FitRequest, _RequestMemo] = OrderedDict()
        self._written: deque[_Judged] = deque()  # the answers holding written replies, oldest first
        self._columns = StateColumns()  # the states judged over columns, by verdict key
        self._unresolvable_verdicts: dict[str, Verdict] = {}
        # states judged for requests new to them: over the columns, or one by one by fit_node
        self.states_judged = {"columns": 0, "per_state": 0}
        self._unknown_logged_at: float | None = None
        self._unknown_since_log = 0

    async def filter(self, body: Any) -> dict[str, Any]:
        args = parse_args(body)
        return _filter_reply(args, await self._judge(args, "filter"))

    async def prioritize(self, body: Any) -> list[dict[str, Any]]:
        args = parse_args(body)
        return _priorities(args, await self._judge(args, "prioritize"))

    async def reply(self, verb: str, body: Any) -> bytes:
        """The verb's reply as the JSON kube-scheduler reads: what ``filter`` or ``prioritize`` answer,
        written once per answer (a repeated call over an unchanged view gets the same bytes)."""
        args = parse_args(body)
        judged = await self._judge(args, verb)
        written = judged.replies.get(verb)
        if written is None:
            written = _encode(_filter_reply(args, judged) if verb == "filter" else _priorities(args, judged))
            if judged.version is not None and args.nodes is None:  # the reply depends on the names alone
                if not judged.replies:
                    self._written.append(judged)
                    if len(self._written) > WRITTEN_ANSWERS:
                        self._written.popleft().replies.clear()
                judged.replies[verb] = written
        return written

    async def _judge(self, args: ExtenderArgs, verb: str) -> _Judged:
        nodes = args.node_names
        try:
            claims = await self.claims.pod_gpus(args.pod) if isinstance(args.pod, Mapping) else None
            request = pod_fit_request(args.pod, gpu_resource_names=self.gpu_resource_names, claims=claims)
        except MalformedPod as err:
            raise ArgsError(err.field, err.message) from None
        except PodRequestError as err:
            log.info("pod %s: %s", pod_name(args.pod), err)
            bad = Verdict(False, reason=_reason(f"{err.field}: {err.message}"), unresolvable=True)
            return self._count(verb, _Judged([bad] * len(nodes), 0))
        except Unjudged as err:
            self._unjudged(verb, args.pod, err)
            return self._count(verb, _Judged([_FITS[0]] * len(nodes), len(nodes)))
        if request is None:  # no GPU asked for: not ours to judge
            return self._count(verb, _Judged([_FITS[0]] * len(nodes), len(nodes)))
        memo = self._memo.pop(request, None)
        if memo is None or len(memo.nodes) + len(memo.states) > 2 * len(self.cache) + 1000:  # forgotten nodes
            memo = _RequestMemo()
        self._memo[request] = memo  # most recent last
        while len(self._memo) > MEMO_REQUESTS:
            self._memo.popitem(last=False)
        now = self._monotonic()
        version = getattr(self.cache, "version", None)  # the cluster view's count of changes
        if version is not None:
            last = memo.answer
            if last is not None and last.version == version and now <= last.until and last.nodes == nodes:
                return self._count(verb, last)  # nothing changed, nothing aged out: the same answer
        if version is not None:  # the cluster view: once its first list is in, one lookup a name in it
            await self.cache.lookup(())  # waits for that list (for at most its sync timeout)
            get = self.cache.by_node().get  # type: ignore[union-attr]
            fresh = now <= self.cache.expiry(self.max_age_seconds)  # type: ignore[union-attr]
        else:  # the agents' cache: fetches the names it has never seen
            get = (await self.cache.lookup(nodes)).get
            fresh = False
        verdicts = self._verdicts(verb, nodes, get, request, memo, now, fresh)
        judged = _Judged(verdicts, sum([v.fits for v in verdicts]))
        if version is not None and version == self.cache.version:  # type: ignore[union-attr]
            judged.version, judged.nodes = version, nodes
            judged.until = self.cache.expiry(self.max_age_seconds)  # type: ignore[union-attr]
            memo.answer = judged
        return self._count(verb, judged)

    def _verdicts(self, verb: str, nodes: Sequence[str], get: Callable[[str], AgentEntry | None],
                  request: FitRequest, memo: _RequestMemo, now: float, fresh: bool) -> list[Verdict]:
        """Each name's verdict, in order: one lookup a name, and each state not judged before for this
        request judged once (``_judge_states``). ``fresh``: no state of the source has aged out."""
        max_age = self.max_age_seconds
        kind = KindKeys._fields.index(kind_name(request))
        by_node, by_state = memo.nodes, memo.states
        known = by_state.get
        if fresh:  # the common call: every name a node of the view, looked up by its state's key
            entries = [get(node) for node in nodes]
            try:
                keys = [entry.keys[kind] for entry in entries]  # type: ignore[union-attr,index]
            except (AttributeError, TypeError):  # a name not in the view, or a state that cannot be judged
                pass  # one by one, below
            else:
                verdicts = [known(key) for key in keys]
                new = {key: entry for entry, key, verdict in zip(entries, keys, verdicts, strict=True)
                       if verdict is None}
                if not new:
                    return verdicts  # type: ignore[return-value]
                self._judge_states(verb, request, new, by_state)  # type: ignore[arg-type]
                return [verdict if verdict is not None else by_state[key]
                        for key, verdict in zip(keys, verdicts, strict=True)]
        out: list[Verdict | bytes] = []
        add = out.append
        pending: dict[bytes, AgentEntry] = {}  # state key -> a node in that state, to judge it by
        unknown = 0
        for node in nodes:
            try:  # whatever one node's entry holds, it is that node's verdict, never the call's error
                entry = get(node)
                if entry is None:
                    if self.cache.knows(node):
                        add(self._unresolvable(self._unknown_reason))
                    else:
                        add(self._unknown_verdict)
                        unknown += 1
                    continue
                answered = entry.answered_at
                if entry.hints is None or answered is None or now - answered > max_age:
                    add(self._unresolvable(entry.reason(now, max_age)))
                    continue
                keys = entry.keys  # the cluster view's: its kind's key leaves out what it never reads
                if keys is not None:
                    key = keys[kind]
                    verdict = known(key)
                    if verdict is None:
                        pending.setdefault(key, entry)
                        add(key)  # judged below, with the other states new to this request
                    else:
                        add(verdict)
                    continue
                hints = entry.hints
                seen = by_node.get(node)
                if seen is not None and seen[0] is hints:
                    add(seen[1])
                    continue
                try:
                    verdict = _score(entry, request)
                except Exception as exc:  # kept below like any verdict: logged once per state
                    verdict = self._unjudgeable(verb, node, exc)
                self.states_judged["per_state"] += 1
                by_node[node] = (hints, verdict)
                add(verdict)
            except Exception as exc:
                add(self._unjudgeable(verb, node, exc))
        if unknown:
            self._unknown(verb, unknown, len(nodes))
        if not pending:
            return out  # type: ignore[return-value]
        self._judge_states(verb, request, pending, by_state)
        return [v if v.__class__ is Verdict else by_state[v] for v in out]  # type: ignore[index]

    def _judge_states(self, verb: str, request: FitRequest, pending: Mapping[bytes, AgentEntry | None],
                      by_state: dict[bytes, Verdict]) -> None:
        """The verdict of each state new to ``request`` (key -> a node in it), into ``by_state``: over the
        columns (``hints.fitcolumns``) where they answer, else by ``fit_node`` state by state."""
        left: dict[bytes, AgentEntry] = pending  # type: ignore[assignment]
        if fitcolumns.handles(request):
            try:
                self._columns.forget_if_over(len(self.cache))
                keys, entries = list(pending), list(pending.values())
                slots = self._columns.slots(zip([e.key for e in entries], [e.index for e in entries],  # type: ignore[union-attr]
                                                strict=True))
                columnar = [i for i, slot in enumerate(slots) if slot != NOT_COLUMNAR]
                judged = self._columns.judge([slots[i] for i in columnar], request)
            except Exception:  # a bug of the columns: every state is judged one by one instead
                log.warning("%s: judging %d states over columns raised; judged one by one", verb,
                            len(pending), exc_info=True)
                self._columns.clear()
            else:
                left = {keys[i]: entries[i] for i, slot in enumerate(slots) if slot == NOT_COLUMNAR}  # type: ignore[misc]
                self.states_judged["columns"] += len(columnar)
                if len(columnar) < len(keys):
                    keys, entries = [keys[i] for i in columnar], [entries[i] for i in columnar]
                placed = [fits == FITS for fits in judged.fits]  # most of them: a shared verdict by score
                scores = [_BY_SCORE[score] for score in compress(judged.score, placed)]
                by_state.update(zip(compress(keys, placed), scores, strict=False))  # compress: no length
                written: dict[tuple[object, ...], Verdict] = {}
                kind = kind_name(request)
                outcome, available, first, why = judged.fits, judged.available, judged.first, judged.why
                for i in [i for i, fits in enumerate(outcome) if fits != FITS]:
                    entry = entries[i]
                    if outcome[i] == PLACE:  # it fits several GPUs: which ones is fit_node's choice
                        left[keys[i]] = entry  # type: ignore[assignment]
                        continue
                    try:
                        by_state[keys[i]] = _failed(entry.index, request, kind,  # type: ignore[union-attr,arg-type]
                                                    available[i], first[i], why[i], written)
                    except Exception as exc:
                        by_state[keys[i]] = self._unjudgeable(verb, entry.node, exc)  # type: ignore[union-attr]
        for key, entry in left.items():
            try:
                verdict = _score(entry, request)
            except Exception as exc:  # kept like any verdict: logged once per state
                verdict = self._unjudgeable(verb, entry.node, exc)
            by_state[key] = verdict
        self.states_judged["per_state"] += len(left)

    def _unresolvable(self, reason: str) -> Verdict:
        """The verdict of a node that cannot be judged, for ``reason`` (one object per reason: stale nodes
        of a fleet share a few)."""
        verdict = self._unresolvable_verdicts.get(reason)
        if verdict is None:
            if len(self._unresolvable_verdicts) >= LOGGED_UNJUDGED:
                self._unresolvable_verdicts.clear()
            verdict = self._unresolvable_verdicts[reason] = Verdict(False, reason=_reason(reason),
                                                                    unresolvable=True)
        return verdict

    def _unjudgeable(self, verb: str, node: str, exc: Exception) -> Verdict:
        """The verdict of a node whose judging raised: failed, unresolvable (preempting pods there would
        not help); counted and logged with the traceback."""
        if self.metrics is not None:
            self.metrics.judge_errors.labels(verb).inc()
        log.warning("%s: judging node %s raised %s; the node fails, unresolvable", verb, node,
                    type(exc).__name__, exc_info=exc)
        return Verdict(False, reason=_reason(unjudgeable(exc)), unresolvable=True)

    def _unknown(self, verb: str, count: int, of: int) -> None:
        """Counted every call; one log line per ``UNKNOWN_LOG_SECONDS`` however many calls and names."""
        if self.metrics is not None:
            self.metrics.unknown.labels(verb).inc(count)
        self._unknown_since_log += count
        now = self._monotonic()
        if self._unknown_logged_at is not None and now - self._unknown_logged_at < UNKNOWN_LOG_SECONDS:
            return
        log.warning("%s: %d candidate names (of %d) are not nodes the extender knows; filtered as unknown, "
                    "never fetched (%d unknown names since the last such line)", verb, count, of,
                    self._unknown_since_log)
        self._unknown_logged_at = now
        self._unknown_since_log = 0

    def _unjudged(self, verb: str, pod: Any, err: Unjudged) -> None:
        """Counted every call, logged once per pod and reason."""
        if self.metrics is not None:
            self.metrics.unjudged.labels(verb, err.category).inc()
        key = (pod_name(pod), err.reason)
        if key in self._logged_unjudged:
            return
        self._logged_unjudged[key] = None
        while len(self._logged_unjudged) > LOGGED_UNJUDGED:
            self._logged_unjudged.popitem(last=False)
        log.info("pod %s passed on every node without judging its GPU claims: %s", key[0], err.reason)

    def _count(self, verb: str, judged: _Judged) -> _Judged:
        if self.metrics is not None:
            passed = judged.passed
            if passed:
                self.metrics.nodes.labels(verb, "pass").inc(passed)
            if len(judged.verdicts) - passed:
                self.metrics.nodes.labels(verb, "fail").inc(len(judged.verdicts) - passed)
        return judged


def _score(entry: AgentEntry, request: FitRequest) -> Verdict:
    """``score_node``'s answer, through the index the cache built when the hints arrived (the fast path:
    no reason text for nodes that fit, one GPU's for those that do not, no sharing-mode recommendation).

    Freshness was judged on this process's clock (when the agent last answered, 200 or 304); the hints'
    taken_at is the agent's clock and stays that of the last 200, so it is not checked here."""
    assert entry.hints is not None
    index = entry.index
    if index is None or index.hints is not entry.hints:
        index = node_index(entry.hints)
    fit = fit_node(index, request)
    if fit.fits:
        return _FITS[extender_score(fit.score)]
    return Verdict(False, reason=_reason(_fit_reason(fit)))


_FITS = [Verdict(True, score=score) for score in range(11)]  # a node that fits: one of these, shared
_BY_SCORE = [_FITS[extender_score(score)] for score in range(101)]  # a 0-100 fit score's verdict
_JSON = msgspec.json.Encoder()


def _fit_reason(fit: NodeFit) -> str:
    """The node-level reason, then the first GPU's, by index (UUIDs are long and differ per node)."""
    return _reason_text(fit.node_reason(), fit.first_gpu_reason())


def _reason_text(node: str | None, first: tuple[int, str, str, int] | None) -> str:
    parts = [node] if node is not None else []
    if first is not None:
        gpu, uuid, why, count = first
        more = f" (+{count - 1} more GPUs)" if count > 1 else ""
        parts.append(f"GPU {gpu if gpu != NO_INDEX else uuid}: {why}{more}")
    return "; ".join(parts) or "does not fit"


def _failed(index: NodeIndex, request: FitRequest, kind: str, available: int, first: int, why: int,
            written: dict[tuple[object, ...], Verdict]) -> Verdict:
    """The verdict of a state the request does not fit, from its outcome over the columns, worded as
    ``_score`` words it (``kind``: the request's, ``kind_name``); ``written``: the call's verdicts by what
    their reasons read (the GPU counts, the first GPU's label and why, and the one figure that why quotes),
    so states that fail alike share one."""
    gpus = len(index.gpus)
    read: tuple[object, ...] = (available, gpus)
    if first >= 0:
        rank, key, pos = index.rank[first]
        gpu = index.gpus[pos]
        label = rank if rank != NO_INDEX else key
        if why == STATIC:
            read = (available, gpus, label, why, getattr(index, kind).static[pos])
        else:
            figure = gpu.schedulable_share_ratio if why == SHARE_SHORT else \
                gpu.memory_free_bytes if why == MEMORY_SHORT else None
            read = (available, gpus, label, why, figure)
    verdict = written.get(read)
    if verdict is None:
        reason = None
        if first >= 0:
            text = read[4] if why == STATIC else size_reason(gpu, why, request, None)
            reason = (rank, key, text, gpus - available)
        node = node_reason(request, available, len(index.rows))
        verdict = written[read] = Verdict(False, reason=_reason(_reason_text(node, reason)))
    return verdict


def _filter_reply(args: ExtenderArgs, judged: _Judged) -> dict[str, Any]:
    """The ExtenderFilterResult of a call's verdicts (C-speed passes over the names: ``compress``)."""
    nodes, verdicts = args.node_names, judged.verdicts
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if judged.passed == len(verdicts):
        return filter_result(args, nodes, failed, unresolvable)
    fits = [verdict.fits for verdict in verdicts]
    failing = [not fit for fit in fits]
    names = list(compress(nodes, failing))
    bad = list(compress(verdicts, failing))
    if any([verdict.unresolvable for verdict in bad]):
        for node, verdict in zip(names, bad, strict=True):
            (unresolvable if verdict.unresolvable else failed)[node] = verdict.reason
    else:
        failed = dict(zip(names, [verdict.reason for verdict in bad], strict=True))
    return filter_result(args, list(compress(nodes, fits)), failed, unresolvable)


def _priorities(args: ExtenderArgs, judged: _Judged) -> list[dict[str, Any]]:
    scores = [verdict.score for verdict in judged.verdicts]
    return host_priority_list(zip(args.node_names, scores, strict=True))


def _encode(reply: Any) -> bytes:
    """JSON as kube-scheduler reads it, written by msgspec (C); a name no UTF-8 can hold (a lone surrogate
    sent as a ``\\ud800`` escape) is written back escaped, as ``json`` writes it."""
    try:
        return _JSON.encode(reply)
    except UnicodeEncodeError:
        return json.dumps(reply, separators=(",", ":")).encode()


def _reason(text: str) -> str:
    """What kube-scheduler is told (``FailedNodes``, its events and logs): prefixed, every control and bidi
    character of the names in it shown as an escape, at most ``MAX_REASON_CHARS``."""
    text = REASON_PREFIX + shown(text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


# --- HTTP ---------------------------------------------------------------------------------------------------

_EXTENDER = web.AppKey("extender", Extender)
_REGISTRY = web.AppKey("registry", CollectorRegistry)


_LIMITS = web.AppKey("body_limits", BodyLimits)
_BODY_SLOTS = web.AppKey("body_slots", asyncio.Semaphore)
_VERBS_NEED_CERT = web.AppKey("verbs_need_client_cert", bool)


def _verb(verb: str) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        if request.app[_VERBS_NEED_CERT] and not _client_certificate(request):
            return json_error(403, "the scheduler verbs need a client certificate signed by the web "
                              "config's client_ca_file (kube-scheduler's tlsConfig certFile and keyFile)",
                              "certificate")
        extender = request.app[_EXTENDER]
        limits = request.app[_LIMITS]
        metrics = extender.metrics
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with request.app[_BODY_SLOTS]:  # bodies in memory at once: bounded
                try:
                    body = parse_json(await read_body(request, limits), limits)
                except BodyError as err:
                    outcome = "bad_request"
                    return error_response(err)
                try:
                    reply = await extender.reply(verb, body)
                except ArgsError as err:
                    outcome = "bad_request"
                    log.info("%s: bad ExtenderArgs: %s", verb, err)
                    return json_error(400, err.message, err.field)
                return web.Response(body=reply, content_type="application/json")
        except Exception:
            outcome = "error"
            raise
        finally:
            if metrics is not None:
                metrics.requests.labels(verb, outcome).inc()
                metrics.duration.labels(verb).observe(time.perf_counter() - started)

    return handle


@web.middleware
async def _internal_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Any exception of a handler (a bug: a node's data cannot cause one, see ``Extender._judge``) is a JSON
    500 naming its type, as every error of the extender is JSON; the traceback goes to the log."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise  # aiohttp's own answers: ``json_errors`` words them
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return json_error(500, f"internal error ({type(exc).__name__}): the extender's log has the details")


def _client_certificate(request: web.Request) -> bool:
    """Whether the connection presented a client certificate (verified by the TLS handshake)."""
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


async def _healthz(request: web.Request) -> web.Response:
    extender = request.app[_EXTENDER]
    return web.json_response({"status": "ok", "agents": extender.cache.counts(extender.max_age_seconds)})


async def _readyz(request: web.Request) -> web.Response:
    """200 once the node source can judge nodes: the cluster view after its first list (a Deployment's
    readiness probe keeps kube-scheduler's calls away until then); the agents' cache at once."""
    source = request.app[_EXTENDER].cache
    if getattr(source, "synced", True):
        return web.json_response({"status": "ready", "nodes": len(source)})
    return web.json_response({"status": "waiting for the first list of GPUNodeStates"}, status=503)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(request.app[_REGISTRY]), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def build_app(
    extender: Extender, registry: CollectorRegistry, *, prefix: str = "",
    max_body_bytes: int = MAX_BODY_BYTES, verbs_need_client_cert: bool = False,
) -> web.Application:
    """The extender's routes: ``<prefix>/filter``, ``<prefix>/prioritize``, ``/healthz``, ``/readyz``,
    ``/metrics``.

    ``verbs_need_client_cert``: the verbs answer 403 to a connection that presented no (verified) client
    certificate; the probes and ``/metrics`` do not ask (the kubelet's probes have no certificate). The TLS
    listener verifies a certificate that is given (``client_auth_type: VerifyClientCertIfGiven``)."""
    app = web.Application(middlewares=[json_errors, _internal_errors], client_max_size=max_body_bytes)
    app[_EXTENDER] = extender
    app[_REGISTRY] = registry
    app[_LIMITS] = BodyLimits(max_bytes=max_body_bytes, timeout_seconds=BODY_TIMEOUT_SECONDS)
    app[_BODY_SLOTS] = asyncio.Semaphore(BODIES_AT_ONCE)
    app[_VERBS_NEED_CERT] = verbs_need_client_cert
    prefix = prefix.rstrip("/")
    app.router.add_post(f"{prefix}/filter", _verb("filter"))
    app.router.add_post(f"{prefix}/prioritize", _verb("prioritize"))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


def build_registry(extender: Extender) -> CollectorRegistry:
    """A registry with the extender's metrics; sets ``extender.metrics`` and the cache's fetch observer."""
    registry = CollectorRegistry()
    metrics = ExtenderMetrics(registry)
    extender.metrics = metrics
    extender.cache.set_fetch_observer(metrics.observe_fetch)
    registry.register(_AgentsCollector(extender.cache, extender.max_age_seconds))
    if isinstance(extender.cache, ClusterView):  # its writes by outcome and the nodes it refuses
        registry.register(extender.cache.collector())
    return registry


async def serve(
    extender: Extender,
    *,
    host: str,
    port: int,
    prefix: str = "",
    ssl_context: ssl.SSLContext | None = None,
    stop: asyncio.Event | None = None,
    started: Callable[[int], None] | None = None,
    lister: NodeLister | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT when no event is given): the cache, its refresher,
    the node lister and the HTTP listener; everything is closed on the way out."""
    stop = stop or _stop_on_signals()
    registry = build_registry(extender)
    checks_certs = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
    app = build_app(extender, registry, prefix=prefix, max_body_bytes=max_body_bytes,
                    verbs_need_client_cert=checks_certs)
    raise_open_file_limit()  # before the guard fits its cap to it
    # Slow and many clients: docs/operations.md#security-model. Bodies in flight may hold four of the largest
    # at once: kube-scheduler's calls (a filter and a prioritize, a retry beside them) are never refused
    # unread for the budget while the extender stays within its memory limit (512 Mi).
    budget = max(ServerLimits.body_budget_bytes, 4 * max_body_bytes)
    guard = ConnectionGuard(ServerLimits(body_budget_bytes=budget))
    guard.install(app)
    registry.register(GuardCollector(guard))
    runner = web.AppRunner(app, access_log=None, **guard.limits.runner_options())  # cancels closed handlers
    await extender.cache.start()
    await runner.setup()
    tune_garbage_collector()
    listing = asyncio.create_task(lister.run(stop), name="node-list") if lister is not None else None
    try:
        site = GuardedSite(runner, host, port, guard, ssl_context=ssl_context, reuse_address=True)
        await site.start()
        bound = site.port
        log.info("extender listening on %s:%d%s (%d agents known)", host, bound, prefix, len(extender.cache))
        if started is not None:
            started(bound)
        await extender.cache.run(stop)
    finally:
        if listing is not None:
            listing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listing
        await runner.cleanup()
        await extender.cache.close()
        await extender.claims.close()
        log.info("extender stopped")


def tune_garbage_collector() -> None:
    """Once the extender is built (and again by the cluster view after each list, which freezes): see
    ``GC_THRESHOLDS``."""
    gctune.tune(*GC_THRESHOLDS)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class NoNodeSource(Exception):
    """Neither an agents file nor the API server: the extender would know no node."""


def from_options(
    options: ExtenderOptions, *, agent_ssl: ssl.SSLContext | None = None
) -> tuple[Extender, NodeLister | None]:
    """The extender, its node source and the lister of the nodes it knows, as ``options`` say (``serve``
    starts them): the cluster view of the agents' published GPUNodeStates where the API server is used
    (``cluster_view``; it knows the nodes that publish, no lister), else the agents' ``/v1/hints`` fetched
    over HTTP for the nodes it knows. Raises ``NoNodeSource`` when it could know no node."""
    claims = claim_reader(options)
    view = cluster_view(options)
    if view is not None:
        return Extender(view, max_age_seconds=options.published_max_age,
                        gpu_resource_names=options.gpu_resource_names, claims=claims), None
    directory = AgentDirectory(template=options.agent_url, urls=options.agent_urls)
    if agent_ssl is None and (options.agent_ca_file or options.agent_cert_file):
        agent_ssl = AgentTLS(options.agent_ca_file, options.agent_cert_file, options.agent_key_file).context()
    known = KnownNodes(options.agent_urls)
    lister = None
    if claims.connection is not None and options.agent_url is not None:
        lister = NodeLister(claims.connection, known, timeout=max(options.timeout, 10.0))
    elif not options.agent_urls:
        raise NoNodeSource(
            "the extender fetches the hints of the nodes it knows only, and knows none: give it an agents "
            "file (agents) or access to the API server's node list (kubernetes_api, kubeconfig)"
        )
    cache = AgentCache(
        directory,
        timeout_seconds=options.timeout,
        refresh_interval_seconds=options.refresh_interval,
        forget_after_seconds=options.forget_after,
        max_concurrent_fetches=options.max_concurrent_fetches,
        ssl_context=agent_ssl,
        known=known,
    )
    extender = Extender(cache, max_age_seconds=options.max_age, gpu_resource_names=options.gpu_resource_names,
                        claims=claims)
    return extender, lister


def cluster_view(options: ExtenderOptions) -> ClusterView | None:
    """The list-and-watch of GPUNodeStates: when asked, or (auto) with a kubeconfig or inside a cluster."""
    from gpuagent.kubeapi import ApiConnection, api_server_available

    if options.cluster_view == "off" or (
        options.cluster_view == "auto" and not (options.kubeconfig or api_server_available())
    ):
        return None
    connection = ApiConnection(kubeconfig_path=options.kubeconfig, request_timeout=max(options.timeout, 10.0))
    return ClusterView(connection=connection, sync_timeout=options.timeout)


def claim_reader(options: ExtenderOptions) -> ClaimReader:
    """Reads pods' ResourceClaims where the API server can be used: when asked (``kubernetes_api: on``), or
    (auto) with a kubeconfig or inside a cluster with a service account token."""
    from gpuagent.kubeapi import ApiConnection, api_server_available

    connection = None
    if options.kubernetes_api == "on" or (
        options.kubernetes_api == "auto" and (options.kubeconfig or api_server_available())
    ):
        connection = ApiConnection(kubeconfig_path=options.kubeconfig, request_timeout=options.timeout)
    return ClaimReader(connection, gpu_classes=options.gpu_device_classes,
                       mig_classes=options.mig_device_classes, timeout=options.timeout)


def run(options: ExtenderOptions, *, ssl_context: ssl.SSLContext | None = None) -> int:
    """``gpuagent extender``: serve until SIGTERM/SIGINT; the exit status."""
    try:
        extender, lister = from_options(options)
    except (ssl.SSLError, OSError) as exc:
        log.error(
            "cannot load the TLS files for the agents (agent_ca_file, agent_cert_file, agent_key_file): %s",
            exc,
        )
        return 2
    except NoNodeSource as exc:
        log.error("%s", exc)
        return 2
    asyncio.run(
        serve(
            extender,
            host=options.listen_host,
            port=options.listen_port,
            prefix=options.url_prefix,
            ssl_context=ssl_context,
            lister=lister,
            max_body_bytes=options.max_body_bytes,
        )
    )
    return 0
