"""The processes on one GPU, each poll: NVML's process lists joined with their names and utilization.

Each poll reads the graphics and compute lists once each (a process on both is kept once, as the listing
with more memory), and the MPS clients' list only where the compute list shows an MPS daemon: a GPU
without a server has no clients, and a process list costs milliseconds of the driver's lock on some GPUs
(``devices/mps.py``, ``docs/nvml-cost.md``). Each process gets its name (``/proc/PID/comm``), its kind, the
GPU instance it runs in (MIG), and its SM and memory utilization of the last per-process read
(``procutil``: every poll where the share controller acts, every ``process_utilization_interval``
elsewhere; NVML has none on a MIG GPU). Where the driver does not sample MPS clients under their own
PIDs, their utilization is unknown, never 0 (``mps.ClientUtilization``).

A :class:`ProcessReader` belongs to one GPU and is only ever used from that GPU's worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuagent.devices.guard import NvmlGuard
from gpuagent.devices.mps import MPS_LIST, ClientUtilization, is_mps_daemon, process_kind
from gpuagent.devices.procutil import ProcessUtilization
from gpuagent.snapshot.processes import MPS_CLIENT, ProcessSample

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process on a GPU without MIG

ProcessNames = Callable[[int], str]


class ProcessReader:
    """One GPU's process list each poll; ``utilization`` is its per-process reader (``every_poll``)."""

    def __init__(self, guard: NvmlGuard, index: int, handle: Any, *, process_names: ProcessNames,
                 utilization: ProcessUtilization) -> None:
        self._guard = guard
        self._index = index
        self._handle = handle
        self._names = process_names
        self.utilization = utilization
        self._mps_clients = ClientUtilization()  # whether this driver samples MPS clients (devices/mps.py)

    def read(self, *, mig_enabled: bool) -> tuple[ProcessSample, ...]:
        """Both process lists once each (and the MPS clients' where an MPS server runs), joined with the
        per-process utilization of the last read (none on a MIG GPU)."""
        g, h, s = self._guard, self._handle, self._index
        found: dict[int, tuple[str, Any]] = {}
        for kind, function in (
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ):
            for proc in g.call(function, h, scope=s) or ():
                previous = found.get(proc.pid)
                if previous is None or _memory(proc) > _memory(previous[1]):
                    found[proc.pid] = (kind, proc)
        if any(is_mps_daemon(self._names(pid)) for pid in found):
            for proc in g.call(MPS_LIST, h, scope=s) or ():
                found[proc.pid] = (MPS_CLIENT, proc)
        per_process_util = not mig_enabled  # NVML has none on MIG
        if per_process_util:
            self.utilization.update(found)
        out = []
        for pid, (kind, proc) in sorted(found.items()):
            gi = getattr(proc, "gpuInstanceId", NO_INSTANCE)
            sm, mem = self.utilization.figures(pid) if per_process_util else (None, None)
            out.append(
                ProcessSample(
                    pid=pid,
                    comm=self._names(pid),
                    kind=process_kind(kind, self._names(pid)),
                    used_memory_bytes=proc.usedGpuMemory,
                    sm_util_percent=sm,
                    memory_util_percent=mem,
                    gpu_instance_id=None if gi in (None, NO_INSTANCE) else gi,
                )
            )
        return self._mps_clients.settle(tuple(out), self.utilization.sampled)


def _memory(proc: Any) -> int:
    return proc.usedGpuMemory or 0
