"""Device figures no consumer needs each second, read every ``detail_interval`` and held in between.

The memory and graphics clocks, encoder and decoder utilization, and the batched counters of
``fields.DETAIL_FIELDS`` (PCIe and NVLink bytes, PCIe replays, memory temperature) only reach Prometheus,
which samples gauges and takes rates of counters over its 15-30 s scrape interval: reading them every
second would hold the driver's lock for nothing (``docs/nvml-cost.md``). The SM clock, GPU temperature,
clock-event reasons, utilization, memory, power and the process lists stay on every poll. Samples between
two reads carry the last values; a value that failed at the last read is absent until the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuagent.devices.cadence import Cadence
from gpuagent.devices.fields import DETAIL_FIELDS, FieldBatch
from gpuagent.devices.guard import NvmlGuard

MHZ = 1_000_000


class DetailReader:
    """The detail figures of one GPU, as ``GpuSample`` keyword arguments. One worker thread only."""

    def __init__(self, guard: NvmlGuard, handle: Any, scope: int, *, interval: float,
                 clock: Callable[[], float]) -> None:
        self._guard = guard
        self._handle = handle
        self._scope = scope
        self._cadence = Cadence(interval)
        self._clock = clock
        self._fields = FieldBatch(guard.nvml, DETAIL_FIELDS)
        self._values: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """The figures of the last read, reading them first when ``detail_interval`` has passed."""
        now = self._clock()
        if self._cadence.due(now):
            self._cadence.mark(now)
            self._values = self._take()
        return self._values

    def _take(self) -> dict[str, Any]:
        g, h, nvml, s = self._guard, self._handle, self._guard.nvml, self._scope
        enc = g.call("nvmlDeviceGetEncoderUtilization", h, scope=s)
        dec = g.call("nvmlDeviceGetDecoderUtilization", h, scope=s)
        memory_clock = g.call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM, scope=s)
        graphics_clock = g.call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_GRAPHICS, scope=s)
        values: dict[str, Any] = dict(self._fields.read(g, h, s))
        values["encoder_util_percent"] = float(enc[0]) if enc is not None else None
        values["decoder_util_percent"] = float(dec[0]) if dec is not None else None
        values["memory_clock_hz"] = float(memory_clock) * MHZ if memory_clock is not None else None
        values["graphics_clock_hz"] = float(graphics_clock) * MHZ if graphics_clock is not None else None
        return values
