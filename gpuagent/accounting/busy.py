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

Settled alone, busy would grow in lumps of one reading window (10 s), so a short range of a counter would
hold a whole lump more or less than its share. Between readings each place is therefore counted
provisionally, poll by poll, by its ``busy_estimate`` (its latest figure, scaled down when the GPU's own
utilization, read every poll, is under the tenants' sum: ``rates``); the reading that covers those polls
then settles the window, and
only the difference between its figure and the provisional count is added. For steady loads that
difference is 0, so the counter is exact at every poll; for changing loads the window's total is still the
reading's, exactly. A counter never goes down: a provisional count that went past what the reading says is
held as ``ahead``, and the place's next increments pay it off before anything more is counted, so what is
published is always the settled busy plus the provisional count plus that excess, and the excess is at most
one window's overestimate.
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
    """A place's busy GPU-seconds over a reading's window (None: unknown), what it held then, and what is
    added to its counter now (``counted``: the reading's figure less what was counted provisionally)."""

    busy: float | None = None
    allocated_seconds: float = 0.0
    counted: float = 0.0

    def add(self, other: Settled) -> None:
        """Sum another place's lump into this one (a series several places contribute to)."""
        self.allocated_seconds += other.allocated_seconds
        self.counted += other.counted
        if other.busy is not None:
            self.busy = (self.busy or 0.0) + other.busy


@dataclass(slots=True)
class PendingBusy:
    """One GPU's places since its last per-process reading (``read_at``), awaiting the next."""

    read_at: float | None = None
    places: dict = field(default_factory=dict)  # place -> _Pending
    rates: dict = field(default_factory=dict)  # place -> its last known busy rate (GPUs)
    provisional: dict = field(default_factory=dict)  # place -> GPU-seconds estimated since the reading
    ahead: dict = field(default_factory=dict)  # place -> GPU-seconds counted past what readings settled

    def add(self, place: object, present_seconds: float, allocated_seconds: float) -> None:
        """One interval of a place: the seconds it was there (trapezoid of its presence at both ends)."""
        pending = self.places.get(place)
        if pending is None:
            pending = self.places[place] = _Pending()
        pending.present_seconds += present_seconds
        pending.allocated_seconds += allocated_seconds

    def estimate(self, place: object, busy_seconds: float) -> float:
        """A provisional ``busy_seconds`` of the place's window so far; returns what to count now."""
        self.provisional[place] = self.provisional.get(place, 0.0) + busy_seconds
        return self.count(place, busy_seconds)

    def count(self, place: object, busy_seconds: float) -> float:
        """What of ``busy_seconds`` (negative: a provisional count the reading took back) the place's
        counter takes now: nothing until the excess counted before (``ahead``) is paid off."""
        ahead = self.ahead.get(place)
        if ahead is None and busy_seconds >= 0.0:
            return busy_seconds  # nearly always: nothing counted in excess
        ahead = (ahead or 0.0) - busy_seconds
        if ahead > 0.0:
            self.ahead[place] = ahead
            return 0.0
        self.ahead.pop(place, None)
        return -ahead

    def note(self, units: dict) -> None:
        """The rates of this poll's places, where known (a place new since the last reading has none)."""
        for place, rate in units.items():
            if isinstance(rate, Rate) and rate.busy is not None:
                self.rates[place] = rate.busy

    def settle(self, read_at: float | None, present: dict) -> dict[object, Settled]:
        """A new reading (``read_at``) came: every pending place at its rate now, less what was counted
        provisionally; then start over. The excess of a place not ``present`` now is forgotten with it."""
        settled = {}
        for place, p in self.places.items():
            busy = self.rates[place] * p.present_seconds if place in self.rates else None
            estimated = self.provisional.get(place, 0.0)
            counted = self.count(place, busy - estimated) if busy is not None else 0.0
            settled[place] = Settled(busy, p.allocated_seconds, counted)
        self.places.clear()
        self.rates.clear()  # the next poll notes the rates of the places still there
        self.provisional.clear()
        self.forget_gone(present)
        self.read_at = read_at
        return settled

    def forget_gone(self, present: dict) -> None:
        """The excess of the places not ``present`` at a reading goes with them (nothing more to pay it)."""
        if self.ahead:
            self.ahead = {place: ahead for place, ahead in self.ahead.items() if place in present}
