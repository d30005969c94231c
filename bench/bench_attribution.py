"""Benchmark the device join without the API server: devices alone, and weighing the processes' environments.

Usage: .venv/bin/python bench/bench_attribution.py [--polls 300]

The node: 8 GPUs, each time-sliced by 8 pods (``GPU-…::n`` replicas), one process each: 64 pods the devices
alone cannot name (8 on every GPU), which their HOSTNAMEs name. ``Attributor.attribute`` runs once per poll
on the same inputs, as in the agent; ``devices_only`` passes no environments (the join before the
evidence), ``with_environments`` passes each process's (HOSTNAME, NVIDIA_VISIBLE_DEVICES), and
``one_pod_straying`` adds a process of one pod on a GPU nobody was allocated. Both in one run, side by side:
report the ratio, not the absolute figures (this machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuagent.pods.attribution import Attributor
from gpuagent.pods.cgroup import CgroupIdentity, parse_proc_cgroup
from gpuagent.pods.podresources import DeviceAllocation, parse_device_id
from gpuagent.snapshot.gpu import GpuInfo, GpuSample
from gpuagent.snapshot.processes import ProcessSample

GPUS, PODS_PER_GPU = 8, 8


Node = tuple[list[GpuSample], dict[int, CgroupIdentity], list[DeviceAllocation], dict[int, dict[str, str]]]


def identity(uid: str, container: str) -> CgroupIdentity:
    """What the agent reads from a kubelet-shaped /proc/PID/cgroup file."""
    slice_uid = uid.replace("-", "_")
    return parse_proc_cgroup(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}"
                             f".slice/cri-containerd-{container}.scope\n")


def allocation(namespace: str, pod: str, container: str, device_id: str) -> DeviceAllocation:
    parsed = parse_device_id(device_id)
    return DeviceAllocation(namespace, pod, container, "nvidia.com/gpu", device_id, parsed.gpu_uuid,
                            parsed.mig_uuid, parsed.replica)


def node(straying: bool) -> Node:
    gpus: list[GpuSample] = []
    identities: dict[int, CgroupIdentity] = {}
    allocations: list[DeviceAllocation] = []
    environs: dict[int, dict[str, str]] = {}
    for g in range(GPUS + 1):  # the last GPU is nobody's
        uuid = f"GPU-{g:08x}-0000-0000-0000-000000000000"
        procs = []
        for n in range(PODS_PER_GPU if g < GPUS else 0):
            pid = 1000 + g * PODS_PER_GPU + n
            name = f"infer-{g}-{n}-7d9f8"
            procs.append(ProcessSample(pid, "python", "compute", 1 << 30, 10.0, 5.0))
            identities[pid] = identity(f"{g:08x}-{n:04x}-4000-8000-000000000000", f"{pid:064x}")
            allocations.append(allocation("serving", name, "main", f"{uuid}::{n}"))
            environs[pid] = {"HOSTNAME": name, "NVIDIA_VISIBLE_DEVICES": uuid}
        if g == GPUS and straying:
            procs.append(ProcessSample(9999, "python", "compute", 1 << 30, 10.0, 5.0))
            identities[9999] = identities[1000]
            environs[9999] = environs[1000]
        info = GpuInfo(index=g, uuid=uuid, name="NVIDIA H100 80GB HBM3", serial=None, pci_bus_id=f"0:{g}",
                       minor_number=g, memory_total_bytes=80 << 30, power_limit_watts=700.0,
                       mig_enabled=False)
        gpus.append(GpuSample(info=info, sampled_at_unix=0.0, processes=tuple(procs)))
    return gpus, identities, allocations, environs


def timed(polls: int, straying: bool, with_environs: bool) -> tuple[list[float], int]:
    gpus, identities, allocations, environs = node(straying)
    attributor = Attributor()
    times, named = [], 0
    for _ in range(polls):
        t0 = time.perf_counter()
        given = environs if with_environs else None
        out, _ = attributor.attribute(gpus, identities, allocations, None, given)
        times.append(time.perf_counter() - t0)
        named = sum(1 for g in out for p in g.processes if p.workload and p.workload.names_from != "cgroup")
    return times, named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=300)
    args = parser.parse_args()
    result = {}
    for label, straying, environs in (("devices_only", False, False), ("with_environments", False, True),
                                      ("one_pod_straying", True, True)):
        times, named = timed(args.polls, straying, environs)
        result[label] = {"median_ms": round(statistics.median(times) * 1000, 3),
                         "p95_ms": round(sorted(times)[int(len(times) * 0.95) - 1] * 1000, 3),
                         "processes_named": named}
    base = result["devices_only"]["median_ms"]
    result["ratio_with_environments"] = round(result["with_environments"]["median_ms"] / base, 2)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
