"""Fit and score of a GPU request on one node's hints: ``POST /v1/hints/score`` and the extender share it.

Pure and fast: no I/O, no clock of its own (``now`` is passed in), only ``NodeHints`` in, so the extender
can score thousands of cached nodes per pod with exactly what an agent would answer. The work is split by
job, each module one step of a call, one way (each imports only the ones before it):

- ``hints.fitrequest``: the request (``FitRequest``) and its one parser, for score bodies and pods alike;
- ``hints.fitreasons``: every text a reason says;
- ``hints.nodeindex``: what judging reads of a node's hints, worked out once per hints, every figure read
  into its range (so judging is total over whatever the hints say);
- ``hints.fit``: the fit arithmetic: whether and where it fits, the score, reasons written on demand (the
  extender's fast path stops there);
- ``hints.sharing_mode``: the mode to recommend;
- here: the full answer (``FitResult``) of ``score_node``, which never raises: an exception while judging
  is the node's answer (``fits: false``, the reason ``unjudgeable`` words), never the caller's error.

The names other layers use are exported from here too (``__all__``), so a caller needs one import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuagent.hints.fit import NodeFit, fit_node
from gpuagent.hints.fitreasons import unjudgeable
from gpuagent.hints.fitrequest import (
    MAX_GPUS,
    POLICIES,
    FitRequest,
    RequestError,
    kind_name,
    parse_fit_request,
    parse_request_memory,
)
from gpuagent.hints.nodeindex import MIG_SLICES, NO_INDEX, NodeIndex, node_index
from gpuagent.hints.sharing_mode import MODES, recommend
from gpuagent.snapshot.hints import NodeHints

__all__ = [
    "MAX_GPUS", "MIG_SLICES", "MODES", "NO_INDEX", "POLICIES", "FitRequest", "FitResult", "NodeFit",
    "NodeIndex", "RequestError", "fit_node", "fit_result", "kind_name", "node_index", "parse_fit_request",
    "parse_request_memory", "score_node", "unjudgeable",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FitResult:
    fits: bool
    score: int  # 0-100; 0 when it does not fit
    gpus: tuple[str, ...]  # UUIDs of the chosen GPUs (a GPU repeats when it takes several MIG instances)
    reasons: Mapping[str, str]  # GPU UUID (or "node") -> why it cannot take the request
    recommended_mode: str  # "exclusive", "mig" or "time_sliced"
    recommended_mig_profile: str | None = None
    recommendation: str = ""  # why that mode
    mig_instances: tuple[str, ...] = ()  # existing idle instances chosen; the rest would be created
    policy: str = "binpack"
    extra: Mapping[str, Any] = field(default_factory=dict)  # policy details (nvlink ratio, ...)

    def to_jsonable(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "score": self.score,
            "gpus": list(self.gpus),
            "reasons": dict(self.reasons),
            "recommended_mode": self.recommended_mode,
            "recommended_mig_profile": self.recommended_mig_profile,
            "recommendation": self.recommendation,
            "mig_instances": list(self.mig_instances),
            "policy": self.policy,
            **({"details": dict(self.extra)} if self.extra else {}),
        }


def fit_result(fit: NodeFit) -> FitResult:
    """The full ``FitResult`` of a fit (what ``/v1/hints/score`` answers), with the recommended sharing mode
    and, for MIG, the existing idle instances chosen."""
    request = fit.request
    gpus = fit.index.gpus
    if not fit.fits:
        return FitResult(fits=False, score=0, gpus=(), reasons=fit.reasons(), policy=request.policy,
                         **recommend(gpus, request))
    extra: dict[str, Any] = {}
    if fit.nvlink_ratio is not None:
        extra["nvlink_connected_ratio"] = round(fit.nvlink_ratio, 3)
    instances: list[str] = []
    if request.mig_profile is not None:
        used: dict[str, int] = {}
        for pos in fit.positions:
            gpu = gpus[pos]
            idle = fit.index.mig_profiles[pos][request.mig_profile].idle_instances
            n = used.get(gpu.uuid, 0)
            if n < len(idle):
                instances.append(idle[n])
            used[gpu.uuid] = n + 1
    return FitResult(
        fits=True,
        score=fit.score,
        gpus=fit.gpus,
        reasons=fit.reasons(),
        mig_instances=tuple(instances),
        policy=request.policy,
        extra=extra,
        **recommend(gpus, request),
    )


def _not_fitting(request: FitRequest, reason: str, recommended: Mapping[str, Any]) -> FitResult:
    return FitResult(fits=False, score=0, gpus=(), policy=request.policy, reasons={"node": reason},
                     **recommended)


def score_node(
    hints: NodeHints, request: FitRequest, *, now: float, max_age_seconds: float | None = None
) -> FitResult:
    """Whether ``request`` fits on the node ``hints`` describe, on which GPUs, and how well (0-100).

    Never raises: an exception while judging the node is its answer, ``fits: false`` with the reason
    ``unjudgeable`` names (and the traceback logged), recommending the mode the request asked for."""
    try:
        index = node_index(hints)
        age = now - hints.taken_at_unix
        if max_age_seconds is not None and age > max_age_seconds:
            reason = f"hints are {age:.0f} s old, more than the {max_age_seconds:g} s allowed"
            return _not_fitting(request, reason, recommend(index.gpus, request))
        return fit_result(fit_node(index, request))
    except Exception as exc:
        log.warning("scoring a request on the hints of %s failed", hints.hostname, exc_info=True)
        mode = {"mig": "mig", "exclusive": "exclusive"}.get(kind_name(request), "time_sliced")
        return _not_fitting(request, unjudgeable(exc), {
            "recommended_mode": mode, "recommended_mig_profile": request.mig_profile,
            "recommendation": "the node's state could not be judged: the mode asked for"})
