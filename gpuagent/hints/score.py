"""Fit and score of a GPU request on one node's hints: ``POST /v1/hints/score`` and the extender share it.

Pure and fast: no I/O, no clock of its own (``now`` is passed in), only ``NodeHints`` in, so the extender
can score thousands of cached nodes per pod with exactly what an agent would answer.

A request (``FitRequest``) asks for ``gpus`` GPUs, each with:

- ``exclusive``: the whole GPU, no other tenant (not MIG-enabled);
- ``mig_profile``: one MIG instance of that profile (an idle one, or room to create one); ``gpus`` counts
  instances;
- otherwise a shared GPU (time-sliced or MPS): ``share`` of its SM time (0-1) must be schedulable, and any
  schedulable time at all when no share is given.

``memory`` (bytes) must be free on each GPU (or fit in the instance's memory for MIG). Every GPU that cannot
take the request gets a reason; a node-level reason is under the key ``"node"``.

Judging is total: hints come from an agent or from an object anyone who may write GPUNodeStates wrote, so
every figure the fit reads is taken into its range once, when the node is indexed (a ratio in [0, 1], bytes
in [0, ``MEMORY_MAX_BYTES``]: ``1e308`` schedules as a whole GPU, never as an ``OverflowError``), and
``score_node`` answers any exception as that node's reason (``unjudgeable``), never as the caller's error.

GPU choice and score follow the policy: ``binpack`` fills the busiest GPUs (and nodes) first, ``spread``
the idlest. The score (0-100, 0 only when it does not fit) is half how loaded the chosen GPUs are after the
placement and half how loaded the node is after it (binpack: higher when fuller; spread: higher when
emptier); a multi-GPU placement also earns up to 15 points for NVLink between the chosen GPUs.

The recommended sharing mode follows the adaptive-sharing idea of KubeGPU (Yeh et al.): a request that
needs most of a GPU (a whole GPU, or half or more of its time or memory) gets a GPU of its own; a small one
is time-sliced onto a lightly loaded GPU when there is one (co-location costs little there), else isolated
in the smallest MIG instance that holds it, else given a free GPU.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from gpuagent.quantities import MEMORY_MAX_BYTES, PolicyValueError, parse_memory, parse_share
from gpuagent.snapshot import GpuHints, MigProfileHint, NodeHints

log = logging.getLogger(__name__)

POLICIES = ("binpack", "spread")
MODES = ("exclusive", "mig", "time_sliced")
MAX_GPUS = 64
MIG_SLICES = 7  # compute slices of an A100/H100-class GPU, for the load a new instance adds
LIGHT_LOAD_RATIO = 0.7  # a GPU's long-average SM use plus the request's share below this co-locates well
NOMINAL_SHARE = 0.1  # the share a request without one is counted as when judging co-location
BIG_REQUEST_RATIO = 0.5  # a share, or part of a GPU's memory, from which a request gets a GPU of its own
FIELDS = ("gpus", "memory", "share", "mig_profile", "exclusive", "policy")

_EPSILON = 1e-9
_MIG_PROFILE_RE = re.compile(r"([1-46-8])g\.([1-9][0-9]{0,3})gb(?:\+(?:me|me\.all|gfx)|-me)?", re.ASCII)
_BYTE_UNIT_RE = re.compile(r"(.*?[0-9.])\s*(Ki|Mi|Gi|Ti|Pi|Ei|[kKMGTPE])B", re.ASCII)


class RequestError(ValueError):
    """A request that cannot be scored: ``field`` names the request key, ``message`` what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class FitRequest:
    gpus: int = 1
    memory_bytes: int | None = None
    share: float | None = None  # ratio of a GPU's SM time, (0, 1]
    mig_profile: str | None = None
    exclusive: bool = False
    policy: str = "binpack"


@dataclass(frozen=True, slots=True)
class FitResult:
    fits: bool
    score: int  # 0-100; 0 when it does not fit
    gpus: tuple[str, ...]  # UUIDs of the chosen GPUs (a GPU repeats when it takes several MIG instances)
    reasons: Mapping[str, str]  # GPU UUID (or "node") -> why it cannot take the request
    recommended_mode: str  # "exclusive", "mig" or "time_sliced"
    recommended_mig_profile: str | None = None
    recommendation: str = ""  # why that mode
    mig_instances: tuple[str, ...] = ()  # existing idle instances chosen; the rest would be created
    policy: str = "binpack"
    extra: Mapping[str, Any] = field(default_factory=dict)  # policy details (nvlink ratio, ...)

    def to_jsonable(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "score": self.score,
            "gpus": list(self.gpus),
            "reasons": dict(self.reasons),
            "recommended_mode": self.recommended_mode,
            "recommended_mig_profile": self.recommended_mig_profile,
            "recommendation": self.recommendation,
            "mig_instances": list(self.mig_instances),
            "policy": self.policy,
            **({"details": dict(self.extra)} if self.extra else {}),
        }


# --- parsing ------------------------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request_memory(value: object) -> int:
    """Bytes from an integer, a Kubernetes quantity ("20Gi", "20G") or a byte unit ("20GB", "20GiB")."""
    if _is_int(value):
        assert isinstance(value, int)
        if not 0 < value <= MEMORY_MAX_BYTES:
            raise RequestError("memory", f"expected bytes > 0 and <= {MEMORY_MAX_BYTES}, got {value}")
        return value
    if not isinstance(value, str):
        raise RequestError("memory", f"expected bytes (an integer) or a quantity like \"20Gi\", got "
                                     f"{_type_name(value)}")
    text = value.strip()
    unit = _BYTE_UNIT_RE.fullmatch(text)
    if unit is not None:  # "20GB" is 20 G, "20GiB" 20 Gi, "512KB" 512 k
        text = unit[1] + ("k" if unit[2] == "K" else unit[2])
    try:
        return parse_memory(text)
    except PolicyValueError as error:
        raise RequestError("memory", error.message) from None


def _parse_share(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= 1:  # NaN fails this too
            raise RequestError("share", f"expected a ratio of a GPU's SM time in (0, 1], got {value!r}")
        return float(value)
    if isinstance(value, str):
        try:
            return parse_share(value)
        except PolicyValueError as error:
            raise RequestError("share", error.message) from None
    raise RequestError("share", f"expected a ratio in (0, 1] or a percent like \"30%\", got "
                                f"{_type_name(value)}")


def _parse_profile(value: object) -> str:
    if not isinstance(value, str):
        raise RequestError("mig_profile", f"expected a MIG profile like \"1g.10gb\", got {_type_name(value)}")
    if _MIG_PROFILE_RE.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise RequestError("mig_profile", f"unknown MIG profile {shown!r}: expected <slices>g.<memory>gb "
                                          "like 1g.10gb, 3g.40gb or 1g.10gb+me")
    return value


def parse_fit_request(body: object) -> FitRequest:
    """A ``FitRequest`` from the JSON body of ``/v1/hints/score``; raises ``RequestError(field, message)``."""
    if not isinstance(body, Mapping):
        raise RequestError("body", f"expected a JSON object with {', '.join(FIELDS)}, got {_type_name(body)}")
    for key in body:
        if key not in FIELDS:
            hint = difflib.get_close_matches(str(key), FIELDS, n=1)
            known = f"did you mean {hint[0]}?" if hint else "known fields: " + ", ".join(FIELDS)
            raise RequestError(str(key)[:64], f"unknown field; {known}")
    gpus = body.get("gpus", 1)
    if not _is_int(gpus):
        raise RequestError("gpus", f"expected an integer from 1 to {MAX_GPUS}, got {_type_name(gpus)}")
    if not 1 <= gpus <= MAX_GPUS:
        raise RequestError("gpus", f"expected an integer from 1 to {MAX_GPUS}, got {gpus}")
    memory = body.get("memory")
    share = body.get("share")
    profile = body.get("mig_profile")
    exclusive = body.get("exclusive", False)
    if not isinstance(exclusive, bool):
        raise RequestError("exclusive", f"expected true or false, got {_type_name(exclusive)}")
    policy = body.get("policy", "binpack")
    if policy not in POLICIES:
        shown = _type_name(policy) if not isinstance(policy, str) else repr(policy[:40])
        raise RequestError("policy", f"expected one of {', '.join(POLICIES)}, got {shown}")
    request = FitRequest(
        gpus=gpus,
        memory_bytes=None if memory is None else parse_request_memory(memory),
        share=None if share is None else _parse_share(share),
        mig_profile=None if profile is None else _parse_profile(profile),
        exclusive=exclusive,
        policy=policy,
    )
    if request.exclusive and request.share is not None:
        raise RequestError("share", "an exclusive request takes the whole GPU: leave share out")
    if request.mig_profile is not None and request.exclusive:
        raise RequestError("exclusive", "a MIG instance is isolated already: leave exclusive out")
    if request.mig_profile is not None and request.share is not None:
        raise RequestError("share", "a MIG instance's share is its slices: leave share out")
    return request


# --- figures in range ---------------------------------------------------------------------------------------
#
# The decoders refuse non-finite numbers, but judging does not depend on it: every figure the fit sizes a
# request with, computes a load from or words a reason with is read through these once, when the node is
# indexed. An agent's own figures are in range and come back as the same objects (no copy).


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


def unjudgeable(exc: BaseException) -> str:
    """The reason a node gets when judging it raised: the exception's type only (its text may carry the
    node's data; the log has it)."""
    return f"its GPU state could not be judged ({type(exc).__name__})"


# --- the per-node index -------------------------------------------------------------------------------------
#
# Scoring runs for every candidate node of every pod, so what does not depend on the request is worked out
# once per hints (``node_index``): which GPUs each kind of request can use at all (and, for the others, the
# reason), each GPU's figures as plain numbers, the order reports list GPUs in. ``fit_node`` then only
# compares the request's sizes with those numbers; reason texts are written when someone reads them.


def gpu_key(gpu: GpuHints) -> str:
    """How reasons name a GPU: its UUID, or "GPU <index>" when it was lost before its UUID was read."""
    return gpu.uuid or f"GPU {gpu.index}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


NO_INDEX = 1 << 30  # where reports rank a GPU known by no UUID (after every indexed one)


class _Row(NamedTuple):
    """One GPU as the fitting loops read it."""

    pos: int  # its place in ``NodeHints.gpus``
    gpu: GpuHints
    share: float  # schedulable_share_ratio
    free: int  # memory_free_bytes
    total: int | None  # memory_total_bytes


def _unusable(gpu: GpuHints) -> str | None:
    if gpu.health != "ok":
        return f"unhealthy ({gpu.health})"
    if gpu.stale:
        return "its last read did not finish in time: its figures are stale"
    return None


def _not_whole_gpu(gpu: GpuHints) -> str | None:
    """Why no request for (a share of) the whole GPU fits it, shared or exclusive; None: it may."""
    if (reason := _unusable(gpu)) is not None:
        return reason
    if gpu.mig_enabled:
        return "MIG is enabled: only a mig_profile request fits it"
    if gpu.compute_mode == "prohibited":
        return "compute mode is prohibited"
    return None


def _shared_static(gpu: GpuHints) -> str | None:
    """Why no shared (time-sliced/MPS) request, of any size, fits this GPU; None: its sizes decide."""
    if (reason := _not_whole_gpu(gpu)) is not None:
        return reason
    if gpu.sharing_mode == "exclusive":
        holder = gpu.tenants[0].name if gpu.tenants else "a tenant"
        return f"held exclusively by {holder}"
    if gpu.compute_mode == "exclusive_process" and gpu.sharing_mode != "mps" and gpu.tenants:
        return "compute mode is exclusive_process and a process holds it"
    return None


def _exclusive_static(gpu: GpuHints) -> str | None:
    """Why no exclusive request fits this GPU; None: its free memory decides."""
    if (reason := _not_whole_gpu(gpu)) is not None:
        return reason
    if gpu.tenants:
        names = ", ".join(t.name for t in gpu.tenants[:3]) + (", ..." if len(gpu.tenants) > 3 else "")
        return f"not free for exclusive use: {len(gpu.tenants)} tenant(s) ({names})"
    return None


def _mig_static(gpu: GpuHints) -> str | None:
    """Why no MIG request fits this GPU; None: its free profiles decide."""
    if (reason := _unusable(gpu)) is not None:
        return reason
    if not gpu.mig_enabled:
        return "MIG is not enabled"
    return None


@dataclass(frozen=True, slots=True, eq=False)
class _Kind:
    """The GPUs one kind of request (shared, exclusive, MIG) can be sized against, and why not the rest."""

    rows: tuple[_Row, ...]
    static: tuple[str | None, ...]  # by position in NodeHints.gpus: the reason, None for the rows
    static_count: int
    max_share: float  # over the rows (-1 without rows): a request above either fits none of them
    max_free: int


def _kind(
    gpus: tuple[GpuHints, ...], rows: tuple[_Row, ...], check: Callable[[GpuHints], str | None]
) -> _Kind:
    static = tuple(check(gpu) for gpu in gpus)
    usable = tuple(r for r in rows if static[r.pos] is None)
    return _Kind(usable, static, sum(1 for s in static if s is not None),
                 max((r.share for r in usable), default=-1.0), max((r.free for r in usable), default=-1))


@dataclass(frozen=True, slots=True, eq=False)
class NodeIndex:
    """What scoring needs of one node's hints, worked out once (``node_index``); see the comment above."""

    hints: NodeHints  # as given: callers check an index is of their hints by identity
    gpus: tuple[GpuHints, ...]  # ``hints.gpus`` with their figures in range: what scoring reads
    rows: tuple[_Row, ...]
    shared: _Kind
    exclusive: _Kind
    mig: _Kind
    mig_profiles: tuple[Mapping[str, MigProfileHint], ...]  # by position: profile -> its first hint
    rank: tuple[tuple[int, str, int], ...]  # (report rank, key, position) of every GPU, in report order
    unique_keys: bool  # no two GPUs share a key (else reports fall back to the reasons mapping)
    healthy: int
    share_gpus: float
    memory_free: int
    memory_total: int | None


def _build_index(hints: NodeHints) -> NodeIndex:
    gpus = tuple(_gpu_in_range(g) for g in hints.gpus)
    rows = tuple(_Row(pos, g, g.schedulable_share_ratio, g.memory_free_bytes, g.memory_total_bytes)
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
        shared=_kind(gpus, rows, _shared_static),
        exclusive=_kind(gpus, rows, _exclusive_static),
        mig=_kind(gpus, rows, _mig_static),
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


# --- fitting ------------------------------------------------------------------------------------------------


# An option: a GPU that can take (part of) the request, as a plain tuple whose order is the policy's:
# (load key: -load_after for binpack, load_after for spread; GPU index; position in NodeHints.gpus;
#  load_after, the GPU's load (0-1) after one unit; SM share one unit takes; memory one unit takes;
#  units it can take). ``min``/``sorted`` on them choose in policy order, ties to the first GPU.
_Option = tuple[float, int, int, float, float, int, int]
_POS, _LOAD_AFTER, _SHARE_TAKEN, _MEMORY_TAKEN, _SLOTS = 2, 3, 4, 5, 6

# Why a GPU the request's sizes rule out cannot take it (the texts: ``_size_reason``).
_SHARE_SHORT, _NO_SHARE_LEFT, _MEMORY_SHORT, _NO_INSTANCE, _INSTANCE_MEMORY_SHORT = range(5)


def _load(share_left: float, memory_left: int, total: int | None) -> float:
    memory_part = memory_left / total if total else share_left
    return 1.0 - (max(0.0, min(1.0, share_left)) + max(0.0, min(1.0, memory_part))) / 2


def _cannot_fit_any(kind: _Kind, request: FitRequest) -> bool:
    """Whether the request's sizes rule out every row of a shared or exclusive kind (checked in O(1)
    before the loop; the loop's own checks then say why, if anyone asks)."""
    memory = request.memory_bytes or 0
    if memory > kind.max_free:
        return True
    if request.exclusive:
        return False
    wanted = request.share
    return kind.max_share + _EPSILON < wanted if wanted is not None else kind.max_share <= _EPSILON


def _shared_options(
    index: NodeIndex, rows: tuple[_Row, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    wanted = request.share
    share = wanted or 0.0
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, share_ratio, free, total in rows:
        if wanted is not None:
            if share_ratio + _EPSILON < wanted:
                failed.append((pos, _SHARE_SHORT))
                continue
        elif share_ratio <= _EPSILON:
            failed.append((pos, _NO_SHARE_LEFT))
            continue
        if memory > free:
            failed.append((pos, _MEMORY_SHORT))
            continue
        load_after = _load(share_ratio - share, free - memory, total)
        options.append((sign * load_after, gpu.index, pos, load_after, share, memory, 1))
    return options


def _exclusive_options(
    index: NodeIndex, rows: tuple[_Row, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, _share, free, _total in rows:
        if memory > free:
            failed.append((pos, _MEMORY_SHORT))
            continue
        options.append((sign, gpu.index, pos, 1.0, 1.0, free, 1))
    return options


def _mig_options(
    index: NodeIndex, rows: tuple[_Row, ...], request: FitRequest, failed: list[tuple[int, int]]
) -> list[_Option]:
    profile = request.mig_profile
    memory = request.memory_bytes or 0
    sign = -1.0 if request.policy == "binpack" else 1.0
    options = []
    for pos, gpu, share_ratio, _free, _total in rows:
        hint = index.mig_profiles[pos].get(profile)  # type: ignore[arg-type]
        if hint is None or (hint.creatable_count == 0 and not hint.idle_instances):
            failed.append((pos, _NO_INSTANCE))
            continue
        if hint.memory_bytes is not None and memory > hint.memory_bytes:
            failed.append((pos, _INSTANCE_MEMORY_SHORT))
            continue
        share = hint.slice_count / MIG_SLICES
        load_after = 1.0 - max(0.0, share_ratio - share)
        options.append((sign * load_after, gpu.index, pos, load_after, share, hint.memory_bytes or 0,
                        len(hint.idle_instances) + hint.creatable_count))
    return options


_OPTIONS = {"shared": _shared_options, "exclusive": _exclusive_options, "mig": _mig_options}


def _size_reason(index: NodeIndex, pos: int, why: int, request: FitRequest) -> str:
    gpu = index.gpus[pos]
    memory = request.memory_bytes or 0
    if why == _SHARE_SHORT:
        return (f"needs a {request.share or 0.0:.0%} share of SM time, {gpu.schedulable_share_ratio:.0%} "
                "schedulable")
    if why == _NO_SHARE_LEFT:
        return "no schedulable SM time left"
    if why == _MEMORY_SHORT:
        return f"needs {_gib(memory)} of memory, {_gib(gpu.memory_free_bytes)} free"
    profile = request.mig_profile
    if why == _NO_INSTANCE:
        free = ", ".join(
            f"{h.profile} x{len(h.idle_instances) + h.creatable_count}" for h in gpu.free_mig_profiles
        )
        return f"no free {profile} instance and no room for one" + (f" (free: {free})" if free else "")
    hint = index.mig_profiles[pos][profile]  # type: ignore[index]
    return f"a {profile} instance has {_gib(hint.memory_bytes or 0)} of memory, needs {_gib(memory)}"


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


def kind_name(request: FitRequest) -> str:
    """Which kind of request: "shared", "exclusive" or "mig" (the ``NodeIndex`` attribute it is sized on)."""
    if request.mig_profile is not None:
        return "mig"
    return "exclusive" if request.exclusive else "shared"


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

    def _kind(self) -> _Kind:
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

    def node_reason(self) -> str | None:
        """The node-level reason (``reasons["node"]``); None when the request fits."""
        if self.fits:
            return None
        if not self.index.rows:
            return "no GPUs"
        unit = "MIG instances" if self.request.mig_profile else "GPUs"
        return f"needs {self.request.gpus} {unit}, {self.available} can take it"

    def reasons(self) -> dict[str, str]:
        """Why each GPU that cannot take the request cannot (by key), then the node's under "node"."""
        static = self._kind().static
        sized = self._sized_out()
        reasons: dict[str, str] = {}
        for row in self.index.rows:
            text = static[row.pos]
            if text is None and row.pos in sized:
                text = _size_reason(self.index, row.pos, sized[row.pos], self.request)
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
                    text = _size_reason(index, pos, why, self.request)
            if text is not None:
                return rank, key, text, count
        raise AssertionError("a counted reason was not found")  # unreachable: count says there is one

    def result(self) -> FitResult:
        """The full ``FitResult`` (what ``/v1/hints/score`` answers), with the recommended sharing mode."""
        request = self.request
        gpus = self.index.gpus
        if not self.fits:
            return FitResult(fits=False, score=0, gpus=(), reasons=self.reasons(), policy=request.policy,
                             **_recommend(gpus, request))
        extra: dict[str, Any] = {}
        if self.nvlink_ratio is not None:
            extra["nvlink_connected_ratio"] = round(self.nvlink_ratio, 3)
        instances: list[str] = []
        if request.mig_profile is not None:
            used: dict[str, int] = {}
            for option in self.chosen:
                gpu = gpus[option[_POS]]
                idle = self.index.mig_profiles[option[_POS]][request.mig_profile].idle_instances
                n = used.get(gpu.uuid, 0)
                if n < len(idle):
                    instances.append(idle[n])
                used[gpu.uuid] = n + 1
        return FitResult(
            fits=True,
            score=self.score,
            gpus=self.gpus,
            reasons=self.reasons(),
            mig_instances=tuple(instances),
            policy=request.policy,
            extra=extra,
            **_recommend(gpus, request),
        )


def fit_node(index: NodeIndex, request: FitRequest) -> NodeFit:
    """Whether ``request`` fits the node, on which GPUs, and how well (0-100); no reason text is written
    (``NodeFit.reasons``) and no sharing mode recommended (``NodeFit.result``): the extender's fast path."""
    name = kind_name(request)
    kind: _Kind = getattr(index, name)
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


def _not_fitting(request: FitRequest, reason: str, recommended: Mapping[str, Any]) -> FitResult:
    return FitResult(fits=False, score=0, gpus=(), policy=request.policy, reasons={"node": reason},
                     **recommended)


def score_node(
    hints: NodeHints, request: FitRequest, *, now: float, max_age_seconds: float | None = None
) -> FitResult:
    """Whether ``request`` fits on the node ``hints`` describe, on which GPUs, and how well (0-100).

    Never raises: an exception while judging the node is its answer, ``fits: false`` with the reason
    ``unjudgeable`` names (and the traceback logged), recommending the mode the request asked for."""
    try:
        index = node_index(hints)
        age = now - hints.taken_at_unix
        if max_age_seconds is not None and age > max_age_seconds:
            reason = f"hints are {age:.0f} s old, more than the {max_age_seconds:g} s allowed"
            return _not_fitting(request, reason, _recommend(index.gpus, request))
        return fit_node(index, request).result()
    except Exception as exc:
        log.warning("scoring a request on the hints of %s failed", hints.hostname, exc_info=True)
        mode = {"mig": "mig", "exclusive": "exclusive"}.get(kind_name(request), "time_sliced")
        return _not_fitting(request, unjudgeable(exc), {
            "recommended_mode": mode, "recommended_mig_profile": request.mig_profile,
            "recommendation": "the node's state could not be judged: the mode asked for"})


# --- the sharing mode to use --------------------------------------------------------------------------------


def _recommend(gpus: tuple[GpuHints, ...], request: FitRequest) -> dict[str, Any]:
    """KubeGPU-style adaptive sharing: the mode that suits the request on this node's current load."""
    if request.mig_profile is not None:
        return {"recommended_mode": "mig", "recommended_mig_profile": request.mig_profile,
                "recommendation": "a MIG instance was asked for"}
    if request.exclusive:
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None,
                "recommendation": "an exclusive GPU was asked for"}
    healthy = [g for g in gpus if g.health == "ok" and not g.stale]
    gpu_memory = max((g.memory_total_bytes or 0 for g in healthy), default=0)
    memory = request.memory_bytes or 0
    share = request.share
    big = share is None and request.memory_bytes is None
    big = big or (share is not None and share >= BIG_REQUEST_RATIO)
    big = big or (gpu_memory > 0 and memory >= BIG_REQUEST_RATIO * gpu_memory)
    free_gpu = any(not g.mig_enabled and not g.tenants for g in healthy)
    if big:
        why = "it needs most of a GPU: sharing would slow it and its neighbours"
        if request.share is None and request.memory_bytes is None:
            why = "it asks for whole GPUs (no share or memory given)"
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None, "recommendation": why}
    wanted = share or 0.0
    for gpu in healthy:
        if gpu.mig_enabled or gpu.sharing_mode == "exclusive" or not gpu.tenants:
            continue
        long = gpu.sm_util_long_ratio if gpu.sm_util_long_ratio is not None else gpu.sm_util_ratio
        if long is None or memory > gpu.memory_free_bytes or gpu.schedulable_share_ratio < wanted:
            continue
        if long + max(wanted, NOMINAL_SHARE) <= LIGHT_LOAD_RATIO:
            return {"recommended_mode": "time_sliced", "recommended_mig_profile": None,
                    "recommendation": f"GPU {gpu.index} is lightly loaded ({long:.0%} SM over the long "
                                      "window): time-slicing onto it costs little"}
    profile = _smallest_profile(healthy, memory, wanted)
    if profile is not None:
        return {"recommended_mode": "mig", "recommended_mig_profile": profile,
                "recommendation": f"no lightly loaded shared GPU: {profile} isolates a request this small"}
    if free_gpu:
        return {"recommended_mode": "exclusive", "recommended_mig_profile": None,
                "recommendation": "no lightly loaded shared GPU and no MIG instance holds it: a free GPU"}
    return {"recommended_mode": "time_sliced", "recommended_mig_profile": None,
            "recommendation": "nothing better is free now: time-slicing with a share limit"}


def _smallest_profile(gpus: list[GpuHints], memory: int, share: float) -> str | None:
    best: tuple[int, int, str] | None = None
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        for hint in gpu.free_mig_profiles:
            if not (hint.idle_instances or hint.creatable_count):
                continue
            if hint.memory_bytes is not None and hint.memory_bytes < memory:
                continue
            if hint.slice_count / MIG_SLICES + _EPSILON < share:
                continue
            key = (hint.slice_count, hint.memory_bytes or 0, hint.profile)
            if best is None or key < best:
                best = key
    return best[2] if best else None
