"""What the standing faults mean for the Node: its conditions, and the quarantine the policy asks for.

Pure functions of the faults and the settings, so that audit mode reports exactly what enforce would do.
Each condition of :data:`gpuagent.health.table.CONDITIONS` is "True" (healthy) unless a fault bears on it;
then "False", with the worst fault's reason, every fault's message and the GPUs concerned. The quarantine:
a NoSchedule taint from ``taint_at`` severity up, a NoExecute one too for fatal faults when asked, a cordon
from ``cordon_at`` up, a drain of the pods using the faulty GPUs from ``drain_at`` up, and a remediation
hand-off (the worst action among the faults that need one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuagent.health import table
from gpuagent.snapshot.health import GpuFault, NodeCondition
from gpuagent.snapshot.node import NodeSnapshot

TAINT_KEY = "gpuagent.io/gpu-unhealthy"
HEALTHY_REASON = "NoGpuFault"
NAMESPACE_MODES = ("evict", "wait", "skip")
THRESHOLDS = ("degraded", "fatal", "never")
_ACTION_RANK = {a: i for i, a in enumerate(table.ACTIONS)}


@dataclass(frozen=True)
class HealthSettings:
    """The policy; the config keys ``health_*`` (docs/configuration.md)."""

    mode: str = "audit"  # off | audit | enforce
    taint_at: str = "degraded"  # degraded | fatal | never
    no_execute: bool = False  # a NoExecute taint too for fatal faults
    cordon_at: str = "fatal"
    drain_at: str = "fatal"
    namespace_modes: Mapping[str, str] = field(default_factory=lambda: {"kube-system": "skip"})
    default_namespace_mode: str = "evict"
    quarantine_budget: int = 1  # nodes quarantined at once, cluster-wide
    budget_namespace: str = "gpuagent"
    clear_after: float = 300.0
    events: bool = True
    dra_taints: str = "report"  # off | report (the GPU not offered) | classify (also the Node's conditions)

    def namespace_mode(self, namespace: str | None) -> str:
        return self.namespace_modes.get(namespace or "", self.default_namespace_mode)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str | None


@dataclass(frozen=True)
class Plan:
    """What the Node should show and undergo, for these faults."""

    conditions: tuple[NodeCondition, ...]
    severity: str
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect)
    cordon: bool
    drain: bool
    pods: tuple[PodRef, ...]  # pods using the GPUs of fatal faults: the drain's
    remediation: Mapping[str, object] | None
    signature: str  # the faults that ask for a quarantine: a person's override holds while it is the same
    # the occurrences held until a GPU reset, as the Node keeps them across agent restarts:
    # (reason, GPU UUID, GPU index, since)
    held: tuple[tuple[str, str, int | None, float], ...] = ()

    @property
    def quarantine(self) -> bool:
        return bool(self.taints or self.cordon or self.drain)


def _reaches(severity: str, threshold: str) -> bool:
    order = table.SEVERITIES
    return threshold != "never" and order.index(severity) >= order.index(threshold)


def conditions_of(faults: Iterable[GpuFault], previous: Mapping[str, NodeCondition], now: float
                  ) -> tuple[NodeCondition, ...]:
    by_condition: dict[str, list[GpuFault]] = {c: [] for c in table.CONDITIONS}
    for f in faults:
        if f.condition in by_condition:
            by_condition[f.condition].append(f)
    out = []
    for name, found in by_condition.items():
        if not found:
            cond = NodeCondition(name, "True", HEALTHY_REASON, "gpuagent sees no fault of this kind")
        else:
            # the worst: by severity, then by how drastic its action is (a replacement over a reset)
            worst = max(found, key=lambda f: (table.SEVERITIES.index(f.severity), _ACTION_RANK[f.action]))
            gpus = tuple(dict.fromkeys(f.gpu_uuid for f in found if f.gpu_uuid))
            message = "; ".join(_describe(f) for f in found)
            cond = NodeCondition(name, "False", worst.reason, message[:1024], gpus, worst.severity)
        before = previous.get(name)
        since = before.since_unix if before is not None and before.status == cond.status else now
        out.append(NodeCondition(cond.type, cond.status, cond.reason, cond.message, cond.gpus, cond.severity,
                                 since))
    return tuple(out)


def _describe(fault: GpuFault) -> str:
    where = f"GPU {fault.gpu_index} ({fault.gpu_uuid})" if fault.gpu_uuid else "node"
    held = ", held until a GPU reset" if fault.held_until_reset else ""
    return f"{where}: {fault.message} [{fault.severity}, action {fault.action}{held}]"


def plan_for(faults: Sequence[GpuFault], conditions: tuple[NodeCondition, ...], snapshot: NodeSnapshot,
             settings: HealthSettings) -> Plan:
    node_faults = [f for f in faults if f.condition is not None]
    severity = table.worst(f.severity for f in node_faults)
    taints: list[tuple[str, str, str]] = []
    if _reaches(severity, settings.taint_at):
        taints.append((TAINT_KEY, severity, "NoSchedule"))
    if severity == table.FATAL and settings.no_execute:
        taints.append((TAINT_KEY, severity, "NoExecute"))
    cordon = _reaches(severity, settings.cordon_at)
    drain = _reaches(severity, settings.drain_at)
    drain_gpus = {f.gpu_uuid for f in node_faults if _reaches(f.severity, settings.drain_at)}
    if None in drain_gpus:  # a node-wide fault (NVML failing): every GPU pod
        drain_gpus = {g.info.uuid for g in snapshot.gpus}
        drain_gpus |= {u for p in snapshot.pods for u in (*p.allocated_gpus, *p.used_gpus)}
    pods = tuple(PodRef(p.namespace, p.name, p.uid) for p in snapshot.pods
                 if drain and p.namespace and (set(p.allocated_gpus) | set(p.used_gpus)) & drain_gpus)
    needing = [f for f in node_faults if f.action in table.RESET_ACTIONS and f.severity == table.FATAL]
    remediation = None
    if needing:
        worst = max(needing, key=lambda f: _ACTION_RANK[f.action])
        remediation = {
            "action": worst.action, "reason": worst.reason, "condition": worst.condition,
            "gpus": sorted({f.gpu_uuid for f in needing if f.gpu_uuid}),
            "faults": [{"reason": f.reason, "gpu": f.gpu_uuid, "action": f.action, "message": f.message}
                       for f in needing][:16],
        }
    quarantining = [f for f in node_faults if _reaches(f.severity, settings.taint_at)
                    or _reaches(f.severity, settings.cordon_at)]
    signature = ",".join(sorted({f"{f.reason}@{f.gpu_uuid or 'node'}" for f in quarantining}))
    held = tuple((f.reason, f.gpu_uuid, f.gpu_index, f.since_unix or 0.0) for f in node_faults
                 if f.held_until_reset and not f.active and f.gpu_uuid)
    return Plan(conditions, severity, tuple(taints), cordon, drain, pods, remediation, signature, held)
