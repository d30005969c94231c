"""The ledger: per-workload GPU counters integrated over the time between polls, with retention.

Between two polls ``dt`` apart (the snapshots' monotonic times), each owner's rates (see ``rates``) are
integrated by the trapezoid rule: the mean of its rate at both ends times ``dt``, an end where it was absent
counting 0 (it appeared or left during the interval), an end where its busy figure was unknown taking the
other end's. Nothing is integrated, and the time is added to the GPU's ``gap_seconds_total`` instead, when
the polls are more than ``max(gap_factor x poll interval, min_gap_seconds)`` apart (the agent was stopped or
starved: use during an outage is not invented), or the GPU was stale or unhealthy at either end.

Energy: each poll interval's energy is split among the owners: the busy part ``E x min(1, sum busy)`` by
each owner's busy, the idle remainder by what each holds (by busy when nobody holds it; "unattributed" when
nobody was there, or for processes without a workload). The counter is read only every ``energy_interval``
(it costs about 3 ms a read on an H100), so between two reads each interval's ``E`` is estimated from the
instant power (trapezoid; equal weights per second without a power reading) and held as pending; when the
next reading comes, the counter's delta is shared out in proportion to those estimates. So the shares of a
GPU add up to its counter's delta exactly, with each poll weighted by the power drawn then. A counter that
went backwards (GPU reset, driver reload), a gap, or an absent counter drops what was pending: nothing
is split until the next reading after it.

Busy on a GPU shared by several owners, whose processes' utilization is read every few seconds (``busy``; an
owner alone on its GPU has the device's per-poll figure instead, ``busy_read_at`` None): each reading's
averages are applied to the time since the previous reading, when it comes, so no window is counted twice or
dropped whatever the cadence; its idle-held seconds are judged over the same window. Between readings each
owner's busy is counted provisionally poll by poll, by the trapezoid of its ``busy_estimate`` (its latest
figure, scaled down to the GPU's utilization when that is less), and the reading adds only what its figure
differs by. A reading
whose window is one interval (utilization read every poll: every GPU the share controller acts on) is
settled with that interval's integration, to the same figures, without the round trip through the pending
busy.

Series: each owner's increments go to its own series (a pod's container, or a workload off Kubernetes)
and, for a pod, to the pod's series too. A series not seen for ``retention_seconds`` is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from gpuagent.accounting.busy import PendingBusy, Settled
from gpuagent.accounting.rates import UNATTRIBUTED, GpuRates, Owner, Rate

POD, CONTAINER, WORKLOAD = "pod", "container", "workload"
_Summed = TypeVar("_Summed", "_Increment", Settled)  # what _by_series sums by series


class SeriesKey(NamedTuple):
    level: str  # POD, CONTAINER or WORKLOAD
    kind: str
    namespace: str | None
    name: str
    container: str | None
    gpu_uuid: str
    gpu_instance_id: int | None


@dataclass(slots=True)
class Series:
    """The running totals of one series."""

    gpu_index: int
    mig_profile: str | None
    last_seen: float  # monotonic time of the last poll that listed it
    allocated_gpu_seconds: float = 0.0
    busy_gpu_seconds: float | None = None
    memory_byte_seconds: float = 0.0
    energy_joules: float | None = None
    idle_allocated_gpu_seconds: float = 0.0
    allocated_now: float = 0.0  # held at the last poll (0 when not seen then)
    busy_now: float | None = None
    running: bool = True  # listed by the last poll


@dataclass(slots=True)
class GpuTotals:
    index: int
    energy_joules: float | None = None
    energy_unattributed_joules: float | None = None
    gap_seconds: float = 0.0


@dataclass(slots=True)
class _PendingEnergy:
    """Estimated energy shares since the GPU's last counter reading (``anchor``), awaiting the next one."""

    anchor: float | None = None  # the counter at the last reading the pending estimates start from
    read_at: tuple[str, float] | None = None  # that reading's identity: when it was read
    shares: dict[SeriesKey, float] = field(default_factory=dict)
    unattributed: float = 0.0
    total: float = 0.0

    def drop(self) -> None:
        self.anchor = self.read_at = None
        self.shares.clear()
        self.unattributed = self.total = 0.0


@dataclass(slots=True)
class _Increment:
    allocated: float = 0.0
    busy: float | None = None
    memory: float = 0.0
    energy: float | None = None
    # busy the counter takes beside ``busy``, not judged idle or not: a provisional count between readings
    # (judged when the reading settles it), or, negative, a provisional excess of before being paid off
    busy_apart: float = 0.0

    def add(self, other: _Increment) -> None:
        self.allocated += other.allocated
        self.memory += other.memory
        self.busy_apart += other.busy_apart
        if other.busy is not None:
            self.busy = (self.busy or 0.0) + other.busy
        if other.energy is not None:
            self.energy = (self.energy or 0.0) + other.energy


class Ledger:
    """Integrates poll rates into series. ``update`` once per poll; read ``series`` and ``gpus`` after."""

    def __init__(
        self,
        *,
        retention_seconds: float = 300.0,
        idle_threshold_ratio: float = 0.05,
        gap_factor: float = 3.0,
        min_gap_seconds: float = 1.0,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.idle_threshold_ratio = idle_threshold_ratio
        self.gap_factor = gap_factor
        self.min_gap_seconds = min_gap_seconds
        self.series: dict[SeriesKey, Series] = {}
        self.gpus: dict[str, GpuTotals] = {}
        self._previous: dict[str, GpuRates | None] = {}  # the last poll's GPUs: rates, None if unusable
        self._previous_at: float | None = None
        self._energy: dict[str, _PendingEnergy] = {}
        self._busy: dict[str, PendingBusy] = {}  # per GPU: busy awaiting the next per-process reading
        # (owner, GPU, MIG instance) -> its series' keys, for the places of the last update and this one
        self._keys: dict[tuple[Owner, str, int | None], tuple[SeriesKey, ...]] = {}
        self._keys_before: dict[tuple[Owner, str, int | None], tuple[SeriesKey, ...]] = {}

    def update(self, rates: dict[str, GpuRates], now: float, poll_interval_seconds: float) -> list[SeriesKey]:
        """Integrate from the previous poll to this one (monotonic ``now``); returns the series dropped."""
        dt = None if self._previous_at is None else now - self._previous_at
        self._keys_before, self._keys = self._keys, {}
        bound = max(self.gap_factor * poll_interval_seconds, self.min_gap_seconds)
        for s in self.series.values():
            s.running, s.allocated_now, s.busy_now = False, 0.0, None
        for uuid, current in rates.items():
            totals = self.gpus.get(uuid)
            if totals is None:
                totals = self.gpus[uuid] = GpuTotals(current.index)
            totals.index = current.index
            previous = self._previous.get(uuid)
            pending = self._energy.setdefault(uuid, _PendingEnergy())
            settled = False  # this interval's busy was settled with its integration
            if dt is not None and dt > 0 and uuid in self._previous:
                if previous is None or dt > bound or not current.usable:
                    totals.gap_seconds += dt
                    pending.drop()
                else:
                    settled = self._integrate(previous, current, dt, totals, pending)
            if current.usable:
                self._settle_energy(current, totals, pending, now)
                if not settled:
                    self._settle_busy(current)
            self._mark_seen(current, now)
        if dt is None or dt > 0:
            self._previous = {uuid: r if r.usable else None for uuid, r in rates.items()}
            self._previous_at = now
        return self._expire(now)

    # -- one interval of one GPU ---------------------------------------------------------------------
    def _integrate(
        self, previous: GpuRates, current: GpuRates, dt: float, totals: GpuTotals, pending: _PendingEnergy
    ) -> bool:
        """One interval's increments into the series; True when a reading covering it settled its busy."""
        increments: dict[tuple[Owner, int | None], _Increment] = {}
        before_units, after_units = previous.units, current.units
        for place in before_units.keys() | after_units.keys():
            a, b = before_units.get(place), after_units.get(place)
            if a is not None and b is not None and a.busy is not None and b.busy is not None:
                # both ends there and known (nearly every place): _trapezoid's arithmetic, inline
                increments[place] = _Increment(
                    (a.allocated + b.allocated) / 2 * dt, (a.busy + b.busy) / 2 * dt,
                    (a.memory_bytes + b.memory_bytes) / 2 * dt)
            else:
                increments[place] = _trapezoid(a, b, dt)
        estimate = _energy_estimate(previous, current, dt) if pending.anchor is not None else None
        if estimate is not None:
            pending.unattributed += _split_energy(increments, estimate, dt)
            pending.total += estimate
        settled = False
        if current.busy_read_at is not None:  # busy waits for the reading that covers this interval
            waiting = self._busy.get(current.uuid)
            if waiting is None:
                waiting = self._busy[current.uuid] = PendingBusy(read_at=previous.busy_read_at)
            before, after = previous.units, current.units
            if current.busy_read_at != waiting.read_at and not waiting.places and not waiting.rates:
                # a reading whose window is this interval alone (per-process use read every poll): what
                # waiting, noting the rates now and settling them give, each place's rate now times the
                # time it was there, without the round trip (_settle_busy is not called for it)
                settled, waiting.read_at = True, current.busy_read_at
                for place, increment in increments.items():
                    rate = after.get(place)
                    increment.busy = (None if rate is None or rate.busy is None
                                      else rate.busy * (((place in before) + 1) / 2 * dt))
                if waiting.ahead:  # a provisional excess of slower readings before: paid off first
                    for place, increment in increments.items():
                        if increment.busy is not None and place in waiting.ahead:
                            increment.busy_apart = waiting.count(place, increment.busy) - increment.busy
                    waiting.forget_gone(after)
            else:
                for place, increment in increments.items():
                    a, b = before.get(place), after.get(place)
                    present = ((a is not None) + (b is not None)) / 2 * dt
                    waiting.add(place, present, increment.allocated)
                    increment.busy = None
                    estimate_a = 0.0 if a is None else a.busy_estimate
                    estimate_b = 0.0 if b is None else b.busy_estimate
                    if estimate_a is not None and estimate_b is not None:
                        increment.busy_apart = waiting.estimate(place, (estimate_a + estimate_b) / 2 * dt)
        shares, series = pending.shares, self.series
        for key, increment in self._by_series(current.uuid, increments, _Increment).items():
            if increment.energy is not None:
                shares[key] = shares.get(key, 0.0) + increment.energy
            self._add(series.get(key) or self._series(key, current), increment)
        return settled

    def _by_series(
        self, uuid: str, increments: dict[tuple[Owner, int | None], _Summed], zero: Callable[[], _Summed]
    ) -> dict[SeriesKey, _Summed]:
        """The places' increments (or a reading's lumps) by series. A pod's series sums its containers'; a
        series with one contributor (the common case: one container) takes its increment as is, which is
        what adding it to a ``zero()`` one gives."""
        by_series: dict[SeriesKey, _Summed] = {}
        merged: set[SeriesKey] = set()  # series whose increment is a sum of its own (not shared)
        for (owner, instance), increment in increments.items():
            if owner is UNATTRIBUTED:
                continue
            for key in self._series_keys(owner, uuid, instance):
                total = by_series.get(key)
                if total is None:
                    by_series[key] = increment
                    continue
                if key not in merged:  # a second contributor: sum into an increment of the series' own
                    merged.add(key)
                    first, total = total, zero()
                    total.add(first)
                    by_series[key] = total
                total.add(increment)
        return by_series

    def _settle_busy(self, current: GpuRates) -> None:
        """At a new per-process reading, the busy of every place since the last one (``busy``)."""
        waiting = self._busy.get(current.uuid)
        if waiting is None:
            if current.busy_read_at is not None:
                self._busy[current.uuid] = PendingBusy(read_at=current.busy_read_at)
            return
        waiting.note(current.units)
        if current.busy_read_at == waiting.read_at:
            return
        settled: dict[tuple[Owner, int | None], Settled] = waiting.settle(current.busy_read_at, current.units)
        by_series = self._by_series(current.uuid, settled, Settled)
        series = self.series
        for key, lump in by_series.items():
            self._add_busy(series.get(key) or self._series(key, current), lump)
        if current.busy_read_at is None:
            del self._busy[current.uuid]

    def _settle_energy(
        self, current: GpuRates, totals: GpuTotals, pending: _PendingEnergy, now: float
    ) -> None:
        """At a new counter reading, share its delta since the anchor out as the pending estimates say.
        A counter without a read time counts as read at this poll."""
        counter = current.energy_joules_total
        if counter is None:
            pending.drop()
            return
        if totals.energy_joules is None:  # as for the series: known from the first reading, counted from 0
            totals.energy_joules = totals.energy_unattributed_joules = 0.0
        read_at = (("read", current.energy_read_at_unix) if current.energy_read_at_unix is not None
                   else ("poll", now))
        if read_at == pending.read_at:
            return  # the same reading as before: keep estimating
        delta = counter - pending.anchor if pending.anchor is not None else None
        if delta is not None and delta >= 0:
            scale = delta / pending.total if pending.total > 0 else 0.0
            totals.energy_joules = (totals.energy_joules or 0.0) + delta
            unattributed = pending.unattributed * scale if pending.total > 0 else delta
            totals.energy_unattributed_joules = (totals.energy_unattributed_joules or 0.0) + unattributed
            for key, share in pending.shares.items():
                s = self._series(key, current)
                s.energy_joules = (s.energy_joules or 0.0) + share * scale
        pending.drop()
        pending.anchor, pending.read_at = counter, read_at

    def _series(self, key: SeriesKey, gpu: GpuRates) -> Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(gpu.index, gpu.profiles.get(key.gpu_instance_id)
                                          if key.gpu_instance_id is not None else None, last_seen=0.0)
        return s

    def _add(self, s: Series, inc: _Increment) -> None:
        """The interval's GPU-seconds and memory; its energy waits in the pending shares."""
        s.allocated_gpu_seconds += inc.allocated
        s.memory_byte_seconds += inc.memory
        if inc.busy_apart:
            s.busy_gpu_seconds = (s.busy_gpu_seconds or 0.0) + inc.busy_apart
        if inc.busy is not None:
            s.busy_gpu_seconds = (s.busy_gpu_seconds or 0.0) + inc.busy
            if inc.allocated > 0 and inc.busy < self.idle_threshold_ratio * inc.allocated:
                s.idle_allocated_gpu_seconds += inc.allocated

    def _add_busy(self, s: Series, lump: Settled) -> None:
        """A reading's busy over its window (less what was counted provisionally), and the time held in it
        judged idle or not by the reading's figure (its GPU-seconds were added poll by poll)."""
        if lump.busy is None:
            return
        s.busy_gpu_seconds = (s.busy_gpu_seconds or 0.0) + lump.counted
        if lump.allocated_seconds > 0 and lump.busy < self.idle_threshold_ratio * lump.allocated_seconds:
            s.idle_allocated_gpu_seconds += lump.allocated_seconds

    def _series_keys(self, owner: Owner, uuid: str, instance: int | None) -> tuple[SeriesKey, ...]:
        place = (owner, uuid, instance)
        keys = self._keys.get(place)
        if keys is None:
            keys = self._keys_before.get(place)
            if keys is None:
                keys = _series_keys(owner, uuid, instance)
            self._keys[place] = keys
        return keys

    def _mark_seen(self, current: GpuRates, now: float) -> None:
        now_by_key: dict[SeriesKey, Rate] = {}
        merged: set[SeriesKey] = set()  # series whose rate is a sum of its own (the units' are not changed)
        for (owner, instance), rate in current.units.items():
            if owner is UNATTRIBUTED:
                continue
            for key in self._series_keys(owner, current.uuid, instance):
                total = now_by_key.get(key)
                if total is None:
                    now_by_key[key] = rate
                    continue
                if key not in merged:
                    merged.add(key)
                    total = now_by_key[key] = Rate(total.allocated, total.busy, total.memory_bytes)
                total.allocated += rate.allocated
                if rate.busy is not None:
                    total.busy = (total.busy or 0.0) + rate.busy
        series = self.series
        for key, rate in now_by_key.items():
            s = series.get(key) or self._series(key, current)  # (a Series is never false)
            s.last_seen, s.running = now, True
            s.allocated_now, s.busy_now = rate.allocated, rate.busy
            # a figure known from the first sight starts its counter at 0 (so increase() sees all of it)
            if rate.busy is not None and s.busy_gpu_seconds is None:
                s.busy_gpu_seconds = 0.0
            if current.energy_joules_total is not None and s.energy_joules is None:
                s.energy_joules = 0.0
            s.gpu_index = current.index
            if key.gpu_instance_id is not None and key.gpu_instance_id in current.profiles:
                s.mig_profile = current.profiles[key.gpu_instance_id]

    def _expire(self, now: float) -> list[SeriesKey]:
        retention = self.retention_seconds
        gone = [k for k, s in self.series.items() if not s.running and now - s.last_seen > retention]
        for key in gone:
            del self.series[key]
        return gone

    def __len__(self) -> int:
        return len(self.series)

    def __iter__(self) -> Iterator[tuple[SeriesKey, Series]]:
        return iter(self.series.items())


def _series_keys(owner: Owner, uuid: str, instance: int | None) -> tuple[SeriesKey, ...]:
    if owner.kind == "pod":
        pod = SeriesKey(POD, "pod", owner.namespace, owner.name, None, uuid, instance)
        if owner.container is None:
            return (pod,)
        return pod, SeriesKey(CONTAINER, "pod", owner.namespace, owner.name, owner.container, uuid, instance)
    return (SeriesKey(WORKLOAD, owner.kind, None, owner.name, None, uuid, instance),)


def _trapezoid(before: Rate | None, after: Rate | None, dt: float) -> _Increment:
    """The mean of the two ends times ``dt``; an absent end counts 0, an unknown busy end the other's."""
    a = before or Rate(0.0, 0.0, 0.0)
    b = after or Rate(0.0, 0.0, 0.0)
    if a.busy is None and b.busy is None:
        busy = None
    else:
        busy_a = a.busy if a.busy is not None else b.busy
        busy_b = b.busy if b.busy is not None else a.busy
        busy = (busy_a + busy_b) / 2 * dt  # type: ignore[operator]
    return _Increment((a.allocated + b.allocated) / 2 * dt, busy, (a.memory_bytes + b.memory_bytes) / 2 * dt)


def _split_energy(increments: dict[tuple[Owner, int | None], _Increment], energy: float, dt: float) -> float:
    """Set each increment's share of ``energy`` (an interval of ``dt`` seconds); returns the part nobody
    took. Busy and held are GPU-seconds over ``dt``: divided by ``dt`` they are fractions of the GPU.

    The busy part goes by busy; the idle remainder by what each holds, or by busy when nobody holds it (a
    place with neither gets no share: its energy stays None). One pass over the places once the totals
    are known; the unattributed places' shares are summed in the places' order."""
    busy = [max(0.0, i.busy or 0.0) for i in increments.values()]
    held = [0.0 if owner is UNATTRIBUTED else max(0.0, i.allocated) for (owner, _), i in increments.items()]
    total_busy, total_held = sum(busy), sum(held)  # (the unattributed places' 0.0 adds nothing)
    busy_energy = energy * min(1.0, total_busy / dt) if total_busy > 0 else 0.0
    idle_energy = energy - busy_energy
    if total_held <= 0 and total_busy <= 0:
        return idle_energy  # nobody was there
    unattributed = 0.0
    for ((owner, _), increment), b, h in zip(increments.items(), busy, held, strict=True):
        share = busy_energy * b / total_busy if b > 0 else None
        if total_held > 0:  # the idle remainder by what each holds
            if owner is not UNATTRIBUTED:
                share = (0.0 if share is None else share) + idle_energy * h / total_held
        else:  # nobody holds it: by use
            share = (0.0 if share is None else share) + idle_energy * b / total_busy
        if share is None:
            continue
        if owner is UNATTRIBUTED:
            unattributed += share
        else:
            increment.energy = share
    return unattributed


def _energy_estimate(previous: GpuRates, current: GpuRates, dt: float) -> float:
    """The interval's energy by the trapezoid of the instant power; without a power reading, ``dt`` (equal
    weight per second: only the ratios between the pending estimates matter)."""
    if previous.power_watts is None or current.power_watts is None:
        return dt
    return max(0.0, (previous.power_watts + current.power_watts) / 2 * dt)
