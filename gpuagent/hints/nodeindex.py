"""What judging reads of one node's hints, worked out once per hints: ``node_index``.

Scoring runs for every candidate node of every pod (``hints.fit``), so what does not depend on the request
is worked out when the hints arrive (the agent cache and the cluster view keep the index beside them):
which GPUs each kind of request (shared, exclusive, MIG) can use at all and, for the others, the reason
(``hints.fitreasons``); each GPU's figures as plain numbers; its free MIG profiles; the order reports list
GPUs in; the node's totals.

Every figure is read into its range here, once: hints come from an agent, or from an object anyone who may
write GPUNodeStates wrote, and the decoders' refusals are not relied on. A ratio is in [0, 1] (NaN: 0),
bytes in [0, ``MEMORY_MAX_BYTES``], a MIG profile's slices in [0, ``MIG_SLICES``], a count at least 0, so
the fit's arithmetic is total (``schedulable_share_ratio: 1e308`` is a whole GPU, never an
``OverflowError``). An agent's own figures are in range and are kept as the same objects (no copy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

from gpuagent.hints.fitreasons import exclusive_static, mig_static, shared_static
from gpuagent.quantities import MEMORY_MAX_BYTES
from gpuagent.snapshot.hints import GpuHints, MigProfileHint, NodeHints

MIG_SLICES = 7  # compute slices of an A100/H100-class GPU, for the load a new instance adds


# --- figures in range ---------------------------------------------------------------------------------------


_N = TypeVar("_N", int, float)


def _within(value: _N, high: _N) -> _N:
    """``value`` itself when in [0, ``high``], else the bound it is past; NaN (which compares false) is 0."""
    if 0 <= value <= high:
        return value
    return high if value > 0 else type(high)(0)


def _ratio(value: float) -> float:
    return _within(value, 1.0)


def _optional_ratio(value: float | None) -> float | None:
    return None if value is None else _within(value, 1.0)


def _bytes(value: int) -> int:
    """No request asks for more than ``MEMORY_MAX_BYTES``, and any sum or ratio of such is a finite float."""
    return _within(value, MEMORY_MAX_BYTES)


def _optional_bytes(value: int | None) -> int | None:
    return None if value is None else _within(value, MEMORY_MAX_BYTES)


def _profile_in_range(hint: MigProfileHint) -> MigProfileHint:
    if 0 <= hint.slice_count <= MIG_SLICES and hint.creatable_count >= 0 and (
            hint.memory_bytes is None or 0 <= hint.memory_bytes <= MEMORY_MAX_BYTES):
        return hint
    return replace(hint, slice_count=_within(hint.slice_count, MIG_SLICES),
                   memory_bytes=_optional_bytes(hint.memory_bytes),
                   creatable_count=max(hint.creatable_count, 0))


def _gpu_in_range(gpu: GpuHints) -> GpuHints:
    """``gpu`` with the figures scoring reads in range: itself when they are (one test per figure)."""
    total, now, long = gpu.memory_total_bytes, gpu.sm_util_ratio, gpu.sm_util_long_ratio
    if (0.0 <= gpu.schedulable_share_ratio <= 1.0 and 0 <= gpu.memory_free_bytes <= MEMORY_MAX_BYTES
            and (total is None or 0 <= total <= MEMORY_MAX_BYTES) and (now is None or 0.0 <= now <= 1.0)
            and (long is None or 0.0 <= long <= 1.0)):
        profiles = gpu.free_mig_profiles
        if not profiles:
            return gpu
        in_range = tuple(_profile_in_range(p) for p in profiles)
        if all(p is q for p, q in zip(in_range, profiles, strict=True)):
            return gpu
    return replace(gpu, schedulable_share_ratio=_ratio(gpu.schedulable_share_ratio),
                   memory_free_bytes=_bytes(gpu.memory_free_bytes), memory_total_bytes=_optional_bytes(total),
                   sm_util_ratio=_optional_ratio(now), sm_util_long_ratio=_optional_ratio(long),
                   free_mig_profiles=tuple(_profile_in_range(p) for p in gpu.free_mig_profiles))


# --- the index ------------------------------------------------------------------------------------------


def gpu_key(gpu: GpuHints) -> str:
    """How reasons name a GPU: its UUID, or "GPU <index>" when it was lost before its UUID was read."""
    return gpu.uuid or f"GPU {gpu.index}"


NO_INDEX = 1 << 30  # where reports rank a GPU known by no UUID (after every indexed one)


class GpuRow(NamedTuple):
    """One GPU as the fitting loops read it."""

    pos: int  # its place in ``NodeHints.gpus``
    gpu: GpuHints
    share: float  # schedulable_share_ratio
    free: int  # memory_free_bytes
    total: int | None  # memory_total_bytes


@dataclass(frozen=True, slots=True, eq=False)
class GpuKind:
    """The GPUs one kind of request (shared, exclusive, MIG) can be sized against, and why not the rest."""

    rows: tuple[GpuRow, ...]
    static: tuple[str | None, ...]  # by position in NodeHints.gpus: the reason, None for the rows
    static_count: int
    max_share: float  # over the rows (-1 without rows): a request above either fits none of them
    max_free: int


def _kind(
    gpus: tuple[GpuHints, ...], rows: tuple[GpuRow, ...], check: Callable[[GpuHints], str | None]
) -> GpuKind:
    static = tuple(check(gpu) for gpu in gpus)
    usable = tuple(r for r in rows if static[r.pos] is None)
    return GpuKind(usable, static, sum(1 for s in static if s is not None),
                 max((r.share for r in usable), default=-1.0), max((r.free for r in usable), default=-1))


@dataclass(frozen=True, slots=True, eq=False)
class NodeIndex:
    """What scoring needs of one node's hints, worked out once (``node_index``; the module docstring)."""

    hints: NodeHints  # as given: callers check an index is of their hints by identity
    gpus: tuple[GpuHints, ...]  # ``hints.gpus`` with their figures in range: what scoring reads
    rows: tuple[GpuRow, ...]
    shared: GpuKind
    exclusive: GpuKind
    mig: GpuKind
    mig_profiles: tuple[Mapping[str, MigProfileHint], ...]  # by position: profile -> its first hint
    rank: tuple[tuple[int, str, int], ...]  # (report rank, key, position) of every GPU, in report order
    unique_keys: bool  # no two GPUs share a key (else reports fall back to the reasons mapping)
    healthy: int
    share_gpus: float
    memory_free: int
    memory_total: int | None


def _build_index(hints: NodeHints) -> NodeIndex:
    gpus = tuple(_gpu_in_range(g) for g in hints.gpus)
    rows = tuple(GpuRow(pos, g, g.schedulable_share_ratio, g.memory_free_bytes, g.memory_total_bytes)
                 for pos, g in enumerate(gpus))
    keys = [gpu_key(g) for g in gpus]
    profiles: list[Mapping[str, MigProfileHint]] = []
    for gpu in gpus:
        first: dict[str, MigProfileHint] = {}
        for hint in gpu.free_mig_profiles:
            first.setdefault(hint.profile, hint)
        profiles.append(first)
    # Reports name the first GPU by index: its UUID's index, GPUs without a UUID after all the others.
    by_uuid = {g.uuid: g.index for g in gpus}
    rank = tuple(sorted((by_uuid.get(key, NO_INDEX), key, pos) for pos, key in enumerate(keys)))
    return NodeIndex(
        hints=hints,
        gpus=gpus,
        rows=rows,
        shared=_kind(gpus, rows, shared_static),
        exclusive=_kind(gpus, rows, exclusive_static),
        mig=_kind(gpus, rows, mig_static),
        mig_profiles=tuple(profiles),
        rank=rank,
        unique_keys=len(set(keys)) == len(keys),
        healthy=_within(hints.healthy_gpu_count, len(gpus)),
        share_gpus=_within(hints.schedulable_share_gpus, float(len(gpus))),
        memory_free=_bytes(hints.memory_free_bytes),
        memory_total=_bytes(hints.memory_total_bytes) or None,
    )


_last_index: NodeIndex | None = None


def node_index(hints: NodeHints) -> NodeIndex:
    """The index of ``hints`` (the last one is kept: an agent scores requests on the same hints)."""
    global _last_index
    last = _last_index
    if last is not None and last.hints is hints:
        return last
    index = _last_index = _build_index(hints)
    return index

