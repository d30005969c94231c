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

from gpuagent.export.families import (
    COUNTER,
    GAUGE,
    Kept,
    TextCache,
    add,
    counter,
    join,
    label_text,
    non_empty,
    with_label,
)
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer, find_mig, pod_labels
from gpuagent.snapshot.accounting import WorkloadGpuUsage
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.node import NodeSnapshot

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

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        # (level, namespace, name, container, kind, the GPU's join keys) -> the series' label text
        self._series = TextCache(_series_text)
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        state = snapshot.accounting
        if state is None:
            return []
        self._series.rotate()
        by_uuid = {g.info.uuid: g for g in snapshot.gpus}
        places = labels.places(snapshot)
        host = labels.host
        levels: dict[str, list[WorkloadGpuUsage]] = {level: [] for level in _FAMILIES}
        for usage in state.usage:
            if usage.level in levels:
                levels[usage.level].append(usage)
        out: list[Metric] = []
        cache, kept = self._series, self._kept
        for level, usages in levels.items():
            names = _FAMILIES[level]
            texts = [
                cache[(level, u.namespace, u.name, u.container, u.kind,
                       places.get((u.gpu_uuid, u.gpu_instance_id))
                       or _gpu_labels(u, by_uuid.get(u.gpu_uuid), labels, host))]
                for u in usages
            ]
            allocated = [u.allocated_gpu_seconds_total for u in usages]
            busy = [u.busy_gpu_seconds_total for u in usages]
            memory = [u.memory_byte_seconds_total for u in usages]
            shares = [u.energy_joules_total for u in usages]
            out += [
                kept.family(names.allocated, _DOC["allocated"], COUNTER, texts, allocated),
                kept.known(names.busy, _DOC["busy"], COUNTER, texts, busy),
                kept.family(names.memory, _DOC["memory"], COUNTER, texts, memory),
                kept.known(names.energy, _DOC["energy"], COUNTER, texts, shares),
            ]
            if names.idle_allocated and names.efficiency and names.idle:  # pods and workloads
                held = [u.idle_allocated_gpu_seconds_total for u in usages]
                out.append(kept.family(names.idle_allocated, _DOC["idle_allocated"], COUNTER, texts, held))
                # The gauges only while it runs.
                running = [i for i, u in enumerate(usages) if u.ended_at_unix is None]
                if len(running) < len(usages):
                    texts = [texts[i] for i in running]
                    usages = [usages[i] for i in running]
                efficiency = [u.efficiency_ratio for u in usages]
                idle = [u.idle_seconds for u in usages]
                out += [
                    kept.known(names.efficiency, _DOC["efficiency"], GAUGE, texts, efficiency),
                    kept.family(names.idle, _DOC["idle"], GAUGE, texts, idle),
                ]
        totals = state.gpus
        at = [places.get((t.gpu_uuid, None)) or cache[("gpu", t.gpu_index, t.gpu_uuid, host)] for t in totals]
        gap = kept.family(
            "gpuagent_accounting_gap_seconds_total",
            "Time not accounted on the GPU: polls too far apart, or the GPU stale or unhealthy.",
            COUNTER, at, [t.gap_seconds_total for t in totals])
        energy = kept.known(
            "gpuagent_gpu_energy_accounted_joules_total",
            "The GPU's energy over the intervals accounted (its tenants' shares add up to it).",
            COUNTER, at, [t.energy_joules_total for t in totals])
        unattributed = kept.known(
            "gpuagent_gpu_energy_unattributed_joules_total",
            "Energy accounted to no workload (nobody there, or unnamed processes).",
            COUNTER, at, [t.energy_unattributed_joules_total for t in totals])
        events = counter("gpuagent_accounting_events_total", "Idle-GPU Kubernetes Events, by outcome.")
        for outcome, count in sorted(state.events_total.items()):
            add(events, {"outcome": outcome}, count)
        tracked = kept.family("gpuagent_accounting_series", "Workload x GPU series held (ended ones too).",
                              GAUGE, [""], [len(state.usage)])
        window = kept.family(
            "gpuagent_accounting_idle_window_seconds", "Idle this long and a workload is flagged.",
            GAUGE, [""], [state.idle_window_seconds])
        threshold = kept.family("gpuagent_accounting_idle_threshold_ratio",
                                "SM use of what a workload holds under which it counts as idle (0-1).",
                                GAUGE, [""], [state.idle_threshold_ratio])
        return non_empty([*out, gap, energy, unattributed, events, tracked, window, threshold])


def _series_text(key: tuple) -> str:
    """The label text of a workload's series on a GPU: who (by level), then the GPU's join keys; or the
    join keys of a GPU the snapshot does not list (``gpu``: its index, UUID and the host label)."""
    if key[0] == "gpu":
        _, index, uuid, host = key
        return join(label_text({"gpu": str(index), "UUID": uuid}), host)
    level, namespace, name, container, kind, gpu = key
    if level == "pod":
        who = pod_labels(namespace, name)
    elif level == "container":
        who = with_label(pod_labels(namespace, name), "container", container or "")
    else:
        who = label_text({"workload_kind": kind, "workload": name})
    return join(who, gpu)


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
