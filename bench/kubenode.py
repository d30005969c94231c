"""A simulated Kubernetes GPU node for the benches: the kubelet, the API server and the pods' cgroups.

The benches that poll a simulated node as a kubelet node would be polled share this set-up: every GPU
process sits in its own pod's kubelet-shaped cgroup (systemd driver, containerd) under a ``/proc`` tree of
its own, the kubelet's allocations come from the tests' real gRPC pod-resources server
(``tests/podresources_server.py``) and the pods' names from the tests' fake API server
(``tests/fake_apiserver.py``), watched as in a cluster. ``bench_poll_scrape`` and ``bench_scale`` run the
agent in this process (``running_agent``); ``bench_soak`` runs it as a process of its own with the same
keys (``KubeletNode.agent_config``).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' kubelet and API-server fakes

from fake_apiserver import NODE, FakeApiServer, container_id, make_pod  # noqa: E402
from podresources_server import Container, Devices, Pod, PodResourcesServer, gpus, short_socket_dir  # noqa: E402

__all__ = ["NODE", "Container", "KubeletNode", "Pod", "VirtualClock", "gpus", "kubelet_node", "make_pod",
           "one_pod_per_process", "running_agent", "write_cgroup"]


def write_cgroup(proc_root: Path, pid: int, pod_uid: str, container: str = "main") -> None:
    """``<proc_root>/<pid>/cgroup`` of a process in ``container`` of pod ``pod_uid`` (cgroup v2, systemd
    driver, containerd; the container ID is the one ``make_pod`` gives that container)."""
    slice_uid = pod_uid.replace("-", "_")
    directory = proc_root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id(pod_uid, container)}.scope\n"
    )


def one_pod_per_process(
    nvml: Any, proc_root: Path, namespace: str = "bench", annotations: Mapping[str, str] | None = None
) -> tuple[list[Pod], list[dict[str, Any]]]:
    """Every process the simulated NVML lists now in a pod of its own (with ``annotations``), allocated a
    time-slicing replica of its GPU (``<uuid>::<n>``): the kubelet's pods and the API server's, cgroup
    files written."""
    pods, api_pods = [], []
    nvml.nvmlInit()
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        for replica, process in enumerate(nvml.nvmlDeviceGetComputeRunningProcesses(handle)):
            uid = f"{process.pid:08x}-0000-4000-8000-{index:012x}"
            name = f"job-{process.pid}"
            write_cgroup(proc_root, process.pid, uid)
            pods.append(Pod(name, namespace, [Container("main", [gpus(f"{uuid}::{replica}")])]))
            api_pods.append(make_pod(name, namespace=namespace, uid=uid, containers=("main",),
                                     annotations=annotations))
    return pods, api_pods


class VirtualClock:
    """Time the bench moves by hand: each poll can be a second apart (the agent's cadence) however fast the
    polls really follow each other, so what depends on time (windows, cadences of the slower NVML reads,
    the kubelet's refresh) sees what it would see on a node. ``monotonic`` is also the simulator's clock."""

    EPOCH = 1_795_000_000.0

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.EPOCH + self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass(frozen=True)
class KubeletNode:
    """The running fakes of one node and where they are."""

    work: Path
    socket: Path
    kubelet: PodResourcesServer
    api: FakeApiServer
    kubeconfig: Path

    def agent_config(self, **keys: Any) -> dict[str, Any]:
        """The agent's config keys for this node (a kubelet node named through the API server), plus
        ``keys``."""
        return {"proc_root": str(self.work / "proc"), "pod_resources_socket": str(self.socket),
                "kubernetes_api": "on", "kubeconfig": str(self.kubeconfig), "hostname": NODE, **keys}

    def add_pods(self, pods: Iterable[Pod], api_pods: Iterable[Mapping[str, Any]]) -> None:
        """The pods join the kubelet's allocations (replacing its list) and the API server."""
        self.kubelet.set_pods(list(pods))
        for pod in api_pods:
            self.api.add_pod(pod)


@asynccontextmanager
async def kubelet_node(work: Path | None = None, *, allocatable: Iterable[Devices] = ()
                       ) -> AsyncIterator[KubeletNode]:
    """The kubelet's pod-resources server and the API server, running, with a kubeconfig for the latter;
    cgroup files go under ``<work>/proc`` (a temporary directory when ``work`` is None)."""
    with tempfile.TemporaryDirectory(prefix="gpuagent-node-") as tmp, short_socket_dir() as sockets:
        work = work or Path(tmp)
        (work / "proc").mkdir(parents=True, exist_ok=True)
        socket = sockets / "kubelet.sock"
        async with FakeApiServer() as api, PodResourcesServer(socket, allocatable=allocatable) as kubelet:
            kubeconfig = api.write_kubeconfig(work / "kubeconfig")
            yield KubeletNode(work, socket, kubelet, api, kubeconfig)


@asynccontextmanager
async def running_agent(node: KubeletNode, nvml: Any, scenario: Path, *, clock: VirtualClock | None = None,
                        **keys: Any) -> AsyncIterator[Any]:
    """An in-process ``Agent`` on ``nvml`` (the simulated NVML of ``scenario``) for this node, with config
    ``keys``, its pod watcher running and synced with the API server; closed on the way out. With
    ``clock`` the agent's wall and monotonic clocks are that one (the simulator's should be too)."""
    from gpuagent.agent import Agent
    from gpuagent.config import load_config

    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(scenario), **node.agent_config(**keys),
    })
    clocks = {} if clock is None else {"clock": clock.wall, "monotonic": clock.monotonic}
    agent = Agent(config, nvml=nvml, backend="sim", **clocks)
    assert agent.pods.metadata is not None
    watcher = asyncio.create_task(agent.pods.metadata.run())
    try:
        deadline = time.monotonic() + 60
        while not agent.pods.metadata.synced:
            if watcher.done():
                watcher.result()  # raises what stopped it
            if time.monotonic() > deadline:
                raise TimeoutError("the pod watcher did not sync with the fake API server in 60 s")
            await asyncio.sleep(0.05)
        yield agent
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await agent.aclose()

