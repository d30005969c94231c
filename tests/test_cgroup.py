"""``pods.cgroup``: the parse of ``/proc/PID/cgroup``, over the real-world fixtures (tests/fixtures/cgroup) and
beyond."""

from __future__ import annotations

import json

import pytest
from cgroups import kubelet_container_path
from fixture_files import CGROUP
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuagent.pods.cgroup import (
    CgroupIdentity,
    CgroupParseError,
    parse_proc_cgroup,
    split_proc_cgroup,
    unescape_pod_uid,
    unescape_systemd_name,
)

EXPECTED: dict[str, dict] = json.loads((CGROUP / "expected.json").read_text())
FIELDS = ("cgroup_version", "container_id", "driver", "is_container", "is_k8s", "pod_uid", "qos", "runtime")

# What the fixtures' notes say beyond the eight fields of expected.json.
NOTES: dict[str, dict[str, object]] = {
    "hybrid-cgroupfs-unified-line-disagrees.txt": {
        "workload_kind": "pod",
        "path": "/kubepods/burstable/pod8833712d-6e69-4f5c-95f3-aebd020ce2e7/"
        "95cbe853416f52d927dec41f1406dd75015ea131244a1ca875a7cd4ebe927ac8",
    },
    "hybrid-host-sshd-service.txt": {
        "workload_kind": "systemd_service", "unit": "ssh.service", "path": "/system.slice/ssh.service",
    },
    "v1-dind-kubelet-in-docker-cgroupfs.txt": {"workload_kind": "pod"},
    "v1-plain-docker.txt": {"workload_kind": "docker", "unit": None},
    "v1-containerd-colon-in-path.txt": {  # the freezer line, the one kubelet's runtime made
        "path": "/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:"
        "d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e",
    },
    "v2-cgroupns-root-only.txt": {"workload_kind": "unknown", "unit": None, "path": "/"},
    "v2-cgroupns-relative-nonk8s-docker.txt": {
        "workload_kind": "docker",
        "unit": "docker-ba7b10d15d16e10e3de7a2dcd408a3d971169ae303f46cfad4c5453c6326fee2.scope",
    },
    "v2-deleted-cgroup-zombie.txt": {"deleted": True, "workload_kind": "pod"},
    "v2-systemd-containerd-burstable.txt": {"deleted": False},
    "v2-host-containerd-service.txt": {"workload_kind": "systemd_service", "unit": "containerd.service"},
    "v2-kind-nested-systemd.txt": {"workload_kind": "pod"},
    "v2-plain-docker-scope.txt": {
        "workload_kind": "docker",
        "unit": "docker-b176419186d75a44628851daf7841d3374a2ec56d0b038ee3bd1e0c6d331e5b1.scope",
    },
    "v2-podman-rootless-container-subdir.txt": {
        "workload_kind": "podman",
        "unit": "libpod-f992ec4ed807f76e5e54c9c67d78f0a4105bf945420271c2558ba905e38d2108.scope",
    },
    "v2-raw-space-in-path.txt": {"workload_kind": "unknown", "path": "/custom jobs/gpu burn test"},
    "v2-systemd-crio-conmon-not-a-container.txt": {"workload_kind": "pod"},
    "v2-systemd-escaped-unit-name.txt": {
        "workload_kind": "systemd_service", "unit": "serial-getty@ttyS0.service",
        "path": "/system.slice/system-serial\\x2dgetty.slice/serial-getty@ttyS0.service",
    },
    "v2-user-session-relative.txt": {
        "workload_kind": "user_session", "unit": "session-3.scope",
        "path": "/../../user.slice/user-501.slice/session-3.scope",
    },
    "v2-user-session-tmux.txt": {
        "workload_kind": "user_session", "unit": "tmux-spawn-e780eea5-fcf4-4010-88be-18150805c48e.scope",
    },
}


def fixture_text(name: str) -> str:
    """A fixture file without its '#' header (no kernel line starts with '#')."""
    text = (CGROUP / name).read_text()
    return "\n".join(line for line in text.split("\n") if not line.startswith("#"))


def as_expected(identity: CgroupIdentity) -> dict[str, object]:
    """The eight fields the way expected.json writes them (cgroup_version 1, 2 or "hybrid")."""
    got = {name: getattr(identity, name) for name in FIELDS}
    version = identity.cgroup_version
    got["cgroup_version"] = int(version) if version.isdigit() else version
    return got


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    identity = parse_proc_cgroup(fixture_text(name))
    assert as_expected(identity) == EXPECTED[name]["expect"], EXPECTED[name].get("note")
    for field_name, value in NOTES.get(name, {}).items():
        assert getattr(identity, field_name) == value, field_name
    if identity.is_k8s and identity.pod_uid:
        assert identity.workload_kind == "pod"


def test_every_fixture_file_has_an_expectation() -> None:
    assert sorted(p.name for p in CGROUP.glob("*.txt")) == sorted(EXPECTED)
    assert set(NOTES) <= set(EXPECTED)


# --- unescaping ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("escaped", "uid"),
    [
        ("f9a04ecc_1875_491b_926c_d2f64757704e", "f9a04ecc-1875-491b-926c-d2f64757704e"),
        ("3e61c214bc3ed9ff81e21474dd6cba17", "3e61c214bc3ed9ff81e21474dd6cba17"),  # static pod: a hash
        ("f9a04ecc-1875-491b-926c-d2f64757704e", "f9a04ecc-1875-491b-926c-d2f64757704e"),
    ],
)
def test_unescape_pod_uid(escaped: str, uid: str) -> None:
    assert unescape_pod_uid(escaped) == uid


def test_systemd_pod_uid_comes_back_dashed() -> None:
    text = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab12cd34_0000_4111_8222_333344445555.slice"
    assert parse_proc_cgroup(text).pod_uid == "ab12cd34-0000-4111-8222-333344445555"


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        (r"system-serial\x2dgetty.slice", "system-serial-getty.slice"),
        (r"serial-getty@ttyS0.service", "serial-getty@ttyS0.service"),
        (r"mnt-my\x20disk.mount", "mnt-my disk.mount"),
        (r"a\x5cx2d.service", r"a\x2d.service"),  # an escaped backslash is decoded once, not twice
        (r"caf\xc3\xa9.service", "café.service"),  # escapes are bytes of UTF-8
        (r"bad\xff.service", r"bad\xff.service"),  # not UTF-8: stays escaped
        (r"\x2D.service", "-.service"),  # hex digits of either case, as systemd reads them
        (r"\X2d.service", r"\X2d.service"),  # but only a lower-case x starts an escape
    ],
)
def test_unescape_systemd_name(name: str, plain: str) -> None:
    assert unescape_systemd_name(name) == plain


def test_unit_keeps_systemds_own_spelling() -> None:
    identity = parse_proc_cgroup(r"0::/system.slice/system-getty.slice/getty@tty\x2d1.service")
    assert identity.unit == r"getty@tty\x2d1.service"
    assert unescape_systemd_name(identity.unit) == "getty@tty-1.service"


# --- the shape of lines --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no cgroup lines"),
        ("\n\n", "no cgroup lines"),
        ("garbage", "line 1: expected ID:CONTROLLERS:PATH"),
        ("0::/\ncpu:/", "line 2: expected ID:CONTROLLERS:PATH"),
        ("x:cpu:/", "line 1: hierarchy ID 'x' is not a number"),
        ("-1:cpu:/", "not a number"),
        ("\uff11:cpu:/", "not a number"),  # a fullwidth digit: isdigit() says yes, the kernel never writes it
        ("1" * 5000 + ":cpu:/", "not a number"),
        ("1:cpu:relative/path", "line 1: path 'relative/path' does not start with '/'"),
        ("1:cpu:", "does not start with '/'"),
        ("0:cpu:/", "hierarchy 0 (cgroup v2) lists controllers"),
        ("1:cpu:/a\n1:cpu:/b", "line 2: hierarchy 1 listed twice"),
        # A directory named "x\n0::/kubepods.slice/..." must not forge a second v2 line.
        ("0::/user.slice/x\n0::/kubepods.slice/kubepods-pod1.slice", "hierarchy 0 listed twice"),
        ("0::/tenant/evil\nname", "line 2: expected ID:CONTROLLERS:PATH"),
    ],
)
def test_malformed_text_raises_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(CgroupParseError, match=None) as info:
        parse_proc_cgroup(text)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_split_on_the_first_two_colons_only() -> None:
    (line,) = split_proc_cgroup("4:memory:/a:b:c d/e (deleted)")
    assert (line.hierarchy_id, line.controllers, line.path, line.deleted) == (4, ("memory",), "/a:b:c d/e", True)
    (merged,) = split_proc_cgroup("2:cpuset,cpu,cpuacct,memory:/x\n")
    assert merged.controllers == ("cpuset", "cpu", "cpuacct", "memory")


@pytest.mark.parametrize(
    "text",
    [
        "0::/a\r",  # '\r' is part of the path: only '\n' separates lines
        "0::/a\x0bb\x1cc\u2028d",  # characters str.splitlines() would split on
        "3::/odd",  # a v1 hierarchy with no controllers named
        "12:perf_event:/\n\n0::/\n",
        "0::/ (deleted)",
    ],
)
def test_odd_but_well_formed_text_parses(text: str) -> None:
    parse_proc_cgroup(text)


def test_versions() -> None:
    assert parse_proc_cgroup("0::/").cgroup_version == "2"
    assert parse_proc_cgroup("1:name=systemd:/").cgroup_version == "1"
    assert parse_proc_cgroup("1:name=systemd:/\n0::/").cgroup_version == "hybrid"


# --- recognition beyond the fixtures -------------------------------------------------------------------

UID = "0b0c0d0e-1111-4222-8333-444455556666"
UID_ = UID.replace("-", "_")
CID = "ab" * 32
CID2 = "cd" * 32


@pytest.mark.parametrize(
    ("path", "expect"),
    [
        # Slurm: cgroup/v1 plugin, cgroup/v2 plugin (slurmstepd's scope).
        ("/slurm/uid_1000/job_1234/step_0/task_0",
         {"workload_kind": "slurm_job", "unit": "job_1234", "driver": "cgroupfs", "is_k8s": False}),
        ("/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0",
         {"workload_kind": "slurm_job", "unit": "job_77", "driver": "systemd"}),
        ("/system.slice/node1_slurmstepd.scope/job_5/step_0/user/task_0", {"workload_kind": "slurm_job"}),
        ("/jobs/job_1", {"workload_kind": "unknown"}),  # "job_" alone is not Slurm
        # systemd, outside Kubernetes.
        ("/init.scope", {"workload_kind": "host", "unit": "init.scope", "driver": "systemd"}),
        ("/system.slice", {"workload_kind": "host", "unit": "system.slice"}),
        ("/system.slice/nvidia-persistenced.service",
         {"workload_kind": "systemd_service", "unit": "nvidia-persistenced.service", "is_container": False}),
        ("/system.slice/run-r1234.scope", {"workload_kind": "systemd_service", "unit": "run-r1234.scope"}),
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service",
         {"workload_kind": "user_session", "unit": "jupyter.service"}),
        ("/.service", {"workload_kind": "unknown", "driver": None}),
        # Containers outside Kubernetes.
        ("/docker/" + CID + "/docker/" + CID2, {"workload_kind": "docker", "container_id": CID2}),
        ("/machine.slice/libpod-" + CID + ".scope",
         {"workload_kind": "podman", "runtime": "podman", "container_id": CID, "is_container": True}),
        ("/machine.slice/libpod-conmon-" + CID + ".scope",
         {"workload_kind": "podman", "is_container": False, "container_id": None}),
        ("/libpod_parent/libpod-" + CID, {"workload_kind": "podman", "driver": "cgroupfs", "unit": None}),
        ("/system.slice/containerd.service/" + CID, {"workload_kind": "systemd_service", "container_id": None}),
        # Kubernetes shapes.
        (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
         {"workload_kind": "pod", "pod_uid": UID, "is_container": False, "runtime": None, "qos": "burstable"}),
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/sub/child",
         {"container_id": CID, "qos": "guaranteed", "runtime": "containerd"}),
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/something-else",
         {"pod_uid": UID, "is_container": False, "container_id": None}),
        (f"/kubepods/pod{UID}/crio-conmon-{CID}", {"runtime": "cri-o", "is_container": False, "driver": "cgroupfs"}),
        ("/kubepods.slice/kubepods-besteffort.slice",
         {"is_k8s": True, "pod_uid": None, "qos": "besteffort", "workload_kind": "unknown", "driver": "systemd"}),
        ("/kubepods/burstable", {"is_k8s": True, "qos": "burstable", "driver": "cgroupfs"}),
        ("/kubepods", {"is_k8s": True, "qos": None}),
        # A kubelet in a container in a pod: the innermost pod is the process's.
        (f"/kubepods/burstable/pod11111111-2222-4333-8444-555555555555/{CID2}/kubelet/kubepods/besteffort/pod{UID}/{CID}",
         {"pod_uid": UID, "container_id": CID, "qos": "besteffort"}),
        (f"/a-b.slice/a_b-kubepods.slice/a_b-kubepods-besteffort.slice/a_b-kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope",
         {"pod_uid": UID, "runtime": "docker", "qos": "besteffort"}),
        # Seen through a cgroup namespace below kubepods (cgroupfs): the pod, QoS unknown or as far as seen.
        (f"/../pod{UID}/{CID}", {"is_k8s": True, "pod_uid": UID, "qos": None, "container_id": CID}),
        (f"/../../burstable/pod{UID}/{CID}", {"qos": "burstable", "pod_uid": UID}),
        (f"/../../somewhere/pod{UID}/{CID}", {"is_k8s": False, "workload_kind": "unknown"}),
        ("/../pod-not-a-uid/x", {"is_k8s": False}),
        (f"/pod{UID}/{CID}", {"is_k8s": False}),  # not vouched for by kubepods nor a namespace-relative path
        ("/..", {"is_k8s": None, "is_container": None, "workload_kind": "unknown"}),
        ("/kubepods-podx.slice.txt", {"is_k8s": False}),
        # Tokens that look like IDs but are not kubelet's.
        (f"/user.slice/user-1000.slice/session-4.scope/{CID}", {"workload_kind": "user_session", "container_id": None}),
        (f"/system.slice/app-{UID}.service", {"pod_uid": None, "workload_kind": "systemd_service"}),
        (f"/kubepods/burstable/pod{UID}/cri-containerd-{CID[:-1]}", {"is_container": False}),
        (f"/kubepods/burstable/pod{UID}/{CID.upper()}", {"is_container": False}),
    ],
)
def test_recognition(path: str, expect: dict[str, object]) -> None:
    identity = parse_proc_cgroup(f"0::{path}\n")
    got = {name: getattr(identity, name) for name in expect}
    assert got == expect
    assert identity.path == path


def test_hybrid_prefers_v2_when_it_agrees() -> None:
    pod = f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"
    identity = parse_proc_cgroup(f"5:freezer:{pod}\n1:name=systemd:{pod}\n0::{pod}\n")
    assert (identity.cgroup_version, identity.path, identity.container_id) == ("hybrid", pod, CID)


def test_hybrid_uses_the_most_telling_v1_line_when_v2_says_less() -> None:
    pod = f"/kubepods/burstable/pod{UID}/{CID}"
    text = f"6:memory:/process_api/1\n5:freezer:{pod}\n4:pids:{pod}/sub\n1:name=systemd:/init.scope\n0::/\n"
    identity = parse_proc_cgroup(text)
    assert (identity.path, identity.pod_uid, identity.container_id) == (pod, UID, CID)


def test_v1_tie_goes_to_the_preferred_controller() -> None:
    text = f"1:name=systemd:/a/kubepods/pod{UID}/{CID}\n7:cpu,cpuacct:/b/kubepods/pod{UID}/{CID}\n"
    assert parse_proc_cgroup(text).path == f"/b/kubepods/pod{UID}/{CID}"
    text += f"9:freezer:/c/kubepods/pod{UID}/{CID}\n"
    assert parse_proc_cgroup(text).path == f"/c/kubepods/pod{UID}/{CID}"


def test_a_zombie_on_a_hybrid_host_keeps_its_pod() -> None:
    # A killed, unreaped process: the kernel shows "/" on every v1 line and keeps the v2 path.
    pod = f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope"
    identity = parse_proc_cgroup(f"6:freezer:/\n4:memory:/\n0::{pod} (deleted)\n")
    assert (identity.pod_uid, identity.container_id, identity.deleted, identity.path) == (UID, CID, True, pod)


# --- properties ----------------------------------------------------------------------------------------

_NOISE = st.text(alphabet=st.sampled_from(list(":/\n0123456789,. _-\\xkubepodslicecrio")) | st.characters())


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _NOISE))
def test_arbitrary_text_raises_only_parse_errors(text: str) -> None:
    try:
        identity = parse_proc_cgroup(text)
    except CgroupParseError:
        return
    assert isinstance(identity, CgroupIdentity)


_CONTROLLERS = st.text(alphabet=st.characters(blacklist_characters=":\n"), max_size=20)
_PATH = st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=80).map(lambda s: "/" + s)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(min_value=1, max_value=64), st.tuples(_CONTROLLERS, _PATH), max_size=12),
       st.one_of(st.none(), _PATH))
def test_well_formed_text_never_raises(v1: dict[int, tuple[str, str]], v2: str | None) -> None:
    lines = [f"{hid}:{controllers or 'name=x'}:{path}" for hid, (controllers, path) in v1.items()]
    if v2 is not None:
        lines.append(f"0::{v2}")
    if not lines:
        return
    identity = parse_proc_cgroup("\n".join(lines))
    shown = [path for _, path in v1.values()] + ([v2] if v2 is not None else [])
    assert identity.path in [p.removesuffix(" (deleted)") for p in shown]


@settings(max_examples=200, deadline=None)
@given(
    uid=st.uuids().map(str) | st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    cid=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    driver=st.sampled_from(["systemd", "cgroupfs"]),
    qos=st.sampled_from(["guaranteed", "burstable", "besteffort"]),
    runtime=st.sampled_from(["containerd", "cri-o", "docker"]),
    root=st.sampled_from(["", "kubelet", "a-b/c"]),
)
def test_every_kubelet_layout_round_trips(uid: str, cid: str, driver: str, qos: str, runtime: str, root: str) -> None:
    path = "/" + kubelet_container_path(driver, qos, uid, runtime, cid, cgroup_root=root)
    identity = parse_proc_cgroup(f"0::{path}\n")
    expected_runtime = runtime if driver == "systemd" or runtime == "cri-o" else "unknown"
    assert (identity.is_k8s, identity.is_container, identity.workload_kind) == (True, True, "pod")
    assert (identity.pod_uid, identity.qos, identity.container_id) == (uid, qos, cid)
    assert (identity.driver, identity.runtime) == (driver, expected_runtime)
