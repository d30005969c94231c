"""The whole agent, end to end: real processes in real kubelet-style cgroups, the kubelet's allocations over
real gRPC, the simulated NVML naming them by PID; the accounting counters on a real /metrics over HTTP,
monotonic across polls, and the accounting state in /v1/state."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from cgroups import CgroupSandbox, kubelet_container_path, new_container_id, new_pod_uid, sandbox_for_test
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from ports import free_port

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario

pytestmark = pytest.mark.integration

COUNTERS = ("gpuagent_pod_gpu_allocated_seconds_total", "gpuagent_pod_gpu_busy_seconds_total",
            "gpuagent_pod_gpu_memory_byte_seconds_total", "gpuagent_pod_gpu_energy_joules_total",
            "gpuagent_container_gpu_busy_seconds_total", "gpuagent_workload_gpu_allocated_seconds_total")


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def values(body: str, family: str) -> dict[str, float]:
    """Label text -> value of every sample of ``family``."""
    out = {}
    for match in re.finditer(rf"^{family}\{{(.*)\}} (\S+)$", body, re.M):
        out[match.group(1)] = float(match.group(2))
    return out


async def test_counters_on_a_real_metrics_endpoint_grow_monotonically(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path
) -> None:
    uid, cid = new_pod_uid(), new_container_id()
    trainer = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd", cid))
    service = cgroup_sandbox.spawn("system.slice/gpu-batch.service")
    scenario = tmp_path / "node.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "accounting-e2e",
                                        "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],
                                        "processes": [
                                            {"pid": trainer.pid, "name": "trainer", "gpu": 0, "memory": "8Gi",
                                             "sm_util": 70},
                                            {"pid": service.pid, "name": "batch", "gpu": 1, "memory": "1Gi",
                                             "sm_util": 20}]}))
    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    gpu0 = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
    port = free_port()
    with short_socket_dir() as directory:
        sock = directory / "kubelet.sock"
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(scenario), "pod_resources_socket": str(sock),
            "pod_resources_interval": 0.2, "listen": f"127.0.0.1:{port}", "poll_interval": 0.2,
            "kubernetes_api": "off", "idle_events": "off", "journal_path": str(tmp_path / "journal.json"),
            "energy_interval": 0.5, "process_utilization_interval": 0.2,  # read within a short run
        })
        agent = Agent(config, nvml=nvml, backend="sim")
        stop = asyncio.Event()
        served = [Pod("train-0", "ml", [Container("trainer", [gpus(gpu0)])])]
        async with PodResourcesServer(sock, pods=served):
            task = asyncio.create_task(agent.serve(stop))
            try:
                scrapes = await scrape(port, times=4, every=0.6)
                async with aiohttp.ClientSession() as http, \
                        http.get(f"http://127.0.0.1:{port}/v1/state") as response:
                    state = await response.json()
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
    pod_series = f'namespace="ml",pod="train-0",gpu="0",UUID="{gpu0}"'
    for family in COUNTERS:
        series = [values(body, family) for body in scrapes]
        assert series[-1], f"{family} missing"
        for key in series[-1]:
            seen = [s[key] for s in series if key in s]
            assert seen == sorted(seen), f"{family}{{{key}}} went down: {seen}"
            assert seen[-1] > seen[0], f"{family}{{{key}}} did not grow: {seen}"
    last = scrapes[-1]
    # every collector renders on a node with pods (a family rendered by two collectors fails one of them)
    failing = [line for line in last.splitlines()
               if line.startswith("gpuagent_collector_success") and line.endswith(" 0.0")]
    assert not failing, failing
    assert any(k.startswith(pod_series) for k in values(last, "gpuagent_pod_gpu_allocated_seconds_total"))
    assert any('workload_kind="systemd_service",workload="gpu-batch.service",gpu="1"' in k
               for k in values(last, "gpuagent_workload_gpu_allocated_seconds_total"))
    assert "# TYPE gpuagent_pod_gpu_busy_seconds_total counter" in last
    accounting = state["accounting"]
    assert accounting["idle"] == [] and accounting["idle_window_seconds"] == 1800.0
    trainer_usage = next(u for u in accounting["usage"] if u["level"] == "pod" and u["name"] == "train-0")
    assert trainer_usage["allocated_gpus"] == 1.0 and trainer_usage["ended_at_unix"] is None
    # busy / allocated: the trainer runs at 70 % SM
    assert trainer_usage["busy_gpu_seconds_total"] == pytest.approx(
        0.7 * trainer_usage["allocated_gpu_seconds_total"], rel=0.05)


async def scrape(port: int, *, times: int, every: float) -> list[str]:
    bodies: list[str] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(200):  # until the agent serves and its first intervals are integrated
            try:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    body = await response.text()
                if "gpuagent_pod_gpu_busy_seconds_total{" in body:
                    break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
        for _ in range(times):
            await asyncio.sleep(every)
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                bodies.append(await response.text())
    return bodies
