"""The keys of the agent as a whole: the node's name it reports, and its log level.
``hostname`` names the node in every metric, the API, Events and the objects the agent writes, and
``log_level`` is set once for the process; ``gpuagent.agent`` and ``gpuagent.cli`` read them, not one
package, so they are a group of their own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import choice, node_name

LOG_LEVELS = ("debug", "info", "warning", "error")
NODE_NAME_ENV = "NODE_NAME"  # the Kubernetes downward-API node name, preferred over gethostname()


def default_hostname(env: Mapping[str, str]) -> tuple[str, str]:
    """The node's name when ``hostname`` is null (``$NODE_NAME``, else the host name), and its source."""
    name = env.get(NODE_NAME_ENV)
    if name:
        return name, f"env {NODE_NAME_ENV}"
    return socket.gethostname(), "default (socket.gethostname())"


@dataclass(frozen=True)
class AgentConfig:
    """Who the agent is and how much it logs (``config.agent``)."""

    hostname: str = key(
        "hostname", None, node_name,
        "node name reported in metrics and the API",
        "NAME", default_doc=f"${NODE_NAME_ENV}, else the host name",
    )
    log_level: str = key(
        "log_level", "info", choice(*LOG_LEVELS),
        "log level", "{" + ",".join(LOG_LEVELS) + "}",
    )

    def __post_init__(self) -> None:
        if self.hostname is None:  # built directly, not by load_config: resolve the way load_config does
            object.__setattr__(self, "hostname", default_hostname(os.environ)[0])
