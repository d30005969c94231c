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
from gpuagent.export.families import add, extend, family, gauge, join, non_empty, with_label
from gpuagent.export.labels import GpuLabels, GpuRenderer, pod_labels
from gpuagent.snapshot import MPS_SERVER, GpuSample, NodeSnapshot, ProcessSample, combined_mps_limits


class PodCollector(GpuRenderer):
    """Renders the pods of a snapshot (nothing off Kubernetes: workloads are then on the process series)."""

    name = "pods"

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        pod_memory = gauge("gpuagent_pod_gpu_memory_used_bytes", "GPU memory used by the pod's processes.")
        pod_sm = gauge("gpuagent_pod_gpu_sm_utilization_ratio",
                       "Share of the GPU's SM time used by the pod's processes (0-1, sum of NVML samples).")
        pod_procs = gauge("gpuagent_pod_gpu_processes", "Processes of the pod on the GPU.")
        ctr_memory = gauge("gpuagent_container_gpu_memory_used_bytes", "GPU memory used by the container.")
        ctr_sm = gauge("gpuagent_container_gpu_sm_utilization_ratio",
                       "Share of the GPU's SM time used by the container's processes (0-1).")
        mps_threads = gauge("gpuagent_pod_gpu_mps_active_thread_ratio",
                            "Share of the GPU's SMs the pod's MPS clients may use (0-1, the sum of their "
                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); absent when a client is not limited.")
        mps_memory = gauge("gpuagent_pod_gpu_mps_memory_limit_bytes",
                           "GPU memory the pod's MPS clients may allocate (the sum of their "
                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for this GPU); absent when a client is not "
                           "limited.")
        tenants = gauge("gpuagent_gpu_tenants", "Pods allocated or using the GPU (more than 1: shared).")
        for gpu in snapshot.gpus:
            self._use(gpu, labels, pod_memory, pod_sm, pod_procs, ctr_memory, ctr_sm, mps_threads, mps_memory)
        allocated = gauge("gpuagent_pod_allocated_gpus", "GPUs the kubelet allocated to the pod.")
        device = gauge("gpuagent_pod_gpu_allocated",
                       "1 for each device the kubelet allocated to a container (device_id as allocated).")
        info = family("gpuagent_pod_info", "A pod holding or using GPUs; where its names came from; its "
                      "owner (the top of its controller chain, from the API server).", "info")
        unallocated = gauge("gpuagent_pod_gpu_unallocated_use",
                            "1 when the pod runs on a GPU the kubelet did not allocate to it.")
        by_uuid = {g.info.uuid: g for g in snapshot.gpus}
        named: dict[str, int] = defaultdict(int)  # GPU -> pods known by name (allocated, or matched in use)
        idle_allocated: dict[str, int] = defaultdict(int)  # GPU -> allocated pods with no use matched
        unnamed: dict[str, int] = defaultdict(int)  # GPU -> pods in use known only by UID
        allocations_known = any(s.name == "pod_resources" and s.ok for s in snapshot.sources)
        # A pod holding a DRA device nothing could map to a GPU may be using that very GPU: not flagged.
        unmapped = {(d.namespace, d.pod) for d in snapshot.dra if d.mapped_by is None}
        for pod in snapshot.pods:
            ident = pod_labels(pod.namespace, pod.name)
            facts = (("uid", pod.uid or ""), ("qos", pod.qos or ""), ("names_from", pod.names_from),
                     ("owner_kind", pod.owner_kind or ""), ("owner_name", pod.owner_name or ""))
            add(info, extend(ident, facts), 1)
            add(allocated, ident, len(pod.allocated_gpus))
            for container in pod.containers:
                for device_id in container.allocated_devices:
                    add(device, extend(ident, (("container", container.name), ("device_id", device_id))), 1)
            for uuid in {*pod.allocated_gpus, *pod.used_gpus}:
                if pod.names_from == "cgroup":
                    unnamed[uuid] += 1
                else:
                    named[uuid] += 1
                    idle_allocated[uuid] += uuid not in pod.used_gpus
            # A pod known only by its UID is most likely an allocated pod we could not name: not flagged.
            if allocations_known and pod.names_from != "cgroup" and (pod.namespace, pod.name) not in unmapped:
                for uuid in pod.unallocated_use:
                    gpu = by_uuid.get(uuid)
                    if gpu is not None:
                        add(unallocated, join(ident, labels.gpu(gpu)), 1)
        for gpu in snapshot.gpus:
            if snapshot.pods:
                # A pod known only by its UID is most likely one of the allocated pods whose use could not
                # be matched (shared GPU): count it only beyond those.
                uuid = gpu.info.uuid
                add(tenants, labels.gpu(gpu), named[uuid] + max(0, unnamed[uuid] - idle_allocated[uuid]))
        return non_empty([pod_memory, pod_sm, pod_procs, ctr_memory, ctr_sm, mps_threads, mps_memory, tenants,
                          allocated, device, info, unallocated]) + dra_families(snapshot, labels)

    @staticmethod
    def _use(gpu: GpuSample, labels: GpuLabels, *families: Metric) -> None:
        pod_memory, pod_sm, pod_procs, ctr_memory, ctr_sm, mps_threads, mps_memory = families
        # (namespace, pod, instance) -> [memory, processes, sm or None]; containers keyed with their name too
        pods: dict[tuple[str | None, str, int | None], list] = {}
        containers: dict[tuple[str | None, str, str, int | None], list] = {}
        members: dict[tuple[str | None, str, int | None], list[ProcessSample]] = defaultdict(list)
        for process in gpu.processes:
            w = process.workload
            if w is None or w.kind != "pod" or process.kind == MPS_SERVER:
                continue
            memory, sm = process.used_memory_bytes or 0, process.sm_util_percent
            instance = process.gpu_instance_id
            _accumulate(pods, (w.namespace, w.name, instance), memory, sm)
            members[(w.namespace, w.name, instance)].append(process)
            if w.container:
                _accumulate(containers, (w.namespace, w.name, w.container, instance), memory, sm)
        for (namespace, pod, instance), (memory, count, sm) in pods.items():
            series = join(pod_labels(namespace, pod), labels.instance(gpu, instance))
            add(pod_memory, series, memory)
            add(pod_procs, series, count)
            if sm is not None:
                add(pod_sm, series, min(sm, 100.0) / 100)
            limits = combined_mps_limits(members[(namespace, pod, instance)])
            if limits is not None and limits.active_thread_percent is not None:
                add(mps_threads, series, limits.active_thread_percent / 100)
            if limits is not None and limits.pinned_memory_limit_bytes is not None:
                add(mps_memory, series, limits.pinned_memory_limit_bytes)
        for (namespace, pod, container, instance), (memory, _, sm) in containers.items():
            owner = with_label(pod_labels(namespace, pod), "container", container)
            series = join(owner, labels.instance(gpu, instance))
            add(ctr_memory, series, memory)
            if sm is not None:
                add(ctr_sm, series, min(sm, 100.0) / 100)


def _accumulate(totals: dict, key: tuple, memory: int, sm: float | None) -> None:
    entry = totals.get(key)
    if entry is None:
        totals[key] = [memory, 1, sm]
        return
    entry[0] += memory
    entry[1] += 1
    if sm is not None:
        entry[2] = sm if entry[2] is None else entry[2] + sm
