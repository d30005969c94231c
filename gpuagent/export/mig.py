"""The MIG layout of each MIG-enabled GPU: ``gpuagent_mig_*``.

Labels are dcgm-exporter's MIG series labels (the parent GPU's, plus ``GPU_I_PROFILE`` and ``GPU_I_ID``), so
``DCGM_FI_DEV_FB_USED{GPU_I_ID=...}`` and ``DCGM_FI_PROF_*`` of an instance join with its slice and UUID here.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import add, add_known, extend, family, gauge, non_empty
from gpuagent.export.labels import GpuLabels, GpuRenderer
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.node import NodeSnapshot


class MigCollector(GpuRenderer):
    """Renders the MIG instances of each GPU."""

    name = "mig"

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        info = family("gpuagent_mig_info", "A MIG GPU instance: its UUID and compute instance.", "info")
        slices = gauge("gpuagent_mig_slice_ratio", "Share of the GPU's compute slices (0-1).")
        memory_total = gauge("gpuagent_mig_memory_total_bytes", "Memory of the instance.")
        for gpu in snapshot.gpus:
            if gpu.health is Health.LOST:
                continue
            for mig in gpu.migs:
                series = labels.gpu(gpu, mig)
                details: tuple[tuple[str, str], ...] = (("mig_uuid", mig.uuid),)
                if mig.compute_instance_id is not None:
                    details += (("compute_instance_id", str(mig.compute_instance_id)),)
                add(info, extend(series, details), 1)
                add(slices, series, mig.slice_fraction)
                add_known(memory_total, series, mig.memory_total_bytes)
        return non_empty([info, slices, memory_total])
