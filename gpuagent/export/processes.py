"""Per-process GPU use: ``gpuagent_process_*`` and the process count of each GPU.

A process series carries the GPU's join keys (``gpu, UUID, Hostname``, as on dcgm-exporter's series), the MIG
instance it runs in (``GPU_I_PROFILE``/``GPU_I_ID``), ``pid``, ``comm`` (left
out when the process exited before its name was read) and ``kind``: a process with both a compute and a
graphics context is listed twice by NVML, and ``kind`` keeps its two series apart; ``kind`` is also
``mps_client`` for an MPS client and ``mps_server`` for the MPS server. Utilization ratios exist only where
NVML reports them (never on MIG; on some drivers not for MPS clients); ``None`` gives no series. They are
NVML's means over one read's window, which ``gpuagent_gpu_process_utilization_window_seconds`` states per GPU
(a poll where the share controller acts, ``process_utilization_interval`` elsewhere), read at
``gpuagent_gpu_process_utilization_timestamp_seconds``. An MPS client's limits, where its environment sets
them, are series of their own.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import GAUGE, Kept, TextCache, extend, non_empty
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer
from gpuagent.snapshot.gpu import GpuSample, Health
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import ProcessSample


class ProcessCollector(GpuRenderer):
    """Renders the processes of a snapshot."""

    name = "processes"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        self._texts = TextCache(_process_text)  # a process's label text, by what it is made of
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        texts, kept = self._texts, self._kept
        texts.rotate()
        series: list[str] = []
        places_of_gpus: list[str] = []
        counts: list[int] = []
        processes: list[ProcessSample] = []
        gpus: list[GpuSample] = []
        for gpu in snapshot.gpus:
            if gpu.health is Health.LOST:
                continue
            unique = _unique(gpu)
            places = labels.instances(gpu) if unique else {}
            for process in unique:
                instance = process.gpu_instance_id
                place = places.get(instance) or labels.instance(gpu, instance)
                w = process.workload
                who = () if w is None else (w.kind, w.name, w.namespace, w.container)
                series.append(texts[(place, process.pid, process.comm, process.kind, *who)])
            processes += unique
            places_of_gpus.append(labels.gpu(gpu))
            counts.append(len({p.pid for p in unique}))
            gpus.append(gpu)
        memory = kept.known(
            "gpuagent_process_gpu_memory_used_bytes", "GPU memory used by the process.",
            GAUGE, series, [p.used_memory_bytes for p in processes])
        sm = kept.known(
            "gpuagent_process_sm_utilization_ratio",
            "Share of the GPU's last per-process read window in which the process ran kernels on the SMs "
            "(0-1).",
            GAUGE, series, [_ratio(p.sm_util_percent) for p in processes])
        mem_util = kept.known(
            "gpuagent_process_memory_utilization_ratio",
            "Share of the GPU's last per-process read window in which the process read or wrote GPU memory "
            "(0-1).",
            GAUGE, series, [_ratio(p.memory_util_percent) for p in processes])
        clients = [(text, p.mps) for text, p in zip(series, processes, strict=True) if p.mps is not None]
        of_clients = [text for text, _ in clients]
        mps_threads = kept.known(
            "gpuagent_process_mps_active_thread_ratio",
            "Share of the GPU's SMs the MPS client may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 0-1).",
            GAUGE, of_clients, [_ratio(limits.active_thread_percent) for _, limits in clients])
        mps_memory = kept.known(
            "gpuagent_process_mps_memory_limit_bytes",
            "GPU memory the MPS client may allocate on this GPU (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).",
            GAUGE, of_clients, [limits.pinned_memory_limit_bytes for _, limits in clients])
        count = kept.family("gpuagent_gpu_processes", "Number of processes using the GPU.", GAUGE,
                            places_of_gpus, counts)
        window = kept.known(
            "gpuagent_gpu_process_utilization_window_seconds",
            "Seconds the per-process utilization ratios of the GPU average over (previous read to last).",
            GAUGE, places_of_gpus, [gpu.process_util_window_seconds for gpu in gpus])
        read_at = kept.known(
            "gpuagent_gpu_process_utilization_timestamp_seconds",
            "Unix time of the last read of the GPU's per-process utilization.",
            GAUGE, places_of_gpus, [gpu.process_util_read_at_unix for gpu in gpus])
        return non_empty([memory, sm, mem_util, mps_threads, mps_memory, count, window, read_at])


def _unique(gpu: GpuSample) -> list[ProcessSample]:
    """The GPU's processes, one per series: a repeated (pid, kind, instance) would be a duplicate series."""
    seen: set[tuple[int, str, int | None]] = set()
    unique = []
    for process in gpu.processes:  # every process of the GPU, MIG instances included
        key = (process.pid, process.kind, process.gpu_instance_id)
        if key not in seen:
            seen.add(key)
            unique.append(process)
    return unique


def _process_text(key: tuple) -> str:
    """A process's label text: where it runs (the GPU's or instance's text), ``pid``, ``comm`` (when known),
    ``kind``, then whose it is: ``namespace, pod, container`` for a pod, else ``workload_kind, workload``."""
    place, pid, comm, kind, *who = key
    labels: tuple[tuple[str, str], ...] = (("pid", str(pid)),)
    if comm:
        labels += (("comm", comm),)
    labels += (("kind", kind),)
    if who:
        workload_kind, name, namespace, container = who
        if workload_kind == "pod":
            if namespace:
                labels += (("namespace", namespace),)
            labels += (("pod", name),)
            if container:
                labels += (("container", container),)
        else:
            labels += (("workload_kind", workload_kind), ("workload", name))
    return extend(place, labels)


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100
