"""Enforcement on an MPS GPU, end to end on this machine: real processes in real kubepods-shaped cgroups are
the MPS server and its clients (the simulated GPU lists them as the real driver does, their utilization
following their real CPU progress), their MPS limits are their real environments, the API server (a fake
one speaking the real JSON) gives their pods ``gpuagent.io/*`` annotations, and the agent enforces.

Three clients share one CPU, so each runs about a third of the time (more when another is frozen):

- Freezing works per client cgroup: the client over its 5 % share is frozen part of every period.
- MPS's own limits are not fought: a client MPS holds to 20 % of the SMs, with a 30 % share, is never
  frozen, though it runs a third of the time or more (a third of the time on a fifth of the SMs is 7 %).
- The MPS server is infrastructure: its pod's annotations (a 5 % share, a 1 MiB memory limit it is far
  over) are never acted on; it is neither frozen nor signalled.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from cgroups import CgroupSandbox, kubelet_container_path, new_pod_uid, sandbox_for_test
from fake_apiserver import NODE, FakeApiServer, container_id, make_pod
from ports import free_port
from test_enforce_e2e import BURN_CPU, burner

from gpuagent.agent import Agent
from gpuagent.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


async def test_freezing_works_per_mps_client_and_leaves_the_server_and_mps_limits_alone(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, agent_off_the_burn_cpu: None
) -> None:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    # The server's /proc/PID/comm reads "nvidia-cuda-mps" (15 characters), as the real server's does.
    server = tmp_path / "nvidia-cuda-mps-server"
    server.symlink_to(shutil.which("sleep") or "/bin/sleep")
    # (pod, namespace, annotations, argv, environment, scenario process type)
    tenants = [
        ("mps-control-daemon", "kube-system", {"gpuagent.io/gpu-share": "5", "gpuagent.io/gpu-memory": "1Mi"},
         (str(server), "600"), base, "mps_server"),
        ("small", "ml", {"gpuagent.io/gpu-share": "5"}, burner(BURN_CPU),
         {**base, "HOSTNAME": "small", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4G"}, "mps_client"),
        ("capped", "ml", {"gpuagent.io/gpu-share": "30"}, burner(BURN_CPU),
         {**base, "HOSTNAME": "capped", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}, "mps_client"),
        ("big", "ml", {"gpuagent.io/gpu-share": "70"}, burner(BURN_CPU), {**base, "HOSTNAME": "big"}, "mps_client"),
    ]
    procs, pods, processes = {}, [], []
    for name, namespace, pod_annotations, argv, env, kind in tenants:
        uid = new_pod_uid()
        path = kubelet_container_path("systemd", "burstable", uid, "containerd", container_id(uid, "main"))
        procs[name] = cgroup_sandbox.spawn(path, argv=argv, env=env)
        pods.append(make_pod(name, namespace=namespace, uid=uid, annotations=pod_annotations, gpus=0))
        sm_util = {"follow_cpu": {"scale": 1.0, "queue_seconds": 0.2}} if kind == "mps_client" else 0
        processes.append({"pid": procs[name].pid, "name": name, "gpu": 0, "type": kind, "memory": "1Gi",
                          "sm_util": sm_util})
    cgroup_sandbox.favour_cpu()  # the tenants win their CPU against other tests' cgroups (the parallel pass)
    scenario = tmp_path / "mps.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "mps-enforce", "processes": processes,
                                        "gpus": [{"model": "H100-SXM5-80GB"}]}))
    async with FakeApiServer() as api:
        for pod in pods:
            api.add_pod(pod)
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(scenario), "listen": f"127.0.0.1:{free_port()}",
            "poll_interval": 0.5, "mode": "enforce", "journal_path": str(tmp_path / "journal.json"),
            "kubernetes_api": "on", "kubeconfig": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "hostname": NODE, "pod_resources_socket": None, "memory_term_after": 0.5, "memory_kill_grace": 0.5,
            "network": "false", "work_conserving": "false",  # shares hold even when the CPU is slow to contend
        })
        agent = Agent(config)
        stop = asyncio.Event()
        serving = asyncio.create_task(agent.serve(stop))
        seen: dict[str, list] = {"capped": [], "small": [], "daemon": []}
        try:
            for _ in range(32):  # 16 s of polls
                await asyncio.sleep(0.5)
                snap = agent.latest
                if snap is None or snap.enforcement is None:
                    continue
                for share in snap.enforcement.shares:
                    key = {"capped": "capped", "small": "small"}.get(share.pod)
                    if key:
                        seen[key].append(share)
                    if share.namespace == "kube-system":
                        seen["daemon"].append(share)
                seen["daemon"].extend(m for m in snap.enforcement.memory if m.namespace == "kube-system")
            snap = agent.latest
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)

    by_pid = {p.pid: p for g in snap.gpus for p in g.processes}
    assert by_pid[procs["capped"].pid].mps is not None
    assert by_pid[procs["capped"].pid].mps.active_thread_percent == 20.0  # read from its real environment
    assert by_pid[procs["small"].pid].mps.pinned_memory_limit_bytes == 4 << 30
    assert by_pid[procs["mps-control-daemon"].pid].kind == "mps_server"
    # freezing works per client cgroup: the client over its share was frozen, through its own cgroup
    assert seen["small"] and max(s.frozen_ratio for s in seen["small"]) > 0
    assert seen["small"][-1].throttled_seconds_total > 0
    counts = snap.enforcement.actions_total
    assert counts.get(("freeze", "done"), 0) > 0 and not counts.get(("freeze", "failed"))
    # MPS holds "capped" to 20 % of the SMs, within its 30 % share: never frozen
    assert seen["capped"] and all(s.frozen_ratio == 0 for s in seen["capped"])
    assert seen["capped"][-1].throttled_seconds_total == 0
    # the server: never decided on, never signalled, never frozen
    assert seen["daemon"] == []
    assert psutil.pid_exists(procs["mps-control-daemon"].pid)
    assert not any(action == "signal" for action, _ in counts)
    for proc in procs.values():  # the agent thawed everything on its way out
        for key, directory in proc.paths.items():
            if key == "unified":
                assert (directory / "cgroup.freeze").read_text().strip() == "0"
