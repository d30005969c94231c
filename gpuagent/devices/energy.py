"""A GPU's energy counter, read every ``energy_interval`` and held in between.

The counter (``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, one field-value call) holds the driver's lock about
3 ms on an H100, more than the rest of a poll together (``docs/nvml-cost.md``); its consumers (rates in
Prometheus, the accountant's energy split) need it every few seconds, not every second. So it is read once
``energy_interval`` (30 s) has passed since the last read, every poll when that is at most the poll
interval. Samples in between carry the last reading and the wall time it was taken
(``energy_read_at_unix``), so a consumer divides by the right interval; a failed read leaves both absent
and is tried again the next poll.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuagent.devices.cadence import Cadence
from gpuagent.devices.fields import ENERGY_FIELDS, FieldBatch
from gpuagent.devices.guard import NvmlGuard


class EnergyReader:
    """One GPU's energy counter: ``joules`` and ``read_at`` of the last read. One worker thread only."""

    def __init__(self, guard: NvmlGuard, handle: Any, scope: int, *, interval: float,
                 clock: Callable[[], float]) -> None:
        self._guard = guard
        self._handle = handle
        self._scope = scope
        self._cadence = Cadence(interval)
        self._clock = clock
        self._fields = FieldBatch(guard.nvml, ENERGY_FIELDS)
        self.joules: float | None = None
        self.read_at: float | None = None  # wall time of the last energy read

    def read(self) -> None:
        """Read the counter when ``energy_interval`` has passed since the last read, or the last failed."""
        now = self._clock()
        if self.read_at is not None and not self._cadence.due(now):
            return
        self._cadence.mark(now)
        self.joules = self._fields.read(self._guard, self._handle, self._scope).get("energy_joules_total")
        self.read_at = now if self.joules is not None else None
