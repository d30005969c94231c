"""What the enforcer decided: shares (limit, achieved, frozen), the memory ladder, its actions and problems.

In audit mode these are the decisions it would have carried out: the same series, with the actions counted
under ``outcome="audit"``. Nothing is rendered while enforcement is off.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import add, add_known, counter, gauge, join, non_empty, with_label
from gpuagent.export.labels import GpuLabels, GpuRenderer, pod_labels
from gpuagent.snapshot import NodeSnapshot

MODES = ("off", "audit", "enforce")
STAGES = ("ok", "warned", "terminating", "killed", "evicted")

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

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        state = snapshot.enforcement
        if state is None:
            return []
        mode = gauge("gpuagent_enforcement_mode", "1 for the node's enforcement mode.")
        for value in MODES:
            add(mode, {"mode": value}, 1.0 if state.mode == value else 0.0)
        frozen = gauge("gpuagent_enforcement_frozen_cgroups", "Cgroups held in a freeze duty cycle.")
        add(frozen, {}, state.frozen_cgroups)
        actions = counter("gpuagent_enforcement_actions_total",
                          "Enforcement actions by outcome (audit: decided, not carried out).")
        counts = dict.fromkeys(KNOWN_ACTIONS.get(state.mode, ()), 0) | dict(state.actions_total)
        for (action, outcome), count in sorted(counts.items()):
            add(actions, {"action": action, "outcome": outcome}, count)
        limit = gauge("gpuagent_pod_gpu_share_limit_ratio", "The pod's share of the GPU's SM time (0-1).")
        achieved = gauge("gpuagent_pod_gpu_share_achieved_ratio",
                         "The pod's measured share of the GPU's SM time over the controller's window (0-1).")
        duty = gauge("gpuagent_pod_gpu_frozen_ratio", "Part of each period the pod is frozen (0-1).")
        throttled = counter("gpuagent_pod_gpu_throttled_seconds_total", "Time the pod spent frozen.")
        by_uuid = {g.info.uuid: g for g in snapshot.gpus}
        for share in state.shares:
            gpu = by_uuid.get(share.gpu_uuid)
            if gpu is None:
                continue
            series = join(pod_labels(share.namespace, share.pod), labels.gpu(gpu))
            add_known(limit, series, share.limit_ratio)
            add(achieved, series, share.achieved_ratio)
            add(duty, series, share.frozen_ratio)
            add(throttled, series, share.throttled_seconds_total)
        memory_limit = gauge("gpuagent_pod_gpu_memory_limit_bytes", "The pod's GPU memory limit.")
        stage = gauge("gpuagent_pod_gpu_memory_limit_stage", "1 for the pod's stage on the memory ladder.")
        for memory in state.memory:
            ident = pod_labels(memory.namespace, memory.pod)
            add_known(memory_limit, ident, memory.limit_bytes)
            for value in STAGES:
                add(stage, with_label(ident, "stage", value), 1.0 if memory.stage == value else 0.0)
        problems = gauge("gpuagent_pod_policy_problem",
                         "1 for an annotation that could not be used (the pod gets the node default).")
        for problem in state.problems:
            ident = pod_labels(problem.namespace, problem.pod)
            add(problems, with_label(ident, "annotation", problem.annotation), 1)
        return non_empty(
            [mode, frozen, actions, limit, achieved, duty, throttled, memory_limit, stage, problems]
        )
