"""A node's GPU state as its agent publishes it in the API server, and as the extender reads it back.

The object is a ``GPUNodeState`` (``gpuagent.io/v1alpha1``, cluster-scoped, named after the node; its
CustomResourceDefinition is ``deploy/extender/gpunodestate-crd.yaml``). Top-level fields, as
NodeResourceTopology objects have them (observed state with no desired state, so no spec/status split):

- ``agent``: ``{epoch, sequence}``: the publishing agent's start time (unix nanoseconds) and a count of its
  writes. The extender keeps the highest pair it has seen per node and ignores an older one, so a write
  that a restarted agent's predecessor had in flight cannot roll the view back.
- ``heartbeatTime``: when the agent last confirmed the state (RFC 3339, the agent's clock). Unchanged state
  is written again every heartbeat interval, so the extender can tell a silent agent from a quiet node.
- ``hints``: the node's ``/v1/hints`` as scheduling needs it (``project``): the figures that move every
  poll and decide fits (memory free and used, the schedulable share) are held at their published value
  until they move by a whole step (``Steps``); what the extender never reads is left out (the SM use of
  the GPUs and tenants, now and averaged, and the network block). So the object changes when a
  scheduling decision could change, not when a utilisation average wobbles: that is what bounds the write
  rate (docs/scheduling.md, "The cluster view", has the budget and its measurement).

Decoding (``decode_state``) is msgspec into the same frozen ``NodeHints`` the agent serves, in the same pass
as the object around them, type-checked (a wrong type names its path); unknown keys are ignored, so an older
extender reads a newer agent's object. Each decoded state carries its verdict key (``hints.verdict_key``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpuagent.hints.codec import hints_to_jsonable
from gpuagent.hints.verdict_key import verdict_key
from gpuagent.snapshot import GpuHints, MigInstanceHint, NodeHints, TenantHint

GROUP = "gpuagent.io"
VERSION = "v1alpha1"
KIND = "GPUNodeState"
PLURAL = "gpunodestates"
API_VERSION = f"{GROUP}/{VERSION}"
COLLECTION_PATH = f"apis/{GROUP}/{VERSION}/{PLURAL}"
FIELD_MANAGER = "gpuagent"


@dataclass(frozen=True, slots=True)
class Steps:
    """How far a moving figure must go from its published value before the object is written again."""

    memory_bytes: int = 256 * 2**20  # a memory request is rarely finer than this
    share_ratio: float = 0.05  # 5 points of SM time (the schedulable share follows the 5-minute average)


DEFAULT_STEPS = Steps()


@dataclass(frozen=True, slots=True)
class Generation:
    """Which write of which agent: ordered, so a stale write is recognised."""

    epoch: int  # the agent's start, unix nanoseconds
    sequence: int  # its writes so far

    def newer_than(self, other: Generation | None) -> bool:
        return other is None or (self.epoch, self.sequence) > (other.epoch, other.sequence)


@dataclass(frozen=True, slots=True)
class PublishedState:
    """One node's published object, decoded."""

    node: str
    resource_version: str
    generation: Generation
    heartbeat_unix: float
    hints: NodeHints
    key: bytes = b""  # ``verdict_key``: equal for nodes whose states schedule alike


# --- the agent's side ---------------------------------------------------------------------------------------


def _held(new: float | None, old: float | None, step: float) -> float | None:
    if new is None or old is None:
        return new
    return old if abs(new - old) < step else new


def _held_int(new: int | None, old: int | None, step: int) -> int | None:
    if new is None or old is None:
        return new
    return old if abs(new - old) < step else new


def _tenant(new: TenantHint, old: TenantHint | None, steps: Steps) -> TenantHint:
    new = dataclasses.replace(new, sm_util_ratio=None)
    if old is None:
        return new
    return dataclasses.replace(
        new, memory_used_bytes=_held_int(new.memory_used_bytes, old.memory_used_bytes, steps.memory_bytes),
    )


def _instance(new: MigInstanceHint, old: MigInstanceHint | None, steps: Steps) -> MigInstanceHint:
    if old is None:
        return new
    return dataclasses.replace(
        new, memory_used_bytes=_held_int(new.memory_used_bytes, old.memory_used_bytes, steps.memory_bytes)
    )


def _gpu(new: GpuHints, old: GpuHints | None, steps: Steps) -> GpuHints:
    old_tenants = {t.name: t for t in old.tenants} if old is not None else {}
    old_instances = {i.uuid: i for i in old.mig_instances} if old is not None else {}
    new = dataclasses.replace(
        new, sm_util_ratio=None, sm_util_short_ratio=None, sm_util_long_ratio=None,
        tenants=tuple(_tenant(t, old_tenants.get(t.name), steps) for t in new.tenants),
        mig_instances=tuple(_instance(i, old_instances.get(i.uuid), steps) for i in new.mig_instances),
    )
    if old is None:
        return new
    memory = steps.memory_bytes
    return dataclasses.replace(
        new,
        memory_used_bytes=_held_int(new.memory_used_bytes, old.memory_used_bytes, memory),
        memory_free_bytes=_held_int(new.memory_free_bytes, old.memory_free_bytes, memory),  # type: ignore[arg-type]
        schedulable_share_ratio=_held(new.schedulable_share_ratio, old.schedulable_share_ratio,  # type: ignore[arg-type]
                                      steps.share_ratio),
    )


def project(hints: NodeHints, published: NodeHints | None, steps: Steps = DEFAULT_STEPS) -> NodeHints:
    """``hints`` as they would be published after ``published``: moving figures held where they moved
    less than a step, SM use and the network left out, the node's sums taken again over the GPUs as held."""
    old_gpus = {g.uuid: g for g in published.gpus} if published is not None else {}
    gpus = tuple(_gpu(g, old_gpus.get(g.uuid), steps) for g in hints.gpus)
    return dataclasses.replace(
        hints,
        gpus=gpus,
        memory_free_bytes=sum(g.memory_free_bytes for g in gpus),
        schedulable_share_gpus=math.fsum(g.schedulable_share_ratio for g in gpus),
        network=None,
    )


def same_state(a: NodeHints | None, b: NodeHints | None) -> bool:
    """Whether two projections would schedule alike (everything but when they were taken)."""
    if a is None or b is None:
        return a is b
    return dataclasses.replace(a, taken_at_unix=0.0) == dataclasses.replace(b, taken_at_unix=0.0)


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def state_object(node: str, hints: NodeHints, generation: Generation, heartbeat_unix: float
                 ) -> dict[str, Any]:
    """The ``GPUNodeState`` body the agent applies (server-side apply: the whole object, every time)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node, "labels": {"app.kubernetes.io/managed-by": "gpuagent"}},
        "agent": {"epoch": generation.epoch, "sequence": generation.sequence},
        "heartbeatTime": rfc3339(heartbeat_unix),
        "hints": hints_to_jsonable(hints),
    }


def object_path(node: str) -> str:
    return f"{COLLECTION_PATH}/{node}"


# --- the extender's side ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Wire:
    """msgspec's decoders, built on first use (msgspec comes with lightkube, imported only then)."""

    obj: Any
    listing: Any
    error: type[Exception]


@functools.cache
def _wire() -> _Wire:
    import msgspec

    meta = msgspec.defstruct("Meta", [("name", str, ""), ("resourceVersion", str, "")])
    agent = msgspec.defstruct("Agent", [("epoch", int, 0), ("sequence", int, 0)])
    obj = msgspec.defstruct("GPUNodeState", [  # the hints in the same pass: no second parse of their bytes
        ("metadata", meta, msgspec.field(default_factory=meta)),
        ("agent", agent, msgspec.field(default_factory=agent)),
        ("heartbeatTime", str, ""),
        ("hints", NodeHints | None, None),
    ])
    list_meta = msgspec.defstruct("ListMeta", [("resourceVersion", str, "")])
    listing = msgspec.defstruct("GPUNodeStateList", [
        ("metadata", list_meta, msgspec.field(default_factory=list_meta)),
        ("items", list[msgspec.Raw] | None, None),
    ])
    return _Wire(msgspec.json.Decoder(obj), msgspec.json.Decoder(listing), msgspec.DecodeError)


def decode_list(body: bytes) -> tuple[list[Any], str]:
    """(the raw items, the list's resourceVersion); raises ``ValueError``."""
    wire = _wire()
    try:
        listing = wire.listing.decode(body)
    except wire.error as exc:
        raise ValueError(f"bad {KIND}List: {exc}") from None
    return list(listing.items or ()), listing.metadata.resourceVersion


def decode_state(raw: Any) -> PublishedState:
    """One object (bytes or msgspec Raw); raises ``ValueError`` naming what is wrong (bad JSON, a field of
    the wrong type with its path, no hints, an unreadable heartbeat)."""
    wire = _wire()
    try:
        obj = wire.obj.decode(raw)
    except wire.error as exc:
        raise ValueError(f"bad {KIND}: {exc}") from None
    name = obj.metadata.name
    hints = obj.hints
    if hints is None:
        raise ValueError(f"{KIND} {name!r}: no hints")
    try:
        heartbeat = datetime.fromisoformat(obj.heartbeatTime.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"{KIND} {name!r}: heartbeatTime {obj.heartbeatTime[:40]!r} is not RFC 3339"
                         ) from None
    return PublishedState(
        node=name,
        resource_version=obj.metadata.resourceVersion,
        generation=Generation(obj.agent.epoch, obj.agent.sequence),
        heartbeat_unix=heartbeat,
        hints=hints,
        key=verdict_key(hints),
    )
