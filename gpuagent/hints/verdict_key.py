"""A node's verdict key: bytes equal for two nodes exactly when the extender must judge them alike.

The extender judges each distinct key once a request (``Extender._judge``) and the cluster view keeps one
decoded copy per key (``hints.cluster_view``), so the key must hold everything the extender's verdict
(``extender._score``: ``nodeindex.node_index`` and ``fit.fit_node``, the fit, its score and the one-line
reason) reads, and it is worth holding nothing else: every field left out lets more nodes share a verdict.
What it holds, and where it is read:

- the node's ``healthy_gpu_count``, ``schedulable_share_gpus``, ``memory_free_bytes``, ``memory_total_bytes``
  (the node's load after a placement);
- per GPU, in order: ``index`` (ties in the policy order, the reason's "GPU n"), ``health``, ``stale``,
  ``mig_enabled``, ``compute_mode``, ``sharing_mode`` (which kinds of request may use it, and the reason
  why not), ``schedulable_share_ratio``, ``memory_free_bytes``, ``memory_total_bytes`` (sizes and load),
  ``numa_node`` (a multi-GPU choice), the free MIG profiles (profile, slices, memory, creatable and idle
  counts: a MIG fit and its reason), its NVLink peers as positions of GPUs of this node (peers elsewhere
  never count);
- its tenants' count and first three names, on a GPU that a whole-GPU request could use (healthy, fresh,
  no MIG, compute mode not prohibited): the reasons "held exclusively by" and "not free for exclusive use"
  name them; elsewhere no reason reads a tenant;
- the GPUs' UUIDs themselves only when they are not what an agent writes (empty, repeated, an index
  repeated or out of range): then reasons and report order read them; otherwise a UUID only tells GPUs
  apart, which positions do.

Per kind of request (``kind_keys``, worked out once per state by the cluster view, which the extender's
per-request memo uses): an exclusive request reads all of the above, so its key is the state's; a shared
request reads of the tenants only whether there are any and, on a GPU held exclusively, the first one's
name; a MIG request none of them. So nodes whose time-sliced GPUs run pods of their own are judged once
for a shared or MIG request, and once each for an exclusive one, whose reasons name their pods.

Left out: the hostname, when the hints were taken, memory used and allocated, SM use, the model, PCI bus,
the fault text (the health carries it), tenants' figures, MIG instances (their idle ones are counted under
the profiles), the node's counts the index does not read. ``tests/test_verdict_key.py`` checks both
directions on random hints and requests. The tuple is serialised with ``marshal`` at version 2, which
writes no back-references, so equal values give equal bytes; and bytes cache their hash, which the
extender's per-node lookups need.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable
from operator import attrgetter
from typing import NamedTuple

from gpuagent.hints.nodeindex import NO_INDEX
from gpuagent.snapshot.hints import GpuHints, NodeHints

_GPU = attrgetter("index", "health", "stale", "mig_enabled", "compute_mode", "sharing_mode",
                  "schedulable_share_ratio", "memory_free_bytes", "memory_total_bytes", "numa_node")
_PROFILE = attrgetter("profile", "slice_count", "memory_bytes", "creatable_count")
_NAME = attrgetter("name")
_MARSHAL_VERSION = 2  # no back-references (version 3 added them): the bytes depend on the values alone


class KindKeys(NamedTuple):
    """A state's keys per kind of request (``fitrequest.kind_name``): each holds what that kind's verdicts
    read."""

    shared: bytes
    exclusive: bytes  # the state's ``verdict_key``: it reads the most
    mig: bytes


def _whole(gpu: GpuHints) -> bool:
    """Whether a whole-GPU request (shared or exclusive) could use ``gpu``: healthy, fresh, no MIG, compute
    mode not prohibited (``fitreasons.not_whole_gpu``); only there do reasons read its tenants."""
    return gpu.health == "ok" and not gpu.stale and not gpu.mig_enabled and gpu.compute_mode != "prohibited"


def _exclusive_tenants(gpu: GpuHints) -> object:
    """"not free for exclusive use: N tenant(s) (first three names)" (and so "held exclusively by")."""
    tenants = gpu.tenants
    return (len(tenants), *map(_NAME, tenants[:3])) if tenants and _whole(gpu) else None


def _shared_tenants(gpu: GpuHints) -> object:
    """A shared request reads whether there are tenants, and the first one's name on a GPU held
    exclusively ("held exclusively by", and "a process holds it" in exclusive_process mode)."""
    tenants = gpu.tenants
    if not tenants or not _whole(gpu):
        return None
    return tenants[0].name if gpu.sharing_mode == "exclusive" else 1


def _no_tenants(gpu: GpuHints) -> object:
    return None  # no MIG reason reads a tenant


def _key(hints: NodeHints, tenants_read: Callable[[GpuHints], object]) -> bytes:
    gpus = hints.gpus
    position: dict[str, int] = {}
    for pos, gpu in enumerate(gpus):
        position.setdefault(gpu.uuid, pos)
    indexes = {gpu.index for gpu in gpus}
    regular = (len(position) == len(gpus) == len(indexes) and "" not in position
               and all(i < NO_INDEX for i in indexes))
    per_gpu: list[object] = []
    add = per_gpu.append
    for gpu in gpus:
        add(_GPU(gpu))
        add(tenants_read(gpu))
        profiles = gpu.free_mig_profiles
        add(tuple((*_PROFILE(p), len(p.idle_instances)) for p in profiles) if profiles else None)
        add(tuple(map(position.get, gpu.nvlink_peers)))  # None: a peer on no GPU of this node
    return marshal.dumps((
        hints.healthy_gpu_count, hints.schedulable_share_gpus, hints.memory_free_bytes,
        hints.memory_total_bytes, per_gpu, None if regular else tuple(gpu.uuid for gpu in gpus),
    ), _MARSHAL_VERSION)


def verdict_key(hints: NodeHints) -> bytes:
    """The key of ``hints``: equal for states every request judges alike (see the module docstring)."""
    return _key(hints, _exclusive_tenants)


def kind_keys(hints: NodeHints, key: bytes | None = None) -> KindKeys:
    """The keys per kind of request (``key``: the state's ``verdict_key``, when it is known already)."""
    return KindKeys(_key(hints, _shared_tenants), key if key is not None else verdict_key(hints),
                    _key(hints, _no_tenants))
