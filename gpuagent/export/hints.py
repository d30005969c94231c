"""The scheduling hints as metrics, so a scheduler (or a person) can read them from Prometheus too.

Per GPU (labels ``gpu, UUID, Hostname`` as the other ``gpuagent_gpu_*`` families; a LOST GPU has none):
free and allocated memory, the schedulable share of SM time, the SM utilization moving averages (the
time constants are in the help text), the sharing mode, the number of tenants, and per MIG profile the
instances still to be had. Per node: the hints' timestamp, free GPUs and schedulable GPUs.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import GAUGE, INFO, Kept, TextCache, add, gauge, non_empty, with_label
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer, host_labels
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.node import NodeSnapshot


class HintsCollector(GpuRenderer):
    """Renders ``snapshot.hints``; nothing when the hints are absent."""

    name = "hints"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        self._texts = TextCache(lambda key: with_label(key[0], "mode", key[1]))  # (GPU, sharing mode)
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        hints = snapshot.hints
        if hints is None:
            return []
        self._texts.rotate()
        short, long = f"{hints.short_window_seconds:g} s", f"{hints.long_window_seconds:g} s"
        kept = self._kept
        samples = {g.info.uuid: g for g in snapshot.gpus}
        found = [(gpu, samples.get(gpu.uuid)) for gpu in hints.gpus]
        rows = [(gpu, s) for gpu, s in found if s is not None and s.health is not Health.LOST]
        gpus = [gpu for gpu, _ in rows]
        series = [labels.gpu(sample) for _, sample in rows]
        free = kept.family(
            "gpuagent_gpu_free_memory_bytes",
            "Memory a new tenant can count on: neither used nor promised to a tenant's limit.",
            GAUGE, series, [gpu.memory_free_bytes for gpu in gpus])
        allocated = kept.family(
            "gpuagent_gpu_allocated_memory_bytes", "Sum of the GPU's tenants' memory limits.",
            GAUGE, series, [gpu.memory_allocated_bytes for gpu in gpus])
        share = kept.family(
            "gpuagent_gpu_schedulable_share_ratio",
            "Part of the GPU's SM time neither promised to tenants' share limits nor taken on "
            "average (0-1); on MIG, the slices of idle instances and room for new ones.",
            GAUGE, series, [gpu.schedulable_share_ratio for gpu in gpus])
        sm_short = kept.known(
            "gpuagent_gpu_sm_util_short_ratio",
            f"SM utilization, exponentially weighted moving average, time constant {short}.",
            GAUGE, series, [gpu.sm_util_short_ratio for gpu in gpus])
        sm_long = kept.known(
            "gpuagent_gpu_sm_util_long_ratio",
            f"SM utilization, exponentially weighted moving average, time constant {long}.",
            GAUGE, series, [gpu.sm_util_long_ratio for gpu in gpus])
        modes = [self._texts[(text, gpu.sharing_mode)] for gpu, text in zip(gpus, series, strict=True)]
        mode = kept.family("gpuagent_gpu_sharing_mode_info",
                           "How the GPU is shared: none, exclusive, time_sliced, mps or mig.", INFO,
                           modes, [1] * len(modes))
        tenants = kept.family("gpuagent_gpu_workloads",
                              "Workloads (pods and others) allocated the GPU or running processes on it.",
                              GAUGE, series, [len(gpu.tenants) for gpu in gpus])
        numa = kept.known("gpuagent_gpu_numa_node", "The CPU NUMA node the GPU is attached to.",
                          GAUGE, series, [gpu.numa_node for gpu in gpus])
        mig_free = gauge("gpuagent_gpu_mig_free_instances",
                         "MIG instances of the profile to be had: idle ones plus those that can be created.")
        for gpu, text in zip(gpus, series, strict=True):
            for profile in gpu.free_mig_profiles:
                add(mig_free, with_label(text, "profile", profile.profile),
                    len(profile.idle_instances) + profile.creatable_count)
        node = host_labels(hints.hostname, self._hostname_label)
        taken = gauge("gpuagent_hints_timestamp_seconds", "When the snapshot the hints come from was taken.")
        free_gpus = gauge("gpuagent_node_free_gpus", "Healthy GPUs without MIG and without any tenant.")
        schedulable = gauge("gpuagent_node_schedulable_gpus",
                            "Sum of the GPUs' schedulable shares of SM time, in GPUs.")
        add(taken, node, hints.taken_at_unix)
        add(free_gpus, node, hints.free_gpu_count)
        add(schedulable, node, hints.schedulable_share_gpus)
        return non_empty([free, allocated, share, sm_short, sm_long, mode, tenants, numa, mig_free, taken,
                          free_gpus, schedulable])
