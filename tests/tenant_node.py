"""The simulated 8xH100 node with tenants, as several integration tests run it: pods named by a fake API
server, their GPUs given by the real pod-resources gRPC server, their processes' cgroups in a ``/proc`` tree
of kubelet-shaped files, and ``gpuagent run`` processes on loopback ports.

``h100_tenants`` places the 64 processes of ``examples/scenarios/h100-8x-64proc.yaml`` in pods (its
docstring lists them); ``fake_kubernetes`` serves those pods; ``Agent`` is an agent process named after
its node. ``tests/test_prometheus_queries.py`` scrapes such a node with Prometheus, ``tests/test_top*.py``
watch it with ``gpuagent top``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner import AgentRunner
from prometheus_server import free_port

from gpuagent.demo.run import ServerThread

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"
FAKE_PID = 4_200_000  # the simulator numbers processes without a real PID from here, in scenario order


# -- the tenants of gpu-node-1 ------------------------------------------------------------------------------

@dataclass
class Tenant:
    namespace: str
    pod: str
    uid: str
    containers: dict[str, list[int]] = field(default_factory=dict)  # container -> fake PIDs
    gpus: dict[str, list[int]] = field(default_factory=dict)  # container -> GPU indexes it uses
    annotations: dict[str, str] = field(default_factory=dict)
    allocated: bool = True  # the kubelet gave it its GPUs (False: it uses a GPU it was not given)


def h100_tenants(processes: Sequence[dict[str, Any]]) -> tuple[list[Tenant], dict[int, str]]:
    """Pods for the scenario's 64 processes (8 per GPU) and the cgroup line of every fake PID.

    GPUs 0-6, per GPU g: ``training/train-g`` (containers ``main`` = train-worker-g, ``prefetch`` =
    dataloader-prefetch-g; share 40 %), ``training/eval-g`` (node defaults: 20 %, 4Gi, which its 7-9 GiB
    exceed), ``serving/embedding-g`` (8Gi), ``serving/vllm-g`` (30 %, 16Gi, priority high),
    ``research/notebook-g`` (a config rule: 15 %; notebook-0's share annotation is bad: a policy problem;
    notebook-3 was not allocated its GPU), ``training/reward-g`` (reward-1 exempt by a config rule; its
    ``gpuagent.io/exempt`` annotation is ignored, a policy problem); tokenizer-cache-g is
    the systemd unit ``tokenizer-cache@g.service`` (a config rule: 10 %, 8Gi). GPU 7: all eight processes
    are one pod, ``training/pretrain-0``, allocated the whole GPU."""
    by_name: dict[str, Tenant] = {}
    cgroups: dict[int, str] = {}

    def tenant(namespace: str, pod: str, **kwargs: Any) -> Tenant:
        if pod not in by_name:
            index = len(by_name)
            by_name[pod] = Tenant(namespace, pod, f"{index:08x}-7e57-4a11-8c0d-{index:012x}", **kwargs)
        return by_name[pod]

    for i, process in enumerate(processes):
        pid, gpu = FAKE_PID + i, int(process["gpu"])
        role = re.sub(r"-\d+$", "", process["name"])
        if gpu == 7:
            owner, container = tenant("training", "pretrain-0"), "main"
        elif role == "tokenizer-cache":
            cgroups[pid] = f"0::/system.slice/system-tokenizer\\x2dcache.slice/tokenizer-cache@{gpu}.service\n"
            continue
        elif role in ("train-worker", "dataloader-prefetch"):
            owner = tenant("training", f"train-{gpu}", annotations={"gpuagent.io/gpu-share": "40"})
            container = "main" if role == "train-worker" else "prefetch"
        elif role == "eval":
            owner, container = tenant("training", f"eval-{gpu}"), "main"
        elif role == "embedding-svc":
            owner, container = tenant("serving", f"embedding-{gpu}",
                                      annotations={"gpuagent.io/gpu-memory": "8Gi"}), "server"
        elif role == "vllm-engine":
            owner, container = tenant("serving", f"vllm-{gpu}", annotations={
                "gpuagent.io/gpu-share": "30", "gpuagent.io/gpu-memory": "16Gi",
                "gpuagent.io/priority": "high"}), "engine"
        elif role == "notebook":
            owner, container = tenant("research", f"notebook-{gpu}", allocated=gpu != 3,
                                      annotations={"gpuagent.io/gpu-share": "lots"} if gpu == 0 else {}), "lab"
        elif role == "reward-model":
            owner, container = tenant("training", f"reward-{gpu}",
                                      annotations={"gpuagent.io/exempt": "true"} if gpu == 1 else {}), "main"
        else:
            raise AssertionError(f"a process the tenants do not place: {process['name']}")
        owner.containers.setdefault(container, []).append(pid)
        owner.gpus.setdefault(container, [])
        if gpu not in owner.gpus[container]:
            owner.gpus[container].append(gpu)
    from fake_apiserver import container_id

    for owner in by_name.values():
        slice_uid = owner.uid.replace("-", "_")
        for container, pids in owner.containers.items():
            line = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
                    f"cri-containerd-{container_id(owner.uid, container)}.scope\n")
            for pid in pids:
                cgroups[pid] = line
    return list(by_name.values()), cgroups


def write_proc(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, line in cgroups.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "cgroup").write_text(line)
    return root


def gpu_uuids(scenario: Path) -> list[str]:
    from gpuagent.devices.sim import SimulatedNvml, load_scenario

    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    try:
        return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()


# -- async servers on a loop of their own ---------------------------------------------------------------------

class LoopThread(ServerThread):
    """An asyncio loop in a daemon thread (``gpuagent demo``'s, for its own kubelet and API server): the fake
    API server and the pod-resources gRPC server live there for as long as the agents run, whatever the test
    does meanwhile."""

    def __init__(self) -> None:
        super().__init__(name="fake-k8s")


@contextlib.contextmanager
def fake_kubernetes(tenants: Sequence[Tenant], uuids: Sequence[str], workdir: Path) -> Iterator[tuple[Path, Path]]:
    """The fake API server and the pod-resources server for ``tenants``; yields (kubeconfig, socket)."""
    from fake_apiserver import FakeApiServer, make_pod
    from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir

    replicas: dict[int, int] = {}
    kubelet_pods, allocatable = [], []
    for tenant in tenants:
        containers = []
        for container, indexes in tenant.gpus.items():
            ids = []
            for index in indexes:
                if tenant.pod == "pretrain-0":
                    ids.append(uuids[index])  # the whole GPU
                else:
                    ids.append(f"{uuids[index]}::{replicas.get(index, 0)}")  # a time-slicing replica
                    replicas[index] = replicas.get(index, 0) + 1
            allocatable += ids
            containers.append(Container(container, [gpus(*ids)] if tenant.allocated else []))
        kubelet_pods.append(Pod(tenant.pod, tenant.namespace, containers))
    loop = LoopThread()
    api = FakeApiServer()
    try:
        with short_socket_dir() as sockets:
            socket_path = sockets / "kubelet.sock"
            kubelet = PodResourcesServer(socket_path, pods=kubelet_pods, allocatable=[gpus(*allocatable)])
            loop.run(api.start())
            loop.run(kubelet.start())
            for tenant in tenants:
                api.add_pod(make_pod(tenant.pod, namespace=tenant.namespace, uid=tenant.uid,
                                     containers=tuple(tenant.containers), annotations=tenant.annotations))
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
            try:
                yield kubeconfig, socket_path
            finally:
                loop.run(kubelet.stop(0))
                loop.run(api.stop())
    finally:
        loop.close()


# -- agents ------------------------------------------------------------------------------------------------

class Agent(AgentRunner):
    """An agent on a free loopback port, named ``name`` (its Hostname label)."""

    def __init__(self, name: str, config: dict[str, Any], workdir: Path) -> None:
        super().__init__(name, {**config, "listen": f"127.0.0.1:{free_port()}", "hostname": name}, workdir)


# -- one such node, ready to watch -------------------------------------------------------------------------

# What the node shows besides its tenants' use: research/notebook-5 holds its replica of GPU 5 and does
# nothing (flagged idle after IDLE_WINDOW_S), XID 31 on GPU 5 (every 2 s) and GPU 6's utilization read hanging
# (GPU 6 goes stale).
IDLE_POD = ("research", "notebook-5")
IDLE_WINDOW_S = 2.0
STALE_GPU = 6


def tenant_scenario() -> dict[str, Any]:
    """The 8xH100 scenario with an idle tenant (notebook-5), an XID on GPU 5 and a hung call on GPU 6."""
    import yaml

    scenario = yaml.safe_load(H100.read_text())
    for process in scenario["processes"]:
        if process["name"] == "notebook-5":
            process["sm_util"] = 0
    scenario["faults"] = [*scenario.get("faults", []),
                          # every 2 s for an hour, not once at 1 s: the simulated NVML, as NVML, gives an
                          # event set only what comes after it registers, which an agent starting on a
                          # loaded machine did more than 1 s in, and then showed no XID at all
                          {"xid_storm": {"gpu": 5, "at": 1, "code": 31, "count": 1800, "interval": 2}},
                          {"hang": {"function": "nvmlDeviceGetUtilizationRates", "gpu": STALE_GPU, "at": 3,
                                    "seconds": 3600}}]
    return scenario


@contextlib.contextmanager
def tenant_agent(work: Path, name: str = "gpu-node-1", **config: Any) -> Iterator[Agent]:
    """``gpuagent run`` on the tenant node, in ``mode: audit`` (shares, the memory ladder), with pods named by
    the fake API server and their GPUs from the pod-resources server; stopped at the end. ``config`` adds
    to or overrides the agent's keys."""
    import yaml

    scenario = tenant_scenario()
    work.mkdir(parents=True, exist_ok=True)
    path = work / "h100-tenants.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    tenants, cgroups = h100_tenants(scenario["processes"])
    proc = write_proc(work / "proc", cgroups)
    with fake_kubernetes(tenants, gpu_uuids(path), work) as (kubeconfig, socket_path):
        agent = Agent(name, {
            "backend": "sim", "scenario": str(path), "poll_interval": 0.5, "proc_root": str(proc),
            "pod_resources_socket": str(socket_path), "pod_resources_interval": 1,
            "kubernetes_api": "on", "kubeconfig": str(kubeconfig), "idle_events": "off",
            "mode": "audit", "default_gpu_share": 20, "default_gpu_memory": "4Gi", "memory_term_after": 3,
            "journal_path": str(work / "journal.json"), "cgroup_root": str(work / "cgroup"),
            "nvml_timeout": 1, "idle_window": IDLE_WINDOW_S, "energy_interval": 0.5,
            # GPU 6's hung call never returns: the shutdown waits this long for it, then exits 3 (what
            # tests/test_shutdown.py checks); 10 s by default, spent by every module that starts this node
            "shutdown_timeout": 1,
            "policies": [{"match_kind": "systemd_service", "gpu_share": 10, "gpu_memory": "8Gi"},
                         {"match_namespace": "research", "gpu_share": 15},
                         {"match_namespace": "training", "match_pod": "reward-1", "exempt": True}],
            # an operator who trusts the pods' authors: their annotations override the defaults
            "pod_annotations": "any",
            **config,
        }, work)
        try:
            agent.wait_ready()
            yield agent
        finally:
            agent.stop()
