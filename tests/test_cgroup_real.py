"""``CgroupReader`` on real processes in real cgroups laid out like kubelet's (root only; see cgroups.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cgroups import (
    UNIFIED,
    CgroupSandbox,
    cgroups_unavailable,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)

from gpuagent.pods.cgroup import CgroupParseError, CgroupReader

pytestmark = pytest.mark.integration


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


# (driver, qos, runtime) for (a)-(d): kubelet layouts; runtime as the identity reports it.
POD_LAYOUTS = {
    "systemd-containerd-burstable": ("systemd", "burstable", "containerd", "containerd"),
    "systemd-crio-guaranteed": ("systemd", "guaranteed", "cri-o", "cri-o"),
    "systemd-docker-besteffort": ("systemd", "besteffort", "docker", "docker"),
    "cgroupfs-burstable": ("cgroupfs", "burstable", "containerd", "unknown"),  # the path does not say
}


def wait_until_zombie(pid: int) -> None:
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, f"PID {pid} did not become a zombie"
        time.sleep(0.005)


@pytest.mark.parametrize("layout", sorted(POD_LAYOUTS))
def test_pod_container_in_v2_and_v1(cgroup_sandbox: CgroupSandbox, layout: str) -> None:
    driver, qos, runtime, reported_runtime = POD_LAYOUTS[layout]
    uid, cid = new_pod_uid(), new_container_id()
    proc = cgroup_sandbox.spawn(kubelet_container_path(driver, qos, uid, runtime, cid))
    assert len(proc.paths) > 1, "expected the v2 and some v1 hierarchies"

    identity = CgroupReader().identify(proc.pid)

    assert identity is not None
    assert (identity.is_k8s, identity.is_container, identity.workload_kind) == (True, True, "pod")
    assert (identity.pod_uid, identity.qos, identity.container_id) == (uid, qos, cid)
    assert (identity.driver, identity.runtime, identity.deleted) == (driver, reported_runtime, False)
    assert identity.cgroup_version == ("hybrid" if UNIFIED in proc.paths and len(proc.paths) > 1 else "1")
    # The identifying path is a real cgroup holding the process.
    key = UNIFIED if UNIFIED in proc.paths else next(iter(proc.paths))
    assert identity.path == proc.cgroup_paths[key]
    assert str(proc.pid) in (proc.paths[key] / "cgroup.procs").read_text().split()


def test_systemd_service_outside_kubernetes(cgroup_sandbox: CgroupSandbox) -> None:
    unit = f"gpu-test-{secrets.token_hex(4)}.service"
    proc = cgroup_sandbox.spawn(f"system.slice/{unit}")

    identity = CgroupReader().identify(proc.pid)

    assert identity is not None
    assert (identity.is_k8s, identity.is_container, identity.pod_uid) == (False, False, None)
    assert (identity.workload_kind, identity.unit, identity.driver) == ("systemd_service", unit, "systemd")


def test_colons_and_spaces_in_a_real_cgroup_name(cgroup_sandbox: CgroupSandbox) -> None:
    proc = cgroup_sandbox.spawn("custom jobs/gpu:burn test")

    identity = CgroupReader().identify(proc.pid)

    assert identity is not None
    assert identity.path in proc.cgroup_paths.values()
    assert identity.path.endswith("/custom jobs/gpu:burn test")
    assert (identity.workload_kind, identity.is_k8s, identity.driver) == ("unknown", False, None)


def test_kernel_refuses_a_newline_in_a_cgroup_name(cgroup_sandbox: CgroupSandbox) -> None:
    """Why a forged /proc/PID/cgroup line cannot come from a directory name here (the parser checks anyway)."""
    proc = cgroup_sandbox.spawn("tenant")
    for directory in proc.paths.values():
        with pytest.raises(OSError) as info:
            (directory / "x\n0::forged").mkdir()
        assert info.value.errno == errno.EINVAL


def test_pod_only_in_v1_hierarchies_is_found_there(cgroup_sandbox: CgroupSandbox) -> None:
    """A hybrid host whose 0:: line says nothing (the runtime left the process at the v2 root)."""
    if cgroup_sandbox.hierarchy("freezer") is None or cgroup_sandbox.hierarchy(UNIFIED) is None:
        pytest.skip("needs a v1 freezer hierarchy beside cgroup v2")
    uid, cid = new_pod_uid(), new_container_id()
    path = kubelet_container_path("cgroupfs", "besteffort", uid, "cri-o", cid)
    proc = cgroup_sandbox.spawn(path, controllers=["freezer", "pids", "name=systemd"])

    identity = CgroupReader().identify(proc.pid)

    assert identity is not None
    assert (identity.cgroup_version, identity.pod_uid, identity.container_id) == ("hybrid", uid, cid)
    assert identity.path == proc.cgroup_paths["freezer"]


def test_pod_only_in_v2_beside_unrelated_v1_paths(cgroup_sandbox: CgroupSandbox) -> None:
    if cgroup_sandbox.hierarchy(UNIFIED) is None:
        pytest.skip("needs cgroup v2")
    uid, cid = new_pod_uid(), new_container_id()
    proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "besteffort", uid, "containerd", cid),
                                controllers=[UNIFIED])

    identity = CgroupReader().identify(proc.pid)

    assert identity is not None
    assert (identity.pod_uid, identity.container_id, identity.path) == (uid, cid, proc.cgroup_paths[UNIFIED])


def test_exited_pid_is_none(cgroup_sandbox: CgroupSandbox) -> None:
    proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", new_pod_uid(), "containerd",
                                                       new_container_id()))
    reader = CgroupReader()
    assert reader.identify(proc.pid) is not None
    proc.kill()
    assert reader.identify(proc.pid) is None
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert reader.identify(pid_max + 1) is None  # never a PID


def test_zombie_keeps_its_pod_and_reads_deleted(cgroup_sandbox: CgroupSandbox) -> None:
    if cgroup_sandbox.hierarchy(UNIFIED) is None:
        pytest.skip("needs cgroup v2: v1 lines of a zombie read '/'")
    uid, cid = new_pod_uid(), new_container_id()
    proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "guaranteed", uid, "cri-o", cid))
    os.kill(proc.pid, signal.SIGKILL)
    wait_until_zombie(proc.pid)
    reader = CgroupReader()

    alive_in_v2 = reader.identify(proc.pid)
    proc.paths[UNIFIED].rmdir()  # the runtime removes the container's cgroup before the reaper runs
    deleted = reader.identify(proc.pid)

    assert alive_in_v2 is not None and deleted is not None
    assert (alive_in_v2.pod_uid, alive_in_v2.container_id, alive_in_v2.deleted) == (uid, cid, False)
    assert (deleted.pod_uid, deleted.container_id, deleted.deleted) == (uid, cid, True)
    assert deleted.path == proc.cgroup_paths[UNIFIED]
    proc.kill()
    assert reader.identify(proc.pid) is None


def test_cleanup_happens_even_when_the_test_fails() -> None:
    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    opened: list[CgroupSandbox] = []
    with pytest.raises(RuntimeError, match="boom"), CgroupSandbox.open() as sandbox:
        opened.append(sandbox)
        procs = [sandbox.spawn(kubelet_container_path("cgroupfs", qos, new_pod_uid(), "docker", new_container_id()))
                 for qos in ("guaranteed", "burstable")]
        assert all(d.is_dir() for p in procs for d in p.paths.values())
        raise RuntimeError("boom")
    (sandbox,) = opened
    assert sandbox.created
    assert not sandbox.leftovers()
    assert not [d for d in sandbox.created if d.exists()]
    for proc in procs:
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)


# --- a fake /proc --------------------------------------------------------------------------------------

def test_fake_proc_root(tmp_path: Path) -> None:
    uid = "f9a04ecc-1875-491b-926c-d2f64757704e"
    cid = "47e320f795efcec1ecf2001c3a09c95e3701ed87de8256837b70b10e23818251"
    text = (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podf9a04ecc_1875_491b_926c_d2f64757704e"
        f".slice/cri-containerd-{cid}.scope\n"
    )
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(text)
    (tmp_path / "4243").mkdir()
    (tmp_path / "4243" / "cgroup").write_text("")  # the task exited while the file was open
    (tmp_path / "4244").mkdir()
    (tmp_path / "4244" / "cgroup").write_text("not a cgroup line\n")
    (tmp_path / "4245").write_text("a file where a directory should be")
    (tmp_path / "4246").mkdir()
    (tmp_path / "4246" / "cgroup").write_bytes(b"0::/custom/caf\xe9 \xff\n")  # not UTF-8

    reader = CgroupReader(tmp_path)
    identity = reader.identify(4242)

    assert identity is not None
    assert (identity.pod_uid, identity.container_id, identity.runtime) == (uid, cid, "containerd")
    assert reader.identify(4243) is None
    assert reader.identify(9999) is None
    assert reader.identify(4245) is None
    with pytest.raises(CgroupParseError, match="line 1"):
        reader.identify(4244)
    odd = reader.identify(4246)
    assert odd is not None and os.fsencode(odd.path) == b"/custom/caf\xe9 \xff"
    with pytest.raises(ValueError, match="not a PID"):
        reader.identify(0)


STARTER = """
import json, os, sys
sys.path.insert(0, sys.argv[2])
from cgroups import CgroupSandbox
sandbox = CgroupSandbox.open().__enter__()
process = sandbox.spawn("orphan")
with open(sys.argv[1], "w") as out:
    json.dump({"pid": process.pid, "created": [str(d) for d in sandbox.created]}, out)
os._exit(0)  # no close(): as a worker ended by another's internal error, or killed
"""


def test_a_sandboxed_process_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A burner that outlived its test starved every later test of a run (ten minutes, its cgroup at the
    highest CPU weight): a process started in a sandbox gets SIGKILL when its starter dies."""
    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    import json
    import subprocess
    import sys

    record = tmp_path / "started.json"
    subprocess.run([sys.executable, "-c", STARTER, str(record), str(Path(__file__).parent)], check=True,
                   timeout=60)
    started = json.loads(record.read_text())
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{started['pid']}").exists():  # reaped by init once killed
            assert time.monotonic() < deadline, "the sandboxed process outlived its starter"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(started["pid"], signal.SIGKILL)
        for directory in sorted(map(Path, started["created"]), key=lambda d: len(d.parts), reverse=True):
            deadline = time.monotonic() + 10
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    assert time.monotonic() < deadline, f"{directory} not removable"
                    time.sleep(0.05)
