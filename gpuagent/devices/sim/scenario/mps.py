"""MPS in a scenario: an ``mps_client``'s limits, and the server every client needs.

A client's limits are what its environment would say (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), given as ``mps:`` on a made-up PID; a real PID's are its own
environment, so ``mps:`` there is an error, as is ``mps:`` on anything but a client. The pinned memory
limit is a whole number of MiB (the variable's unit) and at most what the device holds. A client connects
to the MPS server of its GPU (and MIG instance): a scenario with a client and no such server is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.devices.sim.models import MIB
from gpuagent.devices.sim.scenario.checks import Problems
from gpuagent.devices.sim.scenario.spec import MPS_LIMIT_VARIABLES, MpsSpec, ProcessSpec
from gpuagent.devices.sim.scenario.values import gib, parse_size


def read_mps(problems: Problems, p: Mapping[str, Any], kind: str, where: str,
             capacity: int) -> MpsSpec | None:
    """The limits of the process entry ``p`` of type ``kind`` (None for anything but a client)."""
    if "mps" not in p:
        return MpsSpec() if kind == "mps_client" else None
    if kind != "mps_client":
        problems.error(f"{where}.mps", f"only an mps_client has MPS limits (this process is {kind})")
        return None
    if p.get("pid") is not None:
        problems.error(f"{where}.mps", "a real PID's limits are its own environment: start it with "
                       + " and ".join(MPS_LIMIT_VARIABLES) + " instead")
        return None
    limits = p["mps"]
    memory = None
    if "pinned_memory_limit" in limits:
        memory = parse_size(limits["pinned_memory_limit"])
        if memory <= 0 or memory % MIB:
            problems.error(f"{where}.mps.pinned_memory_limit", f"must be a positive whole number of MiB, "
                           f"got {memory} bytes")
            return None
        if memory > capacity:
            problems.error(f"{where}.mps.pinned_memory_limit",
                           f"{gib(memory)} is more than the {gib(capacity)} the device holds")
            return None
    return MpsSpec(limits.get("active_thread_percentage"), memory)


def check_servers(problems: Problems, processes: list[ProcessSpec]) -> None:
    """An MPS client connects to a server on its GPU (and MIG instance): the scenario must have one."""
    servers = {(p.gpu, p.mig_instance) for p in processes if p.type == "mps_server"}
    for p in processes:
        if p.type == "mps_client" and (p.gpu, p.mig_instance) not in servers:
            on = f"GPU {p.gpu}" + (f" instance {p.mig_instance}" if p.mig_instance is not None else "")
            problems.error(f"processes[{p.index}].type",
                           f"an mps_client needs an mps_server process on {on} (type: mps_server)")
