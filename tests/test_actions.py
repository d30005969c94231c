"""``enforce.actions``: freezes, thaws, signals and evictions through the one gate, on real cgroups laid out
like kubelet's with real processes (root; see cgroups.py), and Evictions against the fake API server."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from cgroups import (
    BUSY_LOOP,
    UNIFIED,
    CgroupProcess,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from fake_apiserver import FakeApiServer

from gpuagent.enforce.actions import ActionRefused, Actions, EvictionClient, FreezeTarget
from gpuagent.enforce.actions.freezer import Freezer
from gpuagent.enforce.journal import Journal, JournalError

REPO = Path(__file__).resolve().parent.parent
KEYS = {"v2": UNIFIED, "v1": "freezer"}  # our hierarchy names -> the sandbox's


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()  # closing the sandbox thaws what a test left frozen


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "freeze-journal.json")


@pytest.fixture
def make(cgroup_sandbox: CgroupSandbox, journal: Journal) -> Iterator[Callable[..., Actions]]:
    """make(mode="enforce", **kwargs) -> Actions on the real cgroupfs; everything thawed at teardown."""
    made: list[Actions] = []

    def _make(mode: str = "enforce", **kwargs: object) -> Actions:
        kwargs.setdefault("journal", journal)
        actions = Actions(mode=mode, **kwargs)  # type: ignore[arg-type]
        made.append(actions)
        return actions

    yield _make
    for actions in made:
        actions.thaw_all()


def pod_path(driver: str = "systemd") -> str:
    return kubelet_container_path(driver, "burstable", new_pod_uid(), "containerd", new_container_id())


def needs(sandbox: CgroupSandbox, hierarchy: str) -> None:
    if sandbox.hierarchy(KEYS[hierarchy]) is None:
        pytest.skip(f"no {KEYS[hierarchy]} hierarchy here")


def target_of(proc: CgroupProcess, hierarchy: str) -> FreezeTarget:
    return FreezeTarget(hierarchy, proc.cgroup_paths[KEYS[hierarchy]])


def control(proc: CgroupProcess, hierarchy: str) -> str:
    name = "cgroup.freeze" if hierarchy == "v2" else "freezer.state"
    return (proc.paths[KEYS[hierarchy]] / name).read_text().strip()


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def wait_for(predicate: Callable[[], object], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.002)


def assert_stopped(pid: int) -> None:
    before = cpu_ticks(pid)
    time.sleep(0.15)
    assert cpu_ticks(pid) == before, "a frozen process used CPU"


def assert_running(pid: int) -> None:
    before = cpu_ticks(pid)
    wait_for(lambda: cpu_ticks(pid) >= before + 3, timeout=2.0)  # 3 ticks: 30 ms of CPU at USER_HZ 100


# --- freeze and thaw on real cgroups --------------------------------------------------------------------

@pytest.mark.parametrize("hierarchy", ["v2", "v1"])
def test_freeze_stops_a_busy_process_and_thaw_resumes_it(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal, hierarchy: str
) -> None:
    needs(cgroup_sandbox, hierarchy)
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    actions = make()
    target = (actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
              if hierarchy == "v2" else actions.target_for(None, proc.cgroup_paths["freezer"]))
    assert target == target_of(proc, hierarchy)
    assert_running(proc.pid)

    assert actions.freeze(target, reason="share 0.30 over 0.25") is True
    assert control(proc, hierarchy) in ("1", "FROZEN", "FREEZING")
    assert target in journal and actions.frozen == {target}
    wait_for(lambda: actions.is_frozen(target))
    assert_stopped(proc.pid)

    assert actions.thaw(target) is True
    assert not actions.is_frozen(target) and actions.frozen == frozenset()
    assert control(proc, hierarchy) in ("0", "THAWED")
    assert_running(proc.pid)
    assert target in journal  # still throttling: the duty cycle will freeze it again

    assert actions.release(target) is True
    assert target not in journal and Journal(journal.path).entries() == ()
    assert actions.counts() == {("freeze", "done"): 1, ("thaw", "done"): 1}


def test_duty_cycle_writes_the_journal_once_and_skips_no_op_writes(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    actions = make()
    target = actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None
    writes: list[bool] = []
    real_write = Freezer._write
    monkeypatch.setattr(Freezer, "_write", staticmethod(
        lambda directory, hierarchy, *, frozen: (writes.append(frozen), real_write(directory, hierarchy,
                                                                                    frozen=frozen))))
    for _ in range(5):
        assert actions.freeze(target, reason="duty cycle")
        assert actions.freeze(target, reason="duty cycle")  # already frozen: no write
        assert actions.thaw(target)
        assert actions.thaw(target)  # already thawed: no write
    assert writes == [True, False] * 5
    assert journal.writes == 1  # journaled once, when throttling started
    assert actions.release(target) and journal.writes == 2
    assert actions.release(target) and actions.thaw(target) and journal.writes == 2  # idempotent
    assert actions.counts() == {("freeze", "done"): 5, ("thaw", "done"): 5}


def test_journal_is_written_before_the_freeze(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = cgroup_sandbox.spawn(pod_path())
    actions = make()
    target = actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None
    seen: list[object] = []
    real_write = Freezer._write

    def write(directory: str, hierarchy: str, *, frozen: bool) -> None:
        on_disk = [e.target for e in Journal(journal.path).entries()]  # what a crash now would leave
        seen.append((frozen, on_disk))
        real_write(directory, hierarchy, frozen=frozen)

    monkeypatch.setattr(Freezer, "_write", staticmethod(write))
    actions.freeze(target, reason="x")
    actions.release(target)
    assert seen == [(True, [target]), (False, [target])]  # thawed before it is un-journaled
    assert Journal(journal.path).entries() == ()


def test_no_journal_no_freeze(cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    (tmp_path / "a-file").write_text("")
    unwritable = Journal(tmp_path / "a-file" / "journal.json")  # ENOTDIR, even for root
    actions = make(journal=unwritable)
    target = actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None

    with caplog.at_level(logging.WARNING):
        assert actions.freeze(target, reason="x") is False
    assert actions.counts() == {("freeze", "failed"): 1}
    assert not actions.is_frozen(target) and control(proc, target.hierarchy) in ("0", "THAWED")
    assert actions.frozen == frozenset() and "cannot write the freeze journal" in caplog.text
    assert_running(proc.pid)

    def full(self: Journal, target: FreezeTarget, reason: str) -> bool:
        raise JournalError("disk full")

    monkeypatch.setattr(Journal, "add", full)
    assert make().freeze(target, reason="x") is False
    assert control(proc, target.hierarchy) in ("0", "THAWED")


def test_vanished_cgroup_is_gone_not_an_error(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    needs(cgroup_sandbox, "v2")
    actions = make()
    never = FreezeTarget("v2", cgroup_sandbox.cgroup_path(cgroup_sandbox.hierarchy(UNIFIED), pod_path()))
    assert actions.freeze(never, reason="x") is False
    assert actions.counts() == {("freeze", "gone"): 1}
    assert never not in journal and not actions.is_frozen(never)

    # Frozen, then the container ends and its cgroup is removed: the thaw finds it gone.
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP, controllers=[UNIFIED])
    target = target_of(proc, "v2")
    assert actions.freeze(target, reason="x")
    proc.kill()  # SIGKILL works on a v2-frozen task
    wait_for(lambda: not (proc.paths[UNIFIED] / "cgroup.procs").read_text().strip())
    proc.paths[UNIFIED].rmdir()
    assert actions.release(target) is True
    assert actions.counts()[("thaw", "gone")] == 1
    assert target not in journal and actions.frozen == frozenset()

    # Throttled (journaled, thawed in the cycle), then gone before the next freeze.
    proc = cgroup_sandbox.spawn(pod_path(), controllers=[UNIFIED])
    target = target_of(proc, "v2")
    assert actions.freeze(target, reason="x") and actions.thaw(target)
    proc.kill()
    wait_for(lambda: not (proc.paths[UNIFIED] / "cgroup.procs").read_text().strip())
    proc.paths[UNIFIED].rmdir()
    assert actions.freeze(target, reason="x") is False
    assert actions.counts()[("freeze", "gone")] == 2
    assert journal.entries() == () and Journal(journal.path).entries() == ()


def test_thaw_all_thaws_everything_and_empties_the_journal(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    procs = [cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP) for _ in range(3)]
    actions = make()
    targets = [actions.target_for(p.cgroup_paths.get(UNIFIED), p.cgroup_paths.get("freezer")) for p in procs]
    if "freezer" in procs[1].paths:  # one through the v1 freezer, where there is one
        targets[1] = actions.target_for(None, procs[1].cgroup_paths["freezer"])
    assert None not in targets
    for target in targets:
        assert actions.freeze(target, reason="x")  # type: ignore[arg-type]
    assert actions.thaw(targets[2])  # type: ignore[arg-type]  # journaled, thawed by the duty cycle
    for target in targets[:2]:
        wait_for(lambda t=target: actions.is_frozen(t))

    assert actions.thaw_all() == 2  # the third needed no write
    assert actions.frozen == frozenset() and journal.entries() == () and Journal(journal.path).entries() == ()
    for proc in procs:
        assert_running(proc.pid)
    assert actions.thaw_all() == 0


# --- crash recovery -------------------------------------------------------------------------------------

CRASHER = """
import sys, time
from gpuagent.enforce.actions import Actions, FreezeTarget
from gpuagent.enforce.journal import Journal
actions = Actions(mode="enforce", journal=Journal(sys.argv[1]))
assert actions.freeze(FreezeTarget(sys.argv[2], sys.argv[3]), reason="crash test")
print("frozen", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("hierarchy", ["v2", "v1"])
def test_recover_thaws_what_a_killed_agent_left_frozen(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal, hierarchy: str
) -> None:
    needs(cgroup_sandbox, hierarchy)
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    target = target_of(proc, hierarchy)
    agent = subprocess.Popen([sys.executable, "-c", CRASHER, str(journal.path), hierarchy, target.path],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert agent.stdout is not None
        ready, _, _ = select.select([agent.stdout], [], [], 10)
        line = agent.stdout.readline() if ready else b""
        assert line == b"frozen\n", agent.stderr.read() if agent.poll() is not None else "no answer"
    finally:
        agent.send_signal(signal.SIGKILL)  # kill -9: no cleanup of any kind
        agent.wait()
        assert agent.stdout is not None and agent.stderr is not None
        agent.stdout.close()
        agent.stderr.close()
    actions = make()  # the next agent, same journal
    wait_for(lambda: actions.is_frozen(target))
    assert_stopped(proc.pid)
    assert actions.throttling == {target} and actions.frozen == frozenset()
    assert Journal(journal.path).entries()[0].pid == agent.pid

    assert actions.recover() == 1
    assert not actions.is_frozen(target)
    assert_running(proc.pid)
    assert Journal(journal.path).entries() == ()
    assert actions.counts() == {("thaw", "done"): 1}
    assert actions.recover() == 0


def test_recover_after_a_crash_between_journal_and_freeze(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    """Journaled but never frozen (killed between the two): the thaw is harmless and the journal clears."""
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    target = FreezeTarget(*next((h, proc.cgroup_paths[k]) for h, k in KEYS.items() if k in proc.paths))
    journal.add(target, "never frozen")
    actions = make(mode="off")  # recovery undoes the agent's own doing in every mode
    assert actions.recover() == 1
    assert journal.entries() == ()
    assert_running(proc.pid)


def test_inherited_entries_are_thawed_by_thaw_all_and_thaw(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    needs(cgroup_sandbox, "v2")
    procs = [cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP, controllers=[UNIFIED]) for _ in range(2)]
    targets = [target_of(p, "v2") for p in procs]
    for target, proc in zip(targets, procs, strict=True):
        journal.add(target, "earlier run")
        (proc.paths[UNIFIED] / "cgroup.freeze").write_text("1")  # as an earlier run left it
    actions = make()
    assert actions.thaw(targets[0]) is True  # unknown state: written, entry kept
    assert not actions.is_frozen(targets[0]) and targets[0] in journal
    assert actions.thaw_all() == 1
    assert journal.entries() == ()
    for proc in procs:
        assert_running(proc.pid)


# --- the safety rules -----------------------------------------------------------------------------------

def test_refuses_cgroups_outside_kubepods_unless_allowed(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    proc = cgroup_sandbox.spawn("system.slice/slurmstepd.scope/job_42", argv=BUSY_LOOP)
    actions = make()
    assert actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer")) is None
    for hierarchy, key in KEYS.items():
        if key in proc.paths:
            target = FreezeTarget(hierarchy, proc.cgroup_paths[key])
            assert actions.freeze(target, reason="x") is False
            with pytest.raises(ActionRefused, match="not-kubepods") as info:
                actions.check(target)
            assert info.value.rule == "not-kubepods" and target.path in str(info.value)
    assert actions.counts() == {("freeze", "refused"): len(set(KEYS.values()) & set(proc.paths))}
    assert journal.entries() == () and not journal.path.exists()
    assert_running(proc.pid)

    allowed = make(allowed_outside_kubepods=["*/system.slice/slurmstepd.scope/job_*"])
    target = allowed.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None
    assert allowed.freeze(target, reason="slurm job over its share")
    wait_for(lambda: allowed.is_frozen(target))
    assert allowed.release(target)


def test_refuses_all_of_kubepods_or_a_qos_class(cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions]) -> None:
    needs(cgroup_sandbox, "v2")
    for driver in ("systemd", "cgroupfs"):
        proc = cgroup_sandbox.spawn(pod_path(driver), controllers=[UNIFIED])
        container = proc.cgroup_paths[UNIFIED]
        pod, qos = container.rsplit("/", 1)[0], container.rsplit("/", 2)[0]
        kubepods = container.rsplit("/", 3)[0]
        actions = make()
        for path in (qos, kubepods):
            with pytest.raises(ActionRefused, match="not-a-pod"):
                actions.check(FreezeTarget("v2", path))
            assert actions.freeze(FreezeTarget("v2", path), reason="x") is False
        actions.check(FreezeTarget("v2", pod))  # a pod's own cgroup, or a container's, is fine
        actions.check(FreezeTarget("v2", container))


@pytest.mark.parametrize(("path", "rule"), [
    ("/", "root"),
    ("//", "root"),
    ("/.", "root"),
    ("/kubepods.slice/../..", "dotdot"),
    ("/kubepods/burstable/pod0f6b3c2a-9e1d-4c7b-8a5e-2d4f6a8b0c1e/../../../etc", "dotdot"),
    ("/../../kubepods-besteffort-pod0f6b3c2a_9e1d_4c7b_8a5e_2d4f6a8b0c1e.slice/x", "dotdot"),
    ("kubepods/burstable/pod0f6b3c2a-9e1d-4c7b-8a5e-2d4f6a8b0c1e", "path"),
    ("/kubepods/besteffort/pod0f6b3c2a-9e1d-4c7b-8a5e-2d4f6a8b0c1e/\0x", "path"),
])
def test_refuses_root_dotdot_and_bad_paths(make: Callable[..., Actions], path: str, rule: str) -> None:
    actions = make()
    for hierarchy in actions.hierarchies:
        target = FreezeTarget(hierarchy, path)
        with pytest.raises(ActionRefused) as info:
            actions.check(target)
        assert info.value.rule == rule
        assert actions.freeze(target, reason="x") is False
    with pytest.raises(ActionRefused, match="'hierarchy'"):
        actions.check(FreezeTarget("v3", "/kubepods/x"))


def test_refuses_the_agents_own_cgroup_and_its_ancestors(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], tmp_path: Path
) -> None:
    """The agent running as a pod: its own container's cgroup and its pod's are off limits; a sibling
    container of another pod is not."""
    needs(cgroup_sandbox, "v2")
    own = cgroup_sandbox.spawn(pod_path(), controllers=[UNIFIED])
    other = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP, controllers=[UNIFIED])
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(Path("/proc/self/mountinfo").read_text())
    (proc / "self" / "cgroup").write_text(f"0::{own.cgroup_paths[UNIFIED]}\n")
    actions = make(proc_root=proc)
    container = own.cgroup_paths[UNIFIED]
    for path, rule in ((container, "own-cgroup"), (container.rsplit("/", 1)[0], "own-cgroup")):
        with pytest.raises(ActionRefused) as info:
            actions.check(FreezeTarget("v2", path))
        assert info.value.rule == rule
    assert actions.target_for(container, None) is None
    assert actions.freeze(FreezeTarget("v2", container), reason="x") is False
    assert (own.paths[UNIFIED] / "cgroup.freeze").read_text().strip() == "0"
    target = actions.target_for(other.cgroup_paths[UNIFIED], None)
    assert target is not None and actions.freeze(target, reason="x")
    assert actions.release(target)

    (proc / "self" / "cgroup").unlink()  # own cgroup unknown: nothing is frozen
    blind = make(proc_root=proc)
    with pytest.raises(ActionRefused, match="own-cgroup"):
        blind.check(FreezeTarget("v2", other.cgroup_paths[UNIFIED]))


def fake_tree(tmp_path: Path, layout: str, mount_root: str = "/") -> tuple[Path, Path]:
    """A cgroup root and a proc root whose mountinfo mounts v2 (pure or hybrid) and a v1 freezer there."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    lines = []
    if layout in ("pure", "hybrid"):
        v2 = root if layout == "pure" else root / "unified"
        lines.append(f"41 31 0:38 {mount_root} {v2} rw,relatime - cgroup2 cgroup2 rw")
    if layout in ("hybrid", "v1"):
        lines.append(f"37 31 0:34 {mount_root} {root / 'freezer'} rw,relatime - cgroup cgroup rw,freezer")
    (proc / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    (proc / "self" / "cgroup").write_text("6:freezer:/\n0::/system.slice/gpuagent.service\n")
    return root, proc


POD = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f6b3c2a_9e1d_4c7b_8a5e_2d4f6a8b0c1e.slice"


@pytest.mark.parametrize(("layout", "hierarchy", "where", "frozen", "thawed"), [
    ("pure", "v2", ".", "1", "0"),
    ("hybrid", "v2", "unified", "1", "0"),
    ("hybrid", "v1", "freezer", "FROZEN", "THAWED"),
    ("v1", "v1", "freezer", "FROZEN", "THAWED"),
])
def test_writes_where_mountinfo_says(tmp_path: Path, layout: str, hierarchy: str, where: str, frozen: str,
                                     thawed: str) -> None:
    root, proc = fake_tree(tmp_path, layout)
    name = "cgroup.freeze" if hierarchy == "v2" else "freezer.state"
    directory = root / where / POD.lstrip("/")
    directory.mkdir(parents=True)
    (directory / name).write_text(thawed)
    actions = Actions(mode="enforce", journal=Journal(tmp_path / "j.json"), cgroup_root=root, proc_root=proc)
    assert hierarchy in actions.hierarchies
    assert actions.target_for(POD, POD) == FreezeTarget("v2" if "v2" in actions.hierarchies else "v1", POD)
    target = actions.target_for(POD if hierarchy == "v2" else None, POD)
    assert target == FreezeTarget(hierarchy, POD)
    assert actions.freeze(target, reason="x") and (directory / name).read_text() == frozen
    assert actions.release(target) and (directory / name).read_text() == thawed
    # A missing cgroup is never created (no O_CREAT), and is "gone".
    missing = FreezeTarget(hierarchy, POD + "/cri-containerd-abc.scope")
    assert actions.freeze(missing, reason="x") is False
    assert not (directory / "cri-containerd-abc.scope").exists()
    assert actions.counts()[("freeze", "gone")] == 1


def test_nothing_mounted_means_nothing_frozen(tmp_path: Path) -> None:
    root, proc = fake_tree(tmp_path, "none")
    actions = Actions(mode="enforce", journal=Journal(tmp_path / "j.json"), cgroup_root=root, proc_root=proc)
    assert actions.hierarchies == {} and actions.target_for(POD, POD) is None
    with pytest.raises(ActionRefused, match="not-mounted"):
        actions.check(FreezeTarget("v2", POD))


def test_refuses_paths_that_resolve_outside_the_root(tmp_path: Path) -> None:
    root, proc = fake_tree(tmp_path, "pure")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cgroup.freeze").write_text("0")
    (root / "kubepods.slice").mkdir(parents=True)
    link = POD.rsplit("/", 1)[0] + "/kubepods-besteffort-pod9f6b3c2a_9e1d_4c7b_8a5e_2d4f6a8b0c1e.slice"
    (root / link.lstrip("/")).parent.mkdir(parents=True)
    (root / link.lstrip("/")).symlink_to(elsewhere)
    actions = Actions(mode="enforce", journal=Journal(tmp_path / "j.json"), cgroup_root=root, proc_root=proc)
    with pytest.raises(ActionRefused, match="outside-root"):
        actions.check(FreezeTarget("v2", link))
    assert actions.freeze(FreezeTarget("v2", link), reason="x") is False
    assert (elsewhere / "cgroup.freeze").read_text() == "0"


def test_paths_are_relative_to_the_mounted_cgroup(tmp_path: Path) -> None:
    """A hierarchy mounted from a sub-cgroup (mountinfo's root field): paths outside it are refused."""
    root, proc = fake_tree(tmp_path, "pure", mount_root="/node")
    directory = root / POD.lstrip("/")
    directory.mkdir(parents=True)
    (directory / "cgroup.freeze").write_text("0")
    (proc / "self" / "cgroup").write_text("0::/node/system.slice/gpuagent.service\n")
    actions = Actions(mode="enforce", journal=Journal(tmp_path / "j.json"), cgroup_root=root, proc_root=proc)
    assert actions.freeze(FreezeTarget("v2", "/node" + POD), reason="x")
    assert (directory / "cgroup.freeze").read_text() == "1"
    with pytest.raises(ActionRefused, match="outside-root"):
        actions.check(FreezeTarget("v2", POD))
    with pytest.raises(ActionRefused, match="'root'"):
        actions.check(FreezeTarget("v2", "/node"))
    actions.thaw_all()


# --- modes ----------------------------------------------------------------------------------------------

def test_audit_counts_and_touches_nothing(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal
) -> None:
    proc = cgroup_sandbox.spawn(pod_path(), argv=BUSY_LOOP)
    actions = make("audit")
    target = actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None
    assert actions.freeze(target, reason="x") is False
    assert actions.freeze(target, reason="x") is False  # would already be frozen
    assert actions.thaw(target) is True
    assert control(proc, target.hierarchy) in ("0", "THAWED") and not actions.is_frozen(target)
    assert not journal.path.exists() and actions.frozen == frozenset()
    assert_running(proc.pid)
    assert actions.signal(proc.pid, signal.SIGTERM, reason="x") is False
    assert proc.popen.poll() is None
    refused = FreezeTarget(target.hierarchy, "/system.slice/x.service")
    assert actions.freeze(refused, reason="x") is False  # the rules apply in audit too
    assert actions.counts() == {("freeze", "audit"): 1, ("thaw", "audit"): 1, ("signal_term", "audit"): 1,
                                ("freeze", "refused"): 1}


def test_off_acts_on_nothing_and_says_so(
    cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions], journal: Journal,
    caplog: pytest.LogCaptureFixture
) -> None:
    proc = cgroup_sandbox.spawn(pod_path())
    actions = make("off")
    target = actions.target_for(proc.cgroup_paths.get(UNIFIED), proc.cgroup_paths.get("freezer"))
    assert target is not None
    with caplog.at_level(logging.INFO, logger="gpuagent.enforce.actions"):
        assert actions.freeze(target, reason="x") is False
        assert actions.signal(proc.pid, signal.SIGKILL, reason="x") is False
        assert asyncio.run(actions.evict("ml-team", "job-0", reason="x")) == "off"
    assert actions.counts() == {} and not journal.path.exists()
    assert control(proc, target.hierarchy) in ("0", "THAWED") and proc.popen.poll() is None
    assert [r.getMessage() for r in caplog.records if "mode is off" in r.getMessage()] != []
    assert len([r for r in caplog.records if "mode is off" in r.getMessage()]) == 1  # said once
    with pytest.raises(ValueError, match="mode"):
        Actions(mode="on", journal=journal)


# --- signals --------------------------------------------------------------------------------------------

def test_sigterm_reaches_a_process_in_a_pod(cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    proc = cgroup_sandbox.spawn(pod_path())
    actions = make()
    used: list[int] = []
    real = signal.pidfd_send_signal
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig, *a: (used.append(sig), real(fd, sig, *a)))
    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail("os.kill is racy with PID reuse"))
    assert actions.signal(proc.pid, signal.SIGTERM, reason="GPU memory over its limit") is True
    assert proc.popen.wait(timeout=5) == -signal.SIGTERM
    assert used[-1] == signal.SIGTERM
    assert actions.counts() == {("signal_term", "done"): 1}


def test_a_pid_that_exited_is_gone(cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions]) -> None:
    proc = cgroup_sandbox.spawn(pod_path())
    proc.kill()  # exited and reaped
    actions = make()
    assert actions.signal(proc.pid, signal.SIGKILL, reason="x") is False
    assert actions.counts() == {("signal_kill", "gone"): 1}


def test_signal_refusals(cgroup_sandbox: CgroupSandbox, make: Callable[..., Actions]) -> None:
    outside = cgroup_sandbox.spawn("system.slice/sshd.service")
    protected = cgroup_sandbox.spawn(pod_path())
    actions = make(protected_pids=[protected.pid])
    refused = {
        1: "pid-1",
        os.getpid(): "own-pid",
        os.getppid(): "ancestor-pid",
        protected.pid: "protected-pid",
        outside.pid: "outside-kubepods",
        0: "pid",
        -5: "pid",
    }
    for pid in refused:
        assert actions.signal(pid, signal.SIGKILL, reason="x") is False
    assert actions.counts() == {("signal_kill", "refused"): len(refused)}
    assert outside.popen.poll() is None and protected.popen.poll() is None
    for pid, rule in refused.items():
        with pytest.raises(ActionRefused) as info:
            actions._signaller.check_pid(pid)
            actions._signaller.check_cgroups(pid, actions._signaller.cgroups_of(pid))
        assert info.value.rule == rule and str(pid) in str(info.value)
    with pytest.raises(ValueError, match="SIGTERM and SIGKILL"):
        actions.signal(outside.pid, signal.SIGSTOP, reason="x")

    allowed = make(allowed_outside_kubepods=["*/system.slice/sshd.service"])
    assert allowed.signal(outside.pid, signal.SIGTERM, reason="x") is True
    assert outside.popen.wait(timeout=5) == -signal.SIGTERM


# --- evictions ------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now



@pytest.fixture
async def evictor(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[Callable[..., Actions]]:
    clients: list[EvictionClient] = []

    def _make(mode: str = "enforce", **kwargs: object) -> Actions:
        client = EvictionClient(config=api.kubeconfig(), grace_period_seconds=kwargs.pop("grace", None))
        clients.append(client)
        kwargs.setdefault("clock", Clock())
        return Actions(mode=mode, journal=Journal(tmp_path / "j.json"), eviction_client=client,
                       **kwargs)  # type: ignore[arg-type]

    yield _make
    for client in clients:
        await client.aclose()


async def test_eviction_is_a_policy_v1_eviction(api: FakeApiServer, evictor: Callable[..., Actions]) -> None:
    actions = evictor(grace=30)
    assert await actions.evict("ml-team", "llm-train-7d9c6b8f5d-x2kqp", reason="GPU memory") == "evicted"
    (seen,) = api.evictions
    assert (seen.namespace, seen.name, seen.status, seen.authorization) == (
        "ml-team", "llm-train-7d9c6b8f5d-x2kqp", 201, "Bearer test-token")
    assert seen.body == {"apiVersion": "policy/v1", "kind": "Eviction",
                         "metadata": {"name": "llm-train-7d9c6b8f5d-x2kqp", "namespace": "ml-team"},
                         "deleteOptions": {"gracePeriodSeconds": 30}}
    assert actions.counts() == {("evict", "done"): 1}


async def test_a_pod_disruption_budget_blocks(api: FakeApiServer, evictor: Callable[..., Actions],
                                              caplog: pytest.LogCaptureFixture) -> None:
    api.pdb_blocks("ml-team", "job-0")
    actions = evictor()
    with caplog.at_level(logging.INFO, logger="gpuagent.enforce.actions"):
        assert await actions.evict("ml-team", "job-0", reason="x") == "blocked"
    assert api.evictions[0].status == 429
    assert "llm-train-pdb needs 2 healthy pods" in caplog.text
    assert actions.counts() == {("evict", "blocked"): 1}


async def test_evictions_are_rate_limited(api: FakeApiServer, evictor: Callable[..., Actions]) -> None:
    clock = Clock()
    actions = evictor(clock=clock, eviction_min_interval=60.0, eviction_burst=2, eviction_refill_interval=30.0)
    assert await actions.evict("a", "p1", reason="x") == "evicted"
    assert await actions.evict("a", "p1", reason="x") == "rate_limited"  # the same pod within a minute
    assert await actions.evict("a", "p2", reason="x") == "evicted"
    assert await actions.evict("a", "p3", reason="x") == "rate_limited"  # the node's burst is spent
    clock.now += 30
    assert await actions.evict("a", "p3", reason="x") == "evicted"  # one token back
    assert await actions.evict("a", "p1", reason="x") == "rate_limited"  # no token yet (pod interval over)
    clock.now += 31
    assert await actions.evict("a", "p1", reason="x") == "evicted"
    assert [e.name for e in api.evictions] == ["p1", "p2", "p3", "p1"]
    assert actions.counts() == {("evict", "done"): 4, ("evict", "rate_limited"): 3}


async def test_eviction_audit_failures_and_refusals(api: FakeApiServer, evictor: Callable[..., Actions]) -> None:
    audit = evictor("audit")
    assert await audit.evict("ml-team", "job-0", reason="x") == "audit"
    assert api.evictions == [] and audit.counts() == {("evict", "audit"): 1}

    actions = evictor()
    api.fail_next(403)
    result = await actions.evict("ml-team", "job-1", reason="x")
    assert result.startswith("failed: HTTP 403") and 'cannot create resource "pods/eviction"' in result
    api.fail_next(404)
    assert await actions.evict("ml-team", "job-2", reason="x") == "gone"
    for namespace, pod in (("ml-team", "../../nodes/x"), ("ML", "job"), ("ml-team", ""), ("a/b", "job")):
        assert (await actions.evict(namespace, pod, reason="x")).startswith("refused:")
    assert len(api.evictions) == 2
    await api.stop()
    assert (await actions.evict("ml-team", "job-3", reason="x")).startswith("failed: ")
    assert actions.counts() == {("evict", "failed"): 2, ("evict", "gone"): 1, ("evict", "refused"): 4}


async def test_eviction_client_without_configuration_fails_cleanly(tmp_path: Path) -> None:
    client = EvictionClient(kubeconfig_path=str(tmp_path / "missing-kubeconfig"))
    actions = Actions(mode="enforce", journal=Journal(tmp_path / "j.json"), eviction_client=client)
    assert (await actions.evict("ml-team", "job-0", reason="x")).startswith("failed: ")
    assert actions.counts() == {("evict", "failed"): 1}


def test_recover_keeps_entries_it_cannot_thaw_and_drops_impossible_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, proc = fake_tree(tmp_path, "pure")
    journal = Journal(tmp_path / "j.json")
    unmounted = FreezeTarget("v1", POD)  # the v1 freezer is not mounted (any more): maybe still frozen
    impossible = FreezeTarget("v2", "/kubepods.slice/../../etc")  # no freeze could have used it
    journal.add(unmounted, "earlier")
    journal.add(impossible, "hand-edited")
    actions = Actions(mode="enforce", journal=journal, cgroup_root=root, proc_root=proc)
    with caplog.at_level(logging.WARNING):
        assert actions.recover() == 0
    assert [e.target for e in Journal(journal.path).entries()] == [unmounted]
    assert actions.counts() == {("thaw", "failed"): 1, ("thaw", "refused"): 1}
    assert "no freeze could have used" in caplog.text and "not-mounted" in caplog.text
