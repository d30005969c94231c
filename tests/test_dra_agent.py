"""DRA pods on a simulated node, through the whole agent: the kubelet's dynamic resources over real gRPC,
kubelet-shaped cgroup files, the driver's CDI specs in a directory, and (in one run) the driver's
ResourceSlices and the pods from the fake API server. A DRA pod must be attributed, labelled, accounted and
hinted exactly as a device-plugin pod on the same node is; a device nothing names is reported, never
guessed, and a malformed CDI spec is named while the agent keeps serving."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fake_apiserver import NODE, FakeApiServer, container_id, gpu_device, make_pod, make_slice, mig_device
from podresources_server import Claim, ClaimDevice, Container, Pod, PodResourcesServer, gpus, short_socket_dir
from test_export import ACCEPTED_LINT

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export.exposition import generate_text
from gpuagent.hints.score import parse_fit_request, score_node
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.views import allocation_view, to_jsonable

FAKE_PID = 4_200_000  # the simulator numbers processes without a real PID from here, in scenario order
SCENARIO = {
    "version": 1, "name": "dra",
    "gpus": [
        {"model": "H100-SXM5-80GB", "count": 3},  # 0: DRA exclusive; 1: one DRA claim shared by two pods;
        # 2: a device-plugin pod, for comparison; 3: MIG, instance 2 given to a DRA pod
        {"model": "H100-SXM5-80GB", "mig": {"instances": [{"profile": "3g.40gb", "id": 1},
                                                          {"profile": "3g.40gb", "id": 2}]}},
        {"model": "H100-SXM5-80GB"},  # 4: the pod whose DRA device nothing maps runs here
    ],
    "processes": [
        {"name": "trainer", "gpu": 0, "memory": "20Gi", "sm_util": 60},
        {"name": "infer-a", "gpu": 1, "memory": "4Gi", "sm_util": 20},
        {"name": "infer-b", "gpu": 1, "memory": "6Gi", "sm_util": 30},
        {"name": "legacy", "gpu": 2, "memory": "8Gi", "sm_util": 50},
        {"name": "notebook", "gpu": 3, "mig_instance": 2, "memory": "5Gi", "sm_util": 10},
        {"name": "lost", "gpu": 4, "memory": "1Gi", "sm_util": 5},
    ],
}
# (namespace, pod, container, pod UID) of each scenario process, in order
PODS = [("ml", "train-0", "main", "0a000000-0000-4000-8000-000000000001"),
        ("serving", "infer-a", "server", "0a000000-0000-4000-8000-000000000002"),
        ("serving", "infer-b", "server", "0a000000-0000-4000-8000-000000000003"),
        ("ml", "legacy-0", "main", "0a000000-0000-4000-8000-000000000004"),
        ("research", "nb-0", "lab", "0a000000-0000-4000-8000-000000000005"),
        ("ml", "lost-0", "main", "0a000000-0000-4000-8000-000000000006")]
CLAIM_UIDS = {"train": "1b000000-0000-4000-8000-00000000000a", "shared": "1b000000-0000-4000-8000-00000000000b",
              "nb": "1b000000-0000-4000-8000-00000000000c", "lost": "1b000000-0000-4000-8000-00000000000d"}
MIG_DEVICE = "gpu-3-mig-2-4-4"  # NVIDIA's canonical name: parent minor, GI profile id, placement start, size
DRIVER = "gpu.nvidia.com"


def claim_cdi(claim: str, device: str) -> str:
    return f"k8s.gpu.nvidia.com/claim={CLAIM_UIDS[claim]}-{device}"


def kubepods_line(uid: str, cid: str) -> str:
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{cid}.scope\n")


@dataclass
class Node:
    tmp: Path
    scenario: Path
    proc: Path
    cdi: Path
    uuids: list[str]
    mig_uuid: str

    def kubelet_pods(self) -> list[Pod]:
        """What the kubelet reports: four DRA pods, one device-plugin pod, one DRA device nothing names."""
        def dra(claim: str, name: str, device: str) -> Claim:
            return Claim(name, [ClaimDevice(DRIVER, NODE, device, [claim_cdi(claim, device)])])

        return [
            Pod("train-0", "ml", [Container("main", claims=[dra("train", "train-0-gpu-x7k2q", "gpu-0")])]),
            Pod("infer-a", "serving", [Container("server", claims=[dra("shared", "shared-gpu", "gpu-1")])]),
            Pod("infer-b", "serving", [Container("server", claims=[dra("shared", "shared-gpu", "gpu-1")])]),
            Pod("legacy-0", "ml", [Container("main", [gpus(self.uuids[2])])]),
            Pod("nb-0", "research", [Container("lab", claims=[dra("nb", "nb-0-mig-p2m9c", MIG_DEVICE)])]),
            Pod("lost-0", "ml", [Container("main", claims=[dra("lost", "lost-0-gpu-c4f8d", "gpu-7")])]),
        ]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    scenario = tmp_path / "dra.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(5)]
    mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(3), 1)
    assert nvml.nvmlDeviceGetGpuInstanceId(mig_handle) == 2
    mig_uuid = nvml.nvmlDeviceGetUUID(mig_handle)
    proc = tmp_path / "proc"
    for offset, (_, _, container, uid) in enumerate(PODS):
        (proc / str(FAKE_PID + offset)).mkdir(parents=True)
        (proc / str(FAKE_PID + offset) / "cgroup").write_text(kubepods_line(uid, container_id(uid, container)))
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu3/gi1/access 30\ngpu3/gi1/ci0/access 31\ngpu3/gi2/access 39\n"
        "gpu3/gi2/ci0/access 40\n")
    cdi = tmp_path / "var-run-cdi"
    cdi.mkdir()
    for claim, device, nodes in (("train", "gpu-0", ["/dev/nvidia0"]), ("shared", "gpu-1", ["/dev/nvidia1"]),
                                 ("nb", MIG_DEVICE, ["/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap39",
                                                     "/dev/nvidia-caps/nvidia-cap40"])):
        spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
                "devices": [{"name": f"{CLAIM_UIDS[claim]}-{device}",
                             "containerEdits": {"deviceNodes": [{"path": n} for n in nodes]}}],
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                                   "deviceNodes": [{"path": "/dev/nvidiactl"}]}}
        (cdi / f"k8s.gpu.nvidia.com-claim_{CLAIM_UIDS[claim]}.yaml").write_text(yaml.safe_dump(spec))
    return Node(tmp_path, scenario, proc, cdi, uuids, mig_uuid)


def make_agent(node: Node, socket: Path, **overrides: object) -> Agent:
    settings = {"backend": "sim", "scenario": str(node.scenario), "proc_root": str(node.proc),
                "pod_resources_socket": str(socket), "pod_resources_interval": 0.01, "poll_interval": 0.05,
                "kubernetes_api": "off", "idle_events": "off", "cdi_spec_dirs": str(node.cdi),
                "hostname": NODE, "network": False, **overrides}
    config = load_config(None, env={}, overrides=settings)
    return Agent(config, nvml=SimulatedNvml(load_scenario(node.scenario)), backend="sim")


async def polls(agent: Agent, count: int = 3) -> NodeSnapshot:
    snapshot = None
    for _ in range(count):
        snapshot = await agent.poll_once()
        await asyncio.sleep(0.02)
    assert snapshot is not None
    return snapshot


async def node_snapshot(node: Node) -> NodeSnapshot:
    """The node's snapshot after a few polls, its kubelet serving :meth:`Node.kubelet_pods` (no API server)."""
    with short_socket_dir() as directory:
        socket = directory / "kubelet.sock"
        agent = make_agent(node, socket)
        try:
            async with PodResourcesServer(socket, pods=node.kubelet_pods()):
                return await polls(agent)
        finally:
            await agent.aclose()


def workloads(snapshot: NodeSnapshot) -> dict[int, tuple]:
    return {p.pid: (p.workload.namespace, p.workload.name, p.workload.container, p.workload.names_from)
            for g in snapshot.gpus for p in g.processes}


def check_like_device_plugin_pods(node: Node, snapshot: NodeSnapshot, agent: Agent, names_from: str) -> str:
    """Attribution, labels, accounting and hints of the DRA pods, next to the device-plugin pod's."""
    gpu0, gpu1, gpu2, gpu3, _ = node.uuids
    by_pid = workloads(snapshot)
    assert by_pid[FAKE_PID] == ("ml", "train-0", "main", names_from)
    assert by_pid[FAKE_PID + 3] == ("ml", "legacy-0", "main", names_from)  # the device plugin's pod
    assert by_pid[FAKE_PID + 4] == ("research", "nb-0", "lab", names_from)
    allocated = {(p.namespace, p.name): p.allocated_gpus for p in snapshot.pods if p.allocated_gpus}
    assert allocated == {("ml", "train-0"): (gpu0,), ("serving", "infer-a"): (gpu1,),
                         ("serving", "infer-b"): (gpu1,), ("ml", "legacy-0"): (gpu2,),
                         ("research", "nb-0"): (gpu3,)}
    containers = {(p.name, c.name): c.allocated_devices for p in snapshot.pods for c in p.containers}
    assert containers[("train-0", "main")] == (gpu0,) and containers[("nb-0", "lab")] == (node.mig_uuid,)
    assert {containers[("infer-a", "server")], containers[("infer-b", "server")]} == {(f"{gpu1}::0",),
                                                                                     (f"{gpu1}::1",)}
    assert all(not p.unallocated_use for p in snapshot.pods if p.names_from != "cgroup" and p.name != "lost-0")

    body = generate_text(agent.registry).decode()
    # dcgm labels: the exclusive DRA GPU and MIG instance carry their pod, as the device plugin's GPU does
    for index, pod, container, extra in ((0, "train-0", "main", ""), (2, "legacy-0", "main", ""),
                                         (3, "nb-0", "lab", 'GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",')):
        line = next(line for line in body.splitlines()
                    if line.startswith(f'DCGM_FI_DEV_FB_USED{{gpu="{index}"') and (extra in line))
        assert f'container="{container}"' in line and f'pod="{pod}"' in line, line
    shared = next(line for line in body.splitlines() if line.startswith('DCGM_FI_DEV_FB_USED{gpu="1"'))
    assert 'pod="' not in shared  # shared by two claims holders: no single owner, as with replicas

    # accounting: a DRA GPU is a whole GPU, a shared one split by holders, a MIG device its slice
    assert snapshot.accounting is not None
    held = {(u.name, u.gpu_index, u.gpu_instance_id): u.allocated_gpus for u in snapshot.accounting.usage
            if u.level == "pod"}
    assert held[("train-0", 0, None)] == 1.0 == held[("legacy-0", 2, None)]
    assert held[("infer-a", 1, None)] == 0.5 == held[("infer-b", 1, None)]
    assert held[("nb-0", 3, 2)] == pytest.approx(3 / 7)

    # hints: the DRA GPUs are taken, with the same sharing modes a device plugin's allocation gives
    assert snapshot.hints is not None
    modes = {g.index: g.sharing_mode for g in snapshot.hints.gpus}
    assert modes == {0: "exclusive", 1: "time_sliced", 2: "exclusive", 3: "mig", 4: "time_sliced"}
    tenants = {g.index: sorted(t.name for t in g.tenants if t.allocated) for g in snapshot.hints.gpus}
    assert tenants[0] == ["ml/train-0"] and tenants[1] == ["serving/infer-a", "serving/infer-b"]
    assert snapshot.hints.free_gpu_count == 0
    whole = score_node(snapshot.hints, parse_fit_request({"gpus": 1, "exclusive": True}), now=snapshot.taken_at_unix)
    assert not whole.fits  # every whole GPU is held: by DRA claims or the device plugin
    mig = score_node(snapshot.hints, parse_fit_request({"gpus": 1, "mig_profile": "3g.40gb"}),
                     now=snapshot.taken_at_unix)
    assert mig.fits  # GPU instance 1 of GPU 3 is idle; instance 2 is the DRA pod's
    return body


async def test_dra_pods_without_the_api_server(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuagent.pods.dra.resolver")
    (node.cdi / "broken.json").write_text('{"kind": "k8s.gpu.nvidia.com/claim", "devices": ')
    with short_socket_dir() as directory:
        socket = directory / "kubelet.sock"
        agent = make_agent(node, socket)
        try:
            async with PodResourcesServer(socket, pods=node.kubelet_pods()):
                snapshot = await polls(agent)
                body = check_like_device_plugin_pods(node, snapshot, agent, "pod_resources")
                sources = {s.name: s for s in snapshot.sources}
                assert sources["pod_resources"].ok
                assert "dra_resource_slices" not in sources  # no API server: never asked
                mapped = {d.device: d for d in snapshot.dra}
                assert {d.mapped_by for n, d in mapped.items() if n != "gpu-7"} == {"cdi"}
                assert mapped[MIG_DEVICE].mig_uuid == node.mig_uuid and mapped[MIG_DEVICE].gpu_uuid == node.uuids[3]
                # the device nothing names: reported, never guessed, and the rest is served
                lost = mapped["gpu-7"]
                assert lost.mapped_by is None and lost.device_id is None and not lost.gpu_uuid
                assert lost.problem.startswith("no ResourceSlices (the API server is not used, or not listed yet)"
                                               f"; CDI device {claim_cdi('lost', 'gpu-7')} is in no spec under ")
                assert not sources["dra"].ok
                assert sources["dra"].error.startswith("1 of 5 DRA devices not mapped to a GPU: ml/lost-0 claim "
                                                       "lost-0-gpu-c4f8d device gpu.nvidia.com/gpu-node-1/gpu-7: ")
                assert not sources["cdi"].ok and sources["cdi"].error.startswith(f"{node.cdi}/broken.json: not JSON")
                assert 'gpuagent_pod_dra_unmapped_devices{namespace="ml",pod="lost-0"} 1.0' in body
                assert 'gpuagent_pod_dra_unmapped_devices{namespace="ml",pod="train-0"} 0.0' in body
                assert ('gpuagent_pod_dra_device_info{namespace="ml",pod="train-0",container="main",'
                        'claim="train-0-gpu-x7k2q",driver="gpu.nvidia.com",pool="gpu-node-1",device="gpu-0",'
                        f'mapped_by="cdi",gpu="0",UUID="{node.uuids[0]}",Hostname="{NODE}"}} 1.0') in body
                assert 'gpuagent_source_success{source="dra"} 0.0' in body
                if shutil.which("promtool"):  # the new families lint clean
                    lint = subprocess.run(["promtool", "check", "metrics"], input=body.encode(),
                                          capture_output=True, timeout=30, check=False)
                    problems = [p for p in (lint.stdout + lint.stderr).decode().splitlines()
                                if p.strip() and not p.endswith(ACCEPTED_LINT)]
                    assert lint.returncode in (0, 3) and not problems, problems
                assert 'gpuagent_source_success{source="cdi"} 0.0' in body
                view = allocation_view(snapshot)
                assert view["pods"]["ml/train-0"]["claims"] == {"train-0-gpu-x7k2q": [{
                    "container": "main", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
                    "uuid": node.uuids[0], "mapped_by": "cdi"}]}
                assert to_jsonable(snapshot)["dra"][0]["claim"] == "train-0-gpu-x7k2q"
                unmapped_logs = [r.getMessage() for r in caplog.records if "cannot be mapped" in r.getMessage()]
                assert len(unmapped_logs) == 1 and "ml/lost-0 claim lost-0-gpu-c4f8d" in unmapped_logs[0]

                # The broken spec is fixed and the lost device's spec appears: mapped on the next read.
                (node.cdi / "broken.json").unlink()
                (node.cdi / "lost.yaml").write_text(yaml.safe_dump({
                    "kind": "k8s.gpu.nvidia.com/claim", "devices": [{
                        "name": f"{CLAIM_UIDS['lost']}-gpu-7", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia7"}]}}]}))
                snapshot = await polls(agent, 2)
                sources = {s.name: s for s in snapshot.sources}
                assert sources["cdi"].ok and not sources["dra"].ok  # /dev/nvidia7: no such GPU here
                assert next(d for d in snapshot.dra if d.device == "gpu-7").problem.endswith(
                    "gives /dev/nvidia7, but no GPU here has that minor number")
                assert len([r for r in caplog.records if "cannot be mapped" in r.getMessage()]) == 2
        finally:
            await agent.aclose()


async def test_dra_pods_with_the_api_server(node: Node) -> None:
    """Names from the API server, devices from the driver's ResourceSlices (no CDI directory at all)."""
    async with FakeApiServer() as api:
        for namespace, name, container, uid in PODS:
            api.add_pod(make_pod(name, namespace=namespace, uid=uid, containers=(container,), gpus=0))
        gpu3 = node.uuids[3]
        api.add_slice(make_slice(NODE, [gpu_device(f"gpu-{i}", u) for i, u in enumerate(node.uuids[:4])]
                                 + [mig_device(MIG_DEVICE, node.mig_uuid, gpu3, "3g.40gb")]))
        api.add_slice(make_slice(NODE, [{"name": "nic-0", "attributes": {}}], driver="dra.net"))
        kubeconfig = api.write_kubeconfig(node.tmp / "kubeconfig")
        with short_socket_dir() as directory:
            socket = directory / "kubelet.sock"
            agent = make_agent(node, socket, kubernetes_api="on", kubeconfig=str(kubeconfig), cdi_spec_dirs="none")
            tasks = [asyncio.create_task(agent.pods.metadata.run())]
            slices = agent.pods.dra.slices
            tasks.append(asyncio.create_task(slices.run()))
            try:
                async with PodResourcesServer(socket, pods=node.kubelet_pods()):
                    await agent.poll_once()  # the kubelet reports DRA devices: the slice watch starts
                    for _ in range(200):
                        if slices.synced and agent.pods.metadata.synced:
                            break
                        await asyncio.sleep(0.01)
                    snapshot = await polls(agent)
                    check_like_device_plugin_pods(node, snapshot, agent, "api_server")
                    sources = {s.name: s for s in snapshot.sources}
                    assert sources["dra_resource_slices"].ok and sources["api_server"].ok
                    assert "cdi" not in sources  # no spec directory configured
                    mapped = {d.device: d for d in snapshot.dra}
                    assert {d.mapped_by for n, d in mapped.items() if n != "gpu-7"} == {"resource_slice"}
                    assert mapped["gpu-7"].problem == ("not in this node's ResourceSlices; no CDI spec "
                                                      "directory is configured")
                    # both watches share one client: one configuration, one connection pool
                    assert {r.path for r in api.lists} == {"/api/v1/pods", "/apis/resource.k8s.io/v1/resourceslices"}
                    # lost-0 runs on GPU 4 and its DRA device is unmapped: it may be GPU 4, so not flagged
                    assert workloads(snapshot)[FAKE_PID + 5] == ("ml", "lost-0", "main", "api_server")
                    lost = next(p for p in snapshot.pods if p.name == "lost-0")
                    assert lost.unallocated_use == (node.uuids[4],)
                    body = generate_text(agent.registry).decode()
                    assert "gpuagent_pod_gpu_unallocated_use{" not in body
                    by_pid = workloads(snapshot)  # the API server tells the two sharers apart
                    assert by_pid[FAKE_PID + 1][:2] == ("serving", "infer-a")
                    assert by_pid[FAKE_PID + 2][:2] == ("serving", "infer-b")
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await agent.aclose()


async def test_no_dra_pods_no_slice_requests(node: Node) -> None:
    """A node whose pods use only the device plugin never asks the API server for ResourceSlices."""
    async with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(node.tmp / "kubeconfig")
        with short_socket_dir() as directory:
            socket = directory / "kubelet.sock"
            agent = make_agent(node, socket, kubernetes_api="on", kubeconfig=str(kubeconfig))
            task = asyncio.create_task(agent.pods.dra.slices.run())
            try:
                legacy = [Pod("legacy-0", "ml", [Container("main", [gpus(node.uuids[2])])])]
                async with PodResourcesServer(socket, pods=legacy):
                    snapshot = await polls(agent)
                assert snapshot.dra == () and not any(r.path.endswith("resourceslices") for r in api.requests)
                assert not {"dra", "cdi", "dra_resource_slices"} & {s.name for s in snapshot.sources}
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await agent.aclose()


async def test_a_bug_in_the_dra_mapping_costs_only_the_dra_devices(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gpuagent.pods.dra.resolver as resolver

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(resolver, "map_devices", broken)
    snapshot = await node_snapshot(node)
    assert workloads(snapshot)[FAKE_PID + 3] == ("ml", "legacy-0", "main", "pod_resources")  # device plugin's
    assert snapshot.dra == ()
    status = {s.name: s for s in snapshot.sources}["dra"]
    assert not status.ok and status.error == "mapping the DRA devices failed: KeyError('surprise')"
    assert len([r for r in caplog.records if "mapping the DRA devices failed" in r.getMessage()]) == 1
