"""One node's verdict for one pod, and the words kube-scheduler is told when it fails.

A verdict is what the extender answers for one candidate node: it fits (with its 0-10 score) or fails
(with a one-line reason, unresolvable when preempting pods there would not help). This module turns a
node's fit into that verdict: ``entry_verdict`` by ``fit_node`` over the index the cache built, the way the
agents' own ``/v1/hints/score`` judges, and ``failed_verdict`` from a state's outcome over the columns
(``hints.fitcolumns``), worded exactly as ``entry_verdict`` words it, so both paths give equal verdicts.
Every reason goes through ``shown_reason``: prefixed, its control and bidi characters shown as escapes
(``untrusted.shown``; tenant and resource names are anyone's), and bounded. It is apart from the
``Extender`` (``hints.extender``) because what a verdict says is one job and judging a call's many names
quickly (memos, columns, written replies) is another; the tests compare verdicts through it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.hints.agents import AgentEntry
from gpuagent.hints.extender_protocol import extender_score
from gpuagent.hints.fit import NodeFit, fit_node
from gpuagent.hints.fitcolumns import STATIC
from gpuagent.hints.fitreasons import MEMORY_SHORT, SHARE_SHORT, node_reason, size_reason
from gpuagent.hints.fitrequest import FitRequest
from gpuagent.hints.nodeindex import NO_INDEX, NodeIndex, node_index
from gpuagent.untrusted import shown

REASON_PREFIX = "gpuagent: "
MAX_REASON_CHARS = 300


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer for one pod."""

    fits: bool
    score: int = 0  # 0-10
    reason: str = ""
    unresolvable: bool = False


def entry_verdict(entry: AgentEntry, request: FitRequest) -> Verdict:
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
        return FITTING[extender_score(fit.score)]
    return Verdict(False, reason=shown_reason(_fit_reason(fit)))


FITTING = [Verdict(True, score=score) for score in range(11)]  # a node that fits: one of these, shared
BY_FIT_SCORE = [FITTING[extender_score(score)] for score in range(101)]  # a 0-100 fit score's verdict


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


def failed_verdict(index: NodeIndex, request: FitRequest, kind: str, available: int, first: int, why: int,
                   written: dict[tuple[object, ...], Verdict]) -> Verdict:
    """The verdict of a state the request does not fit, from its outcome over the columns, worded as
    ``entry_verdict`` words it (``kind``: the request's, ``kind_name``); ``written``: the call's verdicts by
    what their reasons read (the GPU counts, the first GPU's label and why, and the one figure that why
    quotes), so states that fail alike share one."""
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
        verdict = written[read] = Verdict(False, reason=shown_reason(_reason_text(node, reason)))
    return verdict


def shown_reason(text: str) -> str:
    """What kube-scheduler is told (``FailedNodes``, its events and logs): prefixed, every control and bidi
    character of the names in it shown as an escape, at most ``MAX_REASON_CHARS``."""
    text = REASON_PREFIX + shown(text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."

