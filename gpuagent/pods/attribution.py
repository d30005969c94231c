"""Join GPU processes (NVML) with their cgroups and the kubelet's allocations into workloads and pods.

The kubelet's pod-resources API names pods (namespace, pod, container) and the devices each was given, but
carries no pod UID and no container ID; a process's cgroup carries the pod UID and container ID but no
names. The join goes through the GPUs themselves (`pods/matching.py`): a pod UID whose processes run on a
device, and a pod allocated that device, belong together when the device (after eliminating every pair
already matched) leaves exactly one of each and the match holds on every device the UID is seen on, or
when the processes' own environments confirm it (:mod:`gpuagent.pods.evidence`: their hostname, the
devices they were given). That evidence names a pod that also strays onto a GPU it was not allocated
(reported as its unallocated use), tells pods sharing one GPU apart, and keeps an unallocated pod running
on an idle pod's GPU from taking that pod's name. What cannot be matched keeps its UID as its name, and
``names_from`` says so ("cgroup"). The API server, when configured, names every pod outright
(``names_by_uid``). MPS servers are infrastructure: they join no pod's use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from gpuagent.pods.environ import Environ
from gpuagent.pods.evidence import Evidence
from gpuagent.pods.matching import Allocation, PodKey, allocation_key, device_key, match_pods
from gpuagent.snapshot.gpu import GpuSample, MigSample
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import MPS_SERVER, ProcessSample, Workload
from gpuagent.untrusted import label_value


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


@dataclass(frozen=True, slots=True)
class PodName:
    """Names of a pod from the API server: authoritative when present."""

    namespace: str
    name: str
    containers_by_id: Mapping[str, str] = field(default_factory=dict)  # container ID -> container name
    annotations: Mapping[str, str] = field(default_factory=dict)  # gpuagent.io/* annotations
    qos: str | None = None
    # The top of its controller chain (Deployment, CronJob, StatefulSet, ...; "Pod" for a bare pod); None
    # while the API server is being asked (pods/owners.py)
    owner_kind: str | None = None
    owner_name: str | None = None


def attribute(
    gpus: Sequence[GpuSample],
    identities: Mapping[int, Identity | None],
    allocations: Sequence[Allocation] | None,
    names_by_uid: Mapping[str, PodName] | None = None,
    environs: Mapping[int, Environ | None] | None = None,
    node_names: frozenset[str] = frozenset(),
) -> tuple[tuple[GpuSample, ...], tuple[PodUse, ...]]:
    """The GPUs with every process's workload filled in, and the pods holding or using GPUs."""
    return Attributor(node_names).attribute(gpus, identities, allocations, names_by_uid, environs)


T = TypeVar("T")


def _replacer(cls: type[T], *names: str) -> Callable[..., T]:
    """``dataclasses.replace(obj, name=value, ...)`` for fixed field names, positionally: about half the
    cost, which counts for the 60-odd processes of every poll."""
    all_fields = fields(cls)  # type: ignore[arg-type]
    if any(not f.init or f.kw_only for f in all_fields):
        raise TypeError(f"{cls.__name__}: every field must be a positional __init__ argument")
    order = [f.name for f in all_fields]
    get = attrgetter(*order)
    slots = [order.index(name) for name in names]

    def replaced(obj: T, *values: Any) -> T:
        current = list(get(obj))
        for slot, value in zip(slots, values, strict=True):
            current[slot] = value
        return cls(*current)

    return replaced


_with_workload = _replacer(ProcessSample, "workload")
_mig_with_processes = _replacer(MigSample, "processes")
_gpu_with_processes = _replacer(GpuSample, "processes", "migs")
_NO_NAMES: Mapping[str, PodName] = MappingProxyType({})

# How a pod process is named: (namespace, name, container, names_from); None keeps the cgroup's UID.
_Resolved = tuple[str, str, "str | None", str] | None


@dataclass(frozen=True, slots=True)
class _AllocationIndex:
    """What the kubelet's allocations say, indexed for attribution."""

    pods_by_device: Mapping[str, set[PodKey]]
    container_of: Mapping[tuple[PodKey, str], str]  # (pod, device) -> its only container there
    container_devices: Mapping[PodKey, tuple[frozenset[str], ...]]  # pod -> each container's device keys
    # pod -> (container -> device ids allocated, GPUs allocated (a MIG device counts its parent))
    allocated: Mapping[PodKey, tuple[Mapping[str, tuple[str, ...]], tuple[str, ...]]]


def _index_allocations(allocations: Sequence[Allocation], parent_of: Mapping[str, str]) -> _AllocationIndex:
    pods_by_device: dict[str, set[PodKey]] = defaultdict(set)
    containers_by_pod_device: dict[tuple[PodKey, str], set[str]] = defaultdict(set)
    keys_by_container: dict[PodKey, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    devices: dict[PodKey, dict[str, list[str]]] = {}
    allocated_gpus: dict[PodKey, list[str]] = {}
    for allocation in allocations:
        pod = (allocation.namespace, allocation.pod)
        key = allocation_key(allocation)
        if key is not None:
            pods_by_device[key].add(pod)
            containers_by_pod_device[(pod, key)].add(allocation.container)
            keys_by_container[pod][allocation.container].add(key)
        devices.setdefault(pod, {}).setdefault(allocation.container, []).append(allocation.device_id)
        gpus = allocated_gpus.setdefault(pod, [])
        gpu = allocation.gpu_uuid or parent_of.get(allocation.mig_uuid or "")
        if gpu and gpu not in gpus:
            gpus.append(gpu)
    return _AllocationIndex(
        pods_by_device=dict(pods_by_device),
        container_of={k: next(iter(c)) for k, c in containers_by_pod_device.items() if len(c) == 1},
        container_devices={pod: tuple(frozenset(keys) for keys in by_container.values())
                           for pod, by_container in keys_by_container.items()},
        allocated={pod: ({c: tuple(ids) for c, ids in by_container.items()}, tuple(allocated_gpus[pod]))
                   for pod, by_container in devices.items()},
    )


@dataclass(frozen=True, slots=True)
class _NameIndex:
    """What the API server's names say, indexed for attribution."""

    named_pods: frozenset[PodKey]
    known: Mapping[PodKey, tuple[str, PodName]]  # (namespace, name) -> (UID, names)


def _index_names(names_by_uid: Mapping[str, PodName]) -> _NameIndex:
    return _NameIndex(
        named_pods=frozenset((n.namespace, n.name) for n in names_by_uid.values()),
        known={(n.namespace, n.name): (uid, n) for uid, n in names_by_uid.items()},
    )


def _containers_by_id(
    gpus: Sequence[GpuSample], identities: Mapping[int, Identity | None], matched: Mapping[str, PodKey],
    index: _AllocationIndex,
) -> dict[str, str]:
    """Container ID -> container name, where a matched pod's process runs on a device allocated to one
    container of it: its processes elsewhere (a GPU it strays onto) are that container's too."""
    out: dict[str, str] = {}
    for gpu in gpus:
        for process in gpu.processes:
            identity = identities.get(process.pid)
            if identity is None or not identity.container_id or identity.pod_uid not in matched:
                continue
            name = index.container_of.get((matched[identity.pod_uid], device_key(gpu, process)))
            if name is not None:
                out[identity.container_id] = name
    return out


def _workload(identity: Identity, resolved: _Resolved) -> Workload:
    if not (identity.is_k8s and identity.pod_uid):
        # a unit or scope name is a cgroup directory any user with a delegated subtree can create: its
        # controls are shown as escapes here, where it becomes a name (the path itself stays exact)
        name = label_value(identity.unit or (identity.container_id or "")[:12] or identity.workload_kind)
        return Workload(kind=identity.workload_kind, name=name, container_id=identity.container_id,
                        cgroup=identity.path, cgroup_v2=identity.unified_path,
                        cgroup_freezer=identity.freezer_path)
    uid = identity.pod_uid
    if resolved is None:
        namespace, name, container, names_from = None, uid, None, "cgroup"
    else:
        namespace, name, container, names_from = resolved
    return Workload(kind="pod", name=name, namespace=namespace, container=container, pod_uid=uid,
                    container_id=identity.container_id, qos=identity.qos, cgroup=identity.path,
                    names_from=names_from, cgroup_v2=identity.unified_path,
                    cgroup_freezer=identity.freezer_path)


class Attributor:
    """:func:`attribute` for a caller that attributes every poll, doing per poll only what changed.

    Kept between calls: the allocations' index while the allocations are the same object (a sequence
    passed here must not be changed afterwards: the pods source replaces it), the API server's index
    while its names are the same mapping (the metadata source replaces it on every change), each
    process's :class:`Workload` while its identity is the same object and names it the same way, and each
    pod's :class:`PodUse` while everything it is built from is equal. Snapshot objects are immutable, so
    one shared by two polls reads the same as two equal ones. Caches hold only what the last poll used.
    """

    def __init__(self, node_names: frozenset[str] = frozenset()) -> None:
        self._node_names = node_names  # the node's own names: the HOSTNAME of a hostNetwork pod
        self._allocations_in: Sequence[Allocation] | None = None
        self._parents_in: dict[str, str] = {}
        self._allocation_index = _index_allocations((), {})
        self._names_in: Mapping[str, PodName] = _NO_NAMES
        self._name_index = _index_names(_NO_NAMES)
        self._workloads: dict[int, tuple[Identity, _Resolved, Workload]] = {}  # id(identity) -> ...
        self._pod_uses: dict[tuple[str | None, str], tuple[tuple[Any, ...], PodUse]] = {}
        self._match: tuple[Any, dict[str, PodKey]] = ((), {})  # the join's inputs and its answer
        self._keys_in: list[tuple[str | None, str]] = []  # the pods of the last poll, and in their order
        self._keys_sorted: list[tuple[str | None, str]] = []

    def attribute(
        self,
        gpus: Sequence[GpuSample],
        identities: Mapping[int, Identity | None],
        allocations: Sequence[Allocation] | None,
        names_by_uid: Mapping[str, PodName] | None = None,
        environs: Mapping[int, Environ | None] | None = None,
    ) -> tuple[tuple[GpuSample, ...], tuple[PodUse, ...]]:
        """The GPUs with every process's workload filled in, and the pods holding or using GPUs.
        ``environs``: PID -> what its environment says (None: unknown), the evidence of the join."""
        allocations = allocations or ()
        names_by_uid = names_by_uid or _NO_NAMES
        parent_of = {mig.uuid: gpu.info.uuid for gpu in gpus for mig in gpu.migs}
        if allocations is not self._allocations_in or parent_of != self._parents_in:
            self._allocation_index = _index_allocations(allocations, parent_of)
            self._allocations_in, self._parents_in = allocations, parent_of
        if names_by_uid is not self._names_in:
            self._name_index = _index_names(names_by_uid)
            self._names_in = names_by_uid
        index, names = self._allocation_index, self._name_index

        # The pod UIDs the API server does not name, by device (only those need the join), and what their
        # processes' environments say.
        unnamed: dict[str, set[str]] = defaultdict(set)
        environs_by_uid: dict[str, list[Environ]] = defaultdict(list)
        for gpu in gpus:
            for process in gpu.processes:
                identity = identities.get(process.pid)
                if identity is None or not identity.is_k8s or not identity.pod_uid:
                    continue
                if process.kind == MPS_SERVER or identity.pod_uid in names_by_uid:
                    continue  # an MPS server serves the tenants (from a device plugin's pod): none of them
                unnamed[device_key(gpu, process)].add(identity.pod_uid)
                environ = environs.get(process.pid) if environs else None
                if environ is not None:
                    environs_by_uid[identity.pod_uid].append(environ)
        matched: dict[str, PodKey] = {}
        if any(unnamed.values()):  # with none, nothing could match
            inputs = (index, names, frozenset((d, frozenset(u)) for d, u in unnamed.items()),
                      frozenset((uid, frozenset(frozenset(e.items()) for e in envs))
                                for uid, envs in environs_by_uid.items()))
            if inputs == self._match[0]:  # the same join as last poll (unchanged indexes: the same objects)
                matched = self._match[1]
            else:
                open_pods = {d: pods - names.named_pods for d, pods in index.pods_by_device.items()}
                evidence = Evidence(environs_by_uid, gpus, index.container_devices, self._node_names)
                matched = match_pods(unnamed, open_pods, evidence.score)
                self._match = (inputs, matched)

        containers = _containers_by_id(gpus, identities, matched, index) if matched else {}
        previous, workloads = self._workloads, {}
        done: dict[int, ProcessSample] = {}  # id(process) -> attributed (MIG lists repeat the GPU's)

        def with_workload(gpu: GpuSample, process: ProcessSample) -> ProcessSample:
            out = done.get(id(process))
            if out is None:
                out = done[id(process)] = attach(gpu, process)
            return out

        def attach(gpu: GpuSample, process: ProcessSample) -> ProcessSample:
            identity = identities.get(process.pid)
            workload = None
            if identity is not None:
                resolved: _Resolved = None
                uid = identity.pod_uid
                if identity.is_k8s and uid:
                    known = names_by_uid.get(uid)
                    if known is not None:
                        resolved = (known.namespace, known.name,
                                    known.containers_by_id.get(identity.container_id or ""), "api_server")
                    else:
                        pod = matched.get(uid)
                        if pod is not None:
                            container = index.container_of.get((pod, device_key(gpu, process)))
                            if container is None:  # a device it was not allocated: known by its ID, maybe
                                container = containers.get(identity.container_id or "")
                            resolved = (pod[0], pod[1], container, "pod_resources")
                entry = workloads.get(id(identity)) or previous.get(id(identity))
                if entry is not None and entry[0] is identity and entry[1] == resolved:
                    workload = entry[2]
                else:
                    workload = _workload(identity, resolved)
                workloads[id(identity)] = (identity, resolved, workload)
            return process if process.workload is workload else _with_workload(process, workload)

        attributed = []
        for gpu in gpus:
            if not gpu.migs:  # (a GPU's processes are each listed once: no instance lists to share them)
                processes = tuple([attach(gpu, p) for p in gpu.processes])
                attributed.append(_gpu_with_processes(gpu, processes, ()))
                continue
            processes = tuple([with_workload(gpu, p) for p in gpu.processes])
            migs = tuple([
                _mig_with_processes(mig, tuple([with_workload(gpu, p) for p in mig.processes]))
                for mig in gpu.migs
            ])
            attributed.append(_gpu_with_processes(gpu, processes, migs))
        self._workloads = workloads
        return tuple(attributed), self._pods(attributed, index, names)

    def _pods(
        self, gpus: Sequence[GpuSample], index: _AllocationIndex, names: _NameIndex
    ) -> tuple[PodUse, ...]:
        # Each pod's processes as rows, in the GPUs' order: what its PodUse is built from, and (with its
        # allocation and names) what says whether last poll's PodUse still holds.
        used: dict[tuple[str | None, str], list[_Row]] = {}
        for gpu in gpus:
            uuid = gpu.info.uuid
            for process in gpu.processes:
                w = process.workload
                if w is None or w.kind != "pod" or process.kind == MPS_SERVER:
                    continue
                container = w.container or (w.container_id or "")[:12] or "unknown"
                row = (w.pod_uid, w.qos, w.names_from, container, process.pid, process.used_memory_bytes,
                       process.sm_util_percent, uuid)
                rows = used.get((w.namespace, w.name))
                if rows is None:
                    used[(w.namespace, w.name)] = [row]
                else:
                    rows.append(row)
        keys: list[tuple[str | None, str]] = list(index.allocated)
        keys.extend(k for k in used if k not in index.allocated)
        if keys != self._keys_in:  # the same pods as last poll (the common case): the same order
            self._keys_in = list(keys)
            keys.sort(key=lambda k: (k[0] or "", k[1]))  # stable: allocated pods first among equals
            self._keys_sorted = keys
        previous, pod_uses = self._pod_uses, {}
        out = []
        for key in self._keys_sorted:
            allocated = index.allocated.get(key)
            rows = used.get(key)
            known = names.known.get(key)
            inputs = (allocated, known, None if rows is None else tuple(rows))
            entry = previous.get(key)
            if entry is not None and entry[0] == inputs:
                pod_use = entry[1]
            else:
                # the same names as last poll: the same annotations object too (consumers key on it)
                same = entry is not None and known is not None and entry[0][1] == known
                pod_use = _pod_use(key, allocated, rows, known, entry[1].annotations if same else None)
            pod_uses[key] = (inputs, pod_use)
            out.append(pod_use)
        self._pod_uses = pod_uses
        return tuple(out)


# One process of a pod: its workload's UID, QoS and names' source, its container's name, PID, GPU memory,
# SM use and GPU UUID.
_Row = tuple[str | None, str | None, str, str, int, "int | None", "float | None", str]


def _pod_use(
    key: tuple[str | None, str],
    allocated: tuple[Mapping[str, tuple[str, ...]], tuple[str, ...]] | None,
    rows: list[_Row] | None,
    known: tuple[str, PodName] | None,
    annotations: Mapping[str, str] | None = None,
) -> PodUse:
    """``annotations``: the last poll's copy of the same names' annotations, to pass on as it is."""
    devices, allocated_gpus = allocated if allocated is not None else ({}, ())
    # per container, in the order its processes come: PIDs, memory, SM use (summed in that order)
    running: dict[str, tuple[list[int], int, float | None]] = {}
    used_gpus: list[str] = []
    for _, _, _, container, pid, memory, sm, uuid in rows or ():
        pids, total, sm_total = running.get(container) or ([], 0, None)
        pids.append(pid)
        running[container] = (pids, total + (memory or 0), sm_total if sm is None else (sm_total or 0.0) + sm)
        if uuid not in used_gpus:
            used_gpus.append(uuid)
    containers = tuple(
        ContainerUse(
            name=name,
            allocated_devices=devices.get(name, ()),
            pids=tuple(sorted(running[name][0])) if name in running else (),
            gpu_memory_used_bytes=running[name][1] if name in running else 0,
            sm_util_percent=running[name][2] if name in running else None,
        )
        for name in sorted(set(devices) | set(running))
    )
    sm_values = [c.sm_util_percent for c in containers if c.sm_util_percent is not None]
    uid, qos, names_from = None, None, "pod_resources" if allocated is not None else "cgroup"
    if rows:  # the last process's workload says
        uid, qos, names_from = rows[-1][0], rows[-1][1], rows[-1][2]
    owner_kind = owner_name = None
    if known is not None:  # the API server knows the pod, idle or not
        uid, name = known
        qos, names_from = name.qos or qos, "api_server"
        annotations = dict(name.annotations) if annotations is None else annotations
        owner_kind, owner_name = name.owner_kind, name.owner_name
    else:
        annotations = {}
    return PodUse(
        name=key[1], namespace=key[0], uid=uid, qos=qos, names_from=names_from, annotations=annotations,
        containers=containers, allocated_gpus=allocated_gpus,
        used_gpus=tuple(used_gpus),
        gpu_memory_used_bytes=sum(c.gpu_memory_used_bytes for c in containers),
        sm_util_percent=sum(sm_values) if sm_values else None,
        process_count=sum(len(c.pids) for c in containers),
        owner_kind=owner_kind, owner_name=owner_name,
    )
