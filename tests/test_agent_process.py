"""The real ``gpuagent`` process on loopback: what ``make run`` gives a user, a hung NVML call, SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_runner import http_get as get
from ports import free_port

from gpuagent.shutdown import EXIT_FORCED

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"

pytestmark = pytest.mark.integration




class AgentProcess:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuagent", "run", "--listen", f"127.0.0.1:{self.port}", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "NODE_NAME": "test-node"},
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                if get(self.url + "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("agent not ready in time")

    def stop(self, timeout: float = 15) -> tuple[int, str, float]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, time.monotonic() - started


@pytest.fixture
def agent_process() -> Iterator[type[AgentProcess]]:
    started: list[AgentProcess] = []

    def start(*args: str) -> AgentProcess:
        agent = AgentProcess(*args)
        started.append(agent)
        return agent

    yield start  # type: ignore[misc]
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def test_run_serves_a_simulated_node_when_there_is_no_driver(agent_process) -> None:
    agent = agent_process("--backend", "auto", "--scenario", str(H100), "--poll-interval", "0.2")
    agent.wait_ready()
    time.sleep(0.5)  # a few polls: GPM counters need two samples
    status, body = get(agent.url + "/metrics")
    assert status == 200
    for gpu in range(8):
        for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                     "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
            assert f'{name}{{gpu="{gpu}",' in body, f"{name} gpu {gpu}"
        assert f'gpuagent_process_gpu_memory_used_bytes{{gpu="{gpu}",' in body
        assert f'gpuagent_process_sm_utilization_ratio{{gpu="{gpu}",' in body
    assert 'Hostname="test-node"' in body and "gpuagent_up 1.0" in body
    assert "gpuagent_simulated 1.0" in body and 'backend="sim"' in body  # every scrape says it
    status, state = get(agent.url + "/v1/state")
    assert status == 200
    state = json.loads(state)
    assert state["backend"] == "sim" and len(state["gpus"]) == 8
    assert sum(len(g["processes"]) for g in state["gpus"]) > 50
    assert get(agent.url + "/healthz")[0] == 200
    code, log, took = agent.stop()
    assert code == 0 and took < 10
    assert "NO NVIDIA DRIVER" in log and "SIMULATED" in log  # said loudly, once
    assert "auto is for development" in log and "--backend nvml" in log
    assert "stopped" in log


def _nvml_loads() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_backend_nvml_without_a_driver_is_unready_serves_no_gpu_and_retries(agent_process) -> None:
    """What the Dockerfile, the unit and the DaemonSet run: with no NVML, the agent stays up and alive, is
    unready with the reason, serves no GPU figure (none simulated) and keeps trying every poll."""
    if _nvml_loads():
        pytest.skip("NVML loads on this machine: the driverless case cannot be run here")
    agent = agent_process("--backend", "nvml", "--poll-interval", "0.2", "--pod-resources-socket", "null",
                          "--kubernetes-api", "off")
    deadline = time.monotonic() + 30
    while True:
        assert agent.proc.poll() is None, agent.proc.stdout.read()
        with contextlib.suppress(OSError):
            status, body = get(agent.url + "/healthz")
            if status == 200 and json.loads(body)["status"] == "ok":  # a first snapshot is published
                break
        assert time.monotonic() < deadline, "no first snapshot"
        time.sleep(0.1)
    status, body = get(agent.url + "/readyz")
    assert status == 503
    ready = json.loads(body)
    assert "NVML unavailable" in ready["status"] and "nvmlInit" in ready["reason"] and ready["backend"] == "nvml"
    metrics = get(agent.url + "/metrics")[1]
    assert "gpuagent_up 0.0" in metrics and 'gpuagent_source_success{source="nvml"} 0.0' in metrics
    assert "gpuagent_simulated 0.0" in metrics and 'backend="nvml"' in metrics
    assert "DCGM_FI_" not in metrics and "gpuagent_gpu_info{" not in metrics
    state = json.loads(get(agent.url + "/v1/state")[1])
    assert state["backend"] == "nvml" and state["gpus"] == []
    polls = _value(metrics, "gpuagent_polls_total")
    time.sleep(1.0)
    later = get(agent.url + "/metrics")[1]
    assert _value(later, "gpuagent_polls_total") > polls and "gpuagent_up 0.0" in later  # still trying
    assert get(agent.url + "/readyz")[0] == 503 and get(agent.url + "/healthz")[0] == 200
    code, log, _ = agent.stop()
    assert code == 0
    assert log.count("NVML unavailable") == 1 and "retrying every poll" in log  # one line, not one a poll
    assert "SIMULATED" not in log


def test_a_hung_nvml_call_marks_the_gpu_stale_and_the_agent_keeps_serving(agent_process, tmp_path) -> None:
    scenario = yaml.safe_load(H100.read_text())
    scenario["faults"] = [{"hang": {"gpu": 2, "at": 1.5, "seconds": 600}}]  # any call on GPU 2, for 10 min
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(scenario))
    agent = agent_process("--backend", "sim", "--scenario", str(path), "--poll-interval", "0.2",
                          "--nvml-timeout", "0.5", "--shutdown-timeout", "2")
    agent.wait_ready()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status, body = get(agent.url + "/metrics")
        assert status == 200
        if 'gpuagent_gpu_stale{gpu="2",' in body and _value(body, 'gpuagent_gpu_stale{gpu="2",') == 1.0:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("GPU 2 never marked stale")
    assert _value(body, 'gpuagent_gpu_stale{gpu="1",') == 0.0
    assert 'state="unresponsive"} 1.0' in body
    assert get(agent.url + "/healthz")[0] == 200 and get(agent.url + "/readyz")[0] == 200
    time.sleep(1.0)  # polls go on at their pace while the call stays stuck
    polls_before = _value(get(agent.url + "/metrics")[1], "gpuagent_polls_total")
    time.sleep(1.0)
    polls_after = _value(get(agent.url + "/metrics")[1], "gpuagent_polls_total")
    assert polls_after - polls_before >= 3
    code, log, took = agent.stop()
    # The call stuck in the driver holds the exit only until shutdown_timeout: then the agent names it
    # (the GPU's worker thread and its stack) and exits with 3 (tests/test_shutdown.py has the rest).
    assert code == EXIT_FORCED and took < 2 + 10, (code, took)
    assert "thread nvml-gpu2 (daemon)" in log
    assert log.count("GPU 2 (") == 1  # one line for the state change, not one per poll


def test_snapshot_command_prints_json(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuagent", "snapshot", "--backend", "sim", "--scenario",
         str(ROOT / "examples" / "scenarios" / "a100-mig.yaml"), "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    mig = [g for g in state["gpus"] if g["info"]["mig_enabled"]]
    assert mig and all(g["migs"] for g in mig)


def test_bad_config_exits_2_naming_the_key(tmp_path) -> None:
    config = tmp_path / "gpuagent.yaml"
    config.write_text("poll_interval: -1\n")
    out = subprocess.run([sys.executable, "-m", "gpuagent", "run", "--config", str(config)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "poll_interval" in out.stderr


def _value(body: str, prefix: str) -> float:
    for line in body.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {prefix}")
