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

What a call costs is what its names' distinct states cost (issue 31). With the cluster view every pass
over the names is a C-speed ``map`` (no Python code a name): each name's state
(``ClusterView.states_by_node``) and its key for the request's kind (``verdict_key.kind_keys``); a state
already judged for this request (the last ``MEMO_REQUESTS`` requests are remembered) is its verdict, and
the states new to it are judged together: a request for whole GPUs over columns of every state's GPUs at
once (``hints.fitcolumns``, numpy, the same arithmetic as ``fit_node``: equal verdicts), MIG requests, the
placement of several GPUs and the rare state the columns cannot hold exactly by ``fit_node`` one state at a
time. A failing state's one-line reason is worded once per call for all the states whose reasons read the
same figures, which the columns hand out. A repeated call over an unchanged view gets the same answer, and
over HTTP the same bytes (the last ``WRITTEN_ANSWERS`` answers keep them); the replies are written by
``extender_protocol``. With the agents' cache (no cluster view) each node is judged alone, its verdict kept
while its hints are the same object.

Judging one node never fails the call: an exception while judging a node (a state no agent writes, or a
bug it meets) fails that node alone, unresolvable, with the reason ``fitreasons.unjudgeable`` words; the
traceback is logged once per state and request and counted (``gpuagent_extender_judge_errors_total``).
Every reason reaches kube-scheduler (its events and logs) with control and bidi characters shown as escapes
(``untrusted.shown``): tenant and resource names are anyone's.

This module judges a call; the rest of the extender is beside it, one job each: what one node's verdict
says (``hints.extender_verdict``), what is counted (``hints.extender_metrics``), the HTTP app that reads
kube-scheduler's calls and answers them (``hints.extender_app``), and the process that serves it
(``hints.extender_serve``, the ``gpuagent extender`` entry).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq, is_
from typing import Any

import msgspec

from gpuagent.hints import fitcolumns
from gpuagent.hints.agents import AgentCache, AgentEntry
from gpuagent.hints.claim_reader import ClaimReader
from gpuagent.hints.claims import Unjudged
from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.extender_metrics import ExtenderMetrics
from gpuagent.hints.extender_protocol import (
    ArgsError,
    ExtenderArgs,
    encode,
    filter_reply,
    parse_args,
    priorities,
)
from gpuagent.hints.extender_verdict import (
    BY_FIT_SCORE,
    FITTING,
    Judgeable,
    Verdict,
    entry_verdict,
    failed_verdict,
    shown_reason,
)
from gpuagent.hints.fitcolumns import FAILS, FITS, NOT_COLUMNAR, PLACE, Judgement, StateColumns
from gpuagent.hints.fitreasons import unjudgeable
from gpuagent.hints.fitrequest import FitRequest, kind_name
from gpuagent.hints.malformed import MalformedPod
from gpuagent.hints.podrequest import PodRequestError, pod_fit_request, pod_name
from gpuagent.hints.verdict_key import KindKeys
from gpuagent.snapshot.hints import NodeHints

log = logging.getLogger(__name__)

NodeSource = AgentCache | ClusterView  # where node states come from: the agents over HTTP, or Kubernetes

UNKNOWN_NODE = "unknown node: not in the API server's node list nor the agents file"
UNKNOWN_LOG_SECONDS = 60.0
MEMO_REQUESTS = 32  # distinct pod requests whose per-node verdicts are kept
WRITTEN_ANSWERS = 4  # answers whose replies are kept written (1.6 MB for a filter of 20,000 names)
LOGGED_UNJUDGED = 1024  # (pod, reason) pairs already logged
_KIND_KEY = {kind: attrgetter(kind) for kind in KindKeys._fields}  # a SharedState -> one kind's key
_STATE_KEY, _INDEX, _FITS = attrgetter("key"), attrgetter("index"), attrgetter("fits")


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
    fits: list[bool]  # each verdict's ``fits``
    version: int | None = None  # the cluster view's, when these verdicts were worked out from it
    until: float = 0.0  # monotonic time they hold until (the first state to age out)
    nodes: tuple[str, ...] = ()
    replies: dict[str, bytes] = field(default_factory=dict)  # verb -> the reply written (NodeNames form)

    @property
    def passed(self) -> int:
        return self.fits.count(True)



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
        self._unknown_verdict = Verdict(
            False, reason=shown_reason(getattr(cache, "unknown_reason", UNKNOWN_NODE)), unresolvable=True)
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
        judged = await self._judge(args, "filter")
        return filter_reply(args, judged.verdicts, judged.fits)

    async def prioritize(self, body: Any) -> list[dict[str, Any]]:
        args = parse_args(body)
        return msgspec.to_builtins(priorities(args, (await self._judge(args, "prioritize")).verdicts))

    async def reply(self, verb: str, body: Any) -> bytes:
        """The verb's reply as the JSON kube-scheduler reads: what ``filter`` or ``prioritize`` answer,
        written once per answer (a repeated call over an unchanged view gets the same bytes)."""
        args = parse_args(body)
        judged = await self._judge(args, verb)
        written = judged.replies.get(verb)
        if written is None:
            written = encode(filter_reply(args, judged.verdicts, judged.fits) if verb == "filter"
                             else priorities(args, judged.verdicts))
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
            bad = Verdict(False, reason=shown_reason(f"{err.field}: {err.message}"), unresolvable=True)
            return self._count(verb, _Judged([bad] * len(nodes), [False] * len(nodes)))
        except Unjudged as err:
            self._unjudged(verb, args.pod, err)
            return self._count(verb, _Judged([FITTING[0]] * len(nodes), [True] * len(nodes)))
        if request is None:  # no GPU asked for: not ours to judge
            return self._count(verb, _Judged([FITTING[0]] * len(nodes), [True] * len(nodes)))
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
        judged = _Judged(verdicts, list(map(_FITS, verdicts)))
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
        if fresh:  # the common call: every name a node of the view with a state to judge it by
            verdicts = self._fresh_verdicts(verb, nodes, request, by_state, kind_name(request))
            if verdicts is not None:
                return verdicts
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
                    verdict = entry_verdict(entry, request)
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
        self._judge_states(verb, request, pending, by_state, lambda key: pending[key].node)
        return [v if v.__class__ is Verdict else by_state[v] for v in out]  # type: ignore[index]

    def _fresh_verdicts(self, verb: str, nodes: Sequence[str], request: FitRequest,
                        by_state: dict[bytes, Verdict], kind: str) -> list[Verdict] | None:
        """Each name's verdict when every name is a node of the cluster view in a state that can be judged
        (else None: the names are taken one by one). Every pass over the names is a C-speed ``map`` (no
        Python code a name): its state (``ClusterView.states_by_node``) and that state's key for the
        request's kind, its verdict if the state was judged for this request before, and the states new to
        it judged together."""
        held = list(map(self.cache.states_by_node().get, nodes))  # type: ignore[union-attr]
        try:
            keys = list(map(_KIND_KEY[kind], held))
        except AttributeError:  # a name not in the view, or one whose state cannot be judged (None)
            return None
        if not by_state:  # a request never seen: every state of the call is new to it
            pending = dict(zip(keys, held, strict=True))
        else:
            verdicts = list(map(by_state.get, keys))
            new = list(map(is_, verdicts, repeat(None)))  # ``None in`` would call Verdict.__eq__ a name
            if True not in new:
                return verdicts  # type: ignore[return-value]
            pending = dict(zip(compress(keys, new), compress(held, new), strict=False))  # compress: no length
        self._judge_states(verb, request, pending, by_state, lambda key: nodes[keys.index(key)], True)
        return list(map(by_state.__getitem__, keys))

    def _judge_states(self, verb: str, request: FitRequest, pending: Mapping[bytes, Judgeable],
                      by_state: dict[bytes, Verdict], node_of: Callable[[bytes], str],
                      all_states: bool = False) -> None:
        """The verdict of each state new to ``request`` (key -> the state, or a node's entry in it), into
        ``by_state``: over the columns (``hints.fitcolumns``) where they answer, else by ``fit_node`` state
        by state. ``node_of``: a node in the state of a key, named in the log when judging it raised;
        ``all_states``: every value is one of the cluster view's states, which keep their columns' slot."""
        left: Mapping[bytes, Judgeable] = pending
        if fitcolumns.handles(request):
            try:
                self._columns.forget_if_over(len(self.cache))
                keys, entries = list(pending), list(pending.values())
                if all_states:  # the cluster view's states: each keeps its slot
                    slots = self._columns.kept_slots(entries)  # type: ignore[arg-type]
                else:
                    slots = self._columns.slots(zip(map(_STATE_KEY, entries), map(_INDEX, entries),
                                                    strict=True))
                columnar = slots if NOT_COLUMNAR not in slots else [s for s in slots if s != NOT_COLUMNAR]
                judged = self._columns.judge(columnar, request)
            except Exception:  # a bug of the columns: every state is judged one by one instead
                log.warning("%s: judging %d states over columns raised; judged one by one", verb,
                            len(pending), exc_info=True)
                self._columns.clear()
            else:
                if len(columnar) < len(keys):
                    left = {keys[i]: entries[i] for i, slot in enumerate(slots) if slot == NOT_COLUMNAR}  # type: ignore[misc]
                    keys = [key for key, slot in zip(keys, slots, strict=True) if slot != NOT_COLUMNAR]
                else:
                    left = {}
                self.states_judged["columns"] += len(columnar)
                self._columns_verdicts(verb, request, keys, judged, by_state, left, pending, node_of)  # type: ignore[arg-type]
        for key, entry in left.items():
            try:
                verdict = entry_verdict(entry, request)
            except Exception as exc:  # kept like any verdict: logged once per state
                verdict = self._unjudgeable(verb, node_of(key), exc)
            by_state[key] = verdict
        self.states_judged["per_state"] += len(left)

    def _columns_verdicts(self, verb: str, request: FitRequest, keys: list[bytes], judged: Judgement,
                          by_state: dict[bytes, Verdict], left: dict[bytes, Judgeable],
                          pending: Mapping[bytes, Judgeable], node_of: Callable[[bytes], str]) -> None:
        """The verdicts of the states judged over the columns (``keys``, in order), into ``by_state``: by
        score where one GPU takes the request, by reason where none does (one verdict per distinct reading
        of the figures a reason quotes: ``failed_verdict`` is asked once per text, not once per state), and
        into ``left`` for ``fit_node`` where several GPUs take it (which ones is its choice)."""
        outcome = judged.fits
        placed = list(map(eq, outcome, repeat(FITS)))
        scores = map(BY_FIT_SCORE.__getitem__, compress(judged.score, placed))
        by_state.update(zip(compress(keys, placed), scores, strict=False))  # compress: no length
        if placed.count(True) == len(placed):
            return
        if PLACE in outcome:
            several = list(map(eq, outcome, repeat(PLACE)))
            named = list(compress(keys, several))
            left.update(zip(named, map(pending.__getitem__, named), strict=True))
        failing = list(map(eq, outcome, repeat(FAILS)))
        readings = list(zip(*(compress(column, failing) for column in (  # noqa: B905 (compress: no length)
            judged.available, judged.gpus, judged.label, judged.why, judged.figure))))
        failed = list(compress(keys, failing))
        written: dict[tuple[Any, ...], Verdict] = {}
        for reading in set(readings):
            try:
                written[reading] = failed_verdict(request, *reading)
            except Exception as exc:  # kept like any verdict: logged once per reading, naming a node
                written[reading] = self._unjudgeable(verb, node_of(failed[readings.index(reading)]), exc)
        by_state.update(zip(failed, map(written.__getitem__, readings), strict=True))

    def _unresolvable(self, reason: str) -> Verdict:
        """The verdict of a node that cannot be judged, for ``reason`` (one object per reason: stale nodes
        of a fleet share a few)."""
        verdict = self._unresolvable_verdicts.get(reason)
        if verdict is None:
            if len(self._unresolvable_verdicts) >= LOGGED_UNJUDGED:
                self._unresolvable_verdicts.clear()
            verdict = self._unresolvable_verdicts[reason] = Verdict(False, reason=shown_reason(reason),
                                                                    unresolvable=True)
        return verdict

    def _unjudgeable(self, verb: str, node: str, exc: Exception) -> Verdict:
        """The verdict of a node whose judging raised: failed, unresolvable (preempting pods there would
        not help); counted and logged with the traceback."""
        if self.metrics is not None:
            self.metrics.judge_errors.labels(verb).inc()
        log.warning("%s: judging node %s raised %s; the node fails, unresolvable", verb, node,
                    type(exc).__name__, exc_info=exc)
        return Verdict(False, reason=shown_reason(unjudgeable(exc)), unresolvable=True)

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
