"""What the enforcer decided: shares (limit, achieved, frozen), the memory ladder, its actions and problems.

In audit mode these are the decisions it would have carried out: the same series, with the actions counted
under ``outcome="audit"``. Nothing is rendered while enforcement is off.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import (
    COUNTER,
    GAUGE,
    Kept,
    TextCache,
    add,
    gauge,
    join,
    label_pairs,
    non_empty,
    with_label,
)
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer, pod_labels
from gpuagent.snapshot.node import NodeSnapshot

MODES = ("off", "audit", "enforce")
STAGES = ("ok", "warned", "terminating", "killed", "evicted")
STANDINGS = ("exempt", "over", "capped")  # a latency-sensitive pod's on its GPU (timeslice/latency.py)

# Every (action, outcome) the actions gate can count in each mode, exported at 0 from the first poll so
# that rate()/increase() see the first event (a series born at 1 hides it). From enforce/actions.py: in
# enforce mode anything but "audit"; "blocked" (HTTP 429) and "rate_limited" only for evictions. In audit
# mode refusals and "audit"; a signal's target can still be gone or unreadable, an eviction rate limited,
# and thaws of a previous run's freezes (the journal) act in every mode.
_SIGNALS = ("signal_term", "signal_kill")
KNOWN_ACTIONS: dict[str, frozenset[tuple[str, str]]] = {
    "enforce": frozenset(
        [(a, o) for a in ("freeze", "thaw", *_SIGNALS) for o in ("done", "refused", "failed", "gone")]
        + [("evict", o) for o in ("done", "refused", "failed", "gone", "blocked", "rate_limited")]
    ),
    "audit": frozenset(
        [("freeze", o) for o in ("audit", "refused")]
        + [("thaw", o) for o in ("audit", "done", "refused", "failed", "gone")]
        + [(a, o) for a in _SIGNALS for o in ("audit", "refused", "failed", "gone")]
        + [("evict", o) for o in ("audit", "refused", "rate_limited")]
    ),
}


class EnforcementCollector(GpuRenderer):
    name = "enforcement"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        self._texts = TextCache(_label_text)  # a pod's series' label texts, by what they are made of
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        state = snapshot.enforcement
        if state is None:
            return []
        texts, kept = self._texts, self._kept
        texts.rotate()
        mode = kept.family("gpuagent_enforcement_mode", "1 for the node's enforcement mode.", GAUGE,
                           [texts[("mode", value)] for value in MODES],
                           [1.0 if state.mode == value else 0.0 for value in MODES])
        frozen = kept.family("gpuagent_enforcement_frozen_cgroups", "Cgroups held in a freeze duty cycle.",
                             GAUGE, [""], [state.frozen_cgroups])
        known = dict.fromkeys(KNOWN_ACTIONS.get(state.mode, ()), 0)
        counts = sorted((known | dict(state.actions_total)).items())
        actions = kept.family("gpuagent_enforcement_actions_total",
                              "Enforcement actions by outcome (audit: decided, not carried out).", COUNTER,
                              [texts[("action", *key)] for key, _ in counts], [count for _, count in counts])
        places = labels.places(snapshot)
        shares = [share for share in state.shares if (share.gpu_uuid, None) in places]
        series = [texts[("share", s.namespace, s.pod, places[(s.gpu_uuid, None)])] for s in shares]
        limit = kept.known(
            "gpuagent_pod_gpu_share_limit_ratio", "The pod's share of the GPU's SM time (0-1).",
            GAUGE, series, [s.limit_ratio for s in shares])
        achieved = kept.family(
            "gpuagent_pod_gpu_share_achieved_ratio",
            "The pod's measured share of the GPU's SM time over the controller's window (0-1).",
            GAUGE, series, [s.achieved_ratio for s in shares])
        duty = kept.family("gpuagent_pod_gpu_frozen_ratio",
                           "Part of each period the pod is frozen (0-1); in audit mode, would be.",
                           GAUGE, series, [s.frozen_ratio for s in shares])
        throttled = kept.family("gpuagent_pod_gpu_throttled_seconds_total", "Time the pod spent frozen.",
                                COUNTER, series, [s.throttled_seconds_total for s in shares])
        classed = [s for s in shares if s.latency_standing is not None]
        standings: list[str] = []
        for s in classed:
            standings += texts[("standings", s.namespace, s.pod, places[(s.gpu_uuid, None)])]
        standing = kept.family(
            "gpuagent_pod_gpu_latency_standing",
            "1 for the latency-sensitive pod's standing on the GPU: exempt (its requests preempt the batch "
            "pods), over (its share: it preempts no one) or capped (it takes turns at its share).",
            GAUGE, standings, [1.0 if s.latency_standing == v else 0.0 for s in classed for v in STANDINGS])
        preemptions = kept.family(
            "gpuagent_pod_gpu_preemptions_total",
            "The latency-sensitive pod's requests that began with the GPU's batch pods held frozen "
            "(audit mode: would have).",
            COUNTER, [texts[("share", s.namespace, s.pod, places[(s.gpu_uuid, None)])] for s in classed],
            [s.preemptions_total for s in classed])
        memory = state.memory
        memory_limit = kept.known("gpuagent_pod_gpu_memory_limit_bytes", "The pod's GPU memory limit.", GAUGE,
                                  [texts[("pod", m.namespace, m.pod)] for m in memory],
                                  [m.limit_bytes for m in memory])
        stages: list[str] = []
        for m in memory:
            stages += texts[("stages", m.namespace, m.pod)]
        stage = kept.family(
            "gpuagent_pod_gpu_memory_limit_stage",
            "1 for the pod's stage on the memory ladder (audit mode: the step it would have taken).",
            GAUGE, stages, [1.0 if m.stage == value else 0.0 for m in memory for value in STAGES])
        problems = gauge("gpuagent_pod_policy_problem",
                         "1 for an annotation that did not count (the pod keeps the operator's value).")
        for problem in state.problems:
            ident = pod_labels(problem.namespace, problem.pod)
            add(problems, with_label(ident, "annotation", problem.annotation), 1)
        return non_empty(
            [mode, frozen, actions, limit, achieved, duty, throttled, standing, preemptions, memory_limit,
             stage, problems]
        )


def _label_text(key: tuple) -> Any:
    """A pod's label text (``pod``), on a GPU (``share``), or the texts of its memory stages (``stages``: a
    tuple, one per stage); the node's mode (``mode``) and an action's (``action``)."""
    kind = key[0]
    if kind == "mode":
        return label_pairs((("mode", key[1]),))
    if kind == "action":
        return label_pairs((("action", key[1]), ("outcome", key[2])))
    _, namespace, pod = key[:3]
    ident = pod_labels(namespace, pod)
    if kind == "share":
        return join(ident, key[3])
    if kind == "stages":
        return tuple(with_label(ident, "stage", value) for value in STAGES)
    if kind == "standings":
        return tuple(with_label(join(ident, key[3]), "standing", value) for value in STANDINGS)
    return ident
