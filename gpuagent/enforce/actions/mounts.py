"""Where the freezers are mounted, and the path rules that turn a freeze target into a directory there.

A target is "v2" (``cgroup.freeze``) or "v1" (``freezer.state``), and its path is the cgroup as
``/proc/PID/cgroup`` names it, relative to the hierarchy's root. The hierarchies are found once in
``<proc_root>/self/mountinfo``: v2 mounted at ``cgroup_root`` (pure v2) or ``<cgroup_root>/unified``
(hybrid), the v1 freezer at ``<cgroup_root>/<name>``. The path rules (each refusal an
:class:`~gpuagent.enforce.actions.rules.ActionRefused` naming its rule):

- ``hierarchy``/``not-mounted``: a target is "v2" or "v1", in a hierarchy mounted under ``cgroup_root``;
- ``path``, ``dotdot``, ``outside-root``: a path is absolute, has no ``..`` component, and once joined to
  the hierarchy's mount it resolves (symlinks too) strictly inside ``cgroup_root``;
- ``root``: never a hierarchy's root cgroup.

Thaws check these rules only, so that a changed configuration cannot leave a cgroup frozen.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path

from gpuagent.enforce.actions.outcomes import log
from gpuagent.enforce.actions.rules import ActionRefused
from gpuagent.enforce.journal import FreezeTarget

CONTROL = {"v2": ("cgroup.freeze", b"1", b"0"), "v1": ("freezer.state", b"FROZEN", b"THAWED")}


class Mount:
    __slots__ = ("mountpoint", "real", "root")

    def __init__(self, mountpoint: str, root: str) -> None:
        self.mountpoint = mountpoint  # where the hierarchy is mounted
        self.root = root  # the cgroup mounted there (mountinfo's 4th field), "/" on a host
        self.real = os.path.realpath(mountpoint)


class Hierarchies:
    """The v2 hierarchy and the v1 freezer usable under ``cgroup_root``, as ``<proc_root>/self/mountinfo``
    says at construction, and :meth:`directory`, the path rules."""

    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup", *,
                 proc_root: str | Path = "/proc") -> None:
        self.cgroup_root = os.path.normpath(os.fspath(cgroup_root))
        self._mounts = self._find(Path(proc_root) / "self" / "mountinfo")

    @property
    def mountpoints(self) -> Mapping[str, str]:
        """"v2" and/or "v1" -> mount point."""
        return {key: mount.mountpoint for key, mount in self._mounts.items()}

    def __contains__(self, hierarchy: object) -> bool:
        return hierarchy in self._mounts

    def directory(self, target: FreezeTarget) -> str:
        """The path rules: the cgroup's directory, strictly inside its mount under ``cgroup_root``."""
        if target.hierarchy not in CONTROL:
            raise ActionRefused("hierarchy", f"{target.hierarchy}:{target.path}", 'not "v2" or "v1"')
        mount = self._mounts.get(target.hierarchy)
        if mount is None:
            raise ActionRefused("not-mounted", target.path,
                                f"no {target.hierarchy} freezer is mounted under {self.cgroup_root}")
        path = target.path
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise ActionRefused("path", repr(path), "not an absolute cgroup path")
        if ".." in path.split("/"):
            raise ActionRefused("dotdot", path, "a '..' component")
        normal = posixpath.normpath(path)
        relative = posixpath.relpath(normal, mount.root)
        if relative.startswith(".."):
            raise ActionRefused("outside-root", path, f"outside the cgroup {mount.root} mounted at "
                                f"{mount.mountpoint}")
        if relative == ".":
            raise ActionRefused("root", path, f"the root cgroup of {mount.mountpoint}")
        directory = os.path.join(mount.mountpoint, relative)
        real = os.path.realpath(directory)
        if os.path.commonpath([real, mount.real]) != mount.real or real == mount.real:
            raise ActionRefused("outside-root", path, f"{directory} resolves to {real}, outside {mount.real}")
        return directory

    def _find(self, source: Path) -> dict[str, Mount]:
        """v2 mounted at ``cgroup_root`` (pure v2) or ``<root>/unified`` (hybrid); the v1 freezer under it."""
        try:
            text = source.read_text()
        except OSError as exc:
            log.error("cannot read %s: %s; no cgroup can be frozen", source, exc)
            return {}
        v2_places = (self.cgroup_root, os.path.join(self.cgroup_root, "unified"))
        v2: dict[str, Mount] = {}
        found: dict[str, Mount] = {}
        for line in text.splitlines():
            fields = line.split()
            if "-" not in fields:
                continue
            separator = fields.index("-")
            if separator < 5 or len(fields) < separator + 4:
                continue
            fstype, options = fields[separator + 1], fields[separator + 3].split(",")
            mountpoint = os.path.normpath(_unescape_mountinfo(fields[4]))
            root = _unescape_mountinfo(fields[3])
            if fstype == "cgroup2" and mountpoint in v2_places:
                v2.setdefault(mountpoint, Mount(mountpoint, root))
            elif (fstype == "cgroup" and "freezer" in options and "v1" not in found
                  and os.path.dirname(mountpoint) == self.cgroup_root):
                found["v1"] = Mount(mountpoint, root)
        for place in v2_places:  # pure v2 first
            if place in v2:
                found["v2"] = v2[place]
                break
        if not found:
            log.warning("no cgroup freezer is mounted under %s (per %s): nothing can be frozen",
                        self.cgroup_root, source)
        return found


def _unescape_mountinfo(text: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as octal escapes: \040, \011, \012, \134."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)
