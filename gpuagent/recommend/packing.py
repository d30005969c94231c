"""How many GPUs of each model the node pool needs for the recommended sizes: first-fit decreasing (pure).

Each workload brings one item per device it holds at once (replicas x GPUs each), into the bins of its GPU
model and kind of sharing, since a GPU is either whole, time-sliced, running MPS, or cut into MIG
instances:

- keep, needs more, too little history: what it holds now: its MIG instance (or the larger one needing
  more asks for) as a MIG item, a whole GPU each, or (a fraction of a GPU already) a time-sliced item of
  that size;
- share: (share, memory / GPU memory) in a time-sliced GPU of (1, 1);
- MPS: (active threads, memory / GPU memory) in an MPS GPU of (1, 1);
- MIG: (compute slices, memory slices, 1 instance) in a MIG GPU of the model's (7, 8, 7);
- release: nothing standing (it takes a GPU only while it works).

First-fit decreasing: items by their largest dimension, largest first, each into the first open bin where
every dimension still fits, else a new bin. It is within 11/9 of the optimum plus a bin or so for one
dimension, and a fair estimate for two; MIG placement rules are approximated by the slice counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuagent.migprofiles import mig_model
from gpuagent.recommend.model import Action, PoolPacking, Row

EPSILON = 1e-9


@dataclass(frozen=True)
class Item:
    sizes: tuple[float, ...]
    label: str = ""


def first_fit_decreasing(items: Iterable[Item], capacity: Sequence[float]) -> list[list[Item]]:
    """The bins ``items`` fill, each at most ``capacity`` in every dimension (an item larger than a bin in
    some dimension still gets a bin of its own)."""
    order = sorted(items, key=lambda i: (-max(s / c for s, c in zip(i.sizes, capacity, strict=True)),
                                         -sum(i.sizes), i.label))
    bins: list[list[Item]] = []
    loads: list[list[float]] = []
    for item in order:
        for load, content in zip(loads, bins, strict=True):
            if all(used + s <= c + EPSILON for used, s, c in zip(load, item.sizes, capacity, strict=True)):
                content.append(item)
                for d, s in enumerate(item.sizes):
                    load[d] += s
                break
        else:
            bins.append([item])
            loads.append(list(item.sizes))
    return bins


def _kept_mig(row: Row) -> tuple[int, int, int, int] | None:
    """(compute, memory, of compute, of memory) slices of the MIG instance a workload that keeps its size
    holds (the larger one, when it needs more), or None: it is not on MIG, or its model has no table."""
    stats, rec = row.stats, row.recommendation
    name = rec.mig_profile or stats.mig_profile
    table = mig_model(stats.gpu_model)
    profile = table.profile(name) if table is not None and name else None
    if profile is None or table is None or rec.action.resizes or rec.action is Action.RELEASE:
        return None
    return profile.slices, profile.memory_slices, table.slices, table.memory_slices


def pack(rows: Iterable[Row]) -> tuple[PoolPacking, ...]:
    """Per GPU model (most GPUs now first): GPUs held now and GPUs the recommended packing needs."""
    by_model: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.stats.devices:
            by_model[row.stats.gpu_model or "unknown"].append(row)
    out = []
    for model, model_rows in by_model.items():
        whole = 0
        shared: list[Item] = []
        mps: list[Item] = []
        mig: list[Item] = []
        mig_capacity: tuple[float, ...] = (7, 8, 7)
        released = 0
        for row in model_rows:
            stats, rec = row.stats, row.recommendation
            label = str(stats.key)
            memory = (stats.memory.max / stats.gpu_memory_bytes
                      if stats.memory is not None and stats.gpu_memory_bytes else 0.0)
            rec_memory = rec.memory_bytes / stats.gpu_memory_bytes if (
                rec.memory_bytes and stats.gpu_memory_bytes) else memory
            kept_mig = _kept_mig(row)
            for _ in range(stats.devices):
                if rec.action is Action.RELEASE:
                    released += 1
                elif rec.action is Action.SHARE and rec.share_ratio is not None:
                    shared.append(Item((rec.share_ratio, rec_memory), label))
                elif rec.action is Action.MPS and rec.mps_thread_percent is not None:
                    mps.append(Item((rec.mps_thread_percent / 100, rec_memory), label))
                elif rec.action is Action.MIG and rec.mig_slices is not None:
                    compute, memory_slices, of_compute, of_memory = rec.mig_slices
                    mig_capacity = (of_compute, of_memory, of_compute)
                    mig.append(Item((compute, memory_slices, 1), label))
                elif kept_mig is not None:  # a MIG instance it keeps (or a larger one): MIG, not time-sliced
                    compute, memory_slices, of_compute, of_memory = kept_mig
                    mig_capacity = (of_compute, of_memory, of_compute)
                    mig.append(Item((compute, memory_slices, 1), label))
                elif stats.device_size >= 1 - 1e-3:
                    whole += 1
                else:  # a fraction of a GPU already (a replica): it stays one, time-sliced
                    shared.append(Item((stats.device_size, memory), label))
        now = math.ceil(round(sum(r.stats.gpus_held for r in model_rows), 6))
        out.append(PoolPacking(model, now, whole=whole, shared=len(first_fit_decreasing(shared, (1, 1))),
                               mps=len(first_fit_decreasing(mps, (1, 1))),
                               mig=len(first_fit_decreasing(mig, mig_capacity)), released=released))
    return tuple(sorted(out, key=lambda p: (-p.gpus_now, p.gpu_model)))
