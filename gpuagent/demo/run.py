"""``gpuagent demo``: start the simulated node's kubelet and API server, write its ``/proc``, run the agent.

The servers run on an event loop of their own, in a daemon thread, for as long as the agent runs; the agent
is ``gpuagent.agent.run`` (the same process, its own loop, its own signal handling), configured as a user
configures ``gpuagent run`` (file, env, flags) with the node's wiring set by the demo: the simulated NVML
and its scenario, the ``/proc`` tree, the pod-resources socket, the kubeconfig, the node's name, and a
cgroup root and freeze journal inside the demo's temporary directory (so nothing real is ever frozen).
Keys the user did not set take the demo's defaults (:data:`DEMO_DEFAULTS`: audit mode, idle pods flagged
after a second and their Events posted, the kubelet read every second). All of it is removed on exit.

The temporary directory is the demo user's alone (``mkdtemp`` makes it 0700): the kubeconfig in it holds
the API server's token, so the demo's agent is the one local client that can read or write its pods and
Events (the server listens on loopback, which every local user reaches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuagent.config import Config, ConfigError, load_config
from gpuagent.demo.apiserver import ApiServer
from gpuagent.demo.kubelet import KubeletServer
from gpuagent.demo.node import DemoNode, demo_node
from gpuagent.demo.proc import write_proc
from gpuagent.devices.sim import ScenarioError, SimulatedNvml, kubernetes_demo_path, load_scenario

log = logging.getLogger(__name__)

# What the demo decides about the node; not flags of `gpuagent demo`.
WIRED_KEYS = ("backend", "proc_root", "pod_resources_socket", "kubeconfig", "kubernetes_api", "hostname",
              "cgroup_root", "journal_path")
# Defaults of the demo where the user set nothing (file, env or flag).
DEMO_DEFAULTS: Mapping[str, object] = {
    "mode": "audit", "pod_resources_interval": 1.0, "idle_window": 1.0, "idle_events": "on",
    "network": False,
    # the demo's API server serves pods and owners; it holds no GPUNodeState CRD for the extender's view
    "publish_state": "off",
}


class ServerThread:
    """An event loop in a daemon thread, for the kubelet and the API server; ``run`` a coroutine there."""

    def __init__(self, name: str = "demo-node") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


@contextlib.contextmanager
def serving(node: DemoNode, workdir: Path) -> Iterator[tuple[Path, Path]]:
    """The node's kubelet socket and API server, up until the block ends; yields (socket, kubeconfig)."""
    thread = ServerThread()
    kubelet = KubeletServer(workdir / "kubelet.sock", node)
    api = ApiServer(node)
    try:
        thread.run(kubelet.start())
        thread.run(api.start())
        yield kubelet.socket, api.write_kubeconfig(workdir / "kubeconfig")
    finally:
        with contextlib.suppress(Exception):
            thread.run(api.stop())
        with contextlib.suppress(Exception):
            thread.run(kubelet.stop())
        thread.close()


def demo_config(config_file: str | None, flags: Mapping[str, object], *, scenario: str, hostname: str,
                workdir: Path, socket: Path, kubeconfig: Path, env: Mapping[str, str] = os.environ) -> Config:
    """The agent's config: the user's (``config_file``, ``env``, ``flags``), the demo's defaults where the
    user set nothing, the node's wiring always."""
    given = load_config(config_file, overrides=flags, env=env)
    defaults = {k: v for k, v in DEMO_DEFAULTS.items() if given.sources.get(k, "default") == "default"}
    wiring = {"backend": "sim", "scenario": scenario, "proc_root": str(workdir / "proc"),
              "pod_resources_socket": str(socket), "kubeconfig": str(kubeconfig), "kubernetes_api": "on",
              "hostname": hostname, "cgroup_root": str(workdir / "cgroup"),
              "journal_path": str(workdir / "freeze-journal.json")}
    return load_config(config_file, overrides={**flags, **defaults, **wiring}, env=env)


def run(config_file: str | None, flags: Mapping[str, object]) -> int:
    """Serve the demo node until SIGTERM, SIGINT or SIGHUP; the exit code of ``gpuagent run``."""
    from gpuagent import agent

    scenario_path = str(flags.get("scenario") or kubernetes_demo_path())
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        raise ConfigError("scenario", str(exc), "flag --scenario") from exc
    node = demo_node(scenario)
    with tempfile.TemporaryDirectory(prefix="gpuagent-demo-") as work:
        workdir = Path(work)
        write_proc(workdir / "proc", node, SimulatedNvml(scenario).process_environ)
        with serving(node, workdir) as (socket, kubeconfig):
            config = demo_config(config_file, {**flags, "scenario": scenario_path}, scenario=scenario_path,
                                 hostname=scenario.hostname, workdir=workdir, socket=socket,
                                 kubeconfig=kubeconfig)
            log.warning("DEMO: a SIMULATED Kubernetes node %s (scenario %s): %d pods served by the demo's "
                        "own kubelet (%s) and API server (%s); no GPU here is real (gpuagent_simulated 1)",
                        scenario.hostname, scenario_path, len(node.pods), socket, kubeconfig)
            log.info("starting: %s", config.summary())
            log.debug("configuration:\n%s", config.describe())
            return agent.run(config)
