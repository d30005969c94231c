"""The CDI spec files of this node: which device nodes and visible devices each CDI device injects.

A DRA driver prepares a claim by writing a CDI (Container Device Interface) spec and handing the runtime
fully qualified CDI device names, ``<vendor>/<class>=<name>``; the kubelet reports those names next to each
DRA device. NVIDIA's driver writes one transient spec per claim, kind ``k8s.gpu.nvidia.com/claim``, devices
named ``<claim UID>-<device>`` (``…-gpu-3``, ``…-gpu-0-mig-9-4-2``), each with the device nodes of its GPU
(``/dev/nvidia3``) and, for a MIG device, its capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``); older
releases named a per-node spec's devices ``k8s.gpu.nvidia.com/device=gpu-3``. Other tools (the device
plugin's CDI mode, ``nvidia-ctk cdi generate``) put GPU UUIDs in ``NVIDIA_VISIBLE_DEVICES``. Both are read.

Specs are JSON (``.json``) or YAML (``.yaml``, ``.yml``) files in the spec directories (``/etc/cdi``, then
``/var/run/cdi``: a later directory's device replaces an earlier one's, as the CDI cache does; the same name
twice in one directory is a conflict and neither is used). :meth:`CdiSpecs.refresh` re-parses only files
whose size, mtime or inode changed, so calling it at the pod-resources cadence costs a few ``stat`` calls.
A file that cannot be read or parsed is skipped and named in :attr:`CdiIndex.errors`; its neighbours are
still used. It does blocking file I/O: call it on a worker thread.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from gpuagent.config import describe_value as _kind

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 4 * 1024 * 1024  # a spec of every device of an 8-GPU node is about 20 KiB
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# CDI's own grammar: vendor a DNS-ish name, class alphanumerics with - _ ., name alphanumerics with - _ . :
_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")

try:  # libyaml when PyYAML was built with it: several times faster on a large spec
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _Loader = yaml.SafeLoader


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a spec: what identifies a GPU among its container edits."""

    name: str  # fully qualified: <vendor>/<class>=<name>
    spec: str  # the file it came from
    device_nodes: tuple[str, ...] = ()  # container paths (a node's hostPath when it differs, too)
    visible_devices: tuple[str, ...] = ()  # NVIDIA_VISIBLE_DEVICES entries, as written


@dataclass(frozen=True, slots=True)
class CdiIndex:
    """Every CDI device of the spec directories, by fully qualified name, and what could not be read."""

    devices: Mapping[str, CdiDevice] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # "<file>: <what is wrong>", one per spec file skipped
    dirs: tuple[str, ...] = ()
    dirs_found: int = 0  # spec directories that exist


class CdiSpecError(ValueError):
    """A spec file that is not a CDI spec; the message names where in it."""


def parse_spec(text: str, path: str) -> list[CdiDevice]:
    """The devices of one spec file's text (JSON or YAML by the file's suffix); raises CdiSpecError."""
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.load(text, Loader=_Loader)
    except (ValueError, yaml.YAMLError) as exc:
        raise CdiSpecError(f"not {'JSON' if path.endswith('.json') else 'YAML'}: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise CdiSpecError(f"expected a mapping (cdiVersion, kind, devices), got {_kind(data)}")
    kind = data.get("kind")
    if not isinstance(kind, str) or not _KIND.match(kind):
        expected = "<vendor>/<class> like k8s.gpu.nvidia.com/claim"
        raise CdiSpecError(f"kind: expected {expected}, got {kind!r}"[:200])
    devices = data.get("devices")
    if not isinstance(devices, list):
        raise CdiSpecError(f"devices: expected a list, got {_kind(devices)}")
    out: list[CdiDevice] = []
    for i, device in enumerate(devices):
        where = f"devices[{i}]"
        if not isinstance(device, dict):
            raise CdiSpecError(f"{where}: expected a mapping, got {_kind(device)}")
        name = device.get("name")
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            raise CdiSpecError(f"{where}.name: expected a device name, got {name!r}"[:200])
        nodes, visible = _edits(device.get("containerEdits"), f"{where}.containerEdits")
        out.append(CdiDevice(f"{kind}={name}", path, nodes, visible))
    _edits(data.get("containerEdits"), "containerEdits")  # checked, not used: it applies to every device
    return out


def _edits(edits: Any, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(device node paths, NVIDIA_VISIBLE_DEVICES entries) of a containerEdits mapping."""
    if edits is None:
        return (), ()
    if not isinstance(edits, dict):
        raise CdiSpecError(f"{where}: expected a mapping, got {_kind(edits)}")
    nodes: list[str] = []
    raw_nodes = edits.get("deviceNodes") or []
    if not isinstance(raw_nodes, list):
        raise CdiSpecError(f"{where}.deviceNodes: expected a list, got {_kind(raw_nodes)}")
    for i, node in enumerate(raw_nodes):
        path = node.get("path") if isinstance(node, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            raise CdiSpecError(f"{where}.deviceNodes[{i}]: expected a mapping with an absolute path")
        nodes.append(path)
        host = node.get("hostPath")
        if isinstance(host, str) and host and host != path:
            nodes.append(host)
    visible: list[str] = []
    env = edits.get("env") or []
    if not isinstance(env, list):
        raise CdiSpecError(f"{where}.env: expected a list of NAME=VALUE strings, got {_kind(env)}")
    for i, entry in enumerate(env):
        if not isinstance(entry, str):
            raise CdiSpecError(f"{where}.env[{i}]: expected a NAME=VALUE string, got {_kind(entry)}")
        name, sep, value = entry.partition("=")
        if sep and name == VISIBLE_DEVICES_ENV:
            visible = [v.strip() for v in value.split(",") if v.strip()]
    return tuple(nodes), tuple(visible)


class CdiSpecs:
    """The CDI spec directories, re-read as files change; one per agent."""

    def __init__(self, dirs: Sequence[str] = DEFAULT_SPEC_DIRS, *, max_bytes: int = MAX_SPEC_BYTES) -> None:
        if isinstance(dirs, str):
            raise TypeError("dirs must be a sequence of directories, not a string")
        self.dirs = tuple(dirs)
        self._max = max_bytes
        # path -> ((size, mtime_ns, inode), devices or the error)
        self._files: dict[str, tuple[tuple[int, int, int], list[CdiDevice] | str]] = {}
        self._dir_errors: tuple[str, ...] = ()
        self._index = CdiIndex(MappingProxyType({}), (), self.dirs, 0)

    @property
    def index(self) -> CdiIndex:
        """The last :meth:`refresh`'s index (empty before the first)."""
        return self._index

    def refresh(self) -> CdiIndex:
        """Read what changed; the same :class:`CdiIndex` object when nothing did."""
        seen: dict[str, tuple[int, int, int]] = {}
        listing: list[tuple[int, str]] = []  # (directory's rank, path)
        errors: list[str] = []
        found = 0
        for rank, directory in enumerate(self.dirs):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as exc:
                errors.append(f"{directory}: cannot list the directory: {exc.strerror or exc}")
                continue
            found += 1
            for name in names:
                if not name.endswith(SPEC_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # removed between listing and stat (a claim unprepared): not there
                if not stat.S_ISREG(st.st_mode):
                    continue
                seen[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
                listing.append((rank, path))
        changed = (found != self._index.dirs_found or set(seen) != set(self._files)
                   or tuple(errors) != self._dir_errors)
        self._dir_errors = tuple(errors)
        for path, key in seen.items():
            known = self._files.get(path)
            if known is None or known[0] != key:
                self._files[path] = (key, self._read(path, key[0]))
                changed = True
        for path in [p for p in self._files if p not in seen]:
            del self._files[path]
        if not changed:
            return self._index
        self._index = self._build(listing, errors, found)
        return self._index

    def _read(self, path: str, size: int) -> list[CdiDevice] | str:
        if size > self._max:
            return f"{size} bytes, more than the {self._max} a CDI spec may have here"
        try:
            with open(path, encoding="utf-8") as stream:
                text = stream.read(self._max + 1)
        except (OSError, UnicodeDecodeError) as exc:
            return f"cannot read: {getattr(exc, 'strerror', None) or exc}"
        try:
            return parse_spec(text, path)
        except CdiSpecError as exc:
            return str(exc)

    def _build(self, listing: list[tuple[int, str]], errors: list[str], found: int) -> CdiIndex:
        devices: dict[str, CdiDevice] = {}
        rank_of: dict[str, int] = {}
        conflicts: dict[str, list[str]] = {}
        for rank, path in listing:
            parsed = self._files[path][1]
            if isinstance(parsed, str):
                errors.append(f"{path}: {parsed}")
                continue
            for device in parsed:
                earlier = rank_of.get(device.name)
                if earlier == rank:  # the same name twice in one directory: CDI refuses both
                    conflicts.setdefault(device.name, [devices[device.name].spec]).append(path)
                    continue
                devices[device.name] = device  # a later directory overrides an earlier one
                rank_of[device.name] = rank
        for name, paths in conflicts.items():
            devices.pop(name, None)
            errors.append(f"{' and '.join(paths)}: both define CDI device {name}; neither is used")
        return CdiIndex(MappingProxyType(devices), tuple(errors), self.dirs, found)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]
