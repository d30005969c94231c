"""The ``processes:`` section: where each process runs, who it is, and what it uses over time.

A process runs on a GPU, or on one of its MIG instances when the GPU is in MIG mode (and only then); its
memory curve must fit what it runs on. A process without ``pid`` gets a made-up one above any real PID
(``FAKE_PID_BASE`` + its index); one with a real ``pid`` is listed only while that process runs, may
follow its real CPU use (``sm_util: {follow_cpu: ...}``), and has its own environment, never a simulated
one. MPS servers and clients are processes too, with their limits read by :mod:`.mps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.devices.sim.curves import FollowCpu
from gpuagent.devices.sim.scenario.checks import Problems
from gpuagent.devices.sim.scenario.curve_nodes import read_curve
from gpuagent.devices.sim.scenario.gpus import instance_ids, missing_gpu
from gpuagent.devices.sim.scenario.mps import check_servers, read_mps
from gpuagent.devices.sim.scenario.spec import (
    DEFAULT_PROCESS_MEMORY,
    FAKE_PID_BASE,
    MPS_LIMIT_VARIABLES,
    MPS_SERVER_NAME,
    GpuSpec,
    ProcessSpec,
)
from gpuagent.devices.sim.scenario.values import gib


def read_processes(problems: Problems, entries: list[Mapping[str, Any]],
                   gpus: list[GpuSpec]) -> list[ProcessSpec]:
    """The processes of the ``processes:`` entries; an entry whose place is wrong is reported and left out."""
    out: list[ProcessSpec] = []
    pids: dict[int, int] = {}
    for i, p in enumerate(entries):
        where = f"processes[{i}]"
        gi_index = p["gpu"]
        if gi_index >= len(gpus):
            problems.error(f"{where}.gpu", missing_gpu(gi_index, gpus))
            continue
        gpu = gpus[gi_index]
        mig_instance = p.get("mig_instance")
        capacity = gpu.memory_bytes - gpu.reserved_bytes
        if gpu.mig_enabled:
            if mig_instance is None:
                problems.error(where, f"GPU {gi_index} is in MIG mode: give mig_instance "
                               f"(GPU instance IDs: {instance_ids(gpu)})")
                continue
            inst = gpu.instance(mig_instance)
            if inst is None:
                problems.error(f"{where}.mig_instance", f"GPU {gi_index} has no GPU instance {mig_instance} "
                               f"(it has: {instance_ids(gpu)})")
                continue
            capacity = inst.profile.memory_bytes
        elif mig_instance is not None:
            problems.error(f"{where}.mig_instance", f"GPU {gi_index} is not in MIG mode")
            continue
        pid = p.get("pid")
        real = pid is not None
        if pid is None:
            pid = FAKE_PID_BASE + i
        elif pid in pids:
            problems.error(f"{where}.pid", f"PID {pid} is already used by processes[{pids[pid]}]")
        pids[pid] = i
        start = float(p.get("start", 0.0))
        stop = p.get("stop")
        if stop is not None and stop <= start:
            problems.error(f"{where}.stop", f"must be after start ({start:g}), got {stop:g}")
        memory = read_curve(problems, p.get("memory", DEFAULT_PROCESS_MEMORY), f"{where}.memory", size=True,
                            lo=0.0)
        if memory is not None and memory.bounds()[1] > capacity:
            holder = f"GPU {gi_index}"
            if gpu.mig_enabled:
                holder = f"GPU instance {mig_instance} of {holder}"
            problems.error(f"{where}.memory", f"up to {gib(memory.bounds()[1])}, more than the "
                           f"{gib(capacity)} {holder} can hold")
        sm = read_curve(problems, p.get("sm_util", 0), f"{where}.sm_util", lo=0.0, hi=100.0, follow=True)
        if isinstance(sm, FollowCpu) and not real:
            problems.error(f"{where}.sm_util.follow_cpu", "needs a real 'pid' on the process")
        mem_util = (read_curve(problems, p["mem_util"], f"{where}.mem_util", lo=0.0, hi=100.0)
                    if "mem_util" in p else None)
        kind = p.get("type", "compute")
        default_name = MPS_SERVER_NAME if kind == "mps_server" else f"process-{i}"
        out.append(ProcessSpec(
            index=i, pid=pid, real=real, name=p.get("name", default_name), gpu=gi_index,
            mig_instance=mig_instance, type=kind, memory=memory, sm_util=sm,
            mem_util=mem_util, start=start, stop=float(stop) if stop is not None else None,
            mps=read_mps(problems, p, kind, where, capacity), environ=_environ(problems, p, real, where),
        ))
    check_servers(problems, out)
    return out


def _environ(problems: Problems, p: Mapping[str, Any], real: bool, where: str) -> Mapping[str, str]:
    """A made-up PID's simulated environment; a real PID has its own."""
    environ = dict(p.get("environ") or {})
    if environ and real:
        problems.error(f"{where}.environ", "a real PID's environment is its own (/proc/PID/environ): "
                       "start the process with it instead")
        return {}
    given = [v for v in MPS_LIMIT_VARIABLES if v in environ]
    if given and "mps" in p:
        problems.error(f"{where}.environ.{given[0]}",
                       "the MPS limits are given by 'mps' already: give them once")
    return environ
