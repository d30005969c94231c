"""What ``gpuagent.health`` concluded at the last poll: the faults classified, the node conditions they
set, and what it did (or would do, in audit) on the Node: taints, cordon, drain, remediation.
``health/`` produces :class:`HealthState`; the exporter, the hints (a GPU's fault) and ``/v1/state`` read
it. It names GPUs by UUID and index, so it refers to no other part of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class GpuFault:
    """One fault seen on a GPU (or on the node, ``gpu_index`` None), classified by ``gpuagent.health``'s
    table: which node condition it bears on, how bad it is and what to do about it."""

    reason: str  # CamelCase, e.g. "XidFallenOffBus", "RowRemapFailure", "ThermalSlowdown"
    condition: str | None  # the node condition it sets, e.g. "GpuHardwareHealthy"; None: an Event only
    severity: str  # "info", "degraded" or "fatal"
    action: str  # recommended: "none", "restart_workload", "reset_gpu", "reboot", "replace"
    message: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    since_unix: float | None = None  # when it was first seen (this episode)
    active: bool = True  # seen this poll; False: gone, held by hysteresis or until a reset is seen
    held_until_reset: bool = False  # needs a GPU reset (or reboot) and none was seen since


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """One node condition as the agent means it to be on its Node (``status`` "True" = healthy)."""

    type: str
    status: str  # "True" or "False"
    reason: str
    message: str
    gpus: tuple[str, ...] = ()  # UUIDs concerned
    severity: str = "ok"  # the worst of its faults: "ok", "degraded" or "fatal"
    since_unix: float | None = None  # last transition as the agent saw it


@dataclass(frozen=True, slots=True)
class HealthState:
    """What ``gpuagent.health`` concluded at the last poll, and what it did (or, in audit, would do) about
    it on the Node: its conditions, taints, cordon, drain and the remediation asked for."""

    mode: str  # "off", "audit" or "enforce"
    faults: tuple[GpuFault, ...] = ()
    conditions: tuple[NodeCondition, ...] = ()
    severity: str = "ok"  # the node's worst: "ok", "degraded", "fatal"
    unhealthy_gpus: tuple[str, ...] = ()  # UUIDs not to offer to new work (degraded or fatal)
    taints: tuple[str, ...] = ()  # "key=value:Effect" the agent holds (or would, in audit)
    cordoned: bool = False  # the agent cordoned the node (or would)
    quarantined: bool = False  # holds a slot of the cluster-wide quarantine budget
    budget_deferred: bool = False  # would quarantine but the cluster-wide budget is spent
    manual_override: bool = False  # a person undid its cordon or taint: respected until the faults change
    drain: str = "none"  # "none", "draining", "waiting", "done", "blocked" (PDB), "deferred"
    remediation: str | None = None  # the action handed off (the node's annotation), None: none asked
    api: str = "idle"  # the API server writer: "idle", "ok", "failing: ...", "off"
    actions_total: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (action, outcome) -> count


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
