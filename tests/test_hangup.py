"""SIGHUP stops the agent the way SIGTERM does: thaw first, the journal emptied, exit 0.

A closed terminal sends SIGHUP to ``gpuagent run`` and ``gpuagent demo``; its default action would end the
process at once, leaving a tenant frozen in its slot until the next start read the journal (and the demo's
temporary directory behind). An agent started with SIGHUP ignored (``nohup``) keeps ignoring it.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_runner import AgentRunner, journal_entries
from cgroups import (
    SLEEP,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from prometheus_server import free_port

SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "laptop-1gpu.yaml"
BOUND_SECONDS = 30  # a bound on a hang on a loaded machine, not a timing claim


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def _enforcing_agent(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> tuple[AgentRunner, Path, Path]:
    """An agent holding a tenant at 90 % of the GPU to 10 % (frozen most of each period), and the tenant's
    freeze file."""
    uid = new_pod_uid()
    tenant = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd",
                                                         new_container_id()), argv=SLEEP)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({
        "version": 1, "name": "hangup",
        "gpus": [{"model": "H100-SXM5-80GB"}],
        # a steady 90 % of the GPU, whatever CPU the (sleeping) tenant gets: this test is not of shares, and a
        # burner here, on a loaded machine, read as idle and was never throttled within the bound
        "processes": [{"pid": tenant.pid, "name": "tenant", "gpu": 0, "memory": "1Gi", "sm_util": 90}],
    }))
    journal = tmp_path / "journal.json"
    agent = AgentRunner("agent", {
        "listen": f"127.0.0.1:{free_port()}", "backend": "sim", "scenario": str(scenario), "mode": "enforce",
        "poll_interval": 0.5, "shutdown_timeout": 10, "journal_path": str(journal),
        "pod_resources_socket": None, "kubernetes_api": "off", "network": False, "work_conserving": False,
        "policies": [{"match_pod": uid, "gpu_share": 10}],
    }, tmp_path)
    return agent, journal, tenant.paths["unified"] / "cgroup.freeze"


@pytest.mark.integration
def test_sighup_thaws_empties_the_journal_and_exits_0(cgroup_sandbox: CgroupSandbox, tmp_path: Path) -> None:
    agent, journal, freeze = _enforcing_agent(cgroup_sandbox, tmp_path)
    try:
        deadline = time.monotonic() + BOUND_SECONDS
        while not journal_entries(journal):  # the tenant is being throttled: a freeze is on record
            assert agent.proc.poll() is None, agent.log()
            assert time.monotonic() < deadline, f"never throttling:\n{agent.log()}"
            time.sleep(0.1)
        agent.proc.send_signal(signal.SIGHUP)
        code = agent.proc.wait(BOUND_SECONDS)
    finally:
        agent.stop()
    assert code == 0, agent.log()
    assert freeze.read_text().strip() == "0"
    assert journal_entries(journal) == []


@pytest.mark.integration
def test_an_agent_started_with_sighup_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    # `trap "" HUP` ignores it in the shell, and an ignored signal stays ignored across exec: as nohup does
    nohup = ("sh", "-c", 'trap "" HUP; exec "$0" "$@"', sys.executable, "-m", "gpuagent")
    agent = AgentRunner("nohup", {
        "listen": f"127.0.0.1:{free_port()}", "backend": "sim", "scenario": str(SCENARIO),
        "pod_resources_socket": None, "kubernetes_api": "off", "network": False, "mode": "off",
    }, tmp_path, command=nohup)
    try:
        agent.wait_ready()
        agent.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)  # a span the test measures: the agent must still be there after it
        assert agent.proc.poll() is None, agent.log()
    finally:
        code = agent.stop()
    assert code == 0, agent.log()
