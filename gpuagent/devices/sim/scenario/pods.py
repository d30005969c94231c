"""The ``pods:`` section: the Kubernetes pods a simulated node's processes belong to, and their devices.

A pod names its containers; a container names the scenario's processes that run in it (by ``name``: their
cgroup will be the container's) and the devices the kubelet allocated to it: a whole GPU, a replica of one
(time-slicing or MPS sharing: ``GPU-<uuid>::<n>``) or a MIG device (a GPU instance of a GPU in MIG mode).
The checks: a process named exists, once in the file, is a made-up PID (a real process has its own
cgroup), and runs in one container only; a device exists (the GPU, its MIG instance, a replica only of a
GPU not in MIG mode) and is given to one container only; a pod's namespace and name are unique. A process
may run on a GPU its container was not allocated: that is the stray the agent flags, not an error here.
The NVML simulator does not read this section; ``gpuagent demo`` serves it (:mod:`gpuagent.demo`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gpuagent.devices.sim.scenario.checks import Problems, did_you_mean
from gpuagent.devices.sim.scenario.gpus import instance_ids, missing_gpu
from gpuagent.devices.sim.scenario.spec import GpuSpec, PodContainerSpec, PodDeviceSpec, PodSpec, ProcessSpec

_UID_NAMESPACE = uuid.UUID("6f1c9a52-4b7e-4f1a-9d0e-8a4c2b3d5e60")  # pod UIDs derived from the seed


def read_pods(problems: Problems, entries: list[Mapping[str, Any]], gpus: Sequence[GpuSpec],
              processes: Sequence[ProcessSpec], seed: str) -> list[PodSpec]:
    """The pods of the ``pods:`` entries; what is wrong is in ``problems``."""
    by_name: dict[str, list[ProcessSpec]] = {}
    for process in processes:
        by_name.setdefault(process.name, []).append(process)
    placed: dict[int, str] = {}  # pid -> the container it runs in
    given: dict[tuple[int, int | None, int | None], str] = {}  # device -> the container it was given to
    seen: set[tuple[str, str]] = set()
    out = []
    for i, p in enumerate(entries):
        where = f"pods[{i}]"
        key = (p["namespace"], p["name"])
        if key in seen:
            problems.error(f"{where}.name", f"pod {key[0]}/{key[1]} is declared twice")
        seen.add(key)
        containers = []
        for j, c in enumerate(p["containers"]):
            here = f"{where}.containers[{j}]"
            holder = f"{key[0]}/{key[1]}/{c['name']}"
            pids = [pid for k, name in enumerate(c.get("processes") or [])
                    if (pid := _process(problems, f"{here}.processes[{k}]", name, by_name, placed, holder))]
            devices = [device for k, d in enumerate(c.get("devices") or [])
                       if (device := _device(problems, f"{here}.devices[{k}]", d, gpus, given, holder))]
            containers.append(PodContainerSpec(c["name"], tuple(pids), tuple(devices)))
        owner = p.get("owner") or {}
        uid = p.get("uid") or str(uuid.uuid5(_UID_NAMESPACE, f"{seed}/{key[0]}/{key[1]}"))
        out.append(PodSpec(
            namespace=key[0], name=key[1], uid=uid,
            owner_kind=owner.get("kind"), owner_name=owner.get("name"), qos=p.get("qos", "Burstable"),
            annotations=dict(p.get("annotations") or {}), containers=tuple(containers),
        ))
    return out


def _process(problems: Problems, where: str, name: str, by_name: Mapping[str, list[ProcessSpec]],
             placed: dict[int, str], holder: str) -> int | None:
    found = by_name.get(name, [])
    if not found:
        problems.error(where, f"no process is named {name!r}{did_you_mean(name, by_name)}")
        return None
    if len(found) > 1:
        problems.error(where, f"{len(found)} processes are named {name!r}: give them names of their own")
        return None
    process = found[0]
    if process.real:
        problems.error(where, f"process {name!r} is a real PID ({process.pid}): its cgroup is its own")
        return None
    if process.pid in placed:
        problems.error(where, f"process {name!r} already runs in {placed[process.pid]}")
        return None
    placed[process.pid] = holder
    return process.pid


def _device(problems: Problems, where: str, d: Mapping[str, Any], gpus: Sequence[GpuSpec],
            given: dict[tuple[int, int | None, int | None], str], holder: str) -> PodDeviceSpec | None:
    index = d["gpu"]
    if index >= len(gpus):
        problems.error(f"{where}.gpu", missing_gpu(index, gpus))
        return None
    gpu = gpus[index]
    device = PodDeviceSpec(index, d.get("replica"), d.get("mig_instance"))
    if gpu.mig_enabled and device.mig_instance is None:
        problems.error(where, f"GPU {index} is in MIG mode: give mig_instance (GPU instance IDs: "
                       f"{instance_ids(gpu)})")
        return None
    if device.mig_instance is not None and gpu.instance(device.mig_instance) is None:
        which = f"it has: {instance_ids(gpu)}" if gpu.mig_enabled else "it is not in MIG mode"
        problems.error(f"{where}.mig_instance",
                       f"GPU {index} has no GPU instance {device.mig_instance} ({which})")
        return None
    whole = (index, None, None)
    key = (index, device.replica, device.mig_instance)
    if key in given:
        clash: str | None = given[key]
    elif key == whole:  # a whole GPU shares with nobody
        clash = next((other for (g, _, _), other in given.items() if g == index), None)
    else:
        clash = given.get(whole)
    if clash is not None:
        problems.error(where, f"{_describe(device)} is already allocated to {clash}")
        return None
    given[key] = holder
    return device


def _describe(device: PodDeviceSpec) -> str:
    if device.mig_instance is not None:
        return f"GPU {device.gpu} instance {device.mig_instance}"
    if device.replica is not None:
        return f"replica {device.replica} of GPU {device.gpu}"
    return f"GPU {device.gpu}"
