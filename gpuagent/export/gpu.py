"""Per-GPU figures the snapshot has and dcgm-exporter lacks: ``gpuagent_gpu_*`` in base units.

Labels: dcgm-exporter's join keys ``gpu, UUID, Hostname`` (the rest is on ``gpuagent_gpu_info``). A GPU
whose health is LOST has no series here; ``None`` gives none.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import COUNTER, GAUGE, Kept, TextCache, flag, non_empty, with_label
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.node import NodeSnapshot

# NVML's clocks-event (throttle) reason bits, named as dcgm-exporter's ``clock_event`` label values.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("clocks_setting", 0x2),
    ("power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)


class GpuCollector(GpuRenderer):
    """Renders the ``gpuagent_gpu_*`` extras of each GPU."""

    name = "gpu"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        super().__init__(hostname_label=hostname_label)
        # A GPU's label text -> its clock_event_active texts, one per reason
        self._reasons = TextCache(
            lambda series: tuple(with_label(series, "reason", reason) for reason, _ in CLOCK_EVENT_REASONS)
        )
        self._kept = Kept()

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        self._reasons.rotate()
        kept = self._kept
        gpus = [gpu for gpu in snapshot.gpus if gpu.health is not Health.LOST]
        series = [labels.gpu(gpu) for gpu in gpus]
        graphics_clock = kept.known("gpuagent_gpu_graphics_clock_hertz", "Graphics clock frequency.", GAUGE,
                                    series, [gpu.graphics_clock_hz for gpu in gpus])
        power_limit = kept.known("gpuagent_gpu_power_limit_watts", "Power management limit.", GAUGE,
                                 series, [gpu.info.power_limit_watts for gpu in gpus])
        memory_total = kept.known("gpuagent_gpu_memory_total_bytes", "Total framebuffer memory.", GAUGE,
                                  series, [gpu.info.memory_total_bytes for gpu in gpus])
        pcie_tx = kept.known("gpuagent_gpu_pcie_tx_bytes_total", "Bytes transmitted over PCIe.", COUNTER,
                             series, [gpu.pcie_tx_bytes_total for gpu in gpus])
        pcie_rx = kept.known("gpuagent_gpu_pcie_rx_bytes_total", "Bytes received over PCIe.", COUNTER,
                             series, [gpu.pcie_rx_bytes_total for gpu in gpus])
        reasons = [(gpu.clock_event_reasons, text) for gpu, text in zip(gpus, series, strict=True)
                   if gpu.clock_event_reasons is not None]
        events: list[str] = []
        for _, text in reasons:
            events += self._reasons[text]
        clock_event = kept.family(
            "gpuagent_gpu_clock_event_active",
            "1 while the clock event (throttle) reason is active, else 0; one series per known reason.",
            GAUGE, events, [flag(mask & bit) for mask, _ in reasons for _, bit in CLOCK_EVENT_REASONS])
        remaps = [(gpu.remapped_rows, text) for gpu, text in zip(gpus, series, strict=True)
                  if gpu.remapped_rows is not None]
        remap_pending = kept.family(
            "gpuagent_gpu_remapped_rows_pending", "1 while a row remap awaits a reset.",
            GAUGE, [text for _, text in remaps], [flag(rows.pending) for rows, _ in remaps])
        return non_empty(
            [graphics_clock, power_limit, memory_total, pcie_tx, pcie_rx, clock_event, remap_pending]
        )
