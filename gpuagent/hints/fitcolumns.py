"""Whole-GPU requests judged over columns: every distinct state of a call at once, with numpy.

A never-seen pod's call judges each distinct state among its names once (``extender.Extender._judge``). At
thousands of distinct states the Python fit (``fit.fit_node``, 10-20 us a state) was most of the call:
the bench's 5,000 busy nodes are 3,065 states, its 20,000 are 9,151. Here each state's GPUs are rows of a
few numpy columns, written once when a call first meets the state (``StateColumns.slots``), and a request
for whole GPUs (shared or exclusive) is judged over the rows of the call's states with a dozen vectorised
operations, so a call costs what its distinct states cost and nothing of the rest of the fleet.

The arithmetic is ``fit.fit_node``'s, step for step in the same float64 operations: a row fits when its
kind may use the GPU (``NodeIndex.shared``/``exclusive``) and the request's share and memory fit it; of the
fitting rows the one first by (policy load key, GPU index, position) is chosen, as ``min`` over
``fit._Option`` tuples chooses; the GPU's and the node's loads after the placement give the score. So the
verdicts are equal, not close (``tests/test_fitcolumns.py`` holds them equal on random and hostile states,
both ways). For a state the request does not fit, ``judge`` says how many GPUs could take it and which GPU
the one-line reason names (the first in report order that has a reason, and why): the words are
``fitreasons``', written by the caller for that state only.

Left to ``fit_node``: MIG requests, the placement of a request for several GPUs on a node where it fits
(the NVLink and NUMA choice), and states the columns cannot hold exactly: a figure past 2**53 (float64
would round what Python's integers divide exactly) or two GPUs with one key (their reasons are ordered
otherwise). The columns hold a state's rows by its verdict key (the cluster view's states; the agents'
cache keys none) until they hold far more states than the source (``forget_if_over``), then start again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from operator import attrgetter
from typing import NamedTuple, Protocol

import numpy as np

from gpuagent.hints.fit import EPSILON
from gpuagent.hints.fitreasons import MEMORY_SHORT, NO_SHARE_LEFT, SHARE_SHORT
from gpuagent.hints.fitrequest import FitRequest
from gpuagent.hints.nodeindex import NO_INDEX, NodeIndex

EXACT = 2**53  # integers below this are exact in float64: their quotients round as Python's do
NOT_COLUMNAR = -1  # the slot of a state the columns cannot hold exactly
STATIC = -1  # the ``why`` of a GPU its kind cannot use (its reason is the kind's static text)
_BIG = np.iinfo(np.int64).max
_GROWTH = 2
FITS, PLACE, FAILS = 1, 0, -1  # fits one GPU (scored here); fits several (``fit_node`` places it); does not
_SLOT_BITS = 2**32 - 1  # a kept slot: the columns' generation above these bits, the slot + 1 in them
_KEPT = attrgetter("columns")
_GENERATIONS = itertools.count(1)


class KeepsSlot(Protocol):
    """A state that keeps its slot in the columns (``StateColumns.kept_slots``): -1 until it has one."""

    key: bytes
    index: NodeIndex
    columns: int


class Outcome(NamedTuple):
    """One state's outcome for a request."""

    fits: int  # FITS, PLACE or FAILS
    score: int  # 0-100 when it FITS, else 0
    available: int  # GPUs that can take the request
    first: int  # where the first GPU with a reason is in ``NodeIndex.rank``; -1 when none has one
    why: int  # that GPU's size reason (``fitreasons`` codes), or ``STATIC``
    gpus: int  # the state's GPUs
    label: int | str | None  # how the reason names that GPU: its index, else its key; None: no such GPU
    figure: object  # what its reason quotes: the kind's static text (``STATIC``), the share or free memory


class Judgement(NamedTuple):
    """The outcomes of ``StateColumns.judge``, a list per field, one item per state asked about."""

    fits: list[int]
    score: list[int]
    available: list[int]
    first: list[int]
    why: list[int]
    gpus: list[int]
    label: list[int | str | None]
    figure: list[object]

    def outcomes(self) -> list[Outcome]:
        return [Outcome(*state) for state in zip(*self, strict=True)]


def handles(request: FitRequest) -> bool:
    """Whether ``judge`` answers ``request``: whole GPUs, shared or exclusive (not MIG)."""
    return request.mig_profile is None


def _exact(index: NodeIndex) -> bool:
    if not index.unique_keys or not -EXACT < index.memory_free < EXACT:
        return False
    if index.memory_total is not None and not index.memory_total < EXACT:
        return False
    for gpu in index.gpus:
        total = gpu.memory_total_bytes
        if not (-EXACT < gpu.index < EXACT and gpu.memory_free_bytes < EXACT
                and (total is None or total < EXACT)):
            return False
    return True


class StateColumns:
    """The rows of every state judged so far, by verdict key (the cluster view's states: the agents' cache
    keys none, and its nodes are judged one by one)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        # every slot a state keeps (``kept_slots``) is stale from here; unique across all columns, so two
        # extenders over one view never read each other's slots (they would only rewrite them in turn)
        self._generation = next(_GENERATIONS)
        self._slot: dict[bytes, int] = {}
        self._states = 0
        self._rows = 0
        # per state: its first row, its GPUs, then the node's figures ``fit._node_load_after`` reads
        self._start = np.zeros(64, np.int64)
        self._count = np.zeros(64, np.int64)
        self._healthy = np.zeros(64, np.int64)
        self._share_gpus = np.zeros(64, np.float64)
        self._memory_free = np.zeros(64, np.int64)
        self._memory_total = np.zeros(64, np.int64)  # 0: none (``_load`` reads the share instead)
        # per row, a state's GPUs in report order (``NodeIndex.rank``)
        self._gpu = np.zeros(256, np.int64)  # GpuHints.index: the choice's tie-break
        self._pos = np.zeros(256, np.int64)  # the place in NodeHints.gpus: the last tie-break
        self._share = np.zeros(256, np.float64)
        self._free = np.zeros(256, np.int64)
        self._total = np.zeros(256, np.int64)
        self._shared = np.zeros(256, np.bool_)  # a shared request may use it (no static reason)
        self._exclusive = np.zeros(256, np.bool_)
        # what a reason says of a row: how it names the GPU, and each kind's static reason (None: none)
        self._label = np.full(256, None, object)
        self._shared_static = np.full(256, None, object)
        self._exclusive_static = np.full(256, None, object)

    def __len__(self) -> int:
        return len(self._slot)

    def forget_if_over(self, live_states: int) -> None:
        """Start again when the columns hold more than twice ``live_states`` (and 4,096) states: states
        the source has replaced are never asked for again, and are only found by starting over (the rows
        are rewritten as calls meet their states again)."""
        if self._states > 2 * live_states + 4096:
            self.clear()

    def slots(self, states: Iterable[tuple[bytes, NodeIndex]]) -> list[int]:
        """Each state's slot, by its verdict key (``hints.verdict_key``: equal keys, equal rows), written
        first if new; ``NOT_COLUMNAR`` for one the columns cannot hold exactly."""
        slot_of = self._slot
        out = []
        new: list[NodeIndex] = []
        for key, index in states:
            slot = slot_of.get(key)
            if slot is None:
                if _exact(index):
                    slot = self._states + len(new)
                    new.append(index)
                else:
                    slot = NOT_COLUMNAR
                slot_of[key] = slot
            out.append(slot)
        if new:
            self._write(new)
        return out

    def kept_slots(self, states: list[KeepsSlot]) -> list[int]:
        """``slots`` of states that keep their own (the cluster view's ``SharedState``, its ``columns``):
        read in one C-speed pass over the states, where a lookup by verdict key touches each state's key,
        a few kilobytes of bytes apart from the state (at 9,151 states: 5.5 ms against about 2); a slot of
        another generation of the columns (``clear``), or none yet, is looked up by key and kept."""
        generation = self._generation
        kept = np.array(list(map(_KEPT, states)), np.int64)
        slots = (kept & _SLOT_BITS) - 1
        stale = np.flatnonzero(kept >> 32 != generation).tolist()
        if stale:
            found = self.slots((states[i].key, states[i].index) for i in stale)
            slots[stale] = found
            for i, slot in zip(stale, found, strict=True):
                states[i].columns = (generation << 32) + slot + 1
        return slots.tolist()

    def _write(self, new: list[NodeIndex]) -> None:
        states, rows = self._states, self._rows
        gpus = sum(len(index.gpus) for index in new)
        self._grow_states(states + len(new))
        self._grow_rows(rows + gpus)
        counts = [len(index.gpus) for index in new]
        end = states + len(new)
        self._count[states:end] = counts
        self._start[states:end] = rows + np.cumsum(counts) - counts
        self._healthy[states:end] = [index.healthy for index in new]
        self._share_gpus[states:end] = [index.share_gpus for index in new]
        self._memory_free[states:end] = [index.memory_free for index in new]
        self._memory_total[states:end] = [index.memory_total or 0 for index in new]
        order = [(index, pos) for index in new for _rank, _key, pos in index.rank]
        last = rows + gpus
        self._gpu[rows:last] = [index.gpus[pos].index for index, pos in order]
        self._pos[rows:last] = [pos for _index, pos in order]
        self._share[rows:last] = [index.gpus[pos].schedulable_share_ratio for index, pos in order]
        self._free[rows:last] = [index.gpus[pos].memory_free_bytes for index, pos in order]
        self._total[rows:last] = [index.gpus[pos].memory_total_bytes or 0 for index, pos in order]
        shared = [index.shared.static[pos] for index, pos in order]
        exclusive = [index.exclusive.static[pos] for index, pos in order]
        self._shared[rows:last] = [text is None for text in shared]
        self._exclusive[rows:last] = [text is None for text in exclusive]
        self._shared_static[rows:last] = shared
        self._exclusive_static[rows:last] = exclusive
        self._label[rows:last] = [rank if rank != NO_INDEX else key
                                  for index in new for rank, key, _pos in index.rank]
        self._states, self._rows = end, last

    def _grow_states(self, need: int) -> None:
        if need <= len(self._start):
            return
        size = max(need, _GROWTH * len(self._start))
        for name in ("_start", "_count", "_healthy", "_share_gpus", "_memory_free", "_memory_total"):
            setattr(self, name, _grown(getattr(self, name), size))

    def _grow_rows(self, need: int) -> None:
        if need <= len(self._gpu):
            return
        size = max(need, _GROWTH * len(self._gpu))
        for name in ("_gpu", "_pos", "_share", "_free", "_total", "_shared", "_exclusive", "_label",
                     "_shared_static", "_exclusive_static"):
            setattr(self, name, _grown(getattr(self, name), size))

    def judge(self, slots: list[int], request: FitRequest) -> Judgement:
        """The outcome of ``request`` (``handles`` it) on each state of ``slots`` (columnar)."""
        n = len(slots)
        if not n:
            return Judgement([], [], [], [], [], [], [], [])
        states = np.array(slots, np.int64)
        count = self._count[states]
        total = int(count.sum())
        offset = np.cumsum(count) - count  # each state's first row among the call's rows
        rows = np.repeat(self._start[states] - offset, count) + np.arange(total)
        seg = np.repeat(np.arange(n), count)
        share, free, gpu_total = self._share[rows], self._free[rows], self._total[rows]
        memory = request.memory_bytes or 0
        sign = -1.0 if request.policy == "binpack" else 1.0
        mem_ok = free >= memory
        if request.exclusive:
            usable = self._exclusive[rows]
            ok = usable & mem_ok
            why = np.full(total, MEMORY_SHORT, np.int64)
            key = np.full(total, sign)
            load_after = np.ones(total)
            taken_share = 1.0
        else:
            usable = self._shared[rows]
            wanted = request.share
            if wanted is not None:
                share_ok, short = ~(share + EPSILON < wanted), SHARE_SHORT
            else:
                share_ok, short = ~(share <= EPSILON), NO_SHARE_LEFT
            ok = usable & share_ok & mem_ok
            why = np.where(share_ok, MEMORY_SHORT, short)
            taken_share = wanted or 0.0
            load_after = _load(share - taken_share, free - memory, gpu_total)
            key = sign * load_after
        why = np.where(usable, why, STATIC)

        has_rows = count > 0
        starts = offset[has_rows]
        available = np.zeros(n, np.int64)
        first = np.full(n, _BIG, np.int64)
        chosen = np.full(n, -1, np.int64)
        if total:
            index = np.arange(total)
            available[has_rows] = np.add.reduceat(ok.astype(np.int64), starts)
            first[has_rows] = np.minimum.reduceat(np.where(ok, _BIG, index), starts)
            # ``min`` over the options: load key, then GPU index, then position
            candidate = ok.copy()
            for column in (key, self._gpu[rows], self._pos[rows]):
                masked = np.where(candidate, column, np.inf if column.dtype == np.float64 else _BIG)
                best = np.zeros(n, masked.dtype)
                best[has_rows] = np.minimum.reduceat(masked, starts)
                candidate &= masked == best[seg]
            chosen[has_rows] = np.minimum.reduceat(np.where(candidate, index, _BIG), starts)
        fits = available >= request.gpus
        first_why = np.full(n, STATIC, np.int64)
        reasoned = first != _BIG
        first = np.where(reasoned, first, -1)
        first_why[reasoned] = why[first[reasoned]]
        label, figure = self._reason_figures(rows, first, reasoned & ~fits, first_why, request)
        first = np.where(reasoned, first - offset, -1)  # its place in the state's report order

        score = np.zeros(n, np.int64)
        placed = fits & (request.gpus == 1)
        if placed.any():
            row = chosen[placed]
            gpu_load = load_after[row]
            taken_memory = free[row] if request.exclusive else memory
            score[placed] = _score(gpu_load, self._node_load(states[placed], taken_share, taken_memory),
                                   request.policy)
        return Judgement(np.where(placed, FITS, np.where(fits, PLACE, FAILS)).tolist(), score.tolist(),
                         available.tolist(), first.tolist(), first_why.tolist(), count.tolist(),
                         label.tolist(), figure.tolist())

    def _reason_figures(self, rows: np.ndarray, first: np.ndarray, failing: np.ndarray, why: np.ndarray,
                        request: FitRequest) -> tuple[np.ndarray, np.ndarray]:
        """For each state the request does not fit, what its reason reads of its first GPU with one
        (``first``: that GPU among the call's rows): the GPU's label, and the kind's static text
        (``STATIC``), its share (``SHARE_SHORT``) or its free memory (``MEMORY_SHORT``); None elsewhere."""
        n = len(first)
        label, figure = np.full(n, None, object), np.full(n, None, object)
        if failing.any():
            row = rows[first[failing]]
            label[failing] = self._label[row]
            static = self._exclusive_static if request.exclusive else self._shared_static
            code = why[failing]
            read = np.full(len(row), None, object)
            for wanted, column in ((STATIC, static), (SHARE_SHORT, self._share), (MEMORY_SHORT, self._free)):
                where = code == wanted
                if where.any():
                    read[where] = column[row[where]].astype(object)
            figure[failing] = read
        return label, figure

    def _node_load(self, states: np.ndarray, taken_share: float, taken_memory: np.ndarray | int
                   ) -> np.ndarray:
        """``fit._node_load_after`` of each state."""
        healthy = self._healthy[states]
        share_left = np.maximum(0.0, self._share_gpus[states] - taken_share) / np.where(healthy, healthy, 1)
        memory_left = np.maximum(0, self._memory_free[states] - taken_memory)
        load = _load(share_left, memory_left, self._memory_total[states])
        return np.where(healthy == 0, 1.0, load)


def _load(share_left: np.ndarray, memory_left: np.ndarray, total: np.ndarray) -> np.ndarray:
    """``fit._load`` over columns: the memory part is the share's where there is no total."""
    memory_part = np.where(total != 0, memory_left / np.where(total != 0, total, 1), share_left)
    return 1.0 - (np.clip(share_left, 0.0, 1.0) + np.clip(memory_part, 0.0, 1.0)) / 2


def _score(gpu_load: np.ndarray, node_load: np.ndarray, policy: str) -> np.ndarray:
    """``fit_node``'s score of a one-GPU placement: 1-100, rounded half to even as ``round`` does."""
    both = (gpu_load + node_load) / 2
    base = both if policy == "binpack" else 1.0 - both
    return np.clip(np.rint(base * 100), 1, 100).astype(np.int64)


def _grown(array: np.ndarray, size: int) -> np.ndarray:
    grown = np.full(size, None, object) if array.dtype == object else np.zeros(size, array.dtype)
    grown[: len(array)] = array
    return grown
