"""A simulated MPS node through the real agent: ``examples/scenarios/mps-inference.yaml`` (MPS servers, clients
listed by the MPS call, their limits in their simulated environments), a /proc tree of kubelet-shaped cgroup
files, and the kubelet's pod-resources API (MPS replicas ``GPU-…::n``) on a real gRPC server. No API
server: every client is named from the allocations, its HOSTNAME telling apart the pods sharing a GPU.

Checked: each client attributed to its pod with its limits (``/v1/state``, metrics), the MPS servers shown
as infrastructure (kind ``mps_server``, no pod's use, no tenant), hints promising the clients' thread
shares, accounting holding the thread share instead of 1/N.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from simclock import FakeClock
from test_pods_source import kubepods_line

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export.exposition import generate_text
from gpuagent.snapshot.processes import MPS_SERVER, MpsLimits
from gpuagent.snapshot.views import allocation_view, to_jsonable

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "mps-inference.yaml"
FAKE = 4_200_000
GIB = 1 << 30
# PID offset in the scenario -> (pod, namespace, GPU index, replica or MIG)
CLIENTS = {
    1: ("llm-chat-7d9f8-abcde", "serving", 0, 0),
    2: ("embedder-5c6b4-fghij", "serving", 0, 1),
    3: ("reranker-0", "serving", 0, 2),
    5: ("asr-1", "speech", 1, 0),
    6: ("tts-1", "speech", 1, 1),
    9: ("ocr-0", "vision", 3, "mig"),
}
SERVERS = (0, 4, 8)
DAEMON_UID = "0d0d0d0d-1111-4222-8333-444455556666"


def uid(offset: int) -> str:
    return f"{offset:08x}-aaaa-4bbb-8ccc-dddddddddddd"


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """Cgroup files only: the clients' environments come from the simulator (``process_environ``), as
    /proc/PID/environ would give them for real PIDs."""
    root = tmp_path / "proc"
    for offset in [*CLIENTS, 7, *SERVERS]:
        owner = DAEMON_UID if offset in SERVERS else uid(offset)
        (root / str(FAKE + offset)).mkdir(parents=True)
        (root / str(FAKE + offset) / "cgroup").write_text(kubepods_line(owner, f"{offset:064x}"))
    return root


async def test_every_mps_client_is_its_pods_with_its_limits(tmp_path: Path, proc_root: Path) -> None:
    nvml = SimulatedNvml(load_scenario(SCENARIO))
    nvml.nvmlInit()
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]
    ocr_mig = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(3), 1))
    nvml.nvmlShutdown()
    pods = []
    for name, namespace, index, replica in CLIENTS.values():
        device = f"{ocr_mig}::0" if replica == "mig" else f"{uuids[index]}::{replica}"
        resource = "nvidia.com/mig-3g.40gb" if replica == "mig" else "nvidia.com/gpu"
        pods.append(Pod(name, namespace, [Container("main", [gpus(device, resource=resource)])]))
    pods.append(Pod("finetune-0", "training", [Container("main", [gpus(uuids[2])])]))
    pods.append(Pod("nvidia-device-plugin-mps-control-daemon-x2x4f", "kube-system", [Container("mps", [])]))
    with short_socket_dir() as directory:
        sock = directory / "kubelet.sock"
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(SCENARIO), "proc_root": str(proc_root),
            "pod_resources_socket": str(sock), "kubernetes_api": "off", "network": "false",
            "idle_events": "off", "hostname": "hgx-mps-01",
        })
        clock = FakeClock(start=100.0)  # a second between polls: a fresh utilization sample each
        nvml = SimulatedNvml(load_scenario(SCENARIO), clock=clock)
        clock.t = clock.start
        agent = Agent(config, nvml=nvml, backend="sim", clock=clock, monotonic=clock)
        try:
            async with PodResourcesServer(sock, pods=pods, allocatable=[gpus(*uuids)]):
                snaps = []
                # three polls at least; more while a client is unattributed: on a loaded machine the first
                # List can pass its deadline, and the next comes a pod-resources interval later (fake seconds)
                while len(snaps) < 3 or (len(snaps) < 60 and not all(
                        p.workload is not None and p.workload.names_from == "pod_resources"
                        for g in snaps[-1].gpus for p in g.processes if p.pid - FAKE in CLIENTS)):
                    snaps.append(await agent.poll_once())
                    clock.advance(1.0)
        finally:
            await agent.aclose()
    snap = snaps[-1]
    processes = {p.pid: p for g in snap.gpus for p in g.processes}

    for offset, (name, namespace, _, _) in CLIENTS.items():
        w = processes[FAKE + offset].workload
        assert (w.namespace, w.name, w.container, w.names_from) == (namespace, name, "main", "pod_resources")
    assert processes[FAKE + 1].mps == MpsLimits(30.0, 28 * GIB)
    assert processes[FAKE + 2].mps == MpsLimits(20.0, None)
    assert processes[FAKE + 3].mps == MpsLimits(None, 16 * GIB) and processes[FAKE + 3].used_memory_bytes == 16 * GIB
    assert processes[FAKE + 5].mps == MpsLimits(None, None)  # set in no environment: unlimited by it
    assert processes[FAKE + 9].mps == MpsLimits(50.0, 12 * GIB) and processes[FAKE + 9].gpu_instance_id == 2
    for offset in SERVERS:
        server = processes[FAKE + offset]
        assert server.kind == MPS_SERVER and server.workload.pod_uid == DAEMON_UID
    assert all(p.uid != DAEMON_UID for p in snap.pods)  # the daemon's pod uses no GPU of its own

    state: dict[str, Any] = {**to_jsonable(snap), "allocation": allocation_view(snap)}
    chat = next(p for g in state["gpus"] for p in g["processes"] if p["pid"] == FAKE + 1)
    assert chat["kind"] == "mps_client"
    assert chat["mps"] == {"active_thread_percent": 30.0, "pinned_memory_limit_bytes": 28 * GIB}
    assert state["allocation"]["gpus"][uuids[0]]["used_by"] == [
        "serving/embedder-5c6b4-fghij", "serving/llm-chat-7d9f8-abcde", "serving/reranker-0"]
    assert state["allocation"]["pods"]["serving/llm-chat-7d9f8-abcde"]["unallocated_use"] == []

    body = generate_text(agent.registry).decode()
    g0 = f'gpu="0",UUID="{uuids[0]}",Hostname="hgx-mps-01"'
    assert f'gpuagent_pod_gpu_mps_active_thread_ratio{{namespace="serving",pod="llm-chat-7d9f8-abcde",{g0}}} 0.3' in body
    assert f'gpuagent_pod_gpu_mps_memory_limit_bytes{{namespace="serving",pod="reranker-0",{g0}}} 1.7179869184e+10' in body
    assert f'gpuagent_gpu_tenants{{{g0}}} 3.0' in body
    assert 'kind="mps_server"' in body and f'pod="{DAEMON_UID}"' in body  # shown, as the daemon's pod

    hints = snap.hints
    assert hints is not None
    h0 = hints.gpus[0]
    assert h0.sharing_mode == "mps" and len(h0.tenants) == 3
    # 1 - (0.30 and 0.20 promised by MPS + reranker's 15 % now, which MPS does not cap)
    assert h0.schedulable_share_ratio == pytest.approx(0.35, abs=1e-6)
    assert next(t for t in h0.tenants if t.name == "serving/reranker-0").memory_limit_bytes == 16 * GIB

    usage = {(u.name, u.level): u for u in snap.accounting.usage if u.gpu_index == 0}
    assert usage[("llm-chat-7d9f8-abcde", "pod")].allocated_gpus == pytest.approx(0.30)
    assert usage[("embedder-5c6b4-fghij", "pod")].allocated_gpus == pytest.approx(0.20)
    assert usage[("reranker-0", "pod")].allocated_gpus == pytest.approx(1 / 3)  # no thread limit: its replica
    assert not any(u.namespace == "kube-system" for u in snap.accounting.usage)
