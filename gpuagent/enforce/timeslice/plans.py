"""When, within each period, every throttled tenant is thawed: the two schemes the cycler can apply.

A controller decides each throttled tenant's frozen fraction; a plan turns the fractions into one period's
windows, ``key -> (thaw_at, freeze_at)`` in seconds from the period's start (frozen outside the window; an
empty window is frozen all period). The cycler (``cycler.py``) applies the windows on the event loop; the
plant of the tests and the bench (``gpuagent/devices/sim/contention.py``) applies the very same ones in
virtual time, through :func:`desired`.

- :class:`DutyPlan` (``share_scheme: duty``, the scheme before rotation): every throttled tenant is frozen
  from the start of each period and thawed at ``fraction * period``; the thawed ends overlap, so throttled
  tenants run together (time-sliced) at the end of each period.
- :class:`RotationPlan` (``share_scheme: rotation``): exclusive slots. Each throttled tenant is thawed
  only in its own slot of ``(1 - fraction) * period``, the slots one after the other in an order shuffled
  every period, and the rest of the period an open slot where all of them are frozen (tenants not
  throttled run throughout). At most one throttled tenant is thawed at a time, so its queue is the only
  throttled one running, and NVML's per-process view of it is the time it had.

Both dither the period: each period's length is drawn uniformly from ``period * (1 +- dither)``. NVML
samples per-process use on a fixed ~200 ms grid, and a fixed period locks every sample to one phase of the
cycle, so the view is that phase's, not the period's average (docs/shares.md); a dithered period spreads
the samples over every phase.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Period(Generic[K]):
    """One period: its length and each throttled key's thawed window, offsets from its start."""

    length: float
    windows: Mapping[K, tuple[float, float]]


class Plan(Protocol):
    name: str
    period: float
    dither: float

    def next_period(self, fractions: Mapping[K, float],
                    groups: Mapping[K, Hashable] | None = None) -> Period[K]: ...


def _check(period: float, dither: float) -> None:
    if not period > 0:
        raise ValueError("period must be positive")
    if not 0.0 <= dither < 1.0:
        raise ValueError("dither must be in [0, 1)")


class _Dithered:
    def __init__(self, period: float, dither: float, seed: int | None) -> None:
        _check(period, dither)
        self.period = period
        self.dither = dither
        self._rng = random.Random(seed)

    def _length(self) -> float:
        if not self.dither:
            return self.period
        return self.period * (1.0 + self.dither * (2.0 * self._rng.random() - 1.0))


class DutyPlan(_Dithered):
    """Every throttled key frozen from the period's start, thawed at ``fraction * length``."""

    name = "duty"

    def __init__(self, period: float = 0.1, *, dither: float = 0.0, seed: int | None = None) -> None:
        super().__init__(period, dither, seed)

    def next_period(self, fractions: Mapping[K, float],
                    groups: Mapping[K, Hashable] | None = None) -> Period[K]:
        length = self._length()
        return Period(length, {k: (min(max(f, 0.0), 1.0) * length, length) for k, f in fractions.items()})


class RotationPlan(_Dithered):
    """Each throttled key thawed in its own slot of ``(1 - fraction) * length``, in a shuffled order; the
    slots' sum is scaled down to the period when the fractions ask for more. Keys of different ``groups``
    (GPUs) rotate independently, side by side in the same period."""

    name = "rotation"

    def __init__(self, period: float = 1.0, *, dither: float = 0.3, seed: int | None = None) -> None:
        super().__init__(period, dither, seed)

    def next_period(self, fractions: Mapping[K, float],
                    groups: Mapping[K, Hashable] | None = None) -> Period[K]:
        length = self._length()
        by_group: dict[Hashable, list[K]] = {}
        for key in fractions:
            by_group.setdefault(groups.get(key) if groups else None, []).append(key)
        windows: dict[K, tuple[float, float]] = {}
        for keys in by_group.values():
            windows.update(self._rotation({k: fractions[k] for k in keys}, length))
        return Period(length, windows)

    def _rotation(self, fractions: Mapping[K, float], length: float) -> dict[K, tuple[float, float]]:
        slots: dict[K | None, float] = {k: 1.0 - min(max(f, 0.0), 1.0) for k, f in fractions.items()}
        total = sum(slots.values())
        if total > 1.0:
            slots = {k: v / total for k, v in slots.items()}
        else:
            slots[None] = 1.0 - total  # the open slot: every throttled key frozen
        order = list(slots)
        self._rng.shuffle(order)
        windows: dict[K, tuple[float, float]] = {}
        at = 0.0
        for key in order:
            end = at + slots[key] * length
            if key is not None:
                windows[key] = (at, end)
            at = end
        return windows


def desired(period: Period[K], offset: float) -> tuple[set[K], float]:
    """The keys frozen at ``offset`` seconds into ``period``, and the offset of its next change (its length
    when none comes before it ends)."""
    frozen: set[K] = set()
    change = period.length
    for key, (thaw_at, freeze_at) in period.windows.items():
        if thaw_at <= offset < freeze_at:
            change = min(change, freeze_at)
        else:
            frozen.add(key)
            if offset < thaw_at < freeze_at:
                change = min(change, thaw_at)
    return frozen, change


def make_plan(scheme: str, period: float | None = None, *, dither: float | None = None,
              seed: int | None = None) -> DutyPlan | RotationPlan:
    """The plan of ``share_scheme``; ``period``/``dither`` None: the scheme's default."""
    if scheme == "duty":
        return DutyPlan(period if period is not None else 0.1, dither=dither if dither is not None else 0.0,
                        seed=seed)
    if scheme == "rotation":
        return RotationPlan(period if period is not None else 1.0,
                            dither=dither if dither is not None else 0.3, seed=seed)
    raise ValueError(f"unknown share scheme {scheme!r}; known: duty, rotation")
