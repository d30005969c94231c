"""Per-pod and per-container GPU use, allocations, and the tenants of each GPU.

Use is per pod *and GPU* (``gpuagent_pod_gpu_*{namespace, pod, gpu, UUID}``), so every ratio stays 0-1 and
``sum by (namespace, pod)`` gives a pod's total. Allocation comes from the kubelet; a pod running on a GPU
it was not allocated is flagged, but only while the kubelet's allocations are known (otherwise every use
would look unallocated). A pod's MPS clients on a GPU add up to its MPS limits there (each client is held
to its own); the MPS server is nobody's use.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.metrics_core import Metric

from gpuagent.export.dra import dra_families
from gpuagent.export.families import (
    GAUGE,
    INFO,
    Kept,
    TextCache,
    add,
    extend,
    gauge,
    join,
    non_empty,
    with_label,
)
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer, pod_labels
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import MPS_CLIENT, MPS_SERVER, ProcessSample, combined_mps_limits


class PodCollector(GpuRenderer):
    """Renders the pods of a snapshot (nothing off Kubernetes: workloads are then on the process series)."""

    name = "pods"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        self._texts = TextCache(_label_text)  # a pod's series' label texts, by what they are made of
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        self._texts.rotate()
        kept = self._kept
        use = _Use()
        for gpu in snapshot.gpus:
            use.add(gpu, labels, self._texts)
        pod_memory = kept.family(
            "gpuagent_pod_gpu_memory_used_bytes", "GPU memory used by the pod's processes.",
            GAUGE, use.pods, use.pod_memory)
        pod_sm = kept.known(
            "gpuagent_pod_gpu_sm_utilization_ratio",
            "Share of the GPU's SM time used by the pod's processes (0-1, sum of NVML samples).",
            GAUGE, use.pods, use.pod_sm)
        pod_procs = kept.family(
            "gpuagent_pod_gpu_processes", "Processes of the pod on the GPU.",
            GAUGE, use.pods, use.pod_processes)
        ctr_memory = kept.family(
            "gpuagent_container_gpu_memory_used_bytes", "GPU memory used by the container.",
            GAUGE, use.containers, use.container_memory)
        ctr_sm = kept.known(
            "gpuagent_container_gpu_sm_utilization_ratio",
            "Share of the GPU's SM time used by the container's processes (0-1).",
            GAUGE, use.containers, use.container_sm)
        mps_threads = kept.known(
            "gpuagent_pod_gpu_mps_active_thread_ratio",
            "Share of the GPU's SMs the pod's MPS clients may use (0-1, the sum of their "
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); absent when a client is not limited.",
            GAUGE, use.mps_pods, use.mps_threads)
        mps_memory = kept.known(
            "gpuagent_pod_gpu_mps_memory_limit_bytes",
            "GPU memory the pod's MPS clients may allocate (the sum of their "
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for this GPU); absent when a client is not limited.",
            GAUGE, use.mps_pods, use.mps_memory)
        unallocated = gauge("gpuagent_pod_gpu_unallocated_use",
                            "1 when the pod runs on a GPU the kubelet did not allocate to it.")
        by_uuid = {g.info.uuid: g for g in snapshot.gpus}
        named: dict[str, int] = defaultdict(int)  # GPU -> pods known by name (allocated, or matched in use)
        idle_allocated: dict[str, int] = defaultdict(int)  # GPU -> allocated pods with no use matched
        unnamed: dict[str, int] = defaultdict(int)  # GPU -> pods in use known only by UID
        allocations_known = any(s.name == "pod_resources" and s.ok for s in snapshot.sources)
        # A pod holding a DRA device nothing could map to a GPU may be using that very GPU: not flagged.
        unmapped = {(d.namespace, d.pod) for d in snapshot.dra if d.mapped_by is None}
        texts = self._texts
        idents: list[str] = []
        info_texts: list[str] = []
        device_texts: list[str] = []
        for pod in snapshot.pods:
            namespace, name = pod.namespace, pod.name
            ident = texts[("pod", namespace, name)]
            idents.append(ident)
            info_texts.append(texts[("info", namespace, name, pod.uid or "", pod.qos or "", pod.names_from,
                                     pod.owner_kind or "", pod.owner_name or "")])
            for container in pod.containers:
                for device_id in container.allocated_devices:
                    device_texts.append(texts[("device", namespace, name, container.name, device_id)])
            for uuid in {*pod.allocated_gpus, *pod.used_gpus}:
                if pod.names_from == "cgroup":
                    unnamed[uuid] += 1
                else:
                    named[uuid] += 1
                    idle_allocated[uuid] += uuid not in pod.used_gpus
            # A pod known only by its UID is most likely an allocated pod we could not name: not flagged.
            if allocations_known and pod.names_from != "cgroup" and (namespace, name) not in unmapped:
                for uuid in pod.used_gpus:  # pod.unallocated_use, without making a tuple of it
                    gpu = by_uuid.get(uuid) if uuid not in pod.allocated_gpus else None
                    if gpu is not None:
                        add(unallocated, join(ident, labels.gpu(gpu)), 1)
        allocated = kept.family(
            "gpuagent_pod_allocated_gpus", "GPUs the kubelet allocated to the pod.",
            GAUGE, idents, [len(pod.allocated_gpus) for pod in snapshot.pods])
        device = kept.family(
            "gpuagent_pod_gpu_allocated",
            "1 for each device the kubelet allocated to a container (device_id as allocated).",
            GAUGE, device_texts, [1] * len(device_texts))
        info = kept.family(
            "gpuagent_pod_info",
            "A pod holding or using GPUs; where its names came from; its owner (the top of its controller "
            "chain, from the API server).", INFO, info_texts, [1] * len(info_texts))
        gpus = snapshot.gpus if snapshot.pods else ()
        # A pod known only by its UID is most likely one of the allocated pods whose use could not be
        # matched (shared GPU): count it only beyond those.
        tenants = kept.family(
            "gpuagent_gpu_tenants", "Pods allocated or using the GPU (more than 1: shared).", GAUGE,
            [labels.gpu(gpu) for gpu in gpus],
            [named[u] + max(0, unnamed[u] - idle_allocated[u]) for u in (gpu.info.uuid for gpu in gpus)])
        return non_empty([pod_memory, pod_sm, pod_procs, ctr_memory, ctr_sm, mps_threads, mps_memory, tenants,
                          allocated, device, info, unallocated]) + dra_families(snapshot, labels)


class _Use:
    """The per-pod and per-container rows of every GPU's use, in columns (label texts, then each family's
    values), GPU after GPU."""

    __slots__ = ("container_memory", "container_sm", "containers", "mps_memory", "mps_pods", "mps_threads",
                 "pod_memory", "pod_processes", "pod_sm", "pods")

    def __init__(self) -> None:
        self.pods: list[str] = []
        self.pod_memory: list[int] = []
        self.pod_processes: list[int] = []
        self.pod_sm: list[float | None] = []
        self.mps_pods: list[str] = []
        self.mps_threads: list[float | None] = []
        self.mps_memory: list[int | None] = []
        self.containers: list[str] = []
        self.container_memory: list[int] = []
        self.container_sm: list[float | None] = []

    def add(self, gpu: GpuSample, labels: GpuLabels, texts: TextCache) -> None:
        # The GPU's pod processes by (namespace, pod, instance), and by container too.
        pods: dict[tuple[str | None, str, int | None], list[ProcessSample]] = {}
        containers: dict[tuple[str | None, str, str, int | None], list[ProcessSample]] = {}
        for process in gpu.processes:
            w = process.workload
            if w is None or w.kind != "pod" or process.kind == MPS_SERVER:
                continue
            key = (w.namespace, w.name, process.gpu_instance_id)
            members = pods.get(key)
            if members is None:
                pods[key] = [process]
            else:
                members.append(process)
            if w.container:
                ckey = (w.namespace, w.name, w.container, process.gpu_instance_id)
                members = containers.get(ckey)
                if members is None:
                    containers[ckey] = [process]
                else:
                    members.append(process)
        places = labels.instances(gpu) if pods else {}
        for (namespace, pod, instance), members in pods.items():
            place = places.get(instance) or labels.instance(gpu, instance)
            series = texts[("pod", namespace, pod, place)]
            memory, sm = _totals(members)
            self.pods.append(series)
            self.pod_memory.append(memory)
            self.pod_processes.append(len(members))
            self.pod_sm.append(None if sm is None else min(sm, 100.0) / 100)
            if any(p.kind == MPS_CLIENT for p in members):  # else no limits: combined_mps_limits gives None
                limits = combined_mps_limits(members)
                if limits is not None:
                    self.mps_pods.append(series)
                    threads = limits.active_thread_percent
                    self.mps_threads.append(None if threads is None else threads / 100)
                    self.mps_memory.append(limits.pinned_memory_limit_bytes)
        for (namespace, pod, container, instance), members in containers.items():
            place = places.get(instance) or labels.instance(gpu, instance)
            memory, sm = _totals(members)
            self.containers.append(texts[("container", namespace, pod, container, place)])
            self.container_memory.append(memory)
            self.container_sm.append(None if sm is None else min(sm, 100.0) / 100)


def _totals(members: list[ProcessSample]) -> tuple[int, float | None]:
    """Memory used by the processes, and their SM use added up (None when none of them reports one)."""
    if len(members) == 1:  # the common case
        process = members[0]
        return process.used_memory_bytes or 0, process.sm_util_percent
    memory = 0
    sm: float | None = None
    for process in members:
        memory += process.used_memory_bytes or 0
        if process.sm_util_percent is not None:
            sm = process.sm_util_percent if sm is None else sm + process.sm_util_percent
    return memory, sm


def _label_text(key: tuple) -> str:
    """The label text of a pod's series, by what it is made of (the first item says which kind)."""
    kind, namespace, pod = key[:3]
    ident = pod_labels(namespace, pod)
    if kind == "pod":
        return ident if len(key) == 3 else join(ident, key[3])
    if kind == "container":
        _, _, _, container, place = key
        return join(with_label(ident, "container", container), place)
    if kind == "device":
        _, _, _, container, device_id = key
        return extend(ident, (("container", container), ("device_id", device_id)))
    _, _, _, uid, qos, names_from, owner_kind, owner_name = key  # info
    return extend(ident, (("uid", uid), ("qos", qos), ("names_from", names_from), ("owner_kind", owner_kind),
                          ("owner_name", owner_name)))
