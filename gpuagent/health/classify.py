"""Turns one snapshot into the faults it shows, by the table in :mod:`gpuagent.health.table`.

Two kinds of signal: *levels*, present as long as the GPU shows them (pending remaps, a link down, a
slowdown, the GPU lost), and *occurrences* (XIDs: an XID is an event, counted; a new one is one whose count
rose since the last poll, so a storm of thousands is one occurrence per poll). The DRA drivers' device taints
(``snapshot.dra_taints``, KEP-5055) are levels too, a source of their own. The classifier keeps only the
last counts; what stays, for how long, and what a reset clears is :mod:`gpuagent.health.tracker`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuagent.health import table
from gpuagent.health.table import Rule
from gpuagent.snapshot.gpu import GpuSample, Health
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import DraTaint

NVML_SOURCE = "nvml"


@dataclass(frozen=True)
class Observation:
    """A fault seen in this poll: its rule, the GPU (None: the node) and the message filled in."""

    rule: Rule
    gpu_index: int | None
    gpu_uuid: str | None
    message: str
    occurrence: bool = False  # an event (an XID) rather than a level

    @property
    def key(self) -> tuple[str, str | None]:
        return self.rule.reason, self.gpu_uuid


class Classifier:
    """``observe(snapshot)`` -> this poll's observations; remembers each GPU's XID counts in between."""

    def __init__(self, *, dra_taints: str = "report") -> None:
        if dra_taints not in table.DRA_TAINT_MODES:
            raise ValueError(f"dra_taints must be one of {table.DRA_TAINT_MODES}, not {dra_taints!r}")
        self.dra_taints = dra_taints
        self._xid_totals: dict[str, Mapping[int, int]] = {}
        self._never_up: dict[str, frozenset[int]] = {}  # GPU -> links down since the first read

    def observe(self, snapshot: NodeSnapshot) -> list[Observation]:
        out: list[Observation] = []
        nvml = next((s for s in snapshot.sources if s.name == NVML_SOURCE), None)
        if nvml is not None and not nvml.ok and not snapshot.gpus:
            out.append(Observation(table.NVML_FAILING, None, None,
                                   table.NVML_FAILING.message.format(detail=nvml.error or "no GPU answers")))
        for gpu in snapshot.gpus:
            out += self._xids(gpu)
            out += gpu_levels(gpu, self._links_went_down(gpu))
        if self.dra_taints != "off" and snapshot.dra_taints:
            index = {g.info.uuid: g.info.index for g in snapshot.gpus}
            out += dra_observations(snapshot.dra_taints, index, classify=self.dra_taints == "classify")
        return out

    def _links_went_down(self, gpu: GpuSample) -> tuple[int, ...]:
        """The NVLink links down now that were up at some read since the agent started: a link never up
        (a PCIe card's missing bridge) is how the GPU is built, not a fault."""
        if gpu.health is not Health.OK:
            return ()
        down = frozenset(gpu.info.nvlink_links_down)
        uuid = gpu.info.uuid
        never_up = self._never_up[uuid] = self._never_up.get(uuid, down) & down
        return tuple(sorted(down - never_up))

    def _xids(self, gpu: GpuSample) -> list[Observation]:
        uuid = gpu.info.uuid
        before = self._xid_totals.get(uuid, {})
        totals = gpu.xid.totals
        self._xid_totals[uuid] = dict(totals)
        out = []
        for code, count in sorted(totals.items()):
            if count > before.get(code, 0):
                rule = table.rule_for_xid(code)
                message = rule.message.format(code=code)
                out.append(Observation(rule, gpu.info.index, uuid, message, occurrence=True))
        return out


def gpu_levels(gpu: GpuSample, links_down: tuple[int, ...] = ()) -> list[Observation]:
    """The level faults one GPU shows in this sample (``links_down``: the NVLink links that went down)."""
    index, uuid = gpu.info.index, gpu.info.uuid

    def seen(rule: Rule, **fill: str) -> Observation:
        return Observation(rule, index, uuid, rule.message.format(**fill) if fill else rule.message)

    detail = gpu.health_detail or gpu.health.value
    if gpu.health is Health.LOST:
        return [seen(table.GPU_LOST, detail=detail)]  # nothing else can be read from a lost GPU
    out = []
    if gpu.health is Health.UNRESPONSIVE:
        out.append(seen(table.GPU_UNRESPONSIVE, detail=detail))
    elif gpu.health is Health.ERROR:
        out.append(seen(table.GPU_READ_ERROR, detail=detail))
    elif gpu.stale:
        out.append(seen(table.GPU_STALE))
    ecc = gpu.ecc
    if ecc is not None:
        if ecc.dbe_volatile_total:
            out.append(seen(table.ECC_UNCORRECTABLE))
        if ecc.retired_pages_pending:
            out.append(seen(table.PAGE_RETIREMENT_PENDING))
    rows = gpu.remapped_rows
    if rows is not None:
        if rows.failed:
            out.append(seen(table.ROW_REMAP_FAILURE))
        elif rows.pending:
            out.append(seen(table.ROW_REMAP_PENDING))
    if links_down:
        out.append(seen(table.NVLINK_DOWN, links=", ".join(map(str, links_down))))
    reasons = gpu.clock_event_reasons
    if reasons:
        thermal = [name for bit, name in table.THERMAL_BITS.items() if reasons & bit]
        if thermal:
            out.append(seen(table.THERMAL_SLOWDOWN, reasons=", ".join(thermal)))
        if reasons & table.CLOCKS_EVENT_HW_POWER_BRAKE:
            out.append(seen(table.POWER_BRAKE))
    return out


def dra_observations(taints: Iterable[DraTaint], index: Mapping[str, int], *, classify: bool = False
                     ) -> list[Observation]:
    """The DRA drivers' NoSchedule and NoExecute device taints as one level fault per GPU and effect (the
    taints of its MIG devices with it); ``classify``: with the node condition the taint names, so that it
    counts for the Node like the agent's own faults. Informational taints ("None", unknown effects) are no
    fault."""
    grouped: dict[tuple[int, str, str], list[DraTaint]] = {}  # (GPU index, its rule, GPU) -> its taints
    for t in taints:
        rule = table.DRA_RULES.get(t.effect)
        if rule is not None and t.gpu_uuid in index:
            grouped.setdefault((index[t.gpu_uuid], rule.reason, t.gpu_uuid), []).append(t)
    out = []
    for (gpu_index, reason, uuid), found in sorted(grouped.items()):  # NoSchedule's reason sorts first
        rule = next(r for r in table.DRA_RULES.values() if r.reason == reason)
        if classify:
            conditions = {table.dra_condition(t.key, t.value) for t in found}
            rule = replace(rule, condition=min(conditions, key=table.CONDITIONS.index))
        described = "; ".join(sorted({_taint_text(t) for t in found}))
        out.append(Observation(rule, gpu_index, uuid, rule.message.format(taints=described)))
    return out


def _taint_text(t: DraTaint) -> str:
    taint = f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
    since = f" since {t.time_added}" if t.time_added else ""
    return f"{t.driver} device {t.device} {taint}{since}"
