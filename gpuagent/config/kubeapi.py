"""The keys of the API-server connection (``gpuagent.kubeapi``): whether to use it, and which kubeconfig.
Every writer and watcher that talks to the API server reads them (pod names, DRA's ResourceSlices, idle
Events, the published node state, the health monitor's node writes, evictions), so they belong to the
connection they configure rather than to any one of those packages.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import KUBERNETES_API_MODES, choice, optional_path


@dataclass(frozen=True)
class KubeApiConfig:
    """Whether and how the agent reaches the Kubernetes API server (``config.kubeapi``)."""

    kubernetes_api: str = key(
        "kubernetes_api", "auto", choice(*KUBERNETES_API_MODES),
        "name pods through the API server: auto (in a cluster, with a service account), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    kubeconfig: str | None = key(
        "kubeconfig", None, optional_path,
        "kubeconfig for the API server (default: in-cluster, then $KUBECONFIG)", "PATH",
    )
