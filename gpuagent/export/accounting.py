"""Per-workload GPU accounting: counters of GPU-seconds, memory byte-seconds and energy; efficiency; idle.

Counters (``_total``) per pod and GPU (``namespace, pod`` + the GPU's join keys, MIG labels on MIG), per
container (``namespace, pod, container``) and, off Kubernetes, per workload (``workload_kind, workload``).
They are integrated by the agent on every poll (never at scrape time) and are monotonic while it runs; an
ended workload's counters stay for the retention window, then its series go. Gauges (efficiency, the
current idle episode) exist only while the workload runs. A busy or energy figure that is unknown (MIG
without GPM, a GPU without an energy counter) has no series, never 0.
"""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import add, add_known, counter, gauge, join, label_text, non_empty, with_label
from gpuagent.export.labels import GpuLabels, GpuRenderer, find_mig, pod_labels
from gpuagent.snapshot import GpuSample, NodeSnapshot, WorkloadGpuUsage

_DOC = {
    "allocated": "GPU-seconds allocated (a MIG slice counts as its fraction, a replica as 1/N).",
    "busy": "GPU-seconds of SM use (per-process SM utilization x time; MIG: the instance's GPM).",
    "memory": "GPU memory used x time.",
    "energy": "The GPU's measured energy, split among its tenants by SM use, the idle rest by allocation.",
    "idle_allocated": "GPU-seconds allocated while SM use of what it holds was under the idle threshold.",
    "efficiency": "SM use / allocation over the efficiency window (0-1).",
    "idle": "Length of the current idle episode (0 when busy); flagged at >= the idle window.",
}


class _Names(NamedTuple):
    """One level's family names, literal (greppable; alerts/ and the report are checked against them)."""

    allocated: str
    busy: str
    memory: str
    energy: str
    idle_allocated: str | None = None  # None: the level has no such family (containers)
    efficiency: str | None = None
    idle: str | None = None


_FAMILIES = {
    "pod": _Names(
        "gpuagent_pod_gpu_allocated_seconds_total",
        "gpuagent_pod_gpu_busy_seconds_total",
        "gpuagent_pod_gpu_memory_byte_seconds_total",
        "gpuagent_pod_gpu_energy_joules_total",
        "gpuagent_pod_gpu_idle_allocated_seconds_total",
        "gpuagent_pod_gpu_efficiency_ratio",
        "gpuagent_pod_gpu_idle_seconds",
    ),
    "container": _Names(
        "gpuagent_container_gpu_allocated_seconds_total",
        "gpuagent_container_gpu_busy_seconds_total",
        "gpuagent_container_gpu_memory_byte_seconds_total",
        "gpuagent_container_gpu_energy_joules_total",
    ),
    "workload": _Names(
        "gpuagent_workload_gpu_allocated_seconds_total",
        "gpuagent_workload_gpu_busy_seconds_total",
        "gpuagent_workload_gpu_memory_byte_seconds_total",
        "gpuagent_workload_gpu_energy_joules_total",
        "gpuagent_workload_gpu_idle_allocated_seconds_total",
        "gpuagent_workload_gpu_efficiency_ratio",
        "gpuagent_workload_gpu_idle_seconds",
    ),
}


class AccountingCollector(GpuRenderer):
    name = "accounting"

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        state = snapshot.accounting
        if state is None:
            return []
        by_uuid = {g.info.uuid: g for g in snapshot.gpus}
        host = labels.host
        out: list[Metric] = []
        for level, ident in (("pod", _pod), ("container", _container), ("workload", _workload)):
            names = _FAMILIES[level]
            allocated = counter(names.allocated, _DOC["allocated"])
            busy = counter(names.busy, _DOC["busy"])
            memory = counter(names.memory, _DOC["memory"])
            energy = counter(names.energy, _DOC["energy"])
            idle_allocated = efficiency = idle = None
            if names.idle_allocated and names.efficiency and names.idle:  # pods and workloads
                idle_allocated = counter(names.idle_allocated, _DOC["idle_allocated"])
                efficiency = gauge(names.efficiency, _DOC["efficiency"])
                idle = gauge(names.idle, _DOC["idle"])
            for usage in state.usage:
                if usage.level != level:
                    continue
                series = join(ident(usage), _gpu_labels(usage, by_uuid.get(usage.gpu_uuid), labels, host))
                add(allocated, series, usage.allocated_gpu_seconds_total)
                add_known(busy, series, usage.busy_gpu_seconds_total)
                add(memory, series, usage.memory_byte_seconds_total)
                add_known(energy, series, usage.energy_joules_total)
                if idle_allocated is None or efficiency is None or idle is None:
                    continue
                add(idle_allocated, series, usage.idle_allocated_gpu_seconds_total)
                if usage.ended_at_unix is None:  # gauges only while it runs
                    add_known(efficiency, series, usage.efficiency_ratio)
                    add(idle, series, usage.idle_seconds)
            out += [allocated, busy, memory, energy]
            out += [m for m in (idle_allocated, efficiency, idle) if m is not None]
        gap = counter("gpuagent_accounting_gap_seconds_total",
                      "Time not accounted on the GPU: polls too far apart, or the GPU stale or unhealthy.")
        energy = counter("gpuagent_gpu_energy_accounted_joules_total",
                         "The GPU's energy over the intervals accounted (its tenants' shares add up to it).")
        unattributed = counter("gpuagent_gpu_energy_unattributed_joules_total",
                               "Energy accounted to no workload (nobody there, or unnamed processes).")
        for totals in state.gpus:
            gpu = by_uuid.get(totals.gpu_uuid)
            series = labels.gpu(gpu) if gpu is not None else join(
                label_text({"gpu": str(totals.gpu_index), "UUID": totals.gpu_uuid}), host)
            add(gap, series, totals.gap_seconds_total)
            add_known(energy, series, totals.energy_joules_total)
            add_known(unattributed, series, totals.energy_unattributed_joules_total)
        events = counter("gpuagent_accounting_events_total", "Idle-GPU Kubernetes Events, by outcome.")
        for outcome, count in sorted(state.events_total.items()):
            add(events, {"outcome": outcome}, count)
        tracked = gauge("gpuagent_accounting_series", "Workload x GPU series held (ended ones too).")
        add(tracked, {}, len(state.usage))
        window = gauge("gpuagent_accounting_idle_window_seconds", "Idle this long and a workload is flagged.")
        add(window, {}, state.idle_window_seconds)
        threshold = gauge("gpuagent_accounting_idle_threshold_ratio",
                          "SM use of what a workload holds under which it counts as idle (0-1).")
        add(threshold, {}, state.idle_threshold_ratio)
        return non_empty([*out, gap, energy, unattributed, events, tracked, window, threshold])


def _pod(usage: WorkloadGpuUsage) -> str:
    return pod_labels(usage.namespace, usage.name)


def _container(usage: WorkloadGpuUsage) -> str:
    return with_label(pod_labels(usage.namespace, usage.name), "container", usage.container or "")


def _workload(usage: WorkloadGpuUsage) -> str:
    return label_text({"workload_kind": usage.kind, "workload": usage.name})


def _gpu_labels(
    usage: WorkloadGpuUsage, gpu: GpuSample | None, labels: GpuLabels, host: str
) -> str:
    """The GPU's (or MIG instance's) join keys; from the usage itself when the GPU or instance is gone."""
    instance = usage.gpu_instance_id
    if gpu is not None and (instance is None or find_mig(gpu, instance) is not None):
        return labels.instance(gpu, instance)
    series = {"gpu": str(usage.gpu_index), "UUID": usage.gpu_uuid}
    if instance is not None:
        if usage.mig_profile:
            series["GPU_I_PROFILE"] = usage.mig_profile
        series["GPU_I_ID"] = str(instance)
    return join(label_text(series), host)
