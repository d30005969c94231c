"""Per poll: rates from the snapshot, the ledger's integration, idle episodes, Events; the published state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.accounting.events import IdleEventPoster, IdleNotice
from gpuagent.accounting.idle import IdleTracker
from gpuagent.accounting.ledger import CONTAINER, POD, Ledger, Series, SeriesKey
from gpuagent.accounting.rates import RateReader
from gpuagent.snapshot.accounting import AccountingState, GpuAccounting, IdleWorkload, WorkloadGpuUsage
from gpuagent.snapshot.node import NodeSnapshot


@dataclass(frozen=True, slots=True)
class AccountingSettings:
    retention_seconds: float = 300.0
    efficiency_window_seconds: float = 3600.0
    idle_threshold_ratio: float = 0.05
    idle_window_seconds: float = 1800.0


class Accountant:
    """``update(snapshot)`` once per poll, after the sources; returns the :class:`AccountingState`.

    Nothing here blocks: Events are only queued on ``events`` (None: no Events, e.g. off Kubernetes).
    """

    def __init__(self, settings: AccountingSettings, *, events: IdleEventPoster | None = None) -> None:
        self.settings = settings
        self.events = events
        self.ledger = Ledger(retention_seconds=settings.retention_seconds,
                             idle_threshold_ratio=settings.idle_threshold_ratio)
        self.idle: IdleTracker[SeriesKey] = IdleTracker(
            threshold_ratio=settings.idle_threshold_ratio, idle_window_seconds=settings.idle_window_seconds,
            efficiency_window_seconds=settings.efficiency_window_seconds,
        )
        self._notified: set[tuple[str | None, str]] = set()  # pods whose current idle episode has its Event
        self._rates = RateReader()
        self._today = _Today()

    def update(self, snapshot: NodeSnapshot) -> AccountingState:
        now = snapshot.taken_at_monotonic
        dropped = self.ledger.update(self._rates.read(snapshot), now, snapshot.poll_interval_seconds)
        for key in dropped:
            self.idle.forget(key)
            self._today.forget(key)
        self._today.roll(snapshot.taken_at_unix, self.ledger)
        usage: list[WorkloadGpuUsage] = []
        idle: list[IdleWorkload] = []
        uids: dict[tuple[str | None, str], str | None] | None = None  # pod UIDs, once a pod is flagged
        observe, end, flagged = self.idle.observe, self.idle.end, self.idle.flagged
        base = self._today.base
        for key, series in self.ledger:
            level, kind, namespace, name, container, gpu_uuid, instance = key  # (one unpacking: 7 reads)
            observation = None
            if level != CONTAINER:
                if series.running:
                    observation = observe(key, now, series.allocated_now, series.busy_now,
                                          series.allocated_gpu_seconds, series.busy_gpu_seconds)
                else:
                    end(key)
            # positional, in WorkloadGpuUsage's field order: one of these per series per poll
            usage.append(WorkloadGpuUsage(
                level, kind, name, namespace, container, gpu_uuid, series.gpu_index,
                instance, series.mig_profile, series.allocated_gpu_seconds,
                series.busy_gpu_seconds, series.memory_byte_seconds, series.energy_joules,
                series.idle_allocated_gpu_seconds, series.allocated_now,
                observation.efficiency_ratio if observation is not None else None,
                observation.idle_seconds if observation is not None else 0.0,
                None if series.running else snapshot.taken_at_unix - (now - series.last_seen),
                series.allocated_gpu_seconds - base.get(key, 0.0),
            ))
            if observation is not None and flagged(observation):
                assert observation.idle_since is not None
                if uids is None:
                    uids = {(p.namespace, p.name): p.uid for p in snapshot.pods}
                idle.append(IdleWorkload(
                    kind=key.kind, name=key.name, namespace=key.namespace,
                    pod_uid=uids.get((key.namespace, key.name)) if key.level == POD else None,
                    gpu_uuid=key.gpu_uuid, gpu_index=series.gpu_index, gpu_instance_id=key.gpu_instance_id,
                    allocated_gpus=series.allocated_now,
                    idle_since_unix=snapshot.taken_at_unix - (now - observation.idle_since),
                    idle_seconds=observation.idle_seconds,
                ))
        self._notify(idle, self.ledger.series)
        return AccountingState(
            idle=tuple(idle),
            usage=tuple(usage),
            gpus=tuple(
                GpuAccounting(uuid, t.index, t.energy_joules, t.energy_unattributed_joules, t.gap_seconds)
                for uuid, t in self.ledger.gpus.items()
            ),
            idle_threshold_ratio=self.settings.idle_threshold_ratio,
            idle_window_seconds=self.settings.idle_window_seconds,
            efficiency_window_seconds=self.settings.efficiency_window_seconds,
            retention_seconds=self.settings.retention_seconds,
            events_total=self.events.counts() if self.events is not None else {},
            day_started_at_unix=self._today.started_at_unix,
        )

    async def close(self) -> None:
        if self.events is not None:
            await self.events.aclose()

    def _notify(self, idle: list[IdleWorkload], pods: Mapping[SeriesKey, Series]) -> None:
        """One Event per pod per idle episode: when the pod first has a flagged GPU, until it has none."""
        flagged: dict[tuple[str | None, str], list[IdleWorkload]] = {}
        for entry in idle:
            if entry.kind == "pod":
                flagged.setdefault((entry.namespace, entry.name), []).append(entry)
        if self.events is not None:
            for (namespace, name), entries in flagged.items():
                if (namespace, name) in self._notified or namespace is None:
                    continue  # a pod known only by its UID has no namespace to post in
                self.events.submit(IdleNotice(
                    namespace=namespace, pod=name, pod_uid=entries[0].pod_uid,
                    gpus=tuple(_describe(e, pods) for e in entries),
                    idle_seconds=min(e.idle_seconds for e in entries),
                    threshold_ratio=self.settings.idle_threshold_ratio,
                ))
        self._notified = set(flagged)


def _describe(entry: IdleWorkload, pods: Mapping[SeriesKey, Series]) -> str:
    text = f"GPU {entry.gpu_index} ({entry.gpu_uuid})"
    if entry.gpu_instance_id is not None:
        key = SeriesKey(POD, "pod", entry.namespace, entry.name, None, entry.gpu_uuid, entry.gpu_instance_id)
        series = pods.get(key)
        profile = series.mig_profile if series is not None and series.mig_profile else "MIG"
        text += f" {profile} instance {entry.gpu_instance_id}"
    return text


class _Today:
    """GPU-seconds held today (UTC): each series' counter less its value at the first poll of the day.

    The interval across midnight counts to the day before (one poll's worth); a series first seen today
    starts from 0; on the agent's first day, "today" starts at its first poll (``started_at_unix`` says so).
    """

    def __init__(self) -> None:
        self.day: int | None = None
        self.started_at_unix: float | None = None
        self.base: dict[SeriesKey, float] = {}  # each series' allocated GPU-seconds at the day's start

    def roll(self, now_unix: float, ledger: Ledger) -> None:
        day = int(now_unix // _DAY_SECONDS)
        if day == self.day:
            return
        first = self.day is None
        self.day = day
        self.started_at_unix = now_unix if first else float(day * _DAY_SECONDS)
        self.base = {key: s.allocated_gpu_seconds for key, s in ledger}

    def forget(self, key: SeriesKey) -> None:
        self.base.pop(key, None)


_DAY_SECONDS = 86400
