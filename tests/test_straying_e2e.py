"""The issue's case end to end: a pod allocated GPU 1 whose process also runs on GPU 7, which nobody was
allocated (privileged, or NVIDIA_VISIBLE_DEVICES=all), served by the real agent over HTTP.

The node: eight simulated H100s; a /proc tree of kubelet-shaped cgroup files and environments (what the
container runtime and the device plugin give a pod's processes); the kubelet's pod-resources API served by
a real gRPC server on a unix socket; with and without the API server (a fake one speaking its JSON). Also
on the node: an unallocated pod running on the GPU of an idle pod, which must not take that pod's name.

Checked: every series and ``/v1/state`` name the straying pod (never its UID), its use of GPU 7 is
``gpuagent_pod_gpu_unallocated_use`` and the ``GpuPodUnallocatedUse`` alert fires on the agent's own
series (``promtool test rules``), and the interloper keeps its UID while the idle pod shows idle.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from fake_apiserver import NODE, FakeApiServer, container_id, make_pod
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from ports import free_port
from test_pods_source import kubepods_line

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
FAKE_PID = 4_200_000
UID_TRAINER = "7c0a1e2f-3b4c-4d5e-8f90-a1b2c3d4e5f6"
UID_SQUATTER = "8d1b2f3a-4c5d-4e6f-9a01-b2c3d4e5f6a7"
SCENARIO = {
    "version": 1,
    "name": "straying",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 8}],
    "processes": [
        {"name": "trainer", "gpu": 1, "memory": "30Gi", "sm_util": 70},  # FAKE_PID: trainer-0 on its GPU
        {"name": "trainer", "gpu": 7, "memory": "10Gi", "sm_util": 40},  # FAKE_PID + 1: the same pod, GPU 7
        {"name": "squatter", "gpu": 3, "memory": "5Gi", "sm_util": 20},  # FAKE_PID + 2: on idle owner's GPU 3
    ],
}


def environ(**variables: str) -> bytes:
    base = {"PATH": "/usr/local/nvidia/bin:/usr/bin", "NCCL_DEBUG": "WARN"}
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in {**base, **variables}.items())


def proc_tree(root: Path, uuids: list[str]) -> None:
    trainer_ctr, squatter_ctr = container_id(UID_TRAINER, "main"), container_id(UID_SQUATTER, "main")
    # The trainer is privileged: the device plugin gave it GPU 1 (NVIDIA_VISIBLE_DEVICES), it sees all.
    trainer_env = environ(HOSTNAME="trainer-0", NVIDIA_VISIBLE_DEVICES=uuids[1])
    # The squatter requested no GPU; its CUDA image sets NVIDIA_VISIBLE_DEVICES=all.
    squatter_env = environ(HOSTNAME="squatter-0", NVIDIA_VISIBLE_DEVICES="all")
    for offset, (uid, ctr, env) in enumerate([(UID_TRAINER, trainer_ctr, trainer_env),
                                              (UID_TRAINER, trainer_ctr, trainer_env),
                                              (UID_SQUATTER, squatter_ctr, squatter_env)]):
        directory = root / str(FAKE_PID + offset)
        directory.mkdir(parents=True)
        (directory / "cgroup").write_text(kubepods_line(uid, ctr))
        (directory / "environ").write_bytes(env)


async def serve_and_read(agent: Agent, port: int) -> tuple[str, dict[str, Any]]:
    """Run the agent's server until two polls have joined the allocations; /metrics and /v1/state."""
    stop = asyncio.Event()
    serving = asyncio.create_task(agent.serve(stop))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(400):
                await asyncio.sleep(0.05)
                snap = agent.latest
                if snap is not None and any(p.name == "trainer-0" and p.used_gpus for p in snap.pods):
                    break
            await asyncio.sleep(0.2)  # a few more polls: nothing flips back
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                body = await response.text()
            async with http.get(f"http://127.0.0.1:{port}/v1/state") as response:
                state = await response.json()
        return body, state
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)


@pytest.mark.parametrize("api_server", [False, True], ids=["kubelet-only", "with-api-server"])
async def test_a_pod_straying_onto_an_unallocated_gpu_keeps_its_name_and_is_flagged(
    tmp_path: Path, api_server: bool
) -> None:
    scenario = tmp_path / "straying.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    nvml.nvmlShutdown()
    proc_tree(tmp_path / "proc", uuids)
    pods = [Pod("trainer-0", "ml", [Container("main", [gpus(uuids[1])])]),
            Pod("owner-0", "ml", [Container("main", [gpus(uuids[3])])]),  # allocated GPU 3, idle
            Pod("squatter-0", "ml", [Container("main", [])])]  # no GPU requested
    port = free_port()
    with short_socket_dir() as directory:
        sock = directory / "kubelet.sock"
        overrides: dict[str, Any] = {
            "backend": "sim", "scenario": str(scenario), "proc_root": str(tmp_path / "proc"),
            "pod_resources_socket": str(sock), "pod_resources_interval": 0.05, "poll_interval": 0.05,
            "listen": f"127.0.0.1:{port}", "hostname": NODE, "network": "false", "idle_events": "off",
            "kubernetes_api": "off",
        }
        async with PodResourcesServer(sock, pods=pods, allocatable=[gpus(*uuids)]), FakeApiServer() as api:
            if api_server:
                api.add_pod(make_pod("trainer-0", namespace="ml", uid=UID_TRAINER))
                api.add_pod(make_pod("squatter-0", namespace="ml", uid=UID_SQUATTER, gpus=0))
                api.add_pod(make_pod("owner-0", namespace="ml"))
                overrides.update(kubernetes_api="on", kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")))
            agent = Agent(load_config(None, env={}, overrides=overrides),
                          nvml=SimulatedNvml(load_scenario(scenario)), backend="sim")
            body, state = await serve_and_read(agent, port)

    names_from = "api_server" if api_server else "pod_resources"
    g1, g3, g7 = uuids[1], uuids[3], uuids[7]
    pod = 'namespace="ml",pod="trainer-0"'
    # every series of the trainer carries its name; none carries its UID
    assert UID_TRAINER not in body.replace(f'uid="{UID_TRAINER}"', "")
    for gpu, uuid, pid in (("1", g1, FAKE_PID), ("7", g7, FAKE_PID + 1)):
        assert (f'gpuagent_process_gpu_memory_used_bytes{{gpu="{gpu}",UUID="{uuid}",Hostname="{NODE}",'
                f'pid="{pid}",comm="trainer",kind="compute",{pod},container="main"}}') in body
        assert f'gpuagent_pod_gpu_memory_used_bytes{{{pod},gpu="{gpu}",UUID="{uuid}",Hostname="{NODE}"}}' in body
        assert f'gpuagent_pod_gpu_sm_utilization_ratio{{{pod},gpu="{gpu}",UUID="{uuid}"' in body
        assert f'gpuagent_container_gpu_memory_used_bytes{{{pod},container="main",gpu="{gpu}"' in body
    # (its owner labels follow: the owner walk's answer, "" without the API server)
    assert f'gpuagent_pod_info{{{pod},uid="{UID_TRAINER}",qos="burstable",names_from="{names_from}",owner_kind=' in body
    assert f'gpuagent_pod_allocated_gpus{{{pod}}} 1.0' in body
    assert f'gpuagent_pod_gpu_allocated{{{pod},container="main",device_id="{g1}"}} 1.0' in body
    # GPU 1 is the trainer's alone: dcgm-exporter's pod labels; GPU 7 is nobody's: none
    assert f'DCGM_FI_DEV_FB_USED{{gpu="1",UUID="{g1}"' in body
    assert f',container="main",{pod}}}' in next(
        line for line in body.splitlines() if line.startswith('DCGM_FI_DEV_FB_USED{gpu="1"'))
    assert 'pod="' not in next(line for line in body.splitlines() if line.startswith('DCGM_FI_DEV_FB_USED{gpu="7"'))
    # the flag: its use of GPU 7, and only that
    flagged = [line for line in body.splitlines()
               if line.startswith(f"gpuagent_pod_gpu_unallocated_use{{{pod},")]
    assert flagged == [f'gpuagent_pod_gpu_unallocated_use{{{pod},gpu="7",UUID="{g7}",Hostname="{NODE}"}} 1.0']
    assert f'gpuagent_gpu_tenants{{gpu="7",UUID="{g7}",Hostname="{NODE}"}} 1.0' in body

    view = state["allocation"]
    trainer = view["pods"]["ml/trainer-0"]
    assert trainer["uid"] == UID_TRAINER and trainer["names_from"] == names_from
    assert trainer["allocated_gpus"] == [g1] and sorted(trainer["used_gpus"]) == sorted([g1, g7])
    assert trainer["unallocated_use"] == [g7] and trainer["process_count"] == 2
    assert view["gpus"][g7]["used_by"] == ["ml/trainer-0"] and view["gpus"][g7]["allocated_to"] == []
    assert UID_TRAINER not in view["pods"]
    workloads = {p["pid"]: p["workload"] for g in state["gpus"] for p in g["processes"]}
    for pid in (FAKE_PID, FAKE_PID + 1):
        assert (workloads[pid]["namespace"], workloads[pid]["name"], workloads[pid]["names_from"]) == (
            "ml", "trainer-0", names_from)

    # the squatter on idle owner-0's GPU 3: never owner-0; named by the API server when there is one
    squatter = workloads[FAKE_PID + 2]
    if api_server:
        assert (squatter["name"], squatter["names_from"]) == ("squatter-0", "api_server")
        assert view["pods"]["ml/squatter-0"]["unallocated_use"] == [g3]  # named, so flagged too
        assert f'gpuagent_pod_gpu_unallocated_use{{namespace="ml",pod="squatter-0",gpu="3",UUID="{g3}"' in body
    else:
        assert (squatter["name"], squatter["names_from"]) == (UID_SQUATTER, "cgroup")
        assert 'gpuagent_pod_gpu_unallocated_use{namespace="ml",pod="squatter-0"' not in body
    owner = view["pods"]["ml/owner-0"]
    assert owner["allocated_gpus"] == [g3] and owner["used_gpus"] == [] and owner["process_count"] == 0

    _alert_fires_on(body, flagged[0])


def _alert_fires_on(body: str, series: str) -> None:
    """``GpuPodUnallocatedUse`` fires after 5 minutes of the agent's own series (promtool test rules)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    assert "gpuagent_pod_gpu_unallocated_use" in body
    selector = series.rsplit(" ", 1)[0]
    labels = dict(part.split("=", 1) for part in selector[selector.index("{") + 1:-1].split('",'))
    labels = {k: v.strip('"') for k, v in labels.items()}
    test = {
        "rule_files": [str(ROOT / "alerts" / "gpuagent.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": selector, "values": "1x10"}],
            "alert_rule_test": [{"eval_time": "6m", "alertname": "GpuPodUnallocatedUse", "exp_alerts": [{
                "exp_labels": {"severity": "warning", **labels},
                "exp_annotations": _annotations(labels),
            }]}],
        }],
    }
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "straying.test.yml"
        path.write_text(yaml.safe_dump(test, sort_keys=False))
        result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _annotations(labels: dict[str, str]) -> dict[str, str]:
    rules = yaml.safe_load((ROOT / "alerts" / "gpuagent.rules.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuPodUnallocatedUse")
    out = {}
    for key, template in rule["annotations"].items():
        text = template.replace("{{ $labels.namespace }}", labels["namespace"]).replace(
            "{{ $labels.pod }}", labels["pod"]).replace("{{ $labels.gpu }}", labels["gpu"]).replace(
            "{{ $labels.UUID }}", labels["UUID"]).replace(
            "{{ or $labels.Hostname $labels.hostname $labels.node $labels.instance }}", labels["Hostname"])
        out[key] = " ".join(text.split()) if key == "description" else text
    return out
