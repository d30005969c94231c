"""Turns one snapshot into the faults it shows, by the table in :mod:`gpuagent.health.table`.

Two kinds of signal: *levels*, present as long as the GPU shows them (pending remaps, a link down, a
slowdown, the GPU lost), and *occurrences* (XIDs: an XID is an event, counted; a new one is one whose count
rose since the last poll, so a storm of thousands is one occurrence per poll). The classifier keeps only the
last counts; what stays, for how long, and what a reset clears is :mod:`gpuagent.health.tracker`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuagent.health import table
from gpuagent.health.table import Rule
from gpuagent.snapshot import GpuSample, Health, NodeSnapshot

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

    def __init__(self) -> None:
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
