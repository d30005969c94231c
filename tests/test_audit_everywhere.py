"""Audit mode is audit on every surface: nothing is signalled, frozen, evicted or journaled, and the log,
``/v1/state``, ``/metrics`` and ``gpuagent top`` name each decision as one that *would* be taken (issue 30).

On real cgroups (the actions gate and the agent's memory ladder, with real processes in kubepods-shaped
cgroups), on a ``/proc`` tree of simulated PIDs (what the demo node has: the kernel has no such processes),
and on the demo node itself (``gpuagent demo``, audit by default), its ladder shortened to seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_runner import clean_env
from agent_runner import http_get as get
from cgroups import (
    UNIFIED,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from ports import free_port
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.enforce.actions import Actions, FreezeTarget, Journal
from gpuagent.snapshot.views import to_jsonable
from gpuagent.top.model import node_view
from gpuagent.top.render import tenant_line

ROOT = Path(__file__).resolve().parents[1]
SIMULATED_PID = 4200004  # above Linux's largest pid_max (2**22): no process of the kernel has it
POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f6b3c2a_9e1d_4c7b_8a5e_2d4f6a8b0c1e.slice"


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def pod_path() -> str:
    return kubelet_container_path("systemd", "burstable", new_pod_uid(), "containerd", new_container_id())


def actions_of(metrics: str) -> dict[tuple[str, str], float]:
    """``gpuagent_enforcement_actions_total`` of an exposition: (action, outcome) -> count."""
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    return {(s.labels["action"], s.labels["outcome"]): s.value
            for s in families["gpuagent_enforcement_actions"].samples if s.name.endswith("_total")}


def acted(counts: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The counts that would say an action was taken, or a process died of one: any but audit and refused."""
    return {key: n for key, n in counts.items() if n and key[1] not in ("audit", "refused")}


# -- the gate ----------------------------------------------------------------------------------------------

def test_a_simulated_pid_is_a_would_be_signal_not_a_death(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The demo's processes exist in its own /proc tree only: audit reads their cgroup there and counts the
    decision; it opened a pidfd first, read them as "gone", and the log said they had exited."""
    proc = tmp_path / "proc"  # the demo's: its processes' cgroups, as the agent's pods source reads them
    (proc / str(SIMULATED_PID)).mkdir(parents=True)
    (proc / str(SIMULATED_PID) / "cgroup").write_text(f"0::{POD}/cri-containerd-0a1b.scope\n")
    (proc / str(SIMULATED_PID + 1)).mkdir()
    (proc / str(SIMULATED_PID + 1) / "cgroup").write_text("0::/system.slice/sshd.service\n")
    actions = Actions(mode="audit", journal=Journal(tmp_path / "journal.json"), cgroup_root=tmp_path / "cgroup",
                      workload_proc_root=proc)
    with caplog.at_level(logging.INFO, logger="gpuagent.enforce.actions"):
        assert actions.signal(SIMULATED_PID, signal.SIGTERM, reason="over") is False
        assert actions.signal(SIMULATED_PID, signal.SIGKILL, reason="still over") is False
        assert actions.signal(SIMULATED_PID + 1, signal.SIGTERM, reason="x") is False  # the rules still apply
        assert actions.signal(SIMULATED_PID + 2, signal.SIGTERM, reason="x") is False  # no /proc entry: exited
    assert actions.counts() == {("signal_term", "audit"): 1, ("signal_kill", "audit"): 1,
                                ("signal_term", "refused"): 1, ("signal_term", "gone"): 1}
    said = [r.getMessage() for r in caplog.records]
    assert f"audit: would send SIGTERM to PID {SIMULATED_PID} (over)" in said
    assert f"audit: would send SIGKILL to PID {SIMULATED_PID} (still over)" in said
    assert not any(f"PID {SIMULATED_PID} has exited" in line for line in said)


def test_enforce_checks_the_cgroup_of_the_process_its_pidfd_pins_not_the_workload_tree(tmp_path: Path) -> None:
    """The workloads' /proc tree (the config's proc_root) may be another PID namespace's, or made up: enforce
    reads the cgroup where its pidfd pins the process, so a tree that puts a PID in a pod signals nobody."""
    proc = tmp_path / "proc"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (proc / str(sleeper.pid)).mkdir(parents=True)
        (proc / str(sleeper.pid) / "cgroup").write_text(f"0::{POD}/cri-containerd-0a1b.scope\n")
        actions = Actions(mode="enforce", journal=Journal(tmp_path / "journal.json"),
                          cgroup_root=tmp_path / "cgroup", workload_proc_root=proc)
        assert actions.signal(sleeper.pid, signal.SIGTERM, reason="x") is False
        assert sleeper.poll() is None  # in the test's own cgroup, which is no pod
        assert actions.counts() == {("signal_term", "refused"): 1}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_audit_counts_the_thaws_of_release_and_thaw_all_as_enforce_does(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path
) -> None:
    """Enforce counts a thaw for every frozen cgroup it releases (a pod taken off throttling, the memory
    ladder thawing before its signal) or thaws at shutdown: audit counts the same thaws, one for one."""
    first, second = cgroup_sandbox.spawn(pod_path()), cgroup_sandbox.spawn(pod_path())
    if UNIFIED not in first.cgroup_paths:
        pytest.skip("no cgroup v2 hierarchy here")
    journal = Journal(tmp_path / "journal.json")
    actions = Actions(mode="audit", journal=journal)
    targets = [FreezeTarget("v2", p.cgroup_paths[UNIFIED]) for p in (first, second)]
    for target in targets:
        assert actions.freeze(target, reason="over its share") is False
    assert actions.release(targets[0]) is True
    assert actions.release(targets[0]) is True  # no longer would-be frozen: nothing more to count
    actions.thaw_all()
    assert actions.counts() == {("freeze", "audit"): 2, ("thaw", "audit"): 2}
    assert not journal.path.exists() and actions.frozen == frozenset()
    for process in (first, second):
        assert (process.paths[UNIFIED] / "cgroup.freeze").read_text().strip() == "0"


# -- the agent's ladder on real processes --------------------------------------------------------------

@pytest.mark.integration
async def test_the_ladder_in_audit_signals_nobody_and_every_surface_says_would(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod over its GPU memory limit, in audit: the ladder steps on at enforce's times (would SIGTERM, then
    would SIGKILL, as for a process that ignored its SIGTERM), the process runs on, no counter says anything
    was done, and the log, /v1/state, /metrics and top say what would be."""
    uid = new_pod_uid()
    process = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd",
                                                          new_container_id()))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "audit", "gpus": [{"model": "H100-SXM5-80GB"}],
                                        "processes": [{"pid": process.pid, "name": "hog", "gpu": 0,
                                                       "memory": "10Gi", "sm_util": 10}]}))
    config = tmp_path / "gpuagent.yaml"
    config.write_text(yaml.safe_dump({
        "backend": "sim", "scenario": str(scenario), "mode": "audit", "poll_interval": 0.2,
        "memory_term_after": 0.4, "memory_kill_grace": 0.8, "journal_path": str(tmp_path / "journal.json"),
        "pod_resources_socket": None, "kubernetes_api": "off",
        "policies": [{"match_pod": uid, "gpu_memory": "4Gi"}],
    }))
    agent = Agent(load_config(str(config), env={}))
    try:
        with caplog.at_level(logging.INFO):
            deadline = time.monotonic() + 60  # 1.2 s of ladder; a loaded machine polls slowly
            while True:
                await agent.poll_once()
                state = agent.latest.enforcement
                if state is not None and [m.stage for m in state.memory] == ["killed"]:
                    break
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.1)
        metrics = generate_latest(agent.registry).decode()
        body = json.loads(json.dumps(to_jsonable(agent.latest)))
    finally:
        await agent.aclose()
    assert process.popen.poll() is None  # never signalled
    assert not (tmp_path / "journal.json").exists()
    counts = dict(state.actions_total)
    assert counts[("signal_term", "audit")] == 1 and counts[("signal_kill", "audit")] == 1, counts
    assert acted(counts) == {}, counts
    [memory] = state.memory
    assert (memory.next_step, memory.next_step_at_unix) == (None, None)  # nothing left it would do
    # the log: the warning says what would follow, and when; each signal is one that would be sent
    said = [r.getMessage() for r in caplog.records]
    assert any("GPU memory limit exceeded" in line and "audit: would SIGTERM its GPU processes after 0.4s over, "
               "SIGKILL those still on the GPU 0.8s later; nothing is signalled" in line for line in said), said
    assert any(line.startswith(f"audit: would send SIGTERM to PID {process.pid} (") for line in said), said
    assert any(line.startswith(f"audit: would send SIGKILL to PID {process.pid} (") for line in said), said
    assert not any("has exited" in line or line.startswith("sent SIG") for line in said), said
    # /metrics: counted as audit, nothing as done
    exposed = actions_of(metrics)
    assert exposed[("signal_term", "audit")] == 1 and exposed[("signal_kill", "audit")] == 1
    assert acted(exposed) == {}, exposed
    assert 'gpuagent_enforcement_mode{mode="audit"} 1.0' in metrics
    assert "memory ladder (audit mode: the step it would have taken)" in metrics  # the stage gauge's HELP
    assert re.search(r'gpuagent_pod_gpu_memory_limit_stage\{[^}]*stage="killed"\} 1\.0', metrics)
    # /v1/state: the counts as JSON objects by action and outcome, and the ladder's stage under mode audit
    enforcement = body["enforcement"]
    assert enforcement["mode"] == "audit"
    assert enforcement["actions_total"]["signal_kill"] == {"audit": 1}, enforcement["actions_total"]
    assert [m["stage"] for m in enforcement["memory"]] == ["killed"]


# -- top ---------------------------------------------------------------------------------------------------

def _state(mode: str) -> dict:
    """A recorded /v1/state (audit mode, a pod throttled and one on the memory ladder) in ``mode``."""
    state = json.loads((ROOT / "tests" / "fixtures" / "top" / "demo-k8s-node.json").read_text())
    enforcement = state["enforcement"]
    enforcement["mode"] = mode
    for entry in enforcement["memory"]:
        if entry["pod"] == "notebook-alice-0":
            entry["stage"] = "killed"
    for share in enforcement["shares"]:
        if share["pod"] == "notebook-alice-0":
            share["frozen_ratio"] = 0.8
    return state


def _alice(mode: str) -> str:
    node = node_view(_state(mode))
    [tenant] = [t for g in node.gpus for t in g.tenants if t.name == "research/notebook-alice-0" and t.allocated]
    return tenant_line(tenant, 150, expanded=False).plain


def test_top_says_would_in_audit_and_what_was_done_in_enforce() -> None:
    audit = _alice("audit")
    assert "would 80%" in audit and "would kill" in audit, audit
    enforce = _alice("enforce")
    assert "would" not in enforce and re.search(r" 80% .* killed ", enforce), enforce


# -- the demo node -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``gpuagent demo`` (audit, its default) with the memory ladder shortened to seconds; (url, log)."""
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuagent", "demo", "--listen", url.removeprefix("http://"),
                                 "--poll-interval", "0.5", "--memory-term-after", "0.5",
                                 "--memory-kill-grace", "1"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=clean_env())
    try:
        yield url, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise


def _alice_killed(url: str) -> dict | None:
    """The demo's /v1/state once notebook-alice-0 is at the ladder's last step, else None."""
    with contextlib.suppress(OSError, ValueError):
        status, body = get(url + "/v1/state")
        state = json.loads(body) if status == 200 else {}
        memory = (state.get("enforcement") or {}).get("memory") or []
        if any(m["pod"] == "notebook-alice-0" and m["stage"] == "killed" for m in memory):
            return state
    return None


@pytest.mark.integration
def test_the_demos_audit_takes_no_action_on_any_surface(demo: tuple[str, Path]) -> None:
    url, log = demo
    # the ladder's last step, and the throttling decision the controller ramps up to over a few polls
    throttled = re.compile(r"audit: would freeze research/notebook-alice-0 \d+% of each period \(share 20%\); "
                           "nothing is frozen")  # the demo has no freezer: said once, by the enforcer
    deadline = time.monotonic() + 120  # a loaded machine starts the demo slowly
    while (state := _alice_killed(url)) is None or not throttled.search(log.read_text()):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    # /v1/state: counts by action and outcome, every one of them "audit" (or a refusal)
    counts = state["enforcement"]["actions_total"]
    assert counts["signal_kill"]["audit"] >= 1 and counts["signal_term"]["audit"] >= 1, counts
    assert {outcome for by in counts.values() for outcome in by} <= {"audit", "refused"}, counts
    # /metrics: not one action taken, no process gone
    exposed = actions_of(get(url + "/metrics")[1])
    assert exposed[("signal_kill", "audit")] >= 1 and acted(exposed) == {}, exposed
    # top: the frozen part and the ladder's step are what it would do
    out = subprocess.run([sys.executable, "-m", "gpuagent", "top", "--agent", url, "--once", "--width", "150"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean_env())
    assert out.returncode == 0, out.stderr
    [alice] = [line for line in out.stdout.splitlines() if "research/notebook-alice-0" in line
               and "not allocated" not in line]
    assert "would kill" in alice and re.search(r"would \d+%", alice), out.stdout
    assert "mode audit (says what it would do)" in out.stdout
    # the log: decisions, never a death the agent did not cause
    text = log.read_text()
    assert "audit: would send SIGKILL to PID" in text and "has exited" not in text, text[-3000:]
