"""The keys of the GPU health monitor (``gpuagent.health``): its mode, the severities that taint, cordon and
drain, how each namespace is drained, the cluster-wide quarantine budget, the hysteresis, Events, and what
a DRA driver's device taints do.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import (
    DRAIN_MODES,
    MODES,
    boolean,
    choice,
    namespace_drain_modes,
    namespace_name,
    number,
    whole_number,
)

HEALTH_DRA_TAINT_MODES = ("off", "report", "classify")  # gpuagent.health.table.DRA_TAINT_MODES
HEALTH_THRESHOLDS = ("degraded", "fatal", "never")  # the least severity that gets an action (gpuagent.health)


@dataclass(frozen=True)
class HealthConfig:
    """What the health monitor does about a GPU fault (``config.health``)."""

    mode: str = key(
        "health_mode", "audit", choice(*MODES),
        "GPU faults on the Node: off, audit (classify and report in /v1/state and metrics, write nothing) or "
        "enforce (node conditions, Events, taints, cordon, drain, remediation annotation)",
        "{" + ",".join(MODES) + "}",
    )
    taint: str = key(
        "health_taint", "degraded", choice(*HEALTH_THRESHOLDS),
        "least fault severity that taints the node gpuagent.io/gpu-unhealthy:NoSchedule",
        "{degraded,fatal,never}",
    )
    no_execute: bool = key(
        "health_no_execute", False, boolean,
        "also taint NoExecute for a fatal fault (pods without a toleration are evicted)", "BOOL",
    )
    cordon: str = key(
        "health_cordon", "fatal", choice(*HEALTH_THRESHOLDS),
        "least fault severity that cordons the node", "{degraded,fatal,never}",
    )
    drain: str = key(
        "health_drain", "fatal", choice(*HEALTH_THRESHOLDS),
        "least fault severity that drains the pods on the faulty GPUs (Eviction API)",
        "{degraded,fatal,never}",
    )
    drain_namespaces: tuple[str, ...] = key(
        "health_drain_namespaces", ("kube-system=skip",), namespace_drain_modes,
        "drain mode by namespace: evict, wait (for the pod to finish) or skip; others: health_drain_default",
        "NS=MODE,...",
    )
    drain_default: str = key(
        "health_drain_default", "evict", choice(*DRAIN_MODES),
        "drain mode of namespaces not in health_drain_namespaces", "{" + ",".join(DRAIN_MODES) + "}",
    )
    quarantine_budget: int = key(
        "health_quarantine_budget", 1, whole_number,
        "nodes that agents may taint, cordon or drain at once, cluster-wide (a shared Lease)", "N",
    )
    budget_namespace: str = key(
        "health_budget_namespace", "gpuagent", namespace_name,
        "namespace of the quarantine budget's Lease (the agents' own)", "NAMESPACE",
    )
    clear_after: float = key(
        "health_clear_after", 300.0, number(0),
        "seconds a fault must be gone before its condition and taint clear (hysteresis); "
        "faults needing a GPU reset are held until one is seen",
        "SECONDS",
    )
    events: bool = key(
        "health_events", True, boolean,
        "post an Event on the node and its pods for each new fault (enforce)", "BOOL",
    )
    dra_taints: str = key(
        "health_dra_taints", "report", choice(*HEALTH_DRA_TAINT_MODES),
        "a DRA driver's NoSchedule/NoExecute device taints (ResourceSlices): off; report (a fault, the GPU "
        "not offered, the Node untouched); classify (also the Node's conditions and quarantine, by severity)",
        "{" + ",".join(HEALTH_DRA_TAINT_MODES) + "}",
    )

