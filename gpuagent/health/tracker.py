"""How long a fault lasts: hysteresis for the flapping ones, a hold until a reset for those that need one.

A fault is set the poll it is first seen. It clears ``clear_after`` seconds after it was last seen (a
slowdown that comes and goes every few seconds is one fault, not a flood of transitions), except a fault
whose recommended action is a GPU reset, a reboot or a replacement: that one is held until the GPU is seen
healthy *after a reset*. A reset is seen when, after the fault's onset, the GPU was unreachable (lost, in
error, absent from the poll) or NVML itself failed (a driver reload), and it now answers again; or when its
volatile double-bit ECC counter went down (those counters start again at a reset). A new occurrence of the
fault starts the hold again. A fault whose rule has no hysteresis (a DRA driver's device taint: removed on
purpose, it does not flap) clears the poll it is gone. A *level* that needs a reset (a pending remap, the GPU
lost, a link down) ends with the reset itself, so it clears the poll it is no longer seen.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from gpuagent.health import table
from gpuagent.health.classify import Observation
from gpuagent.health.table import Rule
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.health import GpuFault
from gpuagent.snapshot.node import NodeSnapshot

UNREACHABLE = frozenset({table.GPU_LOST.reason, table.GPU_UNRESPONSIVE.reason, table.NVML_FAILING.reason})


@dataclass
class _Entry:
    rule: Rule
    gpu_index: int | None
    gpu_uuid: str | None
    message: str
    since: float
    last_seen: float
    occurrence: bool = False  # an XID (an event), not a level
    reset_seen: bool = False
    active: bool = True

    def fault(self) -> GpuFault:
        r = self.rule
        return GpuFault(r.reason, r.condition, r.severity, r.action, self.message, self.gpu_index,
                        self.gpu_uuid, self.since, self.active, r.needs_reset and not self.reset_seen)


class FaultTracker:
    """``update(snapshot, observations, now)`` -> (the faults standing now, the ones new this poll)."""

    def __init__(self, *, clear_after: float = 300.0) -> None:
        self.clear_after = clear_after
        self._entries: dict[tuple[str, str | None], _Entry] = {}
        self._dbe: dict[str, int] = {}

    def update(self, snapshot: NodeSnapshot, observations: Iterable[Observation],
               now: float) -> tuple[tuple[GpuFault, ...], tuple[GpuFault, ...]]:
        new: list[_Entry] = []
        seen: set[tuple[str, str | None]] = set()
        for o in observations:
            seen.add(o.key)
            entry = self._entries.get(o.key)
            if entry is None:
                entry = self._entries[o.key] = _Entry(o.rule, o.gpu_index, o.gpu_uuid, o.message, now, now,
                                                         o.occurrence)
                new.append(entry)
            else:
                if o.occurrence and entry.reset_seen:  # it happened again after the reset: a new episode
                    entry.since = now
                    new.append(entry)
                entry.reset_seen = False if o.occurrence else entry.reset_seen
                entry.last_seen, entry.message, entry.rule = now, o.message, o.rule
        reachable, resets = self._resets(snapshot)
        for key, entry in list(self._entries.items()):
            entry.active = key in seen
            uuid = entry.gpu_uuid
            if entry.rule.reason in UNREACHABLE or not entry.occurrence:
                # the GPU away, a pending remap, a link down: the symptom itself ends only with a reset
                entry.reset_seen = not entry.active
            elif (entry.rule.needs_reset and not entry.active and entry.since < now
                  and (uuid is None or uuid not in reachable or uuid in resets)):
                entry.reset_seen = True
            if entry.active:
                continue
            if entry.rule.needs_reset:
                if entry.reset_seen and (uuid is None or uuid in reachable):
                    del self._entries[key]  # healthy after a reset
            elif not entry.rule.hysteresis or now - entry.last_seen >= self.clear_after:
                del self._entries[key]
        faults = tuple(e.fault() for e in sorted(self._entries.values(), key=_order))
        return faults, tuple(e.fault() for e in new)

    def adopt(self, held: Iterable[tuple[str, str, int | None, float]], *, gpus: Collection[str],
              now: float) -> int:
        """Faults a previous run of the agent held until a reset (from the Node, on the same boot): held
        again, as if seen before this run started. Only a known reason that needs a reset, on a GPU of this
        node (``gpus``, the UUIDs the poll sees): a fault adopted for a GPU that is not there could never see
        its reset and would be held for ever. An onset after ``now`` is taken as ``now``. Returns how many."""
        rules = table.rules_by_reason()
        adopted = 0
        for reason, uuid, index, since in held:
            rule = rules.get(reason)
            if rule is None or not rule.needs_reset or uuid not in gpus or (reason, uuid) in self._entries:
                continue
            since = min(since, now)
            self._entries[(reason, uuid)] = _Entry(rule, index, uuid, rule.message.format(code="?", detail="",
                                                   links="", reasons="") + " (before the agent restarted)",
                                                   since, since, occurrence=True)
            adopted += 1
        return adopted

    def _resets(self, snapshot: NodeSnapshot) -> tuple[set[str], set[str]]:
        """The GPUs answering now (every one of them, when NVML itself is failing: none), and those whose
        volatile DBE counter went down since the last poll."""
        nvml_ok = any(s.name == "nvml" and s.ok for s in snapshot.sources) or not snapshot.sources
        reachable = {g.info.uuid for g in snapshot.gpus if g.health is Health.OK} if nvml_ok else set()
        resets = set()
        for g in snapshot.gpus:
            dbe = g.ecc.dbe_volatile_total if g.ecc is not None else None
            if dbe is None:
                continue
            if dbe < self._dbe.get(g.info.uuid, 0):
                resets.add(g.info.uuid)
            self._dbe[g.info.uuid] = dbe
        return reachable, resets


def _order(entry: _Entry) -> tuple[int, str, str]:
    return (entry.gpu_index if entry.gpu_index is not None else -1, entry.rule.reason, entry.gpu_uuid or "")
