"""Bytes per second from cumulative counters, per key, over each key's own last window.

A counter that goes down was reset (a link re-created under the same index, a driver reload, an RDMA
counter cleared by ``perfquery -R``): that window has no rate (``None``), never a negative one or a wrap
guessed from a width we do not know. Every counter read here is 64-bit but the 32-bit RDMA ones, which
saturate instead of wrapping (see ``rdma``). A key seen for the first time has no rate either.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class RateTracker:
    """The last (value, time) of each key; :meth:`rate` returns units per second since then."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, float]] = {}

    def rate(self, key: Hashable, value: int | None, now: float) -> float | None:
        """Rate of ``value`` since the key's previous sample; None on its first sample, after a reset, or
        when ``value`` is unknown (which also forgets the key: the next known value starts afresh)."""
        if value is None:
            self._last.pop(key, None)
            return None
        previous = self._last.get(key)
        self._last[key] = (value, now)
        if previous is None:
            return None
        last_value, last_time = previous
        elapsed = now - last_time
        if elapsed <= 0 or value < last_value:
            return None
        return (value - last_value) / elapsed

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Forget every key not in ``keys`` (links, ports and pods that are gone), so memory stays flat."""
        keep = set(keys)
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]

    def __len__(self) -> int:
        return len(self._last)
