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

from gpuagent.export.families import add, add_known, extend, gauge, non_empty
from gpuagent.export.labels import GpuLabels, GpuRenderer
from gpuagent.snapshot import GpuSample, Health, NodeSnapshot, ProcessSample


class ProcessCollector(GpuRenderer):
    """Renders the processes of a snapshot."""

    name = "processes"

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        memory = gauge("gpuagent_process_gpu_memory_used_bytes", "GPU memory used by the process.")
        sm = gauge(
            "gpuagent_process_sm_utilization_ratio",
            "Share of the GPU's last per-process read window in which the process ran kernels on the SMs "
            "(0-1).",
        )
        mem_util = gauge(
            "gpuagent_process_memory_utilization_ratio",
            "Share of the GPU's last per-process read window in which the process read or wrote GPU memory "
            "(0-1).",
        )
        window = gauge(
            "gpuagent_gpu_process_utilization_window_seconds",
            "Seconds the per-process utilization ratios of the GPU average over (previous read to last).",
        )
        read_at = gauge(
            "gpuagent_gpu_process_utilization_timestamp_seconds",
            "Unix time of the last read of the GPU's per-process utilization.",
        )
        mps_threads = gauge(
            "gpuagent_process_mps_active_thread_ratio",
            "Share of the GPU's SMs the MPS client may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 0-1).",
        )
        mps_memory = gauge(
            "gpuagent_process_mps_memory_limit_bytes",
            "GPU memory the MPS client may allocate on this GPU (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT).",
        )
        count = gauge("gpuagent_gpu_processes", "Number of processes using the GPU.")
        for gpu in snapshot.gpus:
            if gpu.health is Health.LOST:
                continue
            processes = _unique(gpu)
            for process in processes:
                series = extend(labels.instance(gpu, process.gpu_instance_id), _identity(process))
                add_known(memory, series, process.used_memory_bytes)
                add_known(sm, series, _ratio(process.sm_util_percent))
                add_known(mem_util, series, _ratio(process.memory_util_percent))
                if process.mps is not None:
                    add_known(mps_threads, series, _ratio(process.mps.active_thread_percent))
                    add_known(mps_memory, series, process.mps.pinned_memory_limit_bytes)
            add(count, labels.gpu(gpu), len({p.pid for p in processes}))
            add_known(window, labels.gpu(gpu), gpu.process_util_window_seconds)
            add_known(read_at, labels.gpu(gpu), gpu.process_util_read_at_unix)
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


def _identity(process: ProcessSample) -> tuple[tuple[str, str], ...]:
    pid, kind = ("pid", str(process.pid)), ("kind", process.kind)
    return ((pid, ("comm", process.comm), kind) if process.comm else (pid, kind)) + _owner(process)


def _owner(process: ProcessSample) -> tuple[tuple[str, str], ...]:
    """Whose process it is: ``namespace, pod, container`` for a pod, else ``workload_kind, workload``."""
    w = process.workload
    if w is None:
        return ()
    if w.kind == "pod":
        labels = (("namespace", w.namespace),) if w.namespace else ()
        labels += (("pod", w.name),)
        if w.container:
            labels += (("container", w.container),)
        return labels
    return (("workload_kind", w.kind), ("workload", w.name))


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100

