"""The health consumer: each poll's snapshot in, the node's GPU health (and what is done about it) out.

``update(snapshot)`` runs on the poll, fast and without I/O: it classifies (:mod:`.classify`), tracks
(:mod:`.tracker`), builds the conditions and the plan (:mod:`.plan`) and hands the plan to the writer
(:mod:`.writer`) when one is configured; the :class:`~gpuagent.snapshot.health.HealthState` it returns goes in
the snapshot, for ``/v1/state``, the metrics, ``gpuagent top`` and the hints (a GPU with a degraded or fatal
fault is not offered). In audit mode the state says what enforce would do and nothing is written.
"""

from __future__ import annotations

import logging
from collections import Counter

from gpuagent.health import table
from gpuagent.health.classify import Classifier
from gpuagent.health.plan import HealthSettings, PodRef, conditions_of, plan_for
from gpuagent.health.tracker import FaultTracker
from gpuagent.health.writer import NodeWriter
from gpuagent.snapshot.health import HealthState, NodeCondition
from gpuagent.snapshot.node import NodeSnapshot

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(self, settings: HealthSettings, writer: NodeWriter | None = None) -> None:
        self.settings = settings
        self.writer = writer
        self._classifier = Classifier(dra_taints=settings.dra_taints)
        self._tracker = FaultTracker(clear_after=settings.clear_after)
        self._conditions: dict[str, NodeCondition] = {}
        self._audit: Counter[tuple[str, str]] = Counter()
        self._last_signature = ""
        self._held: list[tuple[str, str, int | None, float]] = []
        if writer is not None:
            writer.on_held = self._held.extend  # read from the Node; adopted by the next poll, with its GPUs

    def _adopt(self, snapshot: NodeSnapshot) -> None:
        held = list(self._held)
        self._held.clear()  # in place: the writer holds its extend
        adopted = self._tracker.adopt(held, gpus={g.info.uuid for g in snapshot.gpus},
                                      now=snapshot.taken_at_unix)
        if adopted:
            log.warning("holding %d GPU fault(s) a previous run held until a GPU reset (same boot)", adopted)
        if adopted < len(held):
            log.warning("not holding %d fault(s) of the Node's gpuagent.io/held-faults: unknown, not held "
                        "until a reset, or on a GPU this node does not have", len(held) - adopted)

    def update(self, snapshot: NodeSnapshot) -> HealthState:
        now = snapshot.taken_at_unix
        if self._held:
            self._adopt(snapshot)
        faults, new = self._tracker.update(snapshot, self._classifier.observe(snapshot), now)
        conditions = conditions_of(faults, self._conditions, now)
        self._conditions = {c.type: c for c in conditions}
        plan = plan_for(faults, conditions, snapshot, self.settings)
        # not offered: a GPU with a degraded or fatal fault, whether it bears on a node condition or (a DRA
        # driver's device taint, in report) on the GPU alone
        unhealthy = tuple(dict.fromkeys(f.gpu_uuid for f in faults if f.gpu_uuid
                                        and f.severity in (table.DEGRADED, table.FATAL)))
        base = HealthState(mode=self.settings.mode, faults=faults, conditions=conditions,
                           severity=plan.severity, unhealthy_gpus=unhealthy)
        taints = tuple(f"{k}={v}:{e}" for k, v, e in plan.taints)
        remediation = str(plan.remediation["action"]) if plan.remediation else None
        if self.settings.mode == "enforce" and self.writer is not None:
            self.writer.submit(plan, new, _pods_by_gpu(snapshot))
            s = self.writer.status
            return HealthState(**{**_fields(base), "taints": s.taints, "cordoned": s.cordoned,
                                  "quarantined": s.quarantined, "budget_deferred": s.budget_deferred,
                                  "manual_override": s.override, "drain": s.drain,
                                  "remediation": s.remediation,
                                  "api": s.api, "actions_total": dict(s.actions)})
        if self.settings.mode == "audit" and plan.signature != self._last_signature:
            wants = (("taint", bool(plan.taints)), ("cordon", plan.cordon), ("drain", plan.drain))
            for action, wanted in wants:
                if wanted:
                    self._audit[(action, "audit")] += 1
        self._last_signature = plan.signature
        return HealthState(**{**_fields(base), "taints": taints, "cordoned": plan.cordon,
                              "quarantined": plan.quarantine, "drain": "audit" if plan.drain else "none",
                              "remediation": remediation, "api": "off", "actions_total": dict(self._audit)})


def _fields(state: HealthState) -> dict:
    return {name: getattr(state, name) for name in HealthState.__dataclass_fields__}


def _pods_by_gpu(snapshot: NodeSnapshot) -> dict[str, tuple[PodRef, ...]]:
    out: dict[str, list[PodRef]] = {}
    for pod in snapshot.pods:
        if not pod.namespace:
            continue
        for uuid in dict.fromkeys((*pod.allocated_gpus, *pod.used_gpus)):
            out.setdefault(uuid, []).append(PodRef(pod.namespace, pod.name, pod.uid))
    return {k: tuple(v) for k, v in out.items()}
