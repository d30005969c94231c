"""Join GPU processes (NVML) with their cgroups and the kubelet's allocations into workloads and pods.

The kubelet's pod-resources API names pods (namespace, pod, container) and the devices each was given, but
carries no pod UID and no container ID; a process's cgroup carries the pod UID and container ID but no
names. The join goes through the GPUs themselves: a pod UID whose processes run on a device, and a pod
allocated that device, belong together when the device (after eliminating every pair already matched)
leaves exactly one of each, and the match holds on every device the UID is seen on. What cannot be
matched that way keeps its UID as its name, and ``names_from`` says so ("cgroup"). The API server, when
configured, names every pod outright (``names_by_uid``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpuagent.snapshot import ContainerUse, GpuSample, PodUse, ProcessSample, Workload

PodKey = tuple[str, str]  # (namespace, pod name)


class Identity(Protocol):
    """What ``pods.cgroup.CgroupIdentity`` provides."""

    is_k8s: bool
    pod_uid: str | None
    qos: str | None
    container_id: str | None
    workload_kind: str
    unit: str | None
    path: str
    unified_path: str | None
    freezer_path: str | None


class Allocation(Protocol):
    """What ``pods.podresources.DeviceAllocation`` provides."""

    namespace: str
    pod: str
    container: str
    device_id: str
    gpu_uuid: str | None
    mig_uuid: str | None


@dataclass(frozen=True, slots=True)
class PodName:
    """Names of a pod from the API server: authoritative when present."""

    namespace: str
    name: str
    containers_by_id: Mapping[str, str] = field(default_factory=dict)  # container ID -> container name
    annotations: Mapping[str, str] = field(default_factory=dict)  # gpuagent.io/* annotations
    qos: str | None = None


def device_key(gpu: GpuSample, process: ProcessSample) -> str:
    """The device a process runs on, as allocations name it: its MIG instance's UUID, else the GPU's."""
    if process.gpu_instance_id is not None:
        for mig in gpu.migs:
            if mig.gpu_instance_id == process.gpu_instance_id:
                return mig.uuid
    return gpu.info.uuid


def allocation_key(allocation: Allocation) -> str | None:
    return allocation.mig_uuid or allocation.gpu_uuid


def match_pods(
    uids_by_device: Mapping[str, set[str]], pods_by_device: Mapping[str, set[PodKey]]
) -> dict[str, PodKey]:
    """Pod UID -> (namespace, pod), by elimination over the devices both sides name."""
    matched: dict[str, PodKey] = {}
    taken: set[PodKey] = set()
    devices_of_uid: dict[str, set[str]] = defaultdict(set)
    for device, uids in uids_by_device.items():
        for uid in uids:
            devices_of_uid[uid].add(device)
    progress = True
    while progress:
        progress = False
        for device, uids in uids_by_device.items():
            open_uids = uids - matched.keys()
            open_pods = pods_by_device.get(device, set()) - taken
            if len(open_uids) != 1 or len(open_pods) != 1:
                continue
            (uid,), (pod,) = open_uids, open_pods
            # The pod must hold every device the UID is seen on, or the UID is someone else (a pod using a
            # GPU it was not allocated, while the allocated pod is idle).
            if all(pod in pods_by_device.get(d, set()) for d in devices_of_uid[uid]):
                matched[uid] = pod
                taken.add(pod)
                progress = True
    return matched


def attribute(
    gpus: Sequence[GpuSample],
    identities: Mapping[int, Identity | None],
    allocations: Sequence[Allocation] | None,
    names_by_uid: Mapping[str, PodName] | None = None,
) -> tuple[tuple[GpuSample, ...], tuple[PodUse, ...]]:
    """The GPUs with every process's workload filled in, and the pods holding or using GPUs."""
    allocations = allocations or ()
    names_by_uid = names_by_uid or {}
    parent_of = {mig.uuid: gpu.info.uuid for gpu in gpus for mig in gpu.migs}
    pods_by_device: dict[str, set[PodKey]] = defaultdict(set)
    containers_by_pod_device: dict[tuple[PodKey, str], set[str]] = defaultdict(set)
    for allocation in allocations:
        key = allocation_key(allocation)
        if key is not None:
            pod = (allocation.namespace, allocation.pod)
            pods_by_device[key].add(pod)
            containers_by_pod_device[(pod, key)].add(allocation.container)

    uids_by_device: dict[str, set[str]] = defaultdict(set)
    for gpu in gpus:
        for process in gpu.processes:
            identity = identities.get(process.pid)
            if identity is not None and identity.is_k8s and identity.pod_uid:
                uids_by_device[device_key(gpu, process)].add(identity.pod_uid)
    unnamed = {d: {u for u in uids if u not in names_by_uid} for d, uids in uids_by_device.items()}
    named_pods = {(n.namespace, n.name) for n in names_by_uid.values()}
    open_pods = {d: pods - named_pods for d, pods in pods_by_device.items()}
    matched = match_pods(unnamed, open_pods)

    def workload(gpu: GpuSample, process: ProcessSample) -> Workload | None:
        identity = identities.get(process.pid)
        if identity is None:
            return None
        if not (identity.is_k8s and identity.pod_uid):
            name = identity.unit or (identity.container_id or "")[:12] or identity.workload_kind
            return Workload(kind=identity.workload_kind, name=name, container_id=identity.container_id,
                            cgroup=identity.path, cgroup_v2=identity.unified_path,
                            cgroup_freezer=identity.freezer_path)
        uid = identity.pod_uid
        base = Workload(kind="pod", name=uid, pod_uid=uid, container_id=identity.container_id,
                        qos=identity.qos, cgroup=identity.path, cgroup_v2=identity.unified_path,
                        cgroup_freezer=identity.freezer_path)
        known = names_by_uid.get(uid)
        if known is not None:
            container = known.containers_by_id.get(identity.container_id or "")
            return replace(base, name=known.name, namespace=known.namespace, container=container,
                           names_from="api_server")
        pod = matched.get(uid)
        if pod is None:
            return base
        containers = containers_by_pod_device.get((pod, device_key(gpu, process)), set())
        container = next(iter(containers)) if len(containers) == 1 else None
        return replace(base, namespace=pod[0], name=pod[1], container=container, names_from="pod_resources")

    def with_workloads(gpu: GpuSample, processes: Iterable[ProcessSample]) -> tuple[ProcessSample, ...]:
        return tuple(replace(p, workload=workload(gpu, p)) for p in processes)

    attributed = tuple(
        replace(
            gpu,
            processes=with_workloads(gpu, gpu.processes),
            migs=tuple(replace(mig, processes=with_workloads(gpu, mig.processes)) for mig in gpu.migs),
        )
        for gpu in gpus
    )
    return attributed, _pods(attributed, allocations, parent_of, names_by_uid)


@dataclass(slots=True)
class _PodTotals:
    namespace: str | None
    name: str
    uid: str | None = None
    qos: str | None = None
    names_from: str = "cgroup"
    allocated: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # container -> ids
    pids: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    memory: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sm: dict[str, float] = field(default_factory=dict)
    allocated_gpus: list[str] = field(default_factory=list)
    used_gpus: list[str] = field(default_factory=list)


def _pods(
    gpus: Sequence[GpuSample],
    allocations: Sequence[Allocation],
    parent_of: Mapping[str, str],
    names_by_uid: Mapping[str, PodName],
) -> tuple[PodUse, ...]:
    pods: dict[tuple[str | None, str], _PodTotals] = {}
    for allocation in allocations:
        totals = pods.setdefault((allocation.namespace, allocation.pod),
                                 _PodTotals(allocation.namespace, allocation.pod, names_from="pod_resources"))
        totals.allocated[allocation.container].append(allocation.device_id)
        gpu = allocation.gpu_uuid or parent_of.get(allocation.mig_uuid or "")
        if gpu and gpu not in totals.allocated_gpus:
            totals.allocated_gpus.append(gpu)
    for gpu in gpus:
        for process in gpu.processes:
            w = process.workload
            if w is None or w.kind != "pod":
                continue
            totals = pods.setdefault((w.namespace, w.name), _PodTotals(w.namespace, w.name))
            totals.uid, totals.qos, totals.names_from = w.pod_uid, w.qos, w.names_from
            container = w.container or (w.container_id or "")[:12] or "unknown"
            totals.pids[container].append(process.pid)
            totals.memory[container] += process.used_memory_bytes or 0
            if process.sm_util_percent is not None:
                totals.sm[container] = totals.sm.get(container, 0.0) + process.sm_util_percent
            if gpu.info.uuid not in totals.used_gpus:
                totals.used_gpus.append(gpu.info.uuid)
    known = {(n.namespace, n.name): (uid, n) for uid, n in names_by_uid.items()}
    ordered = sorted(pods.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
    return tuple(_pod_use(t, known.get(key)) for key, t in ordered)


def _pod_use(t: _PodTotals, known: tuple[str, PodName] | None = None) -> PodUse:
    names = sorted(set(t.allocated) | set(t.pids))
    containers = tuple(
        ContainerUse(
            name=name,
            allocated_devices=tuple(t.allocated.get(name, ())),
            pids=tuple(sorted(t.pids.get(name, ()))),
            gpu_memory_used_bytes=t.memory.get(name, 0),
            sm_util_percent=t.sm.get(name),
        )
        for name in names
    )
    sm_values = [c.sm_util_percent for c in containers if c.sm_util_percent is not None]
    uid, qos, names_from, annotations = t.uid, t.qos, t.names_from, {}
    if known is not None:  # the API server knows the pod, idle or not
        uid, name = known
        qos, names_from, annotations = name.qos or qos, "api_server", dict(name.annotations)
    return PodUse(
        name=t.name, namespace=t.namespace, uid=uid, qos=qos, names_from=names_from, annotations=annotations,
        containers=containers, allocated_gpus=tuple(t.allocated_gpus), used_gpus=tuple(t.used_gpus),
        gpu_memory_used_bytes=sum(c.gpu_memory_used_bytes for c in containers),
        sm_util_percent=sum(sm_values) if sm_values else None,
        process_count=sum(len(c.pids) for c in containers),
    )
