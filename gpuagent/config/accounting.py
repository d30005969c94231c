"""The keys of accounting (``gpuagent.accounting``): how long an ended workload's counters are kept, the
efficiency window, and when (and whether Events say) a workload is idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import KUBERNETES_API_MODES, choice, number


@dataclass(frozen=True)
class AccountingConfig:
    """What the accountant keeps and when it flags a workload idle (``config.accounting``)."""

    retention: float = key(
        "accounting_retention", 300.0, number(0),
        "seconds an ended workload's accounting counters are kept before its series go", "SECONDS",
    )
    efficiency_window: float = key(
        "efficiency_window", 3600.0, number(0),
        "seconds over which gpuagent_pod_gpu_efficiency_ratio (busy/allocated) is taken", "SECONDS",
    )
    idle_threshold: float = key(
        "idle_threshold", 0.05, number(0, high=1),
        "SM use (0-1) of what a workload holds under which it counts as idle", "RATIO",
    )
    idle_window: float = key(
        "idle_window", 1800.0, number(0),
        "seconds a workload must stay idle before it is flagged (metric, Event, state)", "SECONDS",
    )
    idle_events: str = key(
        "idle_events", "auto", choice(*KUBERNETES_API_MODES),
        "post a Kubernetes Event on a pod flagged idle: auto (when the API server is reachable), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
