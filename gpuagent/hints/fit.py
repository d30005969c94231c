"""The fit arithmetic: whether a request fits one node's index, on which GPUs, and its score (0-100).

``fit_node`` compares the request's sizes with the numbers ``hints.nodeindex`` worked out once per hints
and writes no text: the reasons (``NodeFit.reasons``, ``first_gpu_reason``; the words: ``hints.fitreasons``)
are written when someone reads them, so the extender judges thousands of nodes per pod cheaply.

GPU choice and score follow the policy: ``binpack`` fills the busiest GPUs (and nodes) first, ``spread``
the idlest. The score (0-100, 0 only when it does not fit) is half how loaded the chosen GPUs are after the
placement and half how loaded the node is after it (binpack: higher when fuller; spread: higher when
emptier); a multi-GPU placement also earns up to 15 points for NVLink between the chosen GPUs. Every load
is in [0, 1] whatever the hints say (the index holds their figures in range), so the score is always one.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuagent.hints.fitreasons import (
    INSTANCE_MEMORY_SHORT,
    MEMORY_SHORT,
    NO_INSTANCE,
    NO_SHARE_LEFT,
    SHARE_SHORT,
    node_reason,
    size_reason,
)
from gpuagent.hints.fitrequest import FitRequest, kind_name
from gpuagent.hints.nodeindex import MIG_SLICES, NO_INDEX, GpuKind, GpuRow, NodeIndex, gpu_key
from gpuagent.snapshot.hints import GpuHints

EPSILON = 1e-9  # shares closer than this are equal: 0.3 asked of a GPU with 0.30000000000000004 left fits


# An option: a GPU that can take (part of) the request, as a plain tuple whose order is the policy's:
# (load key: -load_after for binpack, load_after for spread; GPU index; position in NodeHints.gpus;
#  load_after, the GPU's load (0-1) after one unit; SM share one unit takes; memory one unit takes;
#  units it can take). ``min``/``sorted`` on them choose in policy order, ties to the first GPU.
_Option = tuple[float, int, int, float, float, int, int]
_POS, _LOAD_AFTER, _SHARE_TAKEN, _MEMORY_TAKEN, _SLOTS = 2, 3, 4, 5, 6


def _load(share_left: float, memory_left: int, total: int | None) -> float:
    memory_part = memory_left / total if total else share_left
    return 1.0 - (max(0.0, min(1.0, share_left)) + max(0.0, min(1.0, memory_part))) / 2


def _cannot_fit_any(kind: GpuKind, request: FitRequest) -> bool:
    """Whether the request's sizes rule out every row of a shared or exclusive kind (checked in O(1)
    before the loop; the loop's own checks then say why, if anyone asks)."""
    memory = request.memory_bytes or 0
    if memory > kind.max_free:
        return True
    if request.exclusive:
        return False
    wanted = request.share
    return kind.max_share + EPSILON < wanted if wanted is not None else kind.max_share <= EPSILON


def _shared_options(
    index: NodeIndex, rows: tuple[GpuRow, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    wanted = request.share
    share = wanted or 0.0
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, share_ratio, free, total in rows:
        if wanted is not None:
            if share_ratio + EPSILON < wanted:
                failed.append((pos, SHARE_SHORT))
                continue
        elif share_ratio <= EPSILON:
            failed.append((pos, NO_SHARE_LEFT))
            continue
        if memory > free:
            failed.append((pos, MEMORY_SHORT))
            continue
        load_after = _load(share_ratio - share, free - memory, total)
        options.append((sign * load_after, gpu.index, pos, load_after, share, memory, 1))
    return options


def _exclusive_options(
    index: NodeIndex, rows: tuple[GpuRow, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, _share, free, _total in rows:
        if memory > free:
            failed.append((pos, MEMORY_SHORT))
            continue
        options.append((sign, gpu.index, pos, 1.0, 1.0, free, 1))
    return options


def _mig_options(
    index: NodeIndex, rows: tuple[GpuRow, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    profile = request.mig_profile
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, share_ratio, _free, _total in rows:
        hint = index.mig_profiles[pos].get(profile)  # type: ignore[arg-type]
        if hint is None or (hint.creatable_count == 0 and not hint.idle_instances):
            failed.append((pos, NO_INSTANCE))
            continue
        if hint.memory_bytes is not None and memory > hint.memory_bytes:
            failed.append((pos, INSTANCE_MEMORY_SHORT))
            continue
        share = hint.slice_count / MIG_SLICES
        load_after = 1.0 - max(0.0, share_ratio - share)
        options.append((sign * load_after, gpu.index, pos, load_after, share, hint.memory_bytes or 0,
                        len(hint.idle_instances) + hint.creatable_count))
    return options


_OPTIONS = {"shared": _shared_options, "exclusive": _exclusive_options, "mig": _mig_options}


def _node_load_after(index: NodeIndex, taken_share: float, taken_memory: int) -> float:
    healthy = index.healthy
    if not healthy:
        return 1.0
    share_left = max(0.0, index.share_gpus - taken_share) / healthy
    memory_left = max(0, index.memory_free - taken_memory)
    return _load(share_left, memory_left, index.memory_total)


def _nvlink_ratio(chosen: list[GpuHints]) -> float:
    distinct = {g.uuid: g for g in chosen}
    gpus = list(distinct.values())
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if not pairs:
        return 1.0
    return sum(1 for a, b in pairs if b.uuid in a.nvlink_peers or a.uuid in b.nvlink_peers) / len(pairs)


def _choose(index: NodeIndex, options: list[_Option], request: FitRequest) -> list[_Option]:
    """Units one by one in policy order; after the first GPU, NVLink peers (then its NUMA node) first."""
    if request.gpus == 1:  # the common case: the best one, no sort
        return [min(options)]
    ranked = sorted(options)
    if request.mig_profile is not None:
        chosen: list[_Option] = []
        for option in ranked:
            chosen.extend([option] * min(option[_SLOTS], request.gpus - len(chosen)))
            if len(chosen) == request.gpus:
                break
        return chosen
    gpus = index.gpus
    chosen = [ranked[0]]
    rest = [(gpus[o[_POS]], o) for o in ranked[1:]]
    while len(chosen) < request.gpus:
        peers = {p for o in chosen for p in gpus[o[_POS]].nvlink_peers}
        numa = {gpus[o[_POS]].numa_node for o in chosen}
        best = min(range(len(rest)), key=lambda i: (
            rest[i][0].uuid not in peers, rest[i][0].numa_node not in numa, i))
        chosen.append(rest.pop(best)[1])
    return chosen


class NodeFit(NamedTuple):
    """The outcome of ``fit_node``: whether and where the request fits, its score; reasons on demand."""

    fits: bool
    score: int  # 0-100; 0 when it does not fit
    chosen: tuple[_Option, ...]  # one per unit, in choice order; empty when it does not fit
    sized_out: tuple[tuple[int, int], ...] | None  # (position, why) of the rows the request's sizes rule
    # out; None: all of them (found in O(1), why not yet worked out)
    available: int  # units the node can take
    index: NodeIndex
    request: FitRequest
    nvlink_ratio: float | None = None  # between the chosen GPUs, for a multi-GPU placement

    def _kind(self) -> GpuKind:
        return getattr(self.index, kind_name(self.request))  # type: ignore[no-any-return]

    def _sized_out(self) -> dict[int, int]:
        if self.sized_out is not None:
            return dict(self.sized_out)
        failed: list[tuple[int, int]] = []
        _OPTIONS[kind_name(self.request)](self.index, self._kind().rows, self.request, failed)
        return dict(failed)

    @property
    def gpus(self) -> tuple[str, ...]:
        """UUIDs of the chosen GPUs (a GPU repeats when it takes several MIG instances)."""
        gpus = self.index.gpus
        return tuple(gpus[o[_POS]].uuid for o in self.chosen)

    @property
    def positions(self) -> tuple[int, ...]:
        """Where the chosen GPUs are in ``NodeHints.gpus``, one per unit."""
        return tuple(o[_POS] for o in self.chosen)

    def node_reason(self) -> str | None:
        """The node-level reason (``reasons["node"]``); None when the request fits."""
        if self.fits:
            return None
        return node_reason(self.request, self.available, len(self.index.rows))

    def _size_reason(self, pos: int, why: int) -> str:
        profile = self.request.mig_profile
        instance = self.index.mig_profiles[pos].get(profile) if profile is not None else None
        return size_reason(self.index.gpus[pos], why, self.request, instance)

    def reasons(self) -> dict[str, str]:
        """Why each GPU that cannot take the request cannot (by key), then the node's under "node"."""
        static = self._kind().static
        sized = self._sized_out()
        reasons: dict[str, str] = {}
        for row in self.index.rows:
            text = static[row.pos]
            if text is None and row.pos in sized:
                text = self._size_reason(row.pos, sized[row.pos])
            if text is not None:
                reasons[gpu_key(row.gpu)] = text
        node = self.node_reason()
        if node is not None:
            reasons["node"] = node
        return reasons

    def first_gpu_reason(self) -> tuple[int, str, str, int] | None:
        """The first GPU's reason in report order: (GPU index, or ``NO_INDEX`` when it has no UUID; key;
        reason; how many GPUs have one), without writing the others' reasons; None when no GPU has one."""
        index = self.index
        if not index.unique_keys:
            by_uuid = {g.uuid: g.index for g in index.gpus}
            reasons = self.reasons()
            reasons.pop("node", None)
            ranked = sorted((by_uuid.get(k, NO_INDEX), k, v) for k, v in reasons.items())
            return (*ranked[0], len(ranked)) if ranked else None
        kind = self._kind()
        sized_out = len(kind.rows) if self.sized_out is None else len(self.sized_out)
        count = kind.static_count + sized_out
        if not count:
            return None
        for rank, key, pos in index.rank:
            text = kind.static[pos]
            if text is None and sized_out:
                if self.sized_out is None:  # every row is ruled out: why, for this one only
                    failed: list[tuple[int, int]] = []
                    _OPTIONS[kind_name(self.request)](index, (index.rows[pos],), self.request, failed)
                    why = failed[0][1]
                else:
                    why = dict(self.sized_out).get(pos, -1)
                if why >= 0:
                    text = self._size_reason(pos, why)
            if text is not None:
                return rank, key, text, count
        raise AssertionError("a counted reason was not found")  # unreachable: count says there is one


def fit_node(index: NodeIndex, request: FitRequest) -> NodeFit:
    """Whether ``request`` fits the node, on which GPUs, and how well (0-100); no reason text is written
    (``NodeFit.reasons``) and no sharing mode recommended (``score.fit_result``): the extender's fast path."""
    name = kind_name(request)
    kind: GpuKind = getattr(index, name)
    if name != "mig" and _cannot_fit_any(kind, request):
        return NodeFit(False, 0, (), None, 0, index, request)
    failed: list[tuple[int, int]] = []
    options = _OPTIONS[name](index, kind.rows, request, failed)
    available = sum(o[_SLOTS] for o in options) if name == "mig" else len(options)
    if available < request.gpus:
        return NodeFit(False, 0, (), tuple(failed), available, index, request)
    chosen = _choose(index, options, request)
    if len(chosen) == 1:
        option = chosen[0]
        gpu_load = option[_LOAD_AFTER]
        node_load = _node_load_after(index, option[_SHARE_TAKEN], option[_MEMORY_TAKEN])
    else:
        gpu_load = sum(o[_LOAD_AFTER] for o in chosen) / len(chosen)
        taken_share = sum(o[_SHARE_TAKEN] for o in chosen)
        node_load = _node_load_after(index, taken_share, sum(o[_MEMORY_TAKEN] for o in chosen))
    base = (gpu_load + node_load) / 2 if request.policy == "binpack" else 1.0 - (gpu_load + node_load) / 2
    nvlink = None
    if request.gpus > 1 and request.mig_profile is None:
        nvlink = _nvlink_ratio([index.gpus[o[_POS]] for o in chosen])
        base = 0.85 * base + 0.15 * nvlink
    score = max(1, min(100, round(base * 100)))
    return NodeFit(True, score, tuple(chosen), tuple(failed), available, index, request, nvlink)

