"""The pods source inside the real agent: simulated GPUs, a /proc tree of kubelet-shaped cgroup files, and
the kubelet's pod-resources API served by a real gRPC server on a unix socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export.exposition import generate_text
from gpuagent.snapshot.views import allocation_view

FAKE_PID = 4_200_000  # the simulator numbers processes without a real PID from here, in scenario order
UID_A = "0f7c5d4e-1a2b-4c3d-8e9f-0123456789ab"
UID_B = "1f7c5d4e-1a2b-4c3d-8e9f-0123456789ab"
UID_C = "2f7c5d4e-1a2b-4c3d-8e9f-0123456789ab"
SCENARIO = {
    "version": 1,
    "name": "pods",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],
    "processes": [
        {"name": "trainer", "gpu": 0, "memory": "20Gi", "sm_util": 60},  # pod a, exclusive GPU 0
        {"name": "infer-b", "gpu": 1, "memory": "4Gi", "sm_util": 20},  # pod b, GPU 1 shared (replica 0)
        {"name": "infer-c", "gpu": 1, "memory": "6Gi", "sm_util": 30},  # pod c, GPU 1 shared (replica 1)
        {"name": "node-exporter-ish", "gpu": 1, "memory": "1Gi", "sm_util": 0},  # a systemd service
    ],
}


def kubepods_line(uid: str, container_id: str, qos: str = "burstable") -> str:
    slice_uid = uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id}.scope\n")


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    lines = [
        kubepods_line(UID_A, "a" * 64),
        kubepods_line(UID_B, "b" * 64),
        kubepods_line(UID_C, "c" * 64),
        "0::/system.slice/gpu-burn.service\n",
    ]
    for offset, line in enumerate(lines):
        (root / str(FAKE_PID + offset)).mkdir(parents=True)
        (root / str(FAKE_PID + offset) / "cgroup").write_text(line)
    return root


def make_agent(tmp_path: Path, proc_root: Path, socket: Path) -> tuple[Agent, SimulatedNvml]:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(path), "proc_root": str(proc_root),
        "pod_resources_socket": str(socket), "pod_resources_interval": 0.01, "poll_interval": 0.05,
    })
    nvml = SimulatedNvml(load_scenario(path))
    return Agent(config, nvml=nvml, backend="sim"), nvml


def uuids(nvml: SimulatedNvml) -> list[str]:
    nvml.nvmlInit()
    return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]


async def test_attribution_with_the_kubelets_allocations(tmp_path: Path, proc_root: Path) -> None:
    with short_socket_dir() as directory:
        socket = directory / "kubelet.sock"
        agent, nvml = make_agent(tmp_path, proc_root, socket)
        gpu0, gpu1 = uuids(nvml)
        pods = [
            Pod("trainer-0", "ml", [Container("main", [gpus(gpu0)])]),
            Pod("infer-b", "serving", [Container("server", [gpus(f"{gpu1}::0", resource="nvidia.com/gpu")])]),
            Pod("infer-c", "serving", [Container("server", [gpus(f"{gpu1}::1", resource="nvidia.com/gpu")])]),
            Pod("web", "default", [Container("nginx", [])]),
        ]
        try:
            async with PodResourcesServer(socket, pods=pods, allocatable=[gpus(gpu0, f"{gpu1}::0")]) as server:
                snap = await agent.poll_once()
                sources = {s.name: s for s in snap.sources}
                assert sources["pod_resources"].ok and sources["cgroups"].ok
                by_pid = {p.pid: p.workload for g in snap.gpus for p in g.processes}
                trainer = by_pid[FAKE_PID]
                assert (trainer.namespace, trainer.name, trainer.container) == ("ml", "trainer-0", "main")
                assert trainer.pod_uid == UID_A and trainer.names_from == "pod_resources"
                assert by_pid[FAKE_PID + 3].kind == "systemd_service"
                assert by_pid[FAKE_PID + 3].name == "gpu-burn.service"
                # GPU 1 is time-sliced between b and c, and nothing else tells them apart: UIDs only.
                assert {by_pid[FAKE_PID + 1].name, by_pid[FAKE_PID + 2].name} == {UID_B, UID_C}
                allocated = {(p.namespace, p.name): p.allocated_gpus for p in snap.pods if p.allocated_gpus}
                assert allocated == {("ml", "trainer-0"): (gpu0,), ("serving", "infer-b"): (gpu1,),
                                     ("serving", "infer-c"): (gpu1,)}
                view = allocation_view(snap)
                assert view["pods"]["ml/trainer-0"]["allocated_gpus"] == [gpu0] == view["pods"]["ml/trainer-0"]["used_gpus"]
                assert view["gpus"][gpu1]["allocated_to"] == ["serving/infer-b", "serving/infer-c"]
                assert sorted(view["gpus"][gpu1]["used_by"]) == sorted([UID_B, UID_C])
                assert view["pods"][UID_B]["unallocated_use"] == [gpu1]  # unnamed: cannot tell it is b
                body = generate_text(agent.registry).decode()
                assert 'container="main",namespace="ml",pod="trainer-0"} ' in body
                assert f'gpuagent_gpu_tenants{{gpu="1",UUID="{gpu1}"' in body
                assert 'gpuagent_source_success{source="pod_resources"} 1.0' in body

                # The kubelet goes away: attribution keeps the last allocations and says the source failed.
                await server.stop()
                await asyncio.sleep(0.02)
                snap = await agent.poll_once()
                assert not {s.name: s for s in snap.sources}["pod_resources"].ok
                assert {p.pid: p.workload for g in snap.gpus for p in g.processes}[FAKE_PID].name == "trainer-0"
                assert 'gpuagent_source_success{source="pod_resources"} 0.0' in generate_text(agent.registry).decode()

                # It comes back with a changed allocation: picked up on the next read.
                server.set_pods([Pod("trainer-1", "ml", [Container("main", [gpus(gpu0)])])])
                await server.start()
                await asyncio.sleep(0.02)
                snap = await agent.poll_once()
                assert {s.name: s for s in snap.sources}["pod_resources"].ok
                assert {p.pid: p.workload for g in snap.gpus for p in g.processes}[FAKE_PID].name == "trainer-1"
        finally:
            await agent.aclose()


async def test_no_kubelet_means_cgroups_only(tmp_path: Path, proc_root: Path) -> None:
    agent, _ = make_agent(tmp_path, proc_root, tmp_path / "missing" / "kubelet.sock")
    try:
        snap = await agent.poll_once()
    finally:
        await agent.aclose()
    status = {s.name: s for s in snap.sources}["pod_resources"]  # configured explicitly: reported as failing
    assert not status.ok and "kubelet.sock" in status.error
    trainer = {p.pid: p.workload for g in snap.gpus for p in g.processes}[FAKE_PID]
    assert trainer.name == UID_A and trainer.names_from == "cgroup" and trainer.qos == "burstable"
    body = generate_text(agent.registry).decode()
    assert f'pod="{UID_A}"' in body and 'gpuagent_source_success{source="pod_resources"} 0.0' in body


async def test_the_api_server_names_pods_the_kubelet_alone_cannot(tmp_path: Path) -> None:
    """Two pods time-sharing GPU 1 are told apart by the API server (UID -> name, container ID -> name),
    and their gpuagent.io annotations reach the snapshot for the enforcement policy."""
    from fake_apiserver import NODE, FakeApiServer, container_id, make_pod

    b = make_pod("infer-b", namespace="serving", uid=UID_B, containers=("server",),
                 annotations={"gpuagent.io/gpu-share": "30", "team": "search"})
    c = make_pod("infer-c", namespace="serving", uid=UID_C, containers=("server",))
    root = tmp_path / "proc"
    for offset, (uid, container) in enumerate([(UID_A, "a" * 64), (UID_B, container_id(UID_B, "server")),
                                               (UID_C, container_id(UID_C, "server"))]):
        (root / str(FAKE_PID + offset)).mkdir(parents=True)
        (root / str(FAKE_PID + offset) / "cgroup").write_text(kubepods_line(uid, container))
    async with FakeApiServer() as api:
        api.add_pod(b)
        api.add_pod(c)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        path = tmp_path / "pods.yaml"
        path.write_text(yaml.safe_dump(SCENARIO))
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(path), "proc_root": str(root), "pod_resources_socket": None,
            "kubernetes_api": "on", "kubeconfig": str(kubeconfig), "hostname": NODE,
        })
        agent = Agent(config, nvml=SimulatedNvml(load_scenario(path)), backend="sim")
        metadata = agent.pods.metadata
        assert metadata is not None
        watcher = asyncio.create_task(metadata.run())
        try:
            for _ in range(200):
                if metadata.synced:
                    break
                await asyncio.sleep(0.02)
            snap = await agent.poll_once()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await agent.aclose()
    assert {s.name: s.ok for s in snap.sources}["api_server"]
    by_pid = {p.pid: p.workload for g in snap.gpus for p in g.processes}
    for pid, name in ((FAKE_PID + 1, "infer-b"), (FAKE_PID + 2, "infer-c")):
        workload = by_pid[pid]
        assert (workload.namespace, workload.name, workload.container, workload.names_from) == (
            "serving", name, "server", "api_server")
    assert by_pid[FAKE_PID].name == UID_A  # not on this node's API view: its UID, as before
    infer_b = next(p for p in snap.pods if p.name == "infer-b")
    assert infer_b.annotations == {"gpuagent.io/gpu-share": "30"} and infer_b.uid == UID_B
    body = generate_text(agent.registry).decode()
    assert 'gpuagent_pod_gpu_memory_used_bytes{namespace="serving",pod="infer-c",gpu="1"' in body


async def test_the_kubelet_is_read_every_interval_of_the_agents_clock(tmp_path: Path, proc_root: Path) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    now = [100.0]
    with short_socket_dir() as directory:
        socket = directory / "kubelet.sock"
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(path), "proc_root": str(proc_root),
            "pod_resources_socket": str(socket), "pod_resources_interval": 5.0,
        })
        agent = Agent(config, nvml=SimulatedNvml(load_scenario(path)), backend="sim", monotonic=lambda: now[0])
        try:
            async with PodResourcesServer(socket) as server:
                reads = []
                for _ in range(11):  # 10 s of the agent's clock, polled every second, however fast here
                    await agent.poll_once()
                    reads.append(server.calls["List"])
                    now[0] += 1.0
                assert reads == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3]
        finally:
            await agent.aclose()


async def test_environments_are_read_once_and_an_unknown_one_a_few_times_more(tmp_path: Path) -> None:
    """A pod process's environment is read once; one that reads as unknown (a process that just started,
    or one the agent may not read) is read again the next polls, a few of them, not every poll forever."""
    from gpuagent.pods.cgroup import CgroupReader
    from gpuagent.pods.environ import EnvironReader
    from gpuagent.pods.source import ENVIRON_RETRIES, PodsSource
    from gpuagent.snapshot.gpu import GpuInfo, GpuSample
    from gpuagent.snapshot.processes import ProcessSample

    root = tmp_path / "proc"
    for pid, uid in ((101, UID_A), (102, UID_B), (103, None)):
        (root / str(pid)).mkdir(parents=True)
        line = kubepods_line(uid, f"{pid:064x}") if uid else "0::/system.slice/ollama.service\n"
        (root / str(pid) / "cgroup").write_text(line)
    (root / "101" / "environ").write_bytes(b"HOSTNAME=trainer-0\0")
    (root / "102" / "environ").mkdir()  # unreadable (EISDIR): unknown

    reads: list[int] = []

    class Counting(EnvironReader):
        def read(self, pid: int):  # type: ignore[override]
            reads.append(pid)
            return super().read(pid)

    source = PodsSource(cgroups=CgroupReader(root), environs=Counting(root), identity_ttl=3600.0)
    info = GpuInfo(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", serial=None, pci_bus_id="0:0",
                   minor_number=0, memory_total_bytes=80 << 30, power_limit_watts=700.0, mig_enabled=False)
    gpu = GpuSample(info=info, sampled_at_unix=0.0, processes=tuple(
        ProcessSample(pid, "p", "compute", 1 << 30, 1.0, 1.0) for pid in (101, 102, 103)))
    for _ in range(ENVIRON_RETRIES + 3):
        await source.attribute([gpu])
    assert reads.count(101) == 1  # once
    assert reads.count(102) == ENVIRON_RETRIES  # unknown: a few times, then no more
    assert 103 not in reads  # not a pod's process, not an MPS client: never read
    (root / "102" / "environ").rmdir()
    (root / "102" / "environ").write_bytes(b"HOSTNAME=infer-b\0")
    gone = GpuSample(info=info, sampled_at_unix=0.0, processes=gpu.processes[:1])
    await source.attribute([gone])  # 102 left the GPU: forgotten, read afresh if it comes back
    await source.attribute([gpu])
    assert reads.count(102) == ENVIRON_RETRIES + 1
