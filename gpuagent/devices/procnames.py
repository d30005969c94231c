"""Process names (``/proc/PID/comm``) for GPU processes, cached while the PID stays on a GPU.

A process names itself (``prctl(PR_SET_NAME)``, no privilege needed): its controls and bidi characters are
shown as visible escapes here, where the name enters the snapshot (``gpuagent.untrusted.label_value``), so
no label value, API answer, table or log line carries them; bytes that are not UTF-8 read as U+FFFD.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from gpuagent.untrusted import label_value


class ProcessNames:
    def __init__(self, root: str | Path = "/proc", *, fallback: Callable[[int], str | None] | None = None):
        self._root = Path(root)
        self._fallback = fallback
        self._cache: dict[int, str] = {}

    def __call__(self, pid: int) -> str:
        name = self._cache.get(pid)
        if name is None:
            name = label_value(self._read(pid))  # once per PID: the cache keeps the poll path free of it
            self._cache[pid] = name
        return name

    def _read(self, pid: int) -> str:
        try:
            return (self._root / str(pid) / "comm").read_text(errors="replace").rstrip("\n")
        except OSError:  # exited, or not visible from this PID namespace: a name is not essential
            if self._fallback is not None:
                return self._fallback(pid) or ""
            return ""

    def retain(self, pids: Iterable[int]) -> None:
        """Forget PIDs that left the GPUs, so a reused PID gets its new name and the cache stays bounded."""
        keep = set(pids)
        for pid in list(self._cache):  # a copy: a worker thread may be adding names meanwhile
            if pid not in keep:
                self._cache.pop(pid, None)
