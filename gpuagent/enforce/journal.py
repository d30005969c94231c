"""The persisted record of the cgroups the agent may have frozen, so that a restart thaws them.

The invariant the enforcer keeps with it: **whenever a cgroup may be frozen by us, this file names it.**
:class:`~gpuagent.enforce.actions.Actions` journals a target (:meth:`Journal.add`, durable before it
returns) before its first freeze and removes it (:meth:`Journal.remove`) only after a thaw that succeeded
(or found the cgroup gone). A crash at any instant therefore leaves a file listing a superset of what is
frozen, and the next start thaws every entry (``Actions.recover``); an extra entry costs one harmless thaw.

A target is journaled once when throttling starts and stays journaled through every freeze/thaw of the
duty cycle (every 100 ms): :meth:`add` of a target already present writes nothing. So the file is written
twice per throttling episode, not ten times a second.

The file is small JSON, one object::

    {"version": 1, "entries": [{"hierarchy": "v2", "path": "/kubepods.slice/...", "since": 1754562011.2,
                                "reason": "share 0.30 over 0.25", "pid": 4242}, ...]}

Writes are atomic: a temporary file in the same directory, fsync, rename over the journal, fsync of the
directory. A missing file is an empty journal. A file that cannot be parsed (truncated, hand-edited,
disk corruption) is never an error for the agent: one clear error is logged naming the file, the file is
moved aside to ``<file>.corrupt-<unix time>``, and whatever entries can be read are kept (and written back).
A write that fails (disk full, read-only directory) raises :class:`JournalError` from :meth:`add`, and
the caller must then not freeze.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

VERSION = 1
HIERARCHIES = ("v2", "v1")


@dataclass(frozen=True, slots=True)
class FreezeTarget:
    """A cgroup that can be frozen: ``hierarchy`` "v2" (``cgroup.freeze``) or "v1" (``freezer.state``),
    ``path`` the cgroup as /proc/PID/cgroup names it (``/kubepods.slice/.../cri-containerd-<id>.scope``)."""

    hierarchy: str
    path: str


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journaled target: since when (unix time), why, and which agent process journaled it."""

    target: FreezeTarget
    since: float
    reason: str
    pid: int

    def to_json(self) -> dict[str, Any]:
        return {"hierarchy": self.target.hierarchy, "path": self.target.path, "since": self.since,
                "reason": self.reason, "pid": self.pid}

    @classmethod
    def from_json(cls, obj: Any) -> JournalEntry | None:
        """The entry in ``obj``, or None when it is not a well-formed entry."""
        if not isinstance(obj, dict):
            return None
        hierarchy, path = obj.get("hierarchy"), obj.get("path")
        since, reason, pid = obj.get("since", 0.0), obj.get("reason", ""), obj.get("pid", 0)
        if hierarchy not in HIERARCHIES or not isinstance(path, str) or not path.startswith("/"):
            return None
        if isinstance(since, bool) or not isinstance(since, (int, float)):
            return None
        if not isinstance(reason, str) or isinstance(pid, bool) or not isinstance(pid, int):
            return None
        return cls(FreezeTarget(hierarchy, path), float(since), reason, pid)


class JournalError(Exception):
    """The journal could not be written: nothing may be frozen that it does not name."""


class Journal:
    """The journal file at ``path`` and its in-memory copy (read once, on first use).

    Thread-safe. ``clock`` stamps ``since``. The directory is created (mode 0700) on the first write.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: dict[FreezeTarget, JournalEntry] | None = None  # None: not read yet
        self.writes = 0  # successful writes of the file, for tests and the cost budget

    # -- reading ------------------------------------------------------------------------------------------
    def entries(self) -> tuple[JournalEntry, ...]:
        """What the journal names, oldest first."""
        with self._lock:
            return tuple(self._load().values())

    def targets(self) -> frozenset[FreezeTarget]:
        with self._lock:
            return frozenset(self._load())

    def __contains__(self, target: object) -> bool:
        with self._lock:
            return target in self._load()

    def __len__(self) -> int:
        with self._lock:
            return len(self._load())

    # -- writing ------------------------------------------------------------------------------------------
    def add(self, target: FreezeTarget, reason: str) -> bool:
        """Journal ``target``, durably, before it is frozen. True if written; False (no write) when it is
        already journaled. Raises :class:`JournalError` when the file cannot be written (memory unchanged)."""
        with self._lock:
            entries = self._load()
            if target in entries:
                return False
            entry = JournalEntry(target, self._clock(), reason, os.getpid())
            self._save([*entries.values(), entry])
            entries[target] = entry
            return True

    def remove(self, target: FreezeTarget) -> bool:
        """Forget ``target`` (after it was thawed or vanished). True if it was journaled. A failed write is
        logged, not raised: the file then names one target too many, which costs one harmless thaw at the
        next start, and the next successful write drops it."""
        return self.remove_all([target]) > 0

    def remove_all(self, targets: Iterable[FreezeTarget]) -> int:
        """Forget every one of ``targets`` with one write; how many were journaled."""
        with self._lock:
            entries = self._load()
            gone = [t for t in targets if t in entries]
            if not gone:
                return 0
            for target in gone:
                del entries[target]
            try:
                self._save(list(entries.values()))
            except JournalError as exc:
                log.error("%s; it still names %d thawed cgroup(s), thawed again at the next start",
                          exc, len(gone))
            return len(gone)

    def clear(self) -> int:
        """Forget everything (after a recovery thawed it all); how many entries there were."""
        return self.remove_all(self.targets())

    # -- the file -----------------------------------------------------------------------------------------
    def _load(self) -> dict[FreezeTarget, JournalEntry]:
        if self._entries is None:
            self._entries = {e.target: e for e in self._read()}
        return self._entries

    def _read(self) -> list[JournalEntry]:
        self._remove_temporaries()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            # Unreadable (EIO, EACCES on a strange mount): keep the file for a human; start empty.
            log.error("cannot read the freeze journal %s: %s; starting with an empty journal", self.path, exc)
            return []
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            return self._salvage(data, f"not valid JSON ({exc})")
        if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
            return self._salvage(data, "not a journal object (no 'entries' list)")
        raw = document["entries"]
        entries = [e for e in map(JournalEntry.from_json, raw) if e is not None]
        if len(entries) != len(raw) or document.get("version") != VERSION:
            why = (f"{len(raw) - len(entries)} malformed entr{'y' if len(raw) - len(entries) == 1 else 'ies'}"
                   if len(entries) != len(raw) else f"unknown version {document.get('version')!r}")
            return self._set_aside(entries, why)
        return _unique(entries)

    def _salvage(self, data: bytes, why: str) -> list[JournalEntry]:
        """The well-formed entry objects that can still be found in a broken file (e.g. all but the last
        of a truncated one)."""
        text = data.decode("utf-8", "replace")
        decoder = json.JSONDecoder()
        found: list[JournalEntry] = []
        start = text.find("{", 1)
        while start != -1:
            try:
                obj, end = decoder.raw_decode(text, start)
            except ValueError:
                start = text.find("{", start + 1)
                continue
            entry = JournalEntry.from_json(obj)
            if entry is not None:
                found.append(entry)
                start = text.find("{", end)
            else:
                start = text.find("{", start + 1)
        return self._set_aside(found, why)

    def _set_aside(self, salvaged: list[JournalEntry], why: str) -> list[JournalEntry]:
        entries = _unique(salvaged)
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(self.path, aside)
            where = f"moved to {aside}"
        except OSError as exc:
            where = f"could not be moved aside ({exc})"
        log.error("freeze journal %s is corrupt: %s; %s; kept %d readable entr%s, which will be thawed",
                  self.path, why, where, len(entries), "y" if len(entries) == 1 else "ies")
        if entries:
            try:
                self._save(entries)
            except JournalError as exc:
                log.error("%s", exc)
        return entries

    def _save(self, entries: list[JournalEntry]) -> None:
        """Write the whole journal atomically and durably, or raise JournalError (the old file stays)."""
        body = json.dumps({"version": VERSION, "entries": [e.to_json() for e in entries]},
                          indent=1).encode() + b"\n"
        directory = self.path.parent
        tmp = directory / f".{self.path.name}.tmp-{os.getpid()}"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise JournalError(f"cannot write the freeze journal {self.path}: {exc}") from exc
        self.writes += 1

    def _remove_temporaries(self) -> None:
        """A crash mid-write leaves ``.<name>.tmp-<pid>``: never read, removed here."""
        with contextlib.suppress(OSError):
            for leftover in self.path.parent.glob(f".{self.path.name}.tmp-*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _unique(entries: list[JournalEntry]) -> list[JournalEntry]:
    seen: dict[FreezeTarget, JournalEntry] = {}
    for entry in entries:
        seen.setdefault(entry.target, entry)
    return list(seen.values())
