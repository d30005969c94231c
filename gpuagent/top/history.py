"""A short history of each GPU's utilization, for the sparkline of its block.

One point per snapshot (a snapshot seen twice, a 304 or a paused view, adds nothing), the last ``size``
kept. ``sparkline`` draws them with the eight block glyphs, a missing point (the GPU was stale or gave no
figure) as a space, never as the lowest bar.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

BARS = "▁▂▃▄▅▆▇█"


class History:
    def __init__(self, size: int = 60) -> None:
        self.size = size
        self._points: dict[str, deque[float | None]] = {}
        self._last_taken_at: float | None = None

    def add(self, taken_at_unix: float | None, values: dict[str, float | None]) -> None:
        """The figures of one snapshot (GPU UUID -> ratio 0-1, None: unknown), once per snapshot."""
        if taken_at_unix is not None and taken_at_unix == self._last_taken_at:
            return
        self._last_taken_at = taken_at_unix
        for uuid, value in values.items():
            self._points.setdefault(uuid, deque(maxlen=self.size)).append(value)

    def of(self, uuid: str) -> tuple[float | None, ...]:
        return tuple(self._points.get(uuid, ()))


def sparkline(values: Sequence[float | None], width: int) -> str:
    """The last ``width`` values (ratios 0-1) as block glyphs, right-aligned; None is a space."""
    shown = list(values)[-width:] if width > 0 else []
    glyphs = [" " if v is None else BARS[min(len(BARS) - 1, max(0, round(v * (len(BARS) - 1))))]
              for v in shown]
    return " " * (width - len(glyphs)) + "".join(glyphs)
