"""The keys of the node-state publisher (``gpuagent.hints.publisher``): whether this node's GPUNodeState is
written for the scheduler extender, and how often.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import KUBERNETES_API_MODES, choice, number


@dataclass(frozen=True)
class PublishConfig:
    """Whether and how often the node's GPU state is published (``config.publish``)."""

    state: str = key(
        "publish_state", "auto", choice(*KUBERNETES_API_MODES),
        "publish this node's GPU state as a GPUNodeState object for the scheduler extender: auto (when the "
        "API server is reachable), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    min_interval: float = key(
        "publish_min_interval", 10.0, number(0, high=3600),
        "seconds between two writes of the GPUNodeState when it changed", "SECONDS",
    )
    heartbeat: float = key(
        "publish_heartbeat", 300.0, number(1, high=86400),
        "seconds after which an unchanged GPUNodeState is written again (the extender's staleness clock)",
        "SECONDS",
    )
