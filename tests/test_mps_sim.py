"""MPS in the simulated NVML and in the device reader: the server on the compute list, the clients only on
``nvmlDeviceGetMPSComputeRunningProcesses_v3`` (as the real driver lists them), their limits in their
(simulated) environments, and what the reader makes of per-process utilization under MPS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from simclock import FakeClock

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.mps import ClientUtilization, is_mps_daemon, process_kind
from gpuagent.devices.sim import ScenarioError, SimulatedNvml, parse_scenario
from gpuagent.pods.environ import parse_environ
from gpuagent.snapshot.processes import MPS_CLIENT, MPS_SERVER, MpsLimits, ProcessSample

GIB = 1 << 30
FAKE = 4_200_000

MPS_NODE: dict[str, Any] = {
    "hostname": "mps-node",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 2},
             {"model": "A100-SXM4-80GB", "mig": {"instances": [{"profile": "3g.40gb", "id": 1},
                                                              {"profile": "3g.40gb", "id": 2}]}}],
    "processes": [
        {"type": "mps_server", "gpu": 0, "memory": "36Mi"},                                       # FAKE + 0
        {"name": "infer-a", "type": "mps_client", "gpu": 0, "memory": "12Gi", "sm_util": 40,      # FAKE + 1
         "mps": {"active_thread_percentage": 30, "pinned_memory_limit": "10Gi"},
         "environ": {"HOSTNAME": "infer-a"}},
        {"name": "infer-b", "type": "mps_client", "gpu": 0, "memory": "6Gi", "sm_util": 20,       # FAKE + 2
         "mps": {"active_thread_percentage": 50}},
        {"name": "train", "gpu": 1, "memory": "40Gi", "sm_util": 90},                             # FAKE + 3
        {"type": "mps_server", "gpu": 2, "mig_instance": 2, "memory": "30Mi"},                    # FAKE + 4
        {"name": "mig-client", "type": "mps_client", "gpu": 2, "mig_instance": 2, "memory": "3Gi",  # FAKE + 5
         "mps": {"pinned_memory_limit": "2Gi"}},
    ],
}


def make(data: dict[str, Any], clock: FakeClock | None = None) -> SimulatedNvml:
    nvml = SimulatedNvml(parse_scenario(data, source="mps.yaml"), **({"clock": clock} if clock else {}))
    if clock is not None:
        clock.t = clock.start
    nvml.nvmlInit()
    return nvml


def pids(processes: Any) -> list[int]:
    return sorted(p.pid for p in processes)


def test_the_server_is_a_compute_process_and_clients_are_listed_only_by_the_mps_call() -> None:
    nvml = make(MPS_NODE)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert pids(nvml.nvmlDeviceGetComputeRunningProcesses(h0)) == [FAKE]
    assert pids(nvml.nvmlDeviceGetComputeRunningProcesses_v3(h0)) == [FAKE]
    assert pids(nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h0)) == [FAKE + 1, FAKE + 2]
    assert pids(nvml.nvmlDeviceGetMPSComputeRunningProcesses(h0)) == [FAKE + 1, FAKE + 2]
    assert nvml.process_name(FAKE) == "nvidia-cuda-mps-server"
    h1 = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h1) == []
    # MIG: the MIG device's own handle answers too, with its instance's clients
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(2), 1)
    listed = nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(mig)
    assert pids(listed) == [FAKE + 5] and listed[0].gpuInstanceId == 2


def test_a_client_is_held_to_its_pinned_memory_limit_and_its_environment_carries_the_limits() -> None:
    nvml = make(MPS_NODE)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    memory = {p.pid: p.usedGpuMemory for p in nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h0)}
    assert memory == {FAKE + 1: 10 * GIB, FAKE + 2: 6 * GIB}  # 12 GiB wanted, 10 GiB allowed
    uuid0 = nvml.nvmlDeviceGetUUID(h0)
    env = parse_environ(nvml.process_environ(FAKE + 1) or b"")
    assert dict(env) == {"HOSTNAME": "infer-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{uuid0}=10240M"}
    mig_uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(2), 1))
    assert parse_environ(nvml.process_environ(FAKE + 5) or b"")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{mig_uuid}=2048M"
    assert nvml.process_environ(FAKE + 3) is None  # the scenario gives it none


@pytest.mark.parametrize(("change", "path", "fragment"), [
    ({"processes": [{"gpu": 0, "mps": {"active_thread_percentage": 30}}]},
     "processes[0].mps", "only an mps_client has MPS limits (this process is compute)"),
    ({"processes": [{"gpu": 0, "type": "mps_client"}]},
     "processes[0].type", "needs an mps_server process on GPU 0"),
    ({"processes": [{"gpu": 0, "type": "mps_server"}, {"gpu": 0, "type": "mps_client", "pid": 1,
                                                         "mps": {"active_thread_percentage": 5}}]},
     "processes[1].mps", "a real PID's limits are its own environment"),
    ({"processes": [{"gpu": 0, "pid": 1, "environ": {"HOSTNAME": "x"}}]},
     "processes[0].environ", "a real PID's environment is its own"),
    ({"processes": [{"gpu": 0, "type": "mps_server"}, {"gpu": 0, "type": "mps_client",
                                                         "mps": {"pinned_memory_limit": "1000000"}}]},
     "processes[1].mps.pinned_memory_limit", "a positive whole number of MiB"),
    ({"processes": [{"gpu": 0, "type": "mps_server"}, {"gpu": 0, "type": "mps_client",
                                                         "mps": {"pinned_memory_limit": "200Gi"}}]},
     "processes[1].mps.pinned_memory_limit", "is more than the"),
    ({"processes": [{"gpu": 0, "type": "mps_server"}, {
        "gpu": 0, "type": "mps_client", "mps": {"active_thread_percentage": 5},
        "environ": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "9"}}]},
     "processes[1].environ.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "give them once"),
    ({"processes": [{"gpu": 0, "type": "mps_server"}, {"gpu": 0, "type": "mps_client",
                                                         "mps": {"active_thread_percentage": 0}}]},
     "processes[1].mps.active_thread_percentage", "must be > 0"),
    ({"processes": [{"gpu": 0, "environ": {"1BAD": "x"}}]}, "processes[0].environ", ""),
    ({"driver": {"mps_utilization": "sometimes"}}, "driver.mps_utilization", "unknown mps_utilization"),
])
def test_scenario_errors_name_the_path(change: dict[str, Any], path: str, fragment: str) -> None:
    data = {"gpus": [{"model": "H100-SXM5-80GB"}], **change}
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, source="mps.yaml")
    assert any(p == path and fragment in m for p, m in info.value.errors), info.value.errors


# -- the device reader -----------------------------------------------------------------------------------


async def poll(data: dict[str, Any], polls: int = 1, clock: FakeClock | None = None) -> tuple[Any, SimulatedNvml]:
    clock = clock or FakeClock(start=100.0)
    nvml = SimulatedNvml(parse_scenario(data, source="mps.yaml"), clock=clock)
    clock.t = clock.start
    config = load_config(None, env={}, overrides={"backend": "sim", "pod_resources_socket": "null",
                                                  "kubernetes_api": "off", "network": "false"})
    agent = Agent(config, nvml=nvml, backend="sim", clock=clock, monotonic=clock)
    try:
        snap = None
        for _ in range(polls):
            snap = await agent.poll_once()
            clock.advance(1.0)
        return snap, nvml
    finally:
        await agent.devices.close()


async def test_the_reader_lists_clients_with_their_kind_limits_and_use() -> None:
    snap, nvml = await poll(MPS_NODE, polls=2)
    by_pid = {p.pid: p for g in snap.gpus for p in g.processes}
    assert by_pid[FAKE].kind == MPS_SERVER and by_pid[FAKE + 4].kind == MPS_SERVER
    assert (by_pid[FAKE + 1].kind, by_pid[FAKE + 1].used_memory_bytes) == (MPS_CLIENT, 10 * GIB)
    assert by_pid[FAKE + 1].sm_util_percent == 40.0  # this driver samples clients under their PIDs
    assert by_pid[FAKE + 1].mps == MpsLimits(30.0, 10 * GIB)  # from the simulated environment
    assert by_pid[FAKE + 2].mps == MpsLimits(50.0, None)
    assert by_pid[FAKE + 5].mps == MpsLimits(None, 2 * GIB) and by_pid[FAKE + 5].gpu_instance_id == 2
    assert snap.gpus[2].migs[1].processes[1] is by_pid[FAKE + 5]
    assert by_pid[FAKE + 3].kind == "compute" and by_pid[FAKE + 3].mps is None
    calls = nvml.call_counts()
    # asked only where a server runs: GPU 0 and GPU 2, once a poll each
    assert calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 4


async def test_a_driver_without_the_mps_call_is_remembered() -> None:
    data = {**MPS_NODE, "gpus": [{"model": "H100-SXM5-80GB", "count": 2,
                                  "not_supported": ["nvmlDeviceGetMPSComputeRunningProcesses_v3"]},
                                 MPS_NODE["gpus"][1]]}
    snap, nvml = await poll(data, polls=3)
    assert nvml.call_counts()["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 1 + 3  # GPU 0 once; GPU 2 each poll
    assert [p.kind for p in snap.gpus[0].processes] == [MPS_SERVER]  # the clients are not listed: absent


async def test_use_the_driver_puts_on_the_server_is_unknown_for_clients() -> None:
    data = {**MPS_NODE, "driver": {"mps_utilization": "server"}}
    snap, _ = await poll(data, polls=2)
    by_pid = {p.pid: p for p in snap.gpus[0].processes}
    assert by_pid[FAKE].sm_util_percent == 60.0  # 40 + 20, on the server's PID
    assert by_pid[FAKE + 1].sm_util_percent is None and by_pid[FAKE + 2].memory_util_percent is None


def test_client_utilization_is_learned_once_per_gpu() -> None:
    server = ProcessSample(1, "nvidia-cuda-mps", MPS_SERVER, 0, 0.0, 0.0)
    client = ProcessSample(2, "infer", MPS_CLIENT, GIB, 0.0, 0.0)
    learner = ClientUtilization()
    assert learner.settle((server, client), sampled=()) == (server, client)  # idle: 0, nothing learned
    assert learner.measured is None
    out = learner.settle((server, client), sampled={1})  # busy, and only the server sampled
    assert learner.measured is False and out[1].sm_util_percent is None
    assert learner.settle((server, client), sampled=())[1].sm_util_percent is None  # idle again: still unknown
    measured = ClientUtilization()
    measured.settle((server, client), sampled={2})
    assert measured.measured is True and measured.settle((server, client), sampled={1}) == (server, client)


@pytest.mark.parametrize(("comm", "kind"), [
    ("nvidia-cuda-mps", MPS_SERVER),  # /proc/PID/comm cuts both daemons' names to 15 characters
    ("nvidia-cuda-mps-server", MPS_SERVER), ("nvidia-cuda-mps-control", MPS_SERVER),
    ("python", "compute"), ("", "compute"),
])
def test_daemons_are_known_by_their_names(comm: str, kind: str) -> None:
    assert process_kind("compute", comm) == kind
    assert is_mps_daemon(comm) is (kind == MPS_SERVER)


def test_the_example_scenario_loads_and_lists_clients_by_the_mps_call_only() -> None:
    path = Path(__file__).resolve().parents[1] / "examples" / "scenarios" / "mps-inference.yaml"
    data = yaml.safe_load(path.read_text())
    nvml = make(data)
    h0 = nvml.nvmlDeviceGetHandleByIndex(0)
    compute = {nvml.process_name(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h0)}
    assert compute == {"nvidia-cuda-mps-server"}
    assert len(nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3(h0)) == 3
