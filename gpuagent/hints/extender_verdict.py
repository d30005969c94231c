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
from typing import Protocol

from gpuagent.hints.extender_protocol import extender_score
from gpuagent.hints.fit import NodeFit, fit_node
from gpuagent.hints.fitcolumns import STATIC
from gpuagent.hints.fitreasons import node_reason, whole_gpu_size_reason
from gpuagent.hints.fitrequest import FitRequest
from gpuagent.hints.nodeindex import NO_INDEX, NodeIndex, node_index
from gpuagent.snapshot.hints import NodeHints
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


class Judgeable(Protocol):
    """What ``entry_verdict`` reads of a node: an ``AgentEntry``, or the cluster view's ``SharedState``."""

    @property
    def hints(self) -> NodeHints | None: ...

    @property
    def index(self) -> NodeIndex | None: ...


def entry_verdict(entry: Judgeable, request: FitRequest) -> Verdict:
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
    first = fit.first_gpu_reason()
    if first is None:
        return _reason_text(fit.node_reason(), None)
    gpu, uuid, why, count = first
    return _reason_text(fit.node_reason(), (gpu if gpu != NO_INDEX else uuid, why, count))


def _reason_text(node: str | None, first: tuple[int | str, str, int] | None) -> str:
    """``first``: how the first GPU with a reason is named, its reason, how many GPUs have one."""
    parts = [node] if node is not None else []
    if first is not None:
        label, why, count = first
        more = f" (+{count - 1} more GPUs)" if count > 1 else ""
        parts.append(f"GPU {label}: {why}{more}")
    return "; ".join(parts) or "does not fit"


def failed_verdict(request: FitRequest, available: int, gpus: int, label: int | str | None, why: int,
                   figure: object) -> Verdict:
    """The verdict of a state a whole-GPU request does not fit, from what its reason reads over the columns
    (``fitcolumns.Outcome``: the GPUs that can take it, the state's GPUs, and its first GPU with a reason:
    its label, why, and the figure that why quotes), worded as ``entry_verdict`` words it. States whose
    reasons read the same figures share one verdict: the caller asks once per distinct reading."""
    first = None
    if label is not None:
        text = figure if why == STATIC else whole_gpu_size_reason(why, figure, request)  # type: ignore[arg-type]
        first = (label, text, gpus - available)
    return Verdict(False, reason=shown_reason(_reason_text(node_reason(request, available, gpus), first)))  # type: ignore[arg-type]


def shown_reason(text: str) -> str:
    """What kube-scheduler is told (``FailedNodes``, its events and logs): prefixed, every control and bidi
    character of the names in it shown as an escape, at most ``MAX_REASON_CHARS``."""
    text = REASON_PREFIX + shown(text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."

