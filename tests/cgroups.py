"""Real cgroups laid out like kubelet's, with real processes in them, for integration tests.

Use the pytest fixture ``cgroup_sandbox`` (``pytest_plugins = ["cgroups"]`` in the root conftest, or the
two-line fixture shown in :func:`sandbox_for_test`)::

    def test_freeze(cgroup_sandbox):
        uid, cid = new_pod_uid(), new_container_id()
        proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd", cid),
                                    argv=BUSY_LOOP)
        proc.pid                        # a real child process, in that cgroup in every hierarchy used
        proc.paths["freezer"]           # /sys/fs/cgroup/freezer/<own cgroup>/gpuagent-test-1a2b3c4d/kubepods.slice/...
        proc.cgroup_paths["unified"]    # the same cgroup as /proc/PID/cgroup shows it

or the context managers ``CgroupSandbox.open()`` / ``cgroup_process(path)``. On exit, even when the test
failed, every process the sandbox started is killed (SIGKILL, by PID) and reaped, and every directory it
created is removed, deepest first; ``sandbox.leftovers()`` lists what could not be, and the fixture fails
the test if anything is left.

Layout. Each sandbox is one directory ``gpuagent-test-<8 hex>`` under the test process's *own* cgroup in
each hierarchy (``/sys/fs/cgroup/unified/``, ``/sys/fs/cgroup/<controller>/``, found in
``/proc/self/mountinfo``), so parallel or leftover runs never collide and the memory accounting of whoever
runs the tests still covers the children. Below it the layout is exactly kubelet's (see
:func:`kubelet_container_path`), the way a kubelet in a container (kind) lays out its pods below the node
container's cgroup: ``/proc/PID/cgroup`` reads ``0::/gpuagent-test-1a2b3c4d/kubepods.slice/...``. Which
hierarchies: ``controllers`` names them: ``"unified"`` for cgroup v2, controller names (``"freezer"``,
``"cpu"``, ``"name=systemd"``) for the v1 hierarchy carrying them, whatever they are co-mounted with
(``cpu`` and ``cpuacct`` are separate mounts on some hosts, ``cpu,cpuacct`` one on others); those not
mounted are skipped, so ``proc.paths`` says which were used.

What the kernel allows (measured on a hybrid host, Linux 6.18, no systemd as PID 1):

- Writing ``cgroup.procs`` in the v2 hierarchy of a hybrid host works: controllers bound to v1 are absent
  from cgroup2, and with no controller enabled in ``cgroup.subtree_control`` the no-internal-process rule
  does not apply. On a pure-v2 host with controllers enabled, processes may only enter leaves, which is all
  this helper does.
- v1 ``cpuset``: a new cgroup has empty ``cpuset.cpus`` and ``cpuset.mems``, and moving a task in fails
  with ENOSPC; each created level copies both from its parent first.
- A killed, not yet reaped (zombie) process leaves ``cgroup.procs`` at once: its v1 lines then read ``/``,
  its ``0::`` line keeps the path, and after ``rmdir`` of that v2 cgroup it reads ``0::/... (deleted)``.
- ``rmdir`` of a cgroup is EBUSY while a live process is in it, and may be briefly after the last one is
  reaped: removal retries for up to ``REMOVE_TIMEOUT_S``.
- On a systemd host, stay out of systemd's own slices: systemd may move processes it finds in cgroups it
  manages. The sandbox's unique top directory is not one of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = [
    "BUSY_LOOP",
    "DEFAULT_CONTROLLERS",
    "SLEEP",
    "CgroupProcess",
    "CgroupSandbox",
    "Hierarchy",
    "cgroup_process",
    "cgroup_sandbox",
    "cgroups_unavailable",
    "discover_hierarchies",
    "kubelet_container_path",
    "kubelet_pod_path",
    "new_container_id",
    "new_pod_uid",
    "sandbox_for_test",
    "select_hierarchies",
]

UNIFIED = "unified"
DEFAULT_CONTROLLERS = (UNIFIED, "freezer", "pids", "cpu", "cpuacct", "memory", "name=systemd")
SLEEP = ("sleep", "600")
BUSY_LOOP = (sys.executable, "-c", "while True: pass")
REMOVE_TIMEOUT_S = 5.0
_PREFIX = "gpuagent-test"


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy, as the test process sees it."""

    key: str  # "unified" for v2; the /proc/PID/cgroup controllers field for v1: "cpu,cpuacct", "name=systemd"
    controllers: frozenset[str]  # {"cpu", "cpuacct"}, {"name=systemd"}; empty for v2
    mountpoint: Path
    mount_root: str  # the cgroup mounted at mountpoint, usually "/"
    own_path: str  # the test process's cgroup in this hierarchy, as /proc/self/cgroup shows it

    @property
    def version(self) -> int:
        return 2 if self.key == UNIFIED else 1

    def directory(self, cgroup_path: str) -> Path:
        """The directory of a cgroup given as /proc/PID/cgroup shows it."""
        relative = os.path.relpath(cgroup_path, self.mount_root)
        if relative.startswith(".."):
            raise ValueError(f"{cgroup_path} is outside the {self.key} mount at {self.mountpoint}")
        return self.mountpoint if relative == "." else self.mountpoint / relative


def discover_hierarchies(proc_self: Path = Path("/proc/self")) -> dict[str, Hierarchy]:
    """The mounted cgroup hierarchies that hold the test process, by key ("unified", "freezer", ...)."""
    own: dict[frozenset[str], tuple[str, str]] = {}  # controllers -> (key, own path)
    for line in (proc_self / "cgroup").read_text().splitlines():
        hierarchy_id, _, rest = line.partition(":")
        field_text, _, path = rest.partition(":")
        if hierarchy_id == "0":
            own[frozenset()] = (UNIFIED, path)
        else:
            own[frozenset(field_text.split(","))] = (field_text, path)
    found: dict[str, Hierarchy] = {}
    for line in (proc_self / "mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        fstype, options = fields[separator + 1], set(fields[separator + 3].split(","))
        if fstype == "cgroup2":
            matches = [frozenset()] if frozenset() in own else []
        elif fstype == "cgroup":  # super options: "rw,cpu,cpuacct", "rw,name=systemd,xattr"
            matches = [c for c in own if c and c <= options]
        else:
            continue
        if len(matches) != 1:
            continue
        key, own_path = own[matches[0]]
        mount_root = _unescape_mountinfo(fields[3])
        if key in found or os.path.relpath(own_path, mount_root).startswith(".."):
            continue  # a second mount, or one showing another part of the tree
        mountpoint = Path(_unescape_mountinfo(fields[4]))
        found[key] = Hierarchy(key, matches[0], mountpoint, mount_root, own_path)
    return found


def select_hierarchies(
    controllers: Iterable[str] = DEFAULT_CONTROLLERS, available: dict[str, Hierarchy] | None = None
) -> tuple[Hierarchy, ...]:
    """The mounted hierarchies carrying any of ``controllers`` ("unified" for v2), v2 first."""
    wanted = set(controllers)
    hierarchies = (available if available is not None else discover_hierarchies()).values()
    chosen = [h for h in hierarchies if (h.key == UNIFIED and UNIFIED in wanted) or h.controllers & wanted]
    return tuple(sorted(chosen, key=lambda h: (h.version, h.key)))


def cgroups_unavailable(controllers: Iterable[str] = DEFAULT_CONTROLLERS) -> str | None:
    """Why real cgroups cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "creating cgroups needs root"
    try:
        hierarchies = select_hierarchies(controllers)
    except OSError as exc:
        return f"cannot read /proc/self: {exc}"
    if not hierarchies:
        return "no cgroup hierarchy mounted for " + ", ".join(controllers)
    for hierarchy in hierarchies:
        probe = hierarchy.directory(hierarchy.own_path) / f"{_PREFIX}-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"cannot create a cgroup in {hierarchy.mountpoint}: {exc}"
    return None


# --- kubelet's names ------------------------------------------------------------------------------------

def new_pod_uid() -> str:
    return str(uuid.uuid4())


def new_container_id() -> str:
    return secrets.token_hex(32)


def kubelet_pod_path(driver: str, qos: str, pod_uid: str, cgroup_root: str = "") -> str:
    """A pod's cgroup as kubelet names it (relative, no leading '/').

    ``driver`` "systemd": ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice``,
    each ``-`` of a component written as ``_`` and each level's name prefixed by its parents' (kubelet's
    ``ToSystemd``); "cgroupfs": ``kubepods/burstable/pod<uid>``. Guaranteed pods have no QoS level.
    ``cgroup_root`` is kubelet's ``--cgroup-root`` ("kubelet" in kind).
    """
    if qos not in ("guaranteed", "burstable", "besteffort"):
        raise ValueError(f"unknown QoS class {qos!r}")
    components = [c for c in cgroup_root.split("/") if c] + ["kubepods"]
    if qos != "guaranteed":
        components.append(qos)
    components.append(f"pod{pod_uid}")
    if driver == "cgroupfs":
        return "/".join(components)
    if driver != "systemd":
        raise ValueError(f"unknown cgroup driver {driver!r}")
    escaped = [c.replace("-", "_") for c in components]
    return "/".join("-".join(escaped[: depth + 1]) + ".slice" for depth in range(len(escaped)))


def kubelet_container_path(
    driver: str, qos: str, pod_uid: str, runtime: str, container_id: str, cgroup_root: str = ""
) -> str:
    """A container's cgroup as kubelet and its runtime name it: the pod's, then ``cri-containerd-<id>.scope``,
    ``crio-<id>.scope``, ``docker-<id>.scope`` (systemd driver), ``<id>`` or ``crio-<id>`` (cgroupfs)."""
    prefixes = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}
    if runtime not in prefixes:
        raise ValueError(f"unknown runtime {runtime!r}")
    if driver == "systemd":
        leaf = f"{prefixes[runtime]}-{container_id}.scope"
    else:
        leaf = f"crio-{container_id}" if runtime == "cri-o" else container_id
    return f"{kubelet_pod_path(driver, qos, pod_uid, cgroup_root)}/{leaf}"


# --- the sandbox -----------------------------------------------------------------------------------------

@dataclass
class CgroupProcess:
    """A child process the sandbox started and moved into a cgroup."""

    popen: subprocess.Popen[bytes]
    paths: dict[str, Path]  # hierarchy key -> the cgroup's directory
    cgroup_paths: dict[str, str]  # hierarchy key -> the cgroup's path as /proc/PID/cgroup shows it

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """End the process and reap it (its PID is then gone)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=REMOVE_TIMEOUT_S)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before it runs: SIGKILL when the process that started it dies. A burner that outlives
    its test (an xdist worker ended by another's internal error, a test killed by a timeout) burns on in a
    cgroup of the highest CPU weight and starves every later test of the run: seen in a fresh-clone run,
    two tenants burning for ten minutes after their worker was gone, the whole run at a crawl."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the parent died before the call: nobody would reap or kill this one
        os._exit(1)


@dataclass
class CgroupSandbox:
    """Cgroups under one unique directory per hierarchy, and the processes started in them."""

    hierarchies: tuple[Hierarchy, ...]
    name: str = field(default_factory=lambda: f"{_PREFIX}-{secrets.token_hex(4)}")
    created: list[Path] = field(default_factory=list)  # in creation order
    processes: list[CgroupProcess] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what cleanup could not do

    @classmethod
    @contextlib.contextmanager
    def open(cls, controllers: Iterable[str] = DEFAULT_CONTROLLERS) -> Iterator[CgroupSandbox]:
        """A sandbox in the hierarchies carrying ``controllers``; removed on exit, even on error."""
        sandbox = cls(select_hierarchies(controllers))
        if not sandbox.hierarchies:
            raise RuntimeError("no cgroup hierarchy mounted for " + ", ".join(controllers))
        try:
            yield sandbox
        finally:
            sandbox.close()

    def hierarchy(self, key: str) -> Hierarchy | None:
        return next((h for h in self.hierarchies if h.key == key), None)

    def cgroup_path(self, hierarchy: Hierarchy, path: str) -> str:
        """``path`` (relative to the sandbox) as /proc/PID/cgroup shows it in ``hierarchy``."""
        return os.path.join(hierarchy.own_path, self.name, path.strip("/")).rstrip("/")

    def spawn(
        self, path: str, argv: Sequence[str] = SLEEP, *, controllers: Iterable[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> CgroupProcess:
        """Start ``argv`` (with ``env`` as its whole environment, when given) and move it into ``path``
        (relative to the sandbox) in each hierarchy (or those carrying ``controllers``), creating the
        directories; checks /proc/PID/cgroup says so."""
        wanted = set(controllers) if controllers is not None else None
        hierarchies = [
            h for h in self.hierarchies
            if wanted is None or (h.key == UNIFIED and UNIFIED in wanted) or h.controllers & wanted
        ]
        if not hierarchies:
            raise ValueError(f"none of {sorted(wanted or ())} is in this sandbox")
        cgroup_paths = {h.key: self.cgroup_path(h, path) for h in hierarchies}
        paths = {h.key: self._make(h, cgroup_paths[h.key]) for h in hierarchies}
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, preexec_fn=_die_with_parent,
        )
        process = CgroupProcess(popen, paths, cgroup_paths)
        self.processes.append(process)
        for key, directory in paths.items():
            try:
                (directory / "cgroup.procs").write_text(str(popen.pid))
            except OSError as exc:
                raise RuntimeError(f"cannot move PID {popen.pid} into {key} cgroup {directory}: {exc}") from exc
        self._check_membership(process)
        return process

    def favour_cpu(self) -> None:
        """The sandbox's top cgroup at the highest CPU weight (v1 ``cpu.shares``, v2 ``cpu.weight`` where
        the controller is enabled), once a process has made it: the kernel shares a CPU between cgroups by
        their weights before the processes' nice values count, so without this a burner in another test's
        cgroup takes half a CPU from this sandbox's tenants whatever their priority. For the tests that
        measure CPU shares (run beside the parallel pass, which has the same CPUs at nice 19)."""
        for hierarchy in self.hierarchies:
            top = hierarchy.directory(os.path.join(hierarchy.own_path, self.name))
            for knob, value in (("cpu.shares", "262144"), ("cpu.weight", "10000")):
                with contextlib.suppress(OSError):
                    if (top / knob).exists():
                        (top / knob).write_text(value)

    def close(self) -> None:
        """Thaw every created cgroup (a task in a frozen v1 cgroup ignores SIGKILL), kill and reap every
        process, then remove every created directory, deepest first."""
        for directory in self.created:
            for name, value in (("cgroup.freeze", "0"), ("freezer.state", "THAWED")):
                with contextlib.suppress(OSError):
                    if (directory / name).exists():
                        (directory / name).write_text(value)
        for process in self.processes:
            try:
                process.kill()
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.errors.append(f"PID {process.pid}: {exc}")
        self._kill_strays()
        deadline = time.monotonic() + REMOVE_TIMEOUT_S
        for directory in sorted(self.created, key=lambda d: len(d.parts), reverse=True):
            self._remove(directory, deadline)

    def leftovers(self) -> list[str]:
        """Directories still present and processes still alive, after :meth:`close`."""
        left = [str(d) for d in self.created if d.exists()]
        left += [f"PID {p.pid}" for p in self.processes if p.popen.poll() is None]
        return left + self.errors

    def _make(self, hierarchy: Hierarchy, cgroup_path: str) -> Path:
        target = hierarchy.directory(cgroup_path)
        missing: list[Path] = []
        for directory in (target, *target.parents):
            if directory.exists():
                break
            missing.append(directory)
        for directory in reversed(missing):
            directory.mkdir()
            self.created.append(directory)
            if "cpuset" in hierarchy.controllers:
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (directory / knob).read_text().strip():
                        (directory / knob).write_text((directory.parent / knob).read_text())
        return target

    def _check_membership(self, process: CgroupProcess) -> None:
        text = Path(f"/proc/{process.pid}/cgroup").read_text()
        shown = {}
        for line in text.splitlines():
            hierarchy_id, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            shown[UNIFIED if hierarchy_id == "0" else controllers] = path
        wrong = {key: shown.get(key) for key, path in process.cgroup_paths.items() if shown.get(key) != path}
        if wrong:
            raise RuntimeError(f"PID {process.pid} is not where it was put: {wrong}; /proc says:\n{text}")

    def _kill_strays(self) -> None:
        """Descendants of our processes still in our cgroups (a process that forked): kill them too."""
        for directory in self.created:
            try:
                pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _remove(self, directory: Path, deadline: float) -> None:
        while True:
            try:
                directory.rmdir()
                return
            except FileNotFoundError:
                return  # a test removed it (e.g. to see " (deleted)")
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    self.errors.append(f"rmdir {directory}: {exc}")
                    return
                time.sleep(0.01)


@contextlib.contextmanager
def cgroup_process(
    path: str, argv: Sequence[str] = SLEEP, *, controllers: Iterable[str] = DEFAULT_CONTROLLERS
) -> Iterator[CgroupProcess]:
    """One process in ``path`` (kubelet-relative, e.g. :func:`kubelet_container_path`) of a fresh sandbox."""
    with CgroupSandbox.open(controllers) as sandbox:
        yield sandbox.spawn(path, argv)


def sandbox_for_test() -> Iterator[CgroupSandbox]:
    """The body of the ``cgroup_sandbox`` fixture: skips where cgroups cannot be made, fails the test if
    anything is left behind. A test module that imports from this one defines the fixture itself::

        @pytest.fixture
        def cgroup_sandbox() -> Iterator[CgroupSandbox]:
            yield from sandbox_for_test()

    (``pytest_plugins = ["cgroups"]`` there would warn that the module was imported before pytest could
    rewrite it; in the root conftest it is fine.)
    """
    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    with CgroupSandbox.open() as sandbox:
        yield sandbox
    left = sandbox.leftovers()
    if left:
        pytest.fail(f"cgroup sandbox {sandbox.name} left behind: {left}")


cgroup_sandbox = pytest.fixture(sandbox_for_test, name="cgroup_sandbox")


def _unescape_mountinfo(field_text: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as octal escapes: \040, \011, \012, \134."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field_text)
