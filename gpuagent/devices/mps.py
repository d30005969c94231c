"""MPS as NVML shows it: which processes are the MPS daemons, and what per-process utilization means.

Under MPS the driver lists the server (``nvidia-cuda-mps-server``) as the GPU's compute process and the
clients, the tenants' processes, only through ``nvmlDeviceGetMPSComputeRunningProcesses_v3``. The reader
asks for that list only on a GPU whose compute list shows a daemon: a GPU without a server has no
clients, and a process list costs milliseconds of the driver's lock on some GPUs. ``/proc/PID/comm`` holds
15 characters, so both daemons read ``nvidia-cuda-mps`` there; the control daemon opens no GPU context, so
a daemon on a GPU's list is the server unless its full name says it is the control daemon (the simulator
gives full names). Either is infrastructure (``MPS_SERVER``), nobody's tenant.

Per-process utilization: a driver may sample each client under its own PID, or put the clients' use on
the server's. Each GPU's reader learns which from what it sees: a client sampled means clients are
measured (an unsampled one ran no kernels: 0); the server sampled while no client is means they are not
(their use is unknown: ``None``, never 0). Until either shows, an idle GPU's clients read 0.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from gpuagent.snapshot.processes import MPS_CLIENT, MPS_SERVER, ProcessSample

MPS_LIST = "nvmlDeviceGetMPSComputeRunningProcesses_v3"
_DAEMON_NAMES = frozenset({"nvidia-cuda-mps-server", "nvidia-cuda-mps-control", "nvidia-cuda-mps"})


def is_mps_daemon(comm: str) -> bool:
    """The MPS server or control daemon, by its (possibly truncated) process name."""
    return comm in _DAEMON_NAMES


def process_kind(listed_as: str, comm: str) -> str:
    """The kind a process gets: MPS_SERVER for a daemon, else what its NVML list says."""
    return MPS_SERVER if is_mps_daemon(comm) else listed_as


class ClientUtilization:
    """One GPU's answer to "does this driver sample MPS clients under their own PIDs?" (see above)."""

    __slots__ = ("measured",)

    def __init__(self) -> None:
        self.measured: bool | None = None  # None: not known yet

    def settle(
        self, processes: tuple[ProcessSample, ...], sampled: Collection[int]
    ) -> tuple[ProcessSample, ...]:
        """``processes`` with their MPS clients' utilization made unknown where this driver does not
        measure it; ``sampled`` are the PIDs with a utilization sample this poll."""
        clients = [p for p in processes if p.kind == MPS_CLIENT]
        if not clients:
            return processes
        if any(p.pid in sampled for p in clients):
            self.measured = True
        elif self.measured is None and any(p.kind == MPS_SERVER and p.pid in sampled for p in processes):
            self.measured = False
        if self.measured is not False:
            return processes
        return tuple(
            replace(p, sm_util_percent=None, memory_util_percent=None) if p.kind == MPS_CLIENT else p
            for p in processes
        )
