"""Who a process belongs to, read from ``/proc/PID/cgroup``.

Each line of that file is ``HIERARCHY-ID:CONTROLLERS:PATH``: one line per cgroup v1 hierarchy
(``4:memory:/...``, ``2:cpu,cpuacct:/...``, ``1:name=systemd:/...``) and ``0::/...`` for the v2 (unified)
hierarchy. :func:`parse_proc_cgroup` turns the file into a :class:`CgroupIdentity`: a Kubernetes pod
(UID, QoS class, container runtime and container ID) or another workload (systemd service, user session,
Docker or Podman container, Slurm job).

What the kernel writes, and what this module relies on:

- The path is written raw (no escaping, unlike mountinfo): it may hold ``:`` (runc's
  ``slice:prefix:id`` cgroupsPath used as a directory name) and spaces, so a line is split on its first two
  colons only, never on whitespace. Lines are separated by ``\\n`` alone.
- The path is relative to the *reader's* cgroup namespace: an agent in a private namespace sees
  ``/../../kubepods-besteffort-pod<uid>.slice/...``. Leading ``..`` components are dropped before matching
  and kept in :attr:`CgroupIdentity.path`. ``0::/`` alone identifies nothing (unknown, not "host").
- A v2 path ends in `` (deleted)`` when the cgroup was removed before the (zombie) process was reaped.
- On hybrid hosts the ``0::`` line can name the runtime daemon's unit (``containerd.service``) while the
  v1 lines name the container: every hierarchy's path is read and the most telling one wins, the v2 path on
  a tie.
- Kubernetes is recognised by kubelet's own names, never by a loose UUID: systemd driver
  ``[<root>-]kubepods[-<qos>]-pod<uid>.slice`` with ``-`` in the UID escaped as ``_``; cgroupfs driver
  ``kubepods[/<qos>]/pod<uid>``; Guaranteed pods have no QoS level. Static pods have a 32-hex hash UID.
  The container is the component right after the pod's, not the last one (crun's ``/container`` child,
  a process's own sub-cgroups); the innermost pod wins (kind: a kubelet inside a container).
"""

from __future__ import annotations

import errno
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupIdentity",
    "CgroupLine",
    "CgroupParseError",
    "CgroupReader",
    "identify_lines",
    "parse_proc_cgroup",
    "split_proc_cgroup",
    "unescape_pod_uid",
    "unescape_systemd_name",
]

_DELETED_SUFFIX = " (deleted)"
_MAX_ID_DIGITS = 9  # hierarchy IDs are small ints; also keeps int() clear of its 4300-digit limit
_QOS_LEVELS = ("burstable", "besteffort")

# systemd driver: "kubepods-burstable-pod<uid>.slice", "kubepods-pod<uid>.slice" (Guaranteed), with a
# kubelet --cgroup-root in front ("kubelet-kubepods-..." in kind). A runc cgroupsPath used raw as a
# directory name appends ":<prefix>:<id>" (containerd without systemd-created scopes).
_SYSTEMD_POD = re.compile(
    r"(?:.+-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>[0-9A-Za-z_]+)\.slice"
    r"(?::(?P<prefix>[a-z-]+):(?P<id>[0-9a-f]{64}))?"
)
_SYSTEMD_QOS_SLICE = re.compile(r"(?:.+-)?kubepods(?:-(?P<qos>burstable|besteffort))?\.slice")
_CGROUPFS_POD = re.compile(r"pod(?P<uid>[0-9A-Za-z_-]+)")
# Where no kubepods component vouches for it (a namespace-relative path), only a UID-shaped pod name counts.
_STRICT_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
_K8S_CONTAINER = re.compile(r"(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?")
_CRIO_CONMON = re.compile(r"crio-conmon-[0-9a-f]{64}(?:\.scope)?")
_RUNTIME_BY_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", None: "unknown"}
# Outside Kubernetes.
_DOCKER_SCOPE = re.compile(r"docker-(?P<id>[0-9a-f]{64})\.scope")
_PODMAN_SCOPE = re.compile(r"libpod-(?P<id>[0-9a-f]{64})(?P<scope>\.scope)?")
_PODMAN_CONMON = re.compile(r"libpod-conmon-[0-9a-f]{64}(?:\.scope)?")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_SLURM_JOB = re.compile(r"job_[0-9]+")
_USER_SESSION_UNIT = re.compile(r"user@[0-9]+\.service|session-[^/]+\.scope")
_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")
_SYSTEMD_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")

# For a hybrid or v1 reading, which controller's path to report when several say the same thing: the
# ones kubelet manages and the enforcer freezes first, systemd's bookkeeping hierarchy last.
_V1_PREFERENCE = ("freezer", "pids", "memory", "cpu", "cpuacct", "cpuset", "devices", "blkio", "name=systemd")

# How telling a reading is; the highest wins, the v2 line on a tie.
_SCORE_POD_CONTAINER = 6
_SCORE_POD = 5
_SCORE_K8S = 4
_SCORE_CONTAINER = 4
_SCORE_SLURM = 3
_SCORE_SYSTEMD = 2
_SCORE_UNRECOGNISED = 1
_SCORE_ROOT = 0

_GONE_OR_UNREADABLE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR, errno.EACCES, errno.EPERM})


class CgroupParseError(ValueError):
    """A ``/proc/PID/cgroup`` text that is not the kernel's ``ID:CONTROLLERS:PATH`` lines."""


@dataclass(frozen=True, slots=True)
class CgroupLine:
    """One line of ``/proc/PID/cgroup``."""

    hierarchy_id: int  # 0 for the v2 (unified) hierarchy
    controllers: tuple[str, ...]  # () on the v2 line; ("cpu", "cpuacct"), ("name=systemd",) on v1 lines
    path: str  # as read, relative to the reader's cgroup namespace, without " (deleted)"
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """Who a process belongs to, as far as its cgroup paths say.

    ``is_k8s`` and ``is_container`` are ``None`` (unknown), not ``False``, when every path is the cgroup
    namespace's root: nothing can be told then. ``runtime`` is ``"containerd"``, ``"cri-o"``,
    ``"docker"``, ``"podman"``, or ``"unknown"`` for a Kubernetes container whose path does not name it
    (cgroupfs driver with containerd or Docker); CRI-O's conmon keeps ``"cri-o"`` with no container.
    ``unit`` is the systemd unit name as systemd spells it (escapes such as ``\\x2d`` kept; see
    :func:`unescape_systemd_name`), or the Slurm job (``"job_1234"``).
    """

    cgroup_version: str  # "1", "2" or "hybrid"
    driver: str | None  # "systemd" | "cgroupfs" | None
    is_k8s: bool | None
    is_container: bool | None
    pod_uid: str | None  # 8-4-4-4-12 with dashes; static pods' 32-hex hash as is
    qos: str | None  # "guaranteed" | "burstable" | "besteffort"; None where the path does not say
    runtime: str | None
    container_id: str | None  # 64 hex
    workload_kind: str  # pod|systemd_service|user_session|docker|podman|slurm_job|host|unknown
    unit: str | None
    path: str  # the identifying cgroup path, as read (relative to the reader's cgroup namespace)
    deleted: bool = False  # a line's path ended in " (deleted)": the cgroup is gone, the process dying
    unified_path: str | None = None  # the v2 ("0::") line's path: what cgroup.freeze acts on
    freezer_path: str | None = None  # the v1 freezer hierarchy's path: what freezer.state acts on


@dataclass(frozen=True, slots=True)
class _Reading:
    """What one cgroup path says."""

    score: int
    driver: str | None
    is_k8s: bool | None
    is_container: bool | None
    workload_kind: str
    pod_uid: str | None = None
    qos: str | None = None
    runtime: str | None = None
    container_id: str | None = None
    unit: str | None = None


def unescape_pod_uid(escaped: str) -> str:
    """The pod UID from a systemd-driver pod slice name: kubelet writes each ``-`` of the UID as ``_``."""
    return escaped.replace("_", "-")


def unescape_systemd_name(name: str) -> str:
    r"""A systemd unit name with its ``\xNN`` escapes decoded: ``system-serial\x2dgetty.slice`` ->
    ``system-serial-getty.slice``. For display only: systemd knows the unit by its escaped name.

    The escapes are bytes, so ``\xc3\xa9`` becomes one character (é); bytes that are not UTF-8 stay escaped.
    """
    raw = name.encode("utf-8", "surrogateescape")
    decoded = _SYSTEMD_ESCAPE.sub(lambda match: bytes((int(match.group(1), 16),)), raw)
    return decoded.decode("utf-8", "backslashreplace")


def split_proc_cgroup(text: str) -> tuple[CgroupLine, ...]:
    """The lines of a ``/proc/PID/cgroup`` text; :class:`CgroupParseError` naming the first bad line.

    A hierarchy listed twice is an error: the kernel writes one line per hierarchy, so a second one could only
    come from a cgroup name holding a newline, forging a line. Linux 6.18 refuses such names (mkdir gives
    EINVAL); this check does not rely on every kernel doing so.
    """
    lines: list[CgroupLine] = []
    seen: set[int] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw:
            continue
        hierarchy, sep1, rest = raw.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2):
            raise CgroupParseError(f"line {number}: expected ID:CONTROLLERS:PATH, got {_clip(raw)}")
        if not (hierarchy.isascii() and hierarchy.isdigit() and len(hierarchy) <= _MAX_ID_DIGITS):
            raise CgroupParseError(f"line {number}: hierarchy ID {_clip(hierarchy)} is not a number")
        hierarchy_id = int(hierarchy)
        if hierarchy_id == 0 and controllers:
            raise CgroupParseError(
                f"line {number}: hierarchy 0 (cgroup v2) lists controllers {_clip(controllers)}"
            )
        if not path.startswith("/"):
            raise CgroupParseError(f"line {number}: path {_clip(path)} does not start with '/'")
        if hierarchy_id in seen:
            raise CgroupParseError(f"line {number}: hierarchy {hierarchy_id} listed twice")
        seen.add(hierarchy_id)
        deleted = path.endswith(_DELETED_SUFFIX)
        if deleted:
            path = path[: -len(_DELETED_SUFFIX)]
        names = tuple(name for name in controllers.split(",") if name)
        lines.append(CgroupLine(hierarchy_id, names, path, deleted))
    if not lines:
        raise CgroupParseError("no cgroup lines")
    return tuple(lines)


def parse_proc_cgroup(text: str) -> CgroupIdentity:
    """Who the process whose ``/proc/PID/cgroup`` reads ``text`` belongs to. Pure: no I/O.

    Raises :class:`CgroupParseError` (a ``ValueError``) on malformed text, nothing on odd but well-formed
    paths: what cannot be recognised is ``workload_kind="unknown"``.
    """
    return identify_lines(split_proc_cgroup(text))


def identify_lines(lines: Sequence[CgroupLine]) -> CgroupIdentity:
    """:func:`parse_proc_cgroup` for lines already split."""
    if not lines:
        raise CgroupParseError("no cgroup lines")
    unified = [line for line in lines if line.hierarchy_id == 0]
    legacy = sorted((line for line in lines if line.hierarchy_id != 0), key=_v1_rank)
    version = "hybrid" if unified and legacy else ("2" if unified else "1")
    # max() keeps the first of equals: the v2 line, then the preferred v1 controller.
    best_line, reading = max(
        ((line, _read_path(line.path)) for line in (*unified, *legacy)), key=lambda pair: pair[1].score
    )
    return CgroupIdentity(
        cgroup_version=version,
        driver=reading.driver,
        is_k8s=reading.is_k8s,
        is_container=reading.is_container,
        pod_uid=reading.pod_uid,
        qos=reading.qos,
        runtime=reading.runtime,
        container_id=reading.container_id,
        workload_kind=reading.workload_kind,
        unit=reading.unit,
        path=best_line.path,
        deleted=any(line.deleted for line in lines),
        unified_path=unified[0].path if unified else None,
        freezer_path=next((line.path for line in legacy if "freezer" in line.controllers), None),
    )


class CgroupReader:
    """Reads ``<proc_root>/<pid>/cgroup`` and identifies the process."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self._proc_root = Path(proc_root)

    @property
    def proc_root(self) -> Path:
        return self._proc_root

    def read(self, pid: int) -> str | None:
        """The raw text, or ``None`` when the process is gone or its file unreadable.

        Other ``OSError`` (an I/O error) propagates. Paths are decoded as UTF-8 with ``surrogateescape``,
        so ``os.fsencode`` gives back the directory name's exact bytes.
        """
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"not a PID: {pid!r}")
        try:
            data = (self._proc_root / str(pid) / "cgroup").read_bytes()
        except OSError as exc:
            if exc.errno in _GONE_OR_UNREADABLE:
                return None
            raise
        # A task that exits while the file is open reads as empty.
        return data.decode("utf-8", "surrogateescape") or None

    def identify(self, pid: int) -> CgroupIdentity | None:
        """The process's identity, or ``None`` when it is gone (also mid-read) or its file unreadable.

        Malformed content raises :class:`CgroupParseError`.
        """
        text = self.read(pid)
        if text is None:
            return None
        return parse_proc_cgroup(text)


def _clip(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _v1_rank(line: CgroupLine) -> int:
    ranks = [_V1_PREFERENCE.index(name) for name in line.controllers if name in _V1_PREFERENCE]
    return min(ranks, default=len(_V1_PREFERENCE))


def _read_path(path: str) -> _Reading:
    parts = [part for part in path.split("/") if part]
    relative = False
    while parts and parts[0] == "..":
        parts.pop(0)
        relative = True
    if not parts:
        return _Reading(_SCORE_ROOT, None, None, None, "unknown")
    return (
        _read_k8s(parts, relative)
        or _read_container(parts)
        or _read_slurm(parts)
        or _read_systemd(parts)
        or _Reading(_SCORE_UNRECOGNISED, None, False, False, "unknown")
    )


def _read_k8s(parts: list[str], relative: bool) -> _Reading | None:
    if not any("kubepods" in part for part in parts) and not relative:
        return None
    # The innermost pod: a kubelet in a container in a pod names its pods below the outer one's.
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if "kubepods" in part and (match := _SYSTEMD_POD.fullmatch(part)):
            qos = match.group("qos") or "guaranteed"
            uid = unescape_pod_uid(match.group("uid"))
            if match.group("id"):  # "...-pod<uid>.slice:cri-containerd:<id>"
                container = f"{match.group('prefix')}-{match.group('id')}"
            else:
                container = parts[index + 1] if index + 1 < len(parts) else None
            return _pod_reading("systemd", uid, qos, container)
        if part.startswith("pod") and (match := _CGROUPFS_POD.fullmatch(part)):
            qos = _cgroupfs_qos(parts, index, relative, match.group("uid"))
            if qos is not None:
                container = parts[index + 1] if index + 1 < len(parts) else None
                return _pod_reading("cgroupfs", match.group("uid"), qos or None, container)
    return _read_kubepods_level(parts)


def _cgroupfs_qos(parts: list[str], index: int, relative: bool, uid: str) -> str | None:
    """The QoS of a cgroupfs ``pod<uid>`` at ``parts[index]``; "" for "a pod, QoS unknown"; None: no pod."""
    parent = parts[index - 1] if index >= 1 else None
    if parent == "kubepods":
        return "guaranteed"
    if parent in _QOS_LEVELS and index >= 2 and parts[index - 2] == "kubepods":
        return parent
    # Seen from a cgroup namespace below kubepods: "/../pod<uid>/<id>" or "/../burstable/pod<uid>/<id>".
    seen_from_below = relative and index <= 1 and all(p in _QOS_LEVELS for p in parts[:index])
    if seen_from_below and _STRICT_UID.fullmatch(uid):
        return parent or ""
    return None


def _pod_reading(driver: str, uid: str, qos: str | None, container: str | None) -> _Reading:
    if container is not None:
        if match := _K8S_CONTAINER.fullmatch(container):
            return _Reading(
                _SCORE_POD_CONTAINER, driver, True, True, "pod", pod_uid=uid, qos=qos,
                runtime=_RUNTIME_BY_PREFIX[match.group("prefix")], container_id=match.group("id"),
            )
        if _CRIO_CONMON.fullmatch(container):
            return _Reading(_SCORE_POD, driver, True, False, "pod", pod_uid=uid, qos=qos, runtime="cri-o")
    return _Reading(_SCORE_POD, driver, True, False, "pod", pod_uid=uid, qos=qos)


def _read_kubepods_level(parts: list[str]) -> _Reading | None:
    """A process in kubepods but in no pod (a QoS-level cgroup): Kubernetes, no workload."""
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if "kubepods" in part and (match := _SYSTEMD_QOS_SLICE.fullmatch(part)):
            return _Reading(_SCORE_K8S, "systemd", True, False, "unknown", qos=match.group("qos"))
        if part == "kubepods":
            after = parts[index + 1] if index + 1 < len(parts) else None
            qos = after if after in _QOS_LEVELS else None
            return _Reading(_SCORE_K8S, "cgroupfs", True, False, "unknown", qos=qos)
    return None


def _read_container(parts: list[str]) -> _Reading | None:
    """A Docker or Podman container outside Kubernetes; the innermost one."""
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if match := _DOCKER_SCOPE.fullmatch(part):
            return _Reading(
                _SCORE_CONTAINER, "systemd", False, True, "docker", runtime="docker",
                container_id=match.group("id"), unit=part,
            )
        if index >= 1 and parts[index - 1] == "docker" and _CONTAINER_ID.fullmatch(part):
            return _Reading(
                _SCORE_CONTAINER, "cgroupfs", False, True, "docker", runtime="docker", container_id=part,
            )
        if _PODMAN_CONMON.fullmatch(part):
            driver = "systemd" if part.endswith(".scope") else "cgroupfs"
            unit = part if driver == "systemd" else None
            return _Reading(_SCORE_CONTAINER, driver, False, False, "podman", runtime="podman", unit=unit)
        if match := _PODMAN_SCOPE.fullmatch(part):
            scoped = bool(match.group("scope"))
            return _Reading(
                _SCORE_CONTAINER, "systemd" if scoped else "cgroupfs", False, True, "podman",
                runtime="podman", container_id=match.group("id"), unit=part if scoped else None,
            )
    return None


def _read_slurm(parts: list[str]) -> _Reading | None:
    """A Slurm job: ``/slurm/uid_<n>/job_<n>/...`` (cgroup/v1 plugin) or
    ``/system.slice/slurmstepd.scope/job_<n>/...`` (cgroup/v2 plugin)."""
    for index, part in enumerate(parts):
        if _SLURM_JOB.fullmatch(part) and any("slurm" in earlier for earlier in parts[:index]):
            driver = "systemd" if any(_is_unit(p) for p in parts[:index]) else "cgroupfs"
            return _Reading(_SCORE_SLURM, driver, False, False, "slurm_job", unit=part)
    return None


def _is_unit(part: str) -> bool:
    stem, dot, suffix = part.rpartition(".")
    return bool(stem and dot) and f".{suffix}" in _UNIT_SUFFIXES


def _read_systemd(parts: list[str]) -> _Reading | None:
    units = [part for part in parts if _is_unit(part)]
    if not units:
        return None
    leaves = [unit for unit in units if not unit.endswith(".slice")]
    unit = leaves[-1] if leaves else units[-1]
    if parts[0] == "user.slice" or any(_USER_SESSION_UNIT.fullmatch(u) for u in leaves):
        kind = "user_session"
    elif not leaves or unit == "init.scope":
        kind = "host"
    else:
        kind = "systemd_service"
    return _Reading(_SCORE_SYSTEMD, "systemd", False, False, kind, unit=unit)
