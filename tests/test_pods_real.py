"""End to end on this machine: real processes in real cgroups laid out exactly like kubelet's (systemd and
cgroupfs drivers; containerd, CRI-O, Docker), named by PID in a simulated scenario, with the kubelet's
allocations served by a real gRPC server; the exported series must carry the right pod labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cgroups import (
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export.exposition import generate_text

pytestmark = pytest.mark.integration

# (driver, qos, runtime, namespace, pod, container) per GPU: one exclusive pod on each of GPUs 0-3.
LAYOUTS = [
    ("systemd", "burstable", "containerd", "ml", "train-0", "trainer"),
    ("systemd", "guaranteed", "cri-o", "serving", "llm-0", "server"),
    ("systemd", "besteffort", "docker", "batch", "render-7", "worker"),
    ("cgroupfs", "burstable", "containerd", "research", "notebook-2", "jupyter"),
]


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def uuids(nvml: SimulatedNvml, count: int) -> list[str]:
    nvml.nvmlInit()
    return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]


async def test_real_cgroups_become_pod_labels(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> None:
    pods, processes = [], []
    for index, (driver, qos, runtime, namespace, pod, container) in enumerate(LAYOUTS):
        uid, cid = new_pod_uid(), new_container_id()
        proc = cgroup_sandbox.spawn(kubelet_container_path(driver, qos, uid, runtime, cid))
        processes.append({"pid": proc.pid, "name": container, "gpu": index, "memory": "2Gi", "sm_util": 40})
        pods.append((namespace, pod, container, uid, cid))
    service = cgroup_sandbox.spawn("system.slice/gpu-healthcheck.service")
    processes.append({"pid": service.pid, "name": "healthcheck", "gpu": 4, "memory": "256Mi", "sm_util": 1})
    scenario = tmp_path / "real.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "real-cgroups", "processes": processes,
                                        "gpus": [{"model": "H100-SXM5-80GB", "count": 5}]}))
    nvml = SimulatedNvml(load_scenario(scenario))
    gpu_ids = uuids(nvml, 5)
    with short_socket_dir() as directory:
        socket = directory / "kubelet.sock"
        served = [Pod(pod, namespace, [Container(container, [gpus(gpu_ids[i])])])
                  for i, (namespace, pod, container, _, _) in enumerate(pods)]
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(scenario), "pod_resources_socket": str(socket),
        })
        agent = Agent(config, nvml=nvml, backend="sim")
        try:
            async with PodResourcesServer(socket, pods=served):
                snap = await agent.poll_once()
        finally:
            await agent.aclose()
    body = generate_text(agent.registry).decode()
    by_pid = {p.pid: p.workload for g in snap.gpus for p in g.processes}
    for index, (namespace, pod, container, uid, cid) in enumerate(pods):
        workload = by_pid[processes[index]["pid"]]
        assert (workload.namespace, workload.name, workload.container) == (namespace, pod, container)
        assert workload.pod_uid == uid and workload.container_id == cid
        assert workload.qos == LAYOUTS[index][1]
        # where the enforcer would freeze it: the container's own cgroup in v2 and in the v1 freezer
        assert workload.cgroup_v2 is not None and workload.cgroup_v2.endswith((cid, f"{cid}.scope"))
        assert workload.cgroup_freezer == workload.cgroup_v2
        # dcgm-exporter's labels on the GPU's own series, for a GPU allocated to one container
        assert (f'DCGM_FI_DEV_FB_USED{{gpu="{index}",UUID="{gpu_ids[index]}"' in body)
        line = next(x for x in body.splitlines() if x.startswith(f'DCGM_FI_DEV_FB_USED{{gpu="{index}",'))
        assert f'container="{container}",namespace="{namespace}",pod="{pod}"}}' in line
        assert (f'gpuagent_pod_gpu_memory_used_bytes{{namespace="{namespace}",pod="{pod}",gpu="{index}",'
                in body)
    healthcheck = by_pid[service.pid]
    assert (healthcheck.kind, healthcheck.name) == ("systemd_service", "gpu-healthcheck.service")
    assert f'pid="{service.pid}",comm="sleep",kind="compute",workload_kind="systemd_service",' in body
