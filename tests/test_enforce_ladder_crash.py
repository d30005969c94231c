"""The memory ladder on real processes, and a crash of the agent while it holds a cgroup frozen."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cgroups import (
    SLEEP,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from ports import free_port

from gpuagent.agent import Agent
from gpuagent.config import load_config

pytestmark = pytest.mark.integration

# Ignores SIGTERM, then says so by creating the file named by its argument (a loaded machine can take a
# second to start an interpreter: a SIGTERM before the handler would end it like the polite one).
IGNORES_TERM = ("python3", "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                 "open(sys.argv[1], 'w').close()\nwhile True: time.sleep(1)")
EXITS_ON_TERM = ("sleep", "600")


def ready(listen: str) -> bool:
    """Whether an agent answers ``/readyz`` on ``listen`` (refused, not yet listening: False)."""
    try:
        with urllib.request.urlopen(f"http://{listen}/readyz", timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True  # it answers (503: not ready), so it serves
    except OSError:
        return False


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def pod_process(sandbox: CgroupSandbox, argv: tuple[str, ...]) -> tuple[object, str]:
    uid = new_pod_uid()
    path = kubelet_container_path("systemd", "burstable", uid, "containerd", new_container_id())
    return sandbox.spawn(path, argv=argv), uid


def scenario_file(tmp_path: Path, processes: list[dict]) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "ladder", "processes": processes,
                                    "gpus": [{"model": "H100-SXM5-80GB"}]}))
    return path


async def run_ladder(sandbox: CgroupSandbox, tmp_path: Path, mode: str) -> dict[str, object]:
    ready = tmp_path / "stubborn.ready"
    stubborn, stubborn_uid = pod_process(sandbox, (*IGNORES_TERM, str(ready)))
    for _ in range(600):
        if ready.exists():
            break
        await asyncio.sleep(0.05)
    assert ready.exists(), "the stubborn tenant never started"
    polite, polite_uid = pod_process(sandbox, EXITS_ON_TERM)
    scenario = scenario_file(tmp_path, [
        {"pid": stubborn.pid, "name": "stubborn", "gpu": 0, "memory": "10Gi", "sm_util": 10},
        {"pid": polite.pid, "name": "polite", "gpu": 0, "memory": "10Gi", "sm_util": 10},
    ])
    config_path = tmp_path / "gpuagent.yaml"
    config_path.write_text(yaml.safe_dump({
        "backend": "sim", "scenario": str(scenario), "mode": mode, "poll_interval": 0.2,
        "memory_term_after": 0.5, "memory_kill_grace": 1.5, "journal_path": str(tmp_path / "journal.json"),
        "pod_resources_socket": None, "kubernetes_api": "off",
        # Off the API server, pods are known by UID: a config rule gives both a 4 GiB limit.
        "policies": [{"match_pod": stubborn_uid, "gpu_memory": "4Gi"},
                     {"match_pod": polite_uid, "gpu_memory": "4Gi"}],
    }))
    agent = Agent(load_config(str(config_path), env={}))
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            await agent.poll_once()
            await asyncio.sleep(0.2)
    finally:
        await agent.aclose()
    return {"stubborn": stubborn.popen.poll(), "polite": polite.popen.poll(),
            "counts": dict(agent.latest.enforcement.actions_total),
            "stages": {m.pod: m.stage for m in agent.latest.enforcement.memory}}


async def test_over_the_memory_limit_term_then_kill(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> None:
    result = await run_ladder(cgroup_sandbox, tmp_path, "enforce")
    assert result["polite"] == -signal.SIGTERM  # left on SIGTERM: never SIGKILLed
    assert result["stubborn"] == -signal.SIGKILL  # ignored SIGTERM: SIGKILLed after the grace
    counts = result["counts"]
    assert counts[("signal_term", "done")] == 2 and counts[("signal_kill", "done")] == 1


async def test_audit_mode_signals_nobody(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> None:
    result = await run_ladder(cgroup_sandbox, tmp_path, "audit")
    assert result["polite"] is None and result["stubborn"] is None  # both still running
    counts = result["counts"]
    assert counts.get(("signal_term", "audit"), 0) >= 2 and not counts.get(("signal_term", "done"))
    assert set(result["stages"].values()) <= {"terminating", "killed"}  # what it would have done


def test_a_crashed_agent_leaves_nothing_frozen_after_restart(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> None:
    big, big_uid = pod_process(cgroup_sandbox, SLEEP)
    small, small_uid = pod_process(cgroup_sandbox, SLEEP)
    # Steady uses over both shares' sum, whatever CPU the sleeping tenants get: this test is of the journal,
    # not of shares, and burners starved on a loaded machine read idle and were not throttled in time.
    scenario = scenario_file(tmp_path, [
        {"pid": p.pid, "name": n, "gpu": 0, "memory": "1Gi", "sm_util": use}
        for p, n, use in ((big, "big", 60), (small, "small", 40))
    ])
    journal = tmp_path / "journal.json"
    config = tmp_path / "gpuagent.yaml"
    settings = {
        "backend": "sim", "scenario": str(scenario), "mode": "enforce", "poll_interval": 0.5,
        "journal_path": str(journal), "pod_resources_socket": None, "kubernetes_api": "off",
        "policies": [{"match_pod": big_uid, "gpu_share": 90}, {"match_pod": small_uid, "gpu_share": 10}],
    }
    config.write_text(yaml.safe_dump({**settings, "listen": f"127.0.0.1:{free_port()}"}))
    agent = subprocess.Popen([sys.executable, "-m", "gpuagent", "run", "--config", str(config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # an interpreter's start and a few polls, on a busy machine
        while not (journal.exists() and json.loads(journal.read_text() or "{}").get("entries")):
            assert time.monotonic() < deadline, "the agent never started throttling"
            time.sleep(0.05)
        time.sleep(1.0)
        # Crash while the journal names "small": stopped (SIGSTOP) the agent writes nothing more, so the
        # journal read after the stop is the one the crash leaves; "big" is frozen in small's slots (a tenth
        # of the time), when the journal names it instead, and then the agent goes on a moment and is
        # stopped again. (Killed at any instant, the journal named big in one CI run.)
        small_path = str(small.cgroup_paths["unified"])
        while True:
            assert time.monotonic() < deadline + 60, "the journal never named the throttled tenant"
            if small_path in journal.read_text():
                agent.send_signal(signal.SIGSTOP)
                if small_path in journal.read_text():
                    break
                agent.send_signal(signal.SIGCONT)
            time.sleep(0.01)
        agent.kill()  # kill -9: no chance to thaw
        agent.wait(timeout=10)
    finally:
        if agent.poll() is None:
            agent.kill()
    freeze_file = small.paths["unified"] / "cgroup.freeze"
    # The crash may have come between a freeze and its thaw, or not: make it the bad case for certain.
    freeze_file.write_text("1")
    assert small_path in journal.read_text()
    listen = f"127.0.0.1:{free_port()}"
    config.write_text(yaml.safe_dump({**settings, "mode": "off", "listen": listen}))
    started = time.monotonic()
    restarted = subprocess.Popen([sys.executable, "-m", "gpuagent", "run", "--config", str(config)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Thawed before the agent serves anything: judged by order, not by a clock (a busy machine takes
        # seconds to start an interpreter): /readyz never answers while the tenant is still frozen.
        while freeze_file.read_text().strip() != "0":
            assert time.monotonic() - started < 60, "still frozen a minute after the restart"
            assert not ready(listen), "the restarted agent serves while the tenant is still frozen"
            time.sleep(0.02)
        assert freeze_file.read_text().strip() == "0"
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=15)
    assert not journal.exists() or json.loads(journal.read_text()).get("entries") == []  # recovered, cleared
