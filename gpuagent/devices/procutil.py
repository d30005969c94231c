"""Per-process SM and memory utilization: NVML's samples since a cursor, read on a cadence, held in between.

``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` answers, for each process that ran kernels,
its utilization over the driver's samples newer than the cursor (the driver samples about every 1/6 s and
keeps a buffer of them). A read every N seconds therefore gives the average over those N seconds: reading
less often loses no average, only freshness. On an H100 a read holds the driver's lock about 2 ms, the largest
per-GPU cost of a poll, so it runs every poll only where the share controller acts (``every_poll``, set by
the agent for a GPU with two or more tenants under ``mode: audit|enforce``) and every
``process_utilization_interval`` elsewhere (``docs/nvml-cost.md``).

What a reading means:

- each process present at a read gets the mean of its samples since the previous read; one without samples
  ran no kernels in that window (0, not unknown); NOT_FOUND means nobody did (a reading of zeros);
- between reads each process keeps the figures of the last read; a process that appeared since has none
  (``None``: not measured yet);
- ``read_at`` (wall time) and ``window_seconds`` (from the previous read to this one; ``None`` for the first,
  whose window is whatever the driver's buffer held) say what the figures cover;
- the cursor moves only on a successful read (to the newest sample's timestamp), so a failed read makes
  the next one cover the longer window; an unsupported call leaves every figure ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

from gpuagent.devices.cadence import Cadence
from gpuagent.devices.guard import NvmlGuard


class ProcessUtilization:
    """The per-process utilization of one GPU. Used from that GPU's worker thread only."""

    def __init__(
        self, guard: NvmlGuard, handle: Any, scope: Hashable, *, interval: float, clock: Callable[[], float]
    ) -> None:
        self._guard = guard
        self._handle = handle
        self._scope = scope
        self._cadence = Cadence(interval)
        self._clock = clock
        self._cursor = 0
        self._figures: dict[int, tuple[float, float]] = {}  # pid -> (SM %, memory %) of the last read
        self.sampled: frozenset[int] = frozenset()  # the PIDs with samples at the last read
        self.every_poll = False
        self.read_at: float | None = None
        self.window_seconds: float | None = None

    def update(self, pids: Iterable[int]) -> None:
        """Read the samples since the cursor if a read is due (every poll where ``every_poll``)."""
        now = self._clock()
        if not (self.every_poll or self._cadence.due(now)):
            return
        self._cadence.mark(now)  # a failed read is tried again at the next interval, not every poll
        nvml = self._guard.nvml
        samples = self._guard.call(
            "nvmlDeviceGetProcessUtilization", self._handle, self._cursor, scope=self._scope,
            absent_on=(nvml.NVML_ERROR_NOT_FOUND,), empty=(),
        )
        if samples is None:  # unsupported or failed: the last figures stand, the cursor stays
            return
        sm: dict[int, list[float]] = {}
        mem: dict[int, list[float]] = {}
        for sample in samples:
            sm.setdefault(sample.pid, []).append(float(sample.smUtil))
            mem.setdefault(sample.pid, []).append(float(sample.memUtil))
            self._cursor = max(self._cursor, int(sample.timeStamp))
        self._figures = {pid: (_mean(sm.get(pid)), _mean(mem.get(pid))) for pid in pids}
        self.sampled = frozenset(sm)
        self.window_seconds = now - self.read_at if self.read_at is not None else None
        self.read_at = now

    def figures(self, pid: int) -> tuple[float | None, float | None]:
        """(SM %, memory %) of ``pid`` at the last read; (None, None) when it was not there or none worked."""
        return self._figures.get(pid, (None, None))


def _mean(values: list[float] | None) -> float:
    return sum(values) / len(values) if values else 0.0
