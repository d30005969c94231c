"""End to end on this machine: real CPU-burning processes in real kubepods-shaped cgroups share one CPU,
the simulated GPU's per-process utilization follows their real CPU progress, the API server (a fake one
speaking the real JSON) gives them ``gpuagent.io/gpu-share`` annotations, and the agent enforces.

Achieved shares are the tenants' own work: each counts its iterations in a file, and a tenant's share is
its part of the iterations all of them did over the measured window, never anything the agent reports.
The tenants contend for one CPU the agent is moved off (``agent_off_the_burn_cpu``), and the tests that
judge shares run alone (``serial``): whatever else runs on that CPU slows every tenant alike, and the parts
of the work are what is judged, so a busy machine changes the pace, not the split. A run that misses is
measured once more (``held_shares``): a hiccup of the machine does not repeat, the agent's error does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from cgroups import CgroupSandbox, kubelet_container_path, new_pod_uid, sandbox_for_test
from fake_apiserver import NODE, FakeApiServer, container_id, make_pod
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from gpuagent.agent import Agent
from gpuagent.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.serial]

BURN_CPU = max(os.sched_getaffinity(0))  # the tenants contend for this one CPU (conftest's agent_off_the_burn_cpu)


# Pinned to one CPU at a high CPU priority (when allowed), counting its iterations into the file named by
# its argument (at most every 0.05 s).
_BURNER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
try:  # the CPU is theirs: whatever else the machine runs there gets little of it while a tenant is thawed
    os.setpriority(os.PRIO_PROCESS, 0, -15)
except OSError:
    pass
fd, n, last = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644), 0, 0.0
while True:
    for _ in range(2000):
        pass
    n += 1
    now = time.monotonic()
    if now - last > 0.05:
        os.pwrite(fd, b"%020d" % n, 0)
        last = now
"""


def burner(cpu: int, counter: Path | None = None) -> tuple[str, ...]:
    """The command of a burner on ``cpu``, counting into ``counter`` (None: counting nowhere)."""
    return ("python3", "-c", _BURNER, str(counter) if counter is not None else os.devnull, str(cpu))


def brief(states: list) -> list[tuple]:
    """What the agent decided, short enough to read in a failure: (pod, frozen, achieved, correction)."""
    return [(s.pod, round(s.frozen_ratio, 3), round(s.achieved_ratio, 3), s.correction_ratio) for s in states]


def read_count(path: Path) -> int:
    text = path.read_bytes().strip() if path.exists() else b""
    return int(text) if text else 0


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


@pytest.fixture(autouse=True)
def agent_before_the_rest() -> Iterator[None]:
    """The test process (the agent, its simulated GPU's CPU meter) at a high CPU priority where allowed:
    on a busy machine a starved meter reads the tenants' progress late, and the agent's slots end late."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, before)


async def run_enforced(
    sandbox: CgroupSandbox, tmp_path: Path, tenants: list[tuple[str, str | None, bool]], *,
    warmup: float, measure: float, mode: str = "enforce", scrape: list[str] | None = None,
    work_conserving: bool = True, settle: bool = False,
) -> tuple[dict[str, float], Agent, list]:
    """tenants: (pod name, gpu-share annotation or None, busy). Returns each pod's part of the iterations
    the busy pods did over ``measure`` (an idle pod: 0); ``scrape`` gets the agent's ``/metrics``, read over
    HTTP at the end of ``measure``; with ``settle`` the warmup starts once every busy pod is throttled
    (20 s at most): the time to get there is a bench's figure, the split once there is this test's."""
    procs, pods, processes, counters = {}, [], [], {}
    for name, share, busy in tenants:
        uid = new_pod_uid()
        path = kubelet_container_path("systemd", "burstable", uid, "containerd", container_id(uid, "main"))
        counters[name] = tmp_path / f"{name}.count"
        proc = sandbox.spawn(path, argv=burner(BURN_CPU, counters[name]) if busy else ("sleep", "600"))
        procs[name] = proc
        annotations = {"gpuagent.io/gpu-share": share} if share else {}
        pods.append(make_pod(name, namespace="ml", uid=uid, containers=("main",), annotations=annotations))
        processes.append({"pid": proc.pid, "name": name, "gpu": 0, "memory": "1Gi",
                          "sm_util": {"follow_cpu": {"scale": 1.0, "queue_seconds": 0.2}}})
    sandbox.favour_cpu()  # the tenants win their CPU against other tests' cgroups (the parallel pass)
    scenario = tmp_path / "share.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "share", "processes": processes,
                                        "gpus": [{"model": "H100-SXM5-80GB"}]}))
    async with FakeApiServer() as api:
        for pod in pods:
            api.add_pod(pod)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        listen = f"127.0.0.1:{free_port()}"
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(scenario), "listen": listen,
            "poll_interval": 0.5, "mode": mode, "journal_path": str(tmp_path / "journal.json"),
            "kubernetes_api": "on", "kubeconfig": str(kubeconfig), "hostname": NODE,
            "pod_resources_socket": None, "work_conserving": work_conserving,
        })
        agent = Agent(config)
        stop = asyncio.Event()
        serving = asyncio.create_task(agent.serve(stop))
        try:
            busy = [counters[name] for name, _, is_busy in tenants if is_busy]
            for _ in range(600):  # a loaded machine can take seconds to start an interpreter
                if all(read_count(c) > 0 for c in busy):
                    break
                await asyncio.sleep(0.05)
            if settle:  # every busy tenant takes its turns (joins come a poll or two apart): then the warmup
                for _ in range(40):
                    states = agent.latest.enforcement.shares if agent.latest and agent.latest.enforcement else ()
                    if {s.pod for s in states if s.frozen_ratio > 0} >= {n for n, _, b in tenants if b}:
                        break
                    await asyncio.sleep(0.5)
            await asyncio.sleep(warmup)
            before = {n: read_count(c) for n, c in counters.items()}
            await asyncio.sleep(measure)
            done = {n: read_count(c) - before[n] for n, c in counters.items()}
            total = sum(done.values())
            assert total > 0, "no tenant counted an iteration"
            shares = {n: d / total for n, d in done.items()}
            states = list(agent.latest.enforcement.shares) if agent.latest and agent.latest.enforcement else []
            if scrape is not None:
                async with aiohttp.ClientSession() as session, session.get(f"http://{listen}/metrics") as answer:
                    scrape.append(await answer.text())
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    for proc in procs.values():  # the agent thawed everything on its way out
        for key, directory in proc.paths.items():
            if key == "unified":
                assert (directory / "cgroup.freeze").read_text().strip() == "0"
        proc.kill()  # nothing of this run burns on beside a next one
    return shares, agent, states


def misses(shares: dict[str, float], targets: dict[str, float], points: float = 0.05) -> dict[str, float]:
    """The tenants further than ``points`` from their targets, with their shares."""
    return {name: round(shares[name], 3) for name, target in targets.items() if abs(shares[name] - target) > points}


async def held_shares(
    sandbox: CgroupSandbox, tmp_path: Path, tenants: list[tuple[str, str | None, bool]],
    targets: dict[str, float], **kwargs: object,
) -> tuple[dict[str, float], Agent, list]:
    """``run_enforced``, measured once more with fresh tenants, agent and API server when a tenant is more
    than 5 points from its target; fails when both runs miss, naming both. Why a second run: a hiccup of
    this machine (the agent's process stalled for a second, another program given the tenants' CPU) moves
    one slot's worth of work from one tenant to another, some 5 points of a 20 s window and about one
    3-tenant run in fifteen here; the agent's own error, a design's or a regression's, repeats in the second
    run, a hiccup does not."""
    tries = []
    for attempt in (1, 2):
        workdir = tmp_path / f"run{attempt}"
        workdir.mkdir()
        shares, agent, states = await run_enforced(sandbox, workdir, tenants, **kwargs)
        missed = misses(shares, targets)
        if not missed:
            return shares, agent, states
        tries.append((missed, shares, brief(states)))
    raise AssertionError(f"both runs missed by more than 5 points (missed, shares, agent's view): {tries}")


@pytest.mark.serial
async def test_shares_50_30_20_with_three_tenants_are_held_by_the_rotation(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, agent_off_the_burn_cpu: None
) -> None:
    """Three tenants within 5 points of 50/30/20. Two tenants at 70/30 are the GPU check's CI-size shares
    run on the simulator (``tests/test_gpu_check.py``'s ``all``, judged at the same bar), so that split is
    not measured twice: the suite's serial pass is the longest part of its five minutes."""
    _, agent, states = await held_shares(  # fails unless every tenant is within 5 points of its share
        cgroup_sandbox, tmp_path, [("a", "50", True), ("b", "30", True), ("c", "20", True)],
        {"a": 0.50, "b": 0.30, "c": 0.20}, warmup=5, measure=20, settle=True)
    # The rotation (the default scheme): each takes turns, frozen outside its slot of every period.
    by_pod = {s.pod: s for s in states}
    assert by_pod["c"].limit_ratio == 0.20 and by_pod["c"].throttled_seconds_total > 3
    assert 0.6 < by_pod["c"].frozen_ratio < 0.95 and 0.3 < by_pod["a"].frozen_ratio < 0.7, brief(states)
    assert by_pod["a"].frozen_ratio < by_pod["b"].frozen_ratio < by_pod["c"].frozen_ratio, brief(states)
    assert agent.latest.enforcement.share_scheme == "rotation"
    assert agent.latest.enforcement.share_period_seconds == 1.0
    counts = agent.latest.enforcement.actions_total
    assert counts.get(("freeze", "done"), 0) > 0 and not counts.get(("freeze", "failed"))


@pytest.mark.serial
async def test_an_idle_tenant_leaves_the_other_unthrottled(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, agent_off_the_burn_cpu: None
) -> None:
    shares, _, states = await run_enforced(
        cgroup_sandbox, tmp_path, [("busy", "30", True), ("idle", "70", False)], warmup=3, measure=5)
    assert shares["busy"] > 0.9, shares  # work-conserving: it may use what the idle tenant leaves
    busy = next(s for s in states if s.pod == "busy")
    assert busy.frozen_ratio == 0 and busy.throttled_seconds_total == 0


@pytest.mark.serial
async def test_audit_mode_decides_but_touches_nothing(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, agent_off_the_burn_cpu: None
) -> None:
    scrape: list[str] = []
    shares, _, states = await run_enforced(
        cgroup_sandbox, tmp_path, [("big", "70", True), ("small", "10", True)], warmup=3, measure=6,
        mode="audit", scrape=scrape, work_conserving=False)
    # Nobody was frozen: each did far more than its slot would have allowed (the small one's 10 % slot gives
    # it about 0.12 of the work, enforced; the big one's about 0.88). How evenly the kernel splits one CPU
    # between two unfrozen burners over 6 s is the kernel's business (0.39/0.61 in one fresh-clone run).
    assert shares["small"] > 0.3 and shares["big"] > 0.3, shares
    # Not work-conserving: the small pod is over its 10 % however busy the machine keeps the "GPU".
    small = next(s for s in states if s.pod == "small")
    assert 0 < small.frozen_ratio < 1 and small.throttled_seconds_total == 0  # decided, not done
    assert not (tmp_path / "journal.json").exists()  # nothing journaled: nothing was to be thawed
    # /metrics: the rotation's decisions for the pods' cgroups (the small one thawed for its 10 % slot of
    # every 1 s period), a freeze and a thaw per period each, under outcome="audit", never "done".
    families = {family.name: family for family in text_string_to_metric_families(scrape[0])}
    actions = {(s.labels["action"], s.labels["outcome"]): s.value
               for s in families["gpuagent_enforcement_actions"].samples if s.name.endswith("_total")}
    assert actions[("freeze", "audit")] >= 6, actions  # one each 1 s period (~8 s), not one per episode
    throttled = sum(1 for s in states if s.frozen_ratio > 0)  # one or both (below)
    assert 0 <= actions[("freeze", "audit")] - actions[("thaw", "audit")] <= throttled, actions  # each one open
    frozen = {s.labels["pod"]: s.value for s in families["gpuagent_pod_gpu_frozen_ratio"].samples}
    # the small pod is held to a slot of at most its 10 %; nothing being frozen, the readings stay where they
    # were, so whether the big one takes turns too is a matter of their noise: it is held less either way
    assert frozen["small"] >= 0.85 and frozen["big"] < frozen["small"], frozen
    assert not any(count for (_, outcome), count in actions.items() if outcome in ("done", "failed")), actions
