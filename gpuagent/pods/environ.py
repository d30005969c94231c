"""The few variables of a GPU process's environment the agent uses, read from ``/proc/PID/environ``.

Attribution and MPS need them: ``HOSTNAME`` (a container runtime sets it to the pod's hostname, which is
the pod's name), ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` (the devices a container was
given and the order CUDA numbers them in), ``CUDA_DEVICE_ORDER``, and an MPS client's limits
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``). The file holds the
environment the process started with (a later ``setenv`` does not show there), so callers read it once
per PID. Reading another user's process needs ptrace access (root with ``CAP_SYS_PTRACE``, as the agent
runs): a file the agent may not read makes that environment unknown, said once in the log per reason,
never an error of the poll. A PID that has gone reads as unknown, silently.

The simulator's made-up PIDs have no ``/proc`` entry: their environment comes from the backend
(``fallback``, the simulated NVML's ``process_environ``) in the same ``/proc`` format, so one parser reads
both.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

log = logging.getLogger(__name__)

HOSTNAME = "HOSTNAME"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
WANTED = frozenset({HOSTNAME, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, MPS_THREADS,
                    MPS_MEMORY})

Environ = Mapping[str, str]
_GONE = (errno.ENOENT, errno.ESRCH, errno.ENOTDIR)


def parse_environ(data: bytes, wanted: frozenset[str] = WANTED) -> Environ:
    """The ``wanted`` variables of ``/proc/PID/environ`` content (``NAME=value`` entries, each ended by a
    NUL; a value may hold ``=``; bytes that are not UTF-8 are replaced)."""
    out: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep:
            continue
        key = name.decode("utf-8", "replace")
        if key in wanted:
            out[key] = value.decode("utf-8", "replace")
    return MappingProxyType(out)


class EnvironReader:
    """Reads ``<proc_root>/<pid>/environ``; blocking (call it on a worker thread)."""

    def __init__(
        self, proc_root: str | Path = "/proc", *, fallback: Callable[[int], bytes | None] | None = None
    ) -> None:
        self._root = Path(proc_root)
        self._fallback = fallback
        self._said: set[str] = set()  # reasons already logged

    def read(self, pid: int) -> Environ | None:
        """The wanted variables of ``pid``'s environment; None when it cannot be known."""
        try:
            data = (self._root / str(pid) / "environ").read_bytes()
        except OSError as exc:
            if exc.errno in _GONE:
                data = self._fallback(pid) if self._fallback is not None else None
                return None if data is None else parse_environ(data)
            self._say(f"{exc.strerror or exc}",
                      f"cannot read {self._root}/{pid}/environ ({exc.strerror or exc}): the environments of "
                      "GPU processes are unknown (MPS client limits, and the evidence that names pods "
                      "without the API server); the agent needs CAP_SYS_PTRACE and the host's PID namespace")
            return None
        return parse_environ(data) if data else None  # empty: the process is exiting (a zombie has none)

    def _say(self, reason: str, message: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            log.warning("%s", message)
