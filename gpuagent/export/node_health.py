"""The health classification's families: node conditions, each GPU's standing faults, and the quarantine.

From ``snapshot.health`` (``gpuagent.health``); nothing while it is off. In audit mode the quarantine
families say what enforce would do. ``gpuagent_node_gpu_quarantined`` is what the alerts watch. Rendered by
the agent's health collector (``export.health``), with the other per-GPU health families.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import INFO, add, counter, extend, family, gauge, non_empty, with_label
from gpuagent.export.labels import GpuLabels
from gpuagent.snapshot.node import NodeSnapshot

MODES = ("off", "audit", "enforce")
DRAIN_STATES = ("none", "audit", "draining", "blocked", "waiting", "done")


def node_health_families(snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
    state = snapshot.health
    if state is None:
        return []
    host = labels.host
    mode = gauge("gpuagent_node_gpu_health_mode", "1 for the mode of the GPU health actions.")
    for value in MODES:
        add(mode, with_label(host, "mode", value), 1.0 if state.mode == value else 0.0)
    healthy = gauge("gpuagent_node_gpu_condition_healthy",
                    "1 when the node condition is True (no GPU fault of its kind), else 0.")
    info = family("gpuagent_node_gpu_condition_info", "The node condition's status and reason.", INFO)
    for c in state.conditions:
        add(healthy, with_label(host, "condition", c.type), 1.0 if c.status == "True" else 0.0)
        add(info, extend(host, (("condition", c.type), ("status", c.status), ("reason", c.reason),
                                ("severity", c.severity))), 1)
    faults = family("gpuagent_gpu_fault_info",
                    "Each fault standing on a GPU: its reason, severity and recommended action.", INFO)
    by_uuid = {g.info.uuid: g for g in snapshot.gpus}
    for f in state.faults:
        gpu = by_uuid.get(f.gpu_uuid or "")
        base = labels.gpu(gpu) if gpu is not None else host
        add(faults, extend(base, (("reason", f.reason), ("severity", f.severity), ("action", f.action),
                                  ("condition", f.condition or ""),
                                  ("held", "true" if f.held_until_reset else "false"))), 1)
    quarantined = gauge("gpuagent_node_gpu_quarantined",
                        "1 while the agent holds the node tainted or cordoned for a GPU fault (audit: "
                        "would).")
    add(quarantined, host, 1.0 if state.taints or state.cordoned else 0.0)
    cordoned = gauge("gpuagent_node_gpu_cordoned",
                     "1 while the agent's cordon stands (audit: would cordon).")
    add(cordoned, host, 1.0 if state.cordoned else 0.0)
    deferred = gauge("gpuagent_node_gpu_quarantine_deferred",
                     "1 when a quarantine waits for a slot of the cluster-wide budget.")
    add(deferred, host, 1.0 if state.budget_deferred else 0.0)
    override = gauge("gpuagent_node_gpu_manual_override",
                     "1 when a person undid the agent's cordon or taint (respected until the faults "
                     "change).")
    add(override, host, 1.0 if state.manual_override else 0.0)
    drain = gauge("gpuagent_node_gpu_drain_state",
                  "1 for the state of the drain of the faulty GPUs' pods.")
    for value in DRAIN_STATES:
        add(drain, with_label(host, "state", value), 1.0 if state.drain == value else 0.0)
    writes = gauge("gpuagent_node_gpu_health_api_up",
                   "1 when the last write of the node's GPU health to the API server worked (enforce).")
    if state.mode == "enforce" and state.api != "off":
        add(writes, host, 0.0 if state.api.startswith("failing") else 1.0)
    actions = counter("gpuagent_health_actions_total",
                      "GPU health actions by outcome (audit: decided, not carried out).")
    for (action, outcome), count in sorted(state.actions_total.items()):
        add(actions, extend(host, (("action", action), ("outcome", outcome))), count)
    return non_empty([mode, healthy, info, faults, quarantined, cordoned, deferred, override, drain,
                      writes, actions])
