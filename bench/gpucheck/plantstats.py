"""The plant experiment's arithmetic: from raw traces to the table that decides the share design.

Inputs are what the plant item records (``items/plant.py``), all in CLOCK_MONOTONIC seconds: each tenant's
iteration completion times (on a GPU, when the GPU finished each one), every freeze and thaw the item
wrote, each cell's measured window, and NVML's per-process and device samples with their timestamps turned
into the same clock (``nvmltrace.clock_offset``). Pure functions, no I/O: the unit tests feed them recorded
and hand-made traces.

- truth: iterations completed in the window, per tenant; the split is each one's part of the total, and the
  throughput kept is the total rate against the mean of the tenants' solo rates;
- NVML's split: each tenant's summed ``smUtil`` over the per-process samples stamped inside the window;
- the error: the largest distance, in points, of the truth split from the cell's target;
- drain: after each freeze of a tenant, how long its work went on completing on the device (its last
  completion before it was thawed again, less the freeze's time), and, from the device's utilization
  samples, the busy time after a freeze of a tenant running alone;
- queue: a deep tenant's completion less enqueue time of each replay, the work queued in front of it.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NEEDS_GPU = "needs GPU"


@dataclass
class Cell:
    """One configuration run open loop: its windows and what the item wrote to the freezer."""

    name: str
    kind: str
    scheme: str  # solo | free | fraction | rotation | drain
    tenants: list[str]
    window: tuple[float, float]  # measured, monotonic seconds
    target: list[float] | None = None  # the split expected (shares; a model's prediction for fractions)
    events: list[tuple[float, int, str]] = field(default_factory=list)  # (time, tenant index, freeze|thaw)
    params: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "scheme": self.scheme, "tenants": self.tenants,
                "window": list(self.window), "target": self.target, "events": self.events,
                "params": self.params}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        return cls(data["name"], data["kind"], data["scheme"], list(data["tenants"]), tuple(data["window"]),
                   data.get("target"), [tuple(e) for e in data.get("events", ())], data.get("params", {}))


def done_between(times: Sequence[float], t0: float, t1: float) -> int:
    """Iterations completed in (t0, t1]; ``times`` sorted."""
    return bisect.bisect_right(times, t1) - bisect.bisect_right(times, t0)


def truth(cell: Cell, times: dict[str, Sequence[float]]) -> dict[str, Any]:
    """Per tenant: iterations and rate in the window, and the split."""
    t0, t1 = cell.window
    counts = [done_between(times[name], t0, t1) for name in cell.tenants]
    total = sum(counts)
    seconds = t1 - t0
    return {"counts": counts, "rates": [c / seconds if seconds > 0 else 0.0 for c in counts],
            "split": [c / total for c in counts] if total else None, "seconds": seconds}


def nvml_split(cell: Cell, samples: Sequence[Sequence[float]], offset: float, pids: Sequence[int]
               ) -> dict[str, Any] | None:
    """Each tenant's part of the ``smUtil`` NVML gave in the window (``samples``: pid, timeStamp µs, smUtil,
    ...), ``other``: the part of processes not the cell's; None without a sample in the window."""
    t0, t1 = cell.window
    sums = dict.fromkeys(pids, 0.0)
    other = 0.0
    n = 0
    for pid, stamp, sm, *_ in samples:
        t = stamp / 1e6 - offset
        if not t0 < t <= t1:
            continue
        n += 1
        if pid in sums:
            sums[pid] += sm
        else:
            other += sm
    total = sum(sums.values()) + other
    if not n or not total:
        return None
    return {"split": [sums[p] / total for p in pids], "other": other / total, "samples": n}


def max_error(split: Sequence[float] | None, target: Sequence[float] | None) -> float | None:
    if split is None or target is None:
        return None
    return max(abs(s - x) for s, x in zip(split, target, strict=True))


def freezes(cell: Cell, index: int) -> list[tuple[float, float]]:
    """(freeze, next thaw or the cell's end) of tenant ``index``, in order."""
    out: list[tuple[float, float]] = []
    frozen_at: float | None = None
    for t, who, what in sorted(cell.events):
        if who != index:
            continue
        if what == "freeze" and frozen_at is None:
            frozen_at = t
        elif what == "thaw" and frozen_at is not None:
            out.append((frozen_at, t))
            frozen_at = None
    if frozen_at is not None:
        out.append((frozen_at, cell.window[1]))
    return out


def drains(cell: Cell, index: int, times: Sequence[float]) -> list[float]:
    """Per freeze of tenant ``index`` inside the window: seconds its work went on completing after it."""
    t0, t1 = cell.window
    out = []
    for frozen, thawed in freezes(cell, index):
        if not t0 <= frozen < t1:
            continue
        last = bisect.bisect_left(times, thawed) - 1  # the last completion before the thaw
        out.append(max(0.0, times[last] - frozen) if last >= 0 and times[last] > frozen else 0.0)
    return out


def device_drains(cell: Cell, index: int, samples: Sequence[Sequence[float]], offset: float) -> list[float]:
    """Per freeze of tenant ``index`` (running alone before it): the device's busy seconds between the
    freeze and the thaw, from its utilization samples (each the busy % of the time since the one before).
    The sample across the freeze is taken as fully busy up to the freeze, the rest of its busy time after."""
    stamped = sorted((s[0] / 1e6 - offset, float(s[1])) for s in samples)
    out = []
    for frozen, thawed in freezes(cell, index):
        if not cell.window[0] <= frozen < cell.window[1]:
            continue
        busy, seen = 0.0, False
        for (before, _), (t, util) in itertools.pairwise(stamped):
            if t <= frozen or before >= thawed:
                continue
            seen = True
            span = t - before
            busy_here = util / 100.0 * span
            if before < frozen:  # straddles the freeze: busy up to it, the rest after
                busy_here = max(0.0, busy_here - (frozen - before))
            if t > thawed:  # straddles the thaw: only the part before it
                busy_here = min(busy_here, thawed - max(before, frozen))
            busy += busy_here
        if seen:
            out.append(busy)
    return out


def sample_interval(samples: Sequence[Sequence[float]]) -> float | None:
    """The median gap between distinct per-process sample timestamps, seconds."""
    stamps = sorted({s[1] for s in samples})
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    return statistics.median(gaps) if gaps else None


def queue_depths(times: Sequence[float], enqueued: Sequence[float], window: tuple[float, float]
                 ) -> list[float]:
    """Completion less enqueue time of each replay enqueued in ``window``: the work queued in front of it."""
    t0, t1 = window
    return [d - e for d, e in zip(times, enqueued, strict=False) if t0 <= e < t1]


def summary(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"median": statistics.median(ordered), "p90": p90, "max": ordered[-1], "n": len(ordered)}


# -- the table ---------------------------------------------------------------------------------------------


def row(cell: Cell, times: dict[str, Sequence[float]], solo: float | None,
        nvml: dict[str, Any] | None) -> dict[str, Any]:
    """One line of the table; ``nvml``: {"process": samples, "device": samples, "offset": s, "pids": [...]},
    None without a GPU."""
    got = truth(cell, times)
    out: dict[str, Any] = {"cell": cell.name, "kind": cell.kind, "scheme": cell.scheme,
                           "target": cell.target, "truth": got["split"], "rates": got["rates"],
                           "counts": got["counts"], "seconds": got["seconds"],
                           "late_ms": cell.params.get("late_ms_median_max")}
    total_rate = sum(got["rates"])
    out["throughput_vs_solo"] = total_rate / solo if solo else None
    out["error"] = max_error(got["split"], cell.target)
    if nvml is None:
        out["nvml"] = NEEDS_GPU
    else:
        split = nvml_split(cell, nvml["process"], nvml["offset"], nvml["pids"])
        out["nvml"] = split["split"] if split else None
        out["nvml_other"] = split["other"] if split else None
        out["nvml_error"] = max_error(split["split"] if split else None, got["split"])
    drained = [d for i, name in enumerate(cell.tenants) for d in drains(cell, i, times[name])]
    out["drain"] = summary(drained)
    if cell.scheme == "drain":
        out["device_drain"] = (NEEDS_GPU if nvml is None else
                               summary(device_drains(cell, 0, nvml["device"], nvml["offset"])))
    return out


def _split(values: Any) -> str:
    if values is None:
        return "-"
    if isinstance(values, str):
        return values
    return "/".join(f"{v:.3f}" for v in values)


def _ms(stats: Any) -> str:
    if stats is None:
        return "-"
    if isinstance(stats, str):
        return stats
    return f"{stats['median'] * 1e3:.1f} / {stats['max'] * 1e3:.1f} (n={stats['n']})"


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table: per cell, the truth split, NVML's split, the target, the error, throughput
    against solo, the drain after a freeze, and how late the freezer's slots began (its own jitter)."""
    lines = ["| kind | cell | truth split | NVML split | target | error (pts) | throughput vs solo | "
             "drain after freeze, ms median / max | freezer late, ms median / max |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['kind']} | {r['cell']} | {r['skipped']} | | | | | | |")
            continue
        truth_text = _split(r["truth"])
        if r["scheme"] == "solo":
            truth_text = f"alone: {max(r['rates']):.1f} it/s"
        error = "-" if r["error"] is None else f"{r['error'] * 100:.1f}"
        kept = "-" if r["throughput_vs_solo"] is None else f"{r['throughput_vs_solo']:.3f}"
        drain = _ms(r["drain"])
        if "device_drain" in r:
            drain += f"; device busy after: {_ms(r['device_drain'])}"
        late = "-" if not r.get("late_ms") else "{:.1f} / {:.1f}".format(*r["late_ms"])
        lines.append(f"| {r['kind']} | {r['cell']} | {truth_text} | {_split(r['nvml'])} | "
                     f"{_split(r['target'])} | {error} | {kept} | {drain} | {late} |")
    return lines
