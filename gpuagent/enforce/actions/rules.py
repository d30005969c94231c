"""Which workloads the gate may act on: a kubepods pod, or a cgroup the operator allowed, never the agent.

Freezes and signals share these rules (a freeze checks its target's cgroup, a signal the cgroups of the
process it would hit, read at that moment); each refusal is an :class:`ActionRefused` naming its rule:

- ``not-kubepods``: only a path with a kubepods component (``kubepods``, ``kubepods.slice``,
  ``kubepods-*.slice``, ``<root>-kubepods[-*].slice``), or one matching a glob of
  ``allowed_outside_kubepods`` (``fnmatch``: ``*`` also matches ``/``);
- ``not-a-pod``: inside kubepods, only a pod's cgroup or one below it: never the whole of kubepods or a QoS
  class (freezing ``kubepods-burstable.slice`` would stop every Burstable pod);
- ``own-cgroup``: never the agent's own cgroup (read once from ``/proc/self/cgroup``) or an ancestor of it,
  nor one whose own cgroup cannot be read.

The rules depend only on paths and the configuration: nothing here writes, and nothing is read after
start-up but a process's ``/proc/PID/cgroup`` (by the signaller).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Sequence
from pathlib import Path

from gpuagent.enforce.actions.outcomes import log
from gpuagent.enforce.journal import FreezeTarget

# Kubelet's kubepods components: cgroupfs "kubepods"; systemd "kubepods.slice", "kubepods-<qos>.slice",
# "kubepods-<qos>-pod<uid>.slice", each maybe prefixed by --cgroup-root's ("kubelet-kubepods.slice" in kind).
_KUBEPODS = re.compile(r"kubepods|(?:.+-)?kubepods(?:-.+)?\.slice")
# A pod's own level: cgroupfs "pod<uid>"; systemd "[<root>-]kubepods[-<qos>]-pod<uid_>.slice". UIDs are
# UUIDs (36 chars) or, for static pods, a 32-hex config hash; systemd writes each "-" as "_".
_POD = re.compile(r"pod[0-9A-Fa-f_-]{32,36}"
                  r"|(?:.+-)?kubepods(?:-burstable|-besteffort)?-pod[0-9A-Fa-f_]{32,36}\.slice")


class ActionRefused(Exception):
    """A safety rule said no. ``rule`` names the rule (see the gate's rules), ``target`` what was
    refused; the message says both."""

    def __init__(self, rule: str, target: str, detail: str = "") -> None:
        self.rule = rule
        self.target = target
        super().__init__(f"refused by rule {rule!r}: {target}" + (f" ({detail})" if detail else ""))


class WorkloadRules:
    """The rules above for ``allowed_outside_kubepods`` (globs of cgroup paths) and the agent's own
    cgroups, read from ``<proc_root>/self/cgroup`` once."""

    def __init__(self, allowed_outside_kubepods: Sequence[str] = (), *,
                 proc_root: str | Path = "/proc") -> None:
        self.allowed_outside_kubepods = tuple(allowed_outside_kubepods)
        self._source = Path(proc_root) / "self" / "cgroup"
        self.own = self._own_cgroups()  # "v2" and/or "v1" (the freezer's) -> the agent's cgroup there

    def check_target(self, target: FreezeTarget) -> None:
        """Raise :class:`ActionRefused` unless ``target`` is a cgroup the gate may freeze."""
        path = posixpath.normpath(target.path)
        own = self.own.get(target.hierarchy)
        if own is None:
            raise ActionRefused("own-cgroup", target.path, f"the agent's own {target.hierarchy} cgroup is "
                                f"unknown ({self._source} unreadable)")
        if own == path or own.startswith(path.rstrip("/") + "/"):
            raise ActionRefused("own-cgroup", target.path, f"the agent's own cgroup is {own}")
        refused = self._pod_rule(path)
        if refused == "not-kubepods":
            raise ActionRefused("not-kubepods", target.path, "no kubepods component and no "
                                "allowed_outside_kubepods glob matches")
        if refused == "not-a-pod":
            raise ActionRefused("not-a-pod", target.path, "names no pod: all of kubepods or a QoS class")

    def allows(self, path: str) -> bool:
        """Whether a process in the cgroup ``path`` (as ``/proc/PID/cgroup`` writes it) is a workload the
        gate may act on: in a kubepods pod, or allowed by a glob."""
        path = posixpath.normpath(path.removesuffix(" (deleted)"))
        return ".." not in path.split("/") and self._pod_rule(path) is None

    def _pod_rule(self, path: str) -> str | None:
        """The rule a normalised ``path`` breaks ("not-kubepods", "not-a-pod"), or None."""
        if any(fnmatch.fnmatchcase(path, glob) for glob in self.allowed_outside_kubepods):
            return None
        parts = path.split("/")
        first = next((i for i, part in enumerate(parts) if _KUBEPODS.fullmatch(part)), None)
        if first is None:
            return "not-kubepods"
        if not any(_POD.fullmatch(part) for part in parts[first:]):
            return "not-a-pod"
        return None

    def _own_cgroups(self) -> dict[str, str]:
        try:
            cgroups = parse_cgroups(self._source.read_bytes().decode("utf-8", "surrogateescape"))
        except OSError as exc:
            log.error("cannot read the agent's own cgroup from %s: %s; no cgroup will be frozen",
                      self._source, exc)
            return {}
        own: dict[str, str] = {}
        if "v2" in cgroups:
            own["v2"] = posixpath.normpath(cgroups["v2"])
        freezer = next((path for key, path in cgroups.items() if "freezer" in key.split(",")), None)
        if freezer is not None:
            own["v1"] = posixpath.normpath(freezer)
        return own


def parse_cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup lines "id:controllers:path" (paths may hold ':') -> {"v2" | controllers: path}."""
    cgroups: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy_id, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2:
            continue
        cgroups["v2" if hierarchy_id == "0" and not controllers else controllers] = path
    return cgroups
