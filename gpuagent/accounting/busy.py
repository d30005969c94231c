"""Busy time from per-process readings: each reading's averages over the time it covers, counted once.

NVML's per-process utilization is read every poll only where the share controller acts, every
``process_utilization_interval`` (10 s) elsewhere; each read gives the mean use since the previous read
(``GpuSample.process_util_*``). Integrating the figure held between reads poll by poll would count each
reading over the *next* window instead of its own, and a change of cadence (a GPU that becomes shared)
would count some windows twice and drop others. So the ledger keeps, per GPU and place (owner, MIG
instance), the seconds it was present and the GPU-seconds it held since the last reading; when a new
reading comes, each place's busy GPU-seconds are its rate in that reading times the seconds it was present,
and its idle-held seconds are judged over the same window. A place that left before the reading (its
processes ended) takes the last rate it was seen with; one never measured (it came and went between two
reads) stays unknown. Time in a gap is never added (the ledger does not integrate it). When every poll is
a reading this is the poll-by-poll rule with each interval's own figure at its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuagent.accounting.rates import Rate


@dataclass(slots=True)
class _Pending:
    present_seconds: float = 0.0
    allocated_seconds: float = 0.0


@dataclass(slots=True)
class Settled:
    """A place's busy GPU-seconds over a reading's window (None: unknown), and what it held then."""

    busy: float | None = None
    allocated_seconds: float = 0.0

    def add(self, other: Settled) -> None:
        """Sum another place's lump into this one (a series several places contribute to)."""
        self.allocated_seconds += other.allocated_seconds
        if other.busy is not None:
            self.busy = (self.busy or 0.0) + other.busy


@dataclass(slots=True)
class PendingBusy:
    """One GPU's places since its last per-process reading (``read_at``), awaiting the next."""

    read_at: float | None = None
    places: dict = field(default_factory=dict)  # place -> _Pending
    rates: dict = field(default_factory=dict)  # place -> its last known busy rate (GPUs)

    def add(self, place: object, present_seconds: float, allocated_seconds: float) -> None:
        """One interval of a place: the seconds it was there (trapezoid of its presence at both ends)."""
        pending = self.places.get(place)
        if pending is None:
            pending = self.places[place] = _Pending()
        pending.present_seconds += present_seconds
        pending.allocated_seconds += allocated_seconds

    def note(self, units: dict) -> None:
        """The rates of this poll's places, where known (a place new since the last reading has none)."""
        for place, rate in units.items():
            if isinstance(rate, Rate) and rate.busy is not None:
                self.rates[place] = rate.busy

    def settle(self, read_at: float | None) -> dict[object, Settled]:
        """A new reading (``read_at``) came: every pending place at its rate now; then start over."""
        settled = {
            place: Settled(
                busy=self.rates[place] * p.present_seconds if place in self.rates else None,
                allocated_seconds=p.allocated_seconds,
            )
            for place, p in self.places.items()
        }
        self.places.clear()
        self.rates.clear()  # the next poll notes the rates of the places still there
        self.read_at = read_at
        return settled
