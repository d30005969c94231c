"""A workload's CPU seconds so far, read from its cgroup every few milliseconds: the latency class's "has
work" signal (``timeslice/latency.py``: a service with a request in hand spins in CUDA's synchronisation).

Where a freeze target is, its CPU counter is: a v2 target's ``cpu.stat`` (``usage_usec``, present in every
v2 cgroup, with or without the cpu controller) in the same directory; a v1 target (a freezer path) the
``cpuacct.usage`` (nanoseconds) of the same path in the cpuacct hierarchy (kubelet lays a pod out alike in
every v1 hierarchy), mounted at ``<cgroup_root>/cpuacct`` or ``<cgroup_root>/cpu,cpuacct``. Each counter
keeps its file open and rereads it with ``pread`` at offset 0: 1-2 us of CPU a read on the hybrid host of
the tests, against 11-12 us to open, read and close it (the cost of a sensing loop is its wake-ups, not its
reads: docs/isolation.md, the latency class). A v2 counter also reads its cgroup's ``cpu.pressure`` (PSI:
the part of the last 10 s some task of it waited for a CPU), the node's ``/proc/pressure/cpu`` standing in
where a cgroup has none: a service that never waits for a CPU cannot have lost it at a scheduler tick
(``timeslice/ticks.py``). Only reads: freezing stays in ``enforce.actions``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Sequence

from gpuagent.enforce.journal import FreezeTarget

_MAX_BYTES = 4096  # cpu.stat is six lines; cpuacct.usage one number


class CpuCounter:
    """One cgroup's CPU counter, its file kept open; :meth:`seconds` rereads it, :meth:`waited` the
    cgroup's CPU pressure (v2)."""

    __slots__ = ("_fd", "_pressure", "_v2", "path")

    def __init__(self, path: str, *, v2: bool) -> None:
        self.path = path
        self._v2 = v2
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._pressure: int | None = None  # cpu.pressure's descriptor, once opened (-1: none to open)

    def waited(self) -> float | None:
        """The part of the last 10 s some task of the cgroup waited for a CPU (PSI's ``cpu.pressure``,
        ``some avg10``); None without one (a v1 cgroup, PSI off, the cgroup gone)."""
        if self._pressure is None:
            self._pressure = -1
            if self._v2 and self._fd is not None:
                with contextlib.suppress(OSError):
                    self._pressure = os.open(posixpath.join(posixpath.dirname(self.path), "cpu.pressure"),
                                             os.O_RDONLY | os.O_CLOEXEC)
        if self._pressure < 0:
            return None
        try:
            return read_pressure(os.pread(self._pressure, _MAX_BYTES, 0))
        except OSError:
            return None

    def seconds(self) -> float | None:
        """CPU seconds the cgroup has used so far; None once it is gone (or the file reads wrong)."""
        fd = self._fd
        if fd is None:
            return None
        try:
            data = os.pread(fd, _MAX_BYTES, 0)
        except OSError:  # ENODEV: the cgroup was removed
            self.close()
            return None
        try:
            if self._v2:
                head, value, _ = data.split(None, 2)  # "usage_usec N" is the first line
                return int(value) / 1e6 if head == b"usage_usec" else None
            return int(data) / 1e9
        except ValueError:
            return None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        pressure, self._pressure = self._pressure, -1
        if pressure is not None and pressure >= 0:
            os.close(pressure)


def read_pressure(data: bytes) -> float | None:
    """``some avg10`` of a PSI file (``some avg10=7.39 avg60=...``) as a part of the time, 0-1; None if it
    does not read so."""
    first = data.split(b"\n", 1)[0].split()
    if len(first) < 2 or first[0] != b"some" or not first[1].startswith(b"avg10="):
        return None
    try:
        value = float(first[1][6:]) / 100.0
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


def system_waited(path: str = "/proc/pressure/cpu") -> float | None:
    """The node's CPU pressure (``some avg10``), where a cgroup has none of its own; None without PSI."""
    try:
        with open(path, "rb") as f:
            return read_pressure(f.read(_MAX_BYTES))
    except OSError:
        return None


class CpuStat:
    """Opens the CPU counter of a freeze target's cgroup (see the module)."""

    def __init__(self, cgroup_root: str = "/sys/fs/cgroup", *, v2_mount: str | None = None) -> None:
        self.v2_mount = v2_mount  # where the agent's freezer found the unified hierarchy (None: not mounted)
        self.cpuacct_mount = next(
            (path for name in ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
             if os.path.isfile(os.path.join(path := os.path.join(cgroup_root, name), "cpuacct.usage"))),
            None)

    def path(self, target: FreezeTarget) -> str | None:
        """The counter file of ``target``; None where its hierarchy is not mounted or the path is not a
        plain absolute one."""
        mount = self.v2_mount if target.hierarchy == "v2" else self.cpuacct_mount
        cgroup = target.path
        if mount is None or not cgroup.startswith("/") or ".." in cgroup.split("/"):
            return None
        name = "cpu.stat" if target.hierarchy == "v2" else "cpuacct.usage"
        return posixpath.join(mount, cgroup.lstrip("/"), name)

    def open(self, targets: Sequence[FreezeTarget]) -> list[CpuCounter]:
        """The counters of ``targets`` that can be opened now (a workload's containers: summed by the
        caller)."""
        counters = []
        for target in targets:
            path = self.path(target)
            if path is None:
                continue
            try:
                counters.append(CpuCounter(path, v2=target.hierarchy == "v2"))
            except OSError:
                continue  # gone, or no such file on this kernel: not a signal to read
        return counters
