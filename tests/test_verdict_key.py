"""The verdict key (``hints.verdict_key``) against the extender's own verdicts, over random hints and requests.

Both directions: two states with the same key get the same verdict (``extender_verdict.entry_verdict``: fit, score and the
one-line reason) for any request, however they differ in what the key leaves out; and two states that
differ in anything the fit, score or reason reads get different keys. The fields the key reads and those
it leaves out are listed here, and a test holds the lists to the dataclasses, so a new field of the hints
needs a decision either way before the suite passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hints_fastpath import RATIOS, node_hints, requests

from gpuagent.hints.agents import AgentEntry
from gpuagent.hints.extender_verdict import Verdict, entry_verdict
from gpuagent.hints.fitreasons import not_whole_gpu
from gpuagent.hints.score import FitRequest, kind_name, node_index
from gpuagent.hints.verdict_key import KindKeys, kind_keys, verdict_key
from gpuagent.snapshot.hints import GpuHints, MigInstanceHint, MigProfileHint, NodeHints, TenantHint

pytestmark = pytest.mark.long  # property tests of many seconds: handed out early (conftest.py)

GIB = 2**30
TEXT = st.text(max_size=12)
BYTES = st.none() | st.integers(0, 80 * GIB)

# What the key holds (``verdict_key``'s docstring says where each is read) ...
NODE_READ = {"gpus", "healthy_gpu_count", "schedulable_share_gpus", "memory_free_bytes", "memory_total_bytes"}
GPU_READ = {"uuid", "index", "health", "stale", "mig_enabled", "compute_mode", "sharing_mode",
            "schedulable_share_ratio", "memory_free_bytes", "memory_total_bytes", "numa_node", "tenants",
            "free_mig_profiles", "nvlink_peers"}
# ... and what it leaves out, with other values to put there.
NODE_LEFT_OUT: dict[str, st.SearchStrategy[object]] = {
    "hostname": TEXT, "taken_at_unix": st.floats(0, 2e9), "gpu_count": st.integers(0, 9),
    "free_gpu_count": st.integers(0, 9), "stale": st.booleans(), "short_window_seconds": st.floats(1, 60),
    "long_window_seconds": st.floats(60, 600), "network": st.none(),
}
GPU_LEFT_OUT: dict[str, st.SearchStrategy[object]] = {
    "model": TEXT, "pci_bus_id": TEXT, "memory_used_bytes": BYTES, "memory_allocated_bytes": st.integers(0, 80 * GIB),
    "sm_util_ratio": st.none() | RATIOS, "sm_util_short_ratio": st.none() | RATIOS,
    "sm_util_long_ratio": st.none() | RATIOS, "fault": st.none() | TEXT,
    "mig_instances": st.lists(st.builds(
        MigInstanceHint, uuid=TEXT, profile=TEXT, gpu_instance_id=st.integers(0, 14), slice_ratio=RATIOS,
        memory_total_bytes=BYTES, memory_used_bytes=BYTES, tenants=st.lists(TEXT, max_size=2).map(tuple),
        idle=st.booleans()), max_size=3).map(tuple),
}
TENANT_READ = {"name"}  # on a GPU a whole-GPU request could use, the first three


def verdicts(hints: NodeHints, asked: list[FitRequest]) -> list[Verdict]:
    entry = AgentEntry(node="node", url=None, hints=hints, index=node_index(hints))
    return [entry_verdict(entry, request) for request in asked]


def regular(hints: NodeHints) -> bool:
    """UUIDs as an agent writes them: present and distinct, and so are the indexes."""
    uuids = [g.uuid for g in hints.gpus]
    indexes = [g.index for g in hints.gpus]
    return "" not in uuids and len(set(uuids)) == len(uuids) and len(set(indexes)) == len(indexes)


def test_every_field_of_the_hints_is_either_read_or_left_out() -> None:
    assert {f.name for f in dataclasses.fields(NodeHints)} == NODE_READ | NODE_LEFT_OUT.keys()
    assert {f.name for f in dataclasses.fields(GpuHints)} == GPU_READ | GPU_LEFT_OUT.keys()
    assert {f.name for f in dataclasses.fields(TenantHint)} >= TENANT_READ


def _tenant(draw: st.DrawFn, name: str) -> TenantHint:
    return TenantHint(name=name, kind=draw(TEXT), share_ratio=draw(st.none() | RATIOS),
                      memory_limit_bytes=draw(BYTES), memory_used_bytes=draw(st.integers(0, 80 * GIB)),
                      sm_util_ratio=draw(st.none() | RATIOS), allocated=draw(st.booleans()),
                      replicas=draw(st.integers(0, 4)), mig_instance=draw(st.none() | TEXT),
                      mps_active_thread_ratio=draw(st.none() | RATIOS))


def _tenants(draw: st.DrawFn, gpu: GpuHints, reads: str) -> tuple[TenantHint, ...]:
    """Other tenants, alike in what requests of kind ``reads`` read of them: "exclusive" (every kind) the
    count and first three names where a whole-GPU request could go; "shared" there whether there is one,
    and the first's name on a GPU held exclusively; "mig" nothing."""
    whole = not_whole_gpu(gpu) is None
    if reads == "mig" or not whole or (reads == "shared" and not gpu.tenants):
        count = draw(st.integers(0, 4)) if reads == "mig" or not whole else 0
        return tuple(_tenant(draw, draw(TEXT)) for _ in range(count))
    if reads == "shared":
        first = gpu.tenants[0].name if gpu.sharing_mode == "exclusive" else draw(TEXT)
        return tuple(_tenant(draw, first if k == 0 else draw(TEXT)) for k in range(draw(st.integers(1, 4))))
    return tuple(_tenant(draw, t.name if k < 3 else draw(TEXT)) for k, t in enumerate(gpu.tenants))


@st.composite
def alike(draw: st.DrawFn, hints: NodeHints, reads: str = "exclusive") -> NodeHints:
    """``hints`` with everything the key of requests of kind ``reads`` leaves out drawn afresh: the node's
    and GPUs' other fields, the tenants (``_tenants``), the idle MIG instances' UUIDs, peers on other nodes,
    and (for agent-written UUIDs) every GPU's UUID, renamed consistently. The exclusive kind's key is the
    state's (``verdict_key``): it reads the most."""
    rename: dict[str, str] = {}
    if regular(hints):
        fresh = draw(st.lists(st.text(min_size=1, max_size=8), min_size=len(hints.gpus),
                              max_size=len(hints.gpus), unique=True))
        rename = {g.uuid: f"GPU-x{new}" for g, new in zip(hints.gpus, fresh, strict=True)}
    gpus = []
    for gpu in hints.gpus:
        tenants = _tenants(draw, gpu, reads)
        profiles = tuple(replace(p, idle_instances=tuple(draw(TEXT) for _ in p.idle_instances))
                         for p in gpu.free_mig_profiles)
        on_node = {g.uuid for g in hints.gpus}
        peers = tuple(rename.get(p, p) if p in on_node else f"elsewhere-{draw(TEXT)}" for p in gpu.nvlink_peers)
        others = {name: draw(strategy) for name, strategy in GPU_LEFT_OUT.items()}
        gpus.append(replace(gpu, uuid=rename.get(gpu.uuid, gpu.uuid), tenants=tenants,
                            free_mig_profiles=profiles, nvlink_peers=peers, **others))
    others = {name: draw(strategy) for name, strategy in NODE_LEFT_OUT.items()}
    return replace(hints, gpus=tuple(gpus), **others)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hints=node_hints(), asked=st.lists(requests(), min_size=1, max_size=6))
def test_states_with_the_same_key_get_the_same_verdicts(data: st.DataObject, hints: NodeHints,
                                                        asked: list[FitRequest]) -> None:
    other = data.draw(alike(hints))
    assert verdict_key(other) == verdict_key(hints)  # what was redrawn is left out of the key ...
    assert verdicts(other, asked) == verdicts(hints, asked)  # ... and no verdict reads it
    assert kind_keys(other) == kind_keys(hints)  # the state's key decides every kind's


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hints=node_hints(), asked=st.lists(requests(), min_size=1, max_size=9))
def test_states_with_the_same_key_for_a_kind_get_the_same_verdicts_for_that_kind(
        data: st.DataObject, hints: NodeHints, asked: list[FitRequest]) -> None:
    keys = kind_keys(hints)
    for reads in KindKeys._fields:
        other = data.draw(alike(hints, reads))
        assert getattr(kind_keys(other), reads) == getattr(keys, reads), reads
        mine = [request for request in asked if kind_name(request) == reads]
        assert verdicts(other, mine) == verdicts(hints, mine), reads


# --- anything read changes the key ------------------------------------------------------------------------------

Change = Callable[[NodeHints], "NodeHints | None"]  # None: the change does not apply to these hints


def _on_gpu(pick: Callable[[GpuHints], bool], change: Callable[[GpuHints, NodeHints], GpuHints]) -> Change:
    def apply(hints: NodeHints) -> NodeHints | None:
        for pos, gpu in enumerate(hints.gpus):
            if pick(gpu):
                changed = change(gpu, hints)
                return replace(hints, gpus=(*hints.gpus[:pos], changed, *hints.gpus[pos + 1:]))
        return None

    return apply


def _any(_: GpuHints) -> bool:
    return True


def _named(gpu: GpuHints) -> bool:
    return not_whole_gpu(gpu) is None and bool(gpu.tenants)


def _first_profile(gpu: GpuHints, **changes: object) -> GpuHints:
    first = replace(gpu.free_mig_profiles[0], **changes)
    return replace(gpu, free_mig_profiles=(first, *gpu.free_mig_profiles[1:]))


def _new_peer(gpu: GpuHints, hints: NodeHints) -> GpuHints:
    missing = [g.uuid for g in hints.gpus if g.uuid not in gpu.nvlink_peers]
    return replace(gpu, nvlink_peers=(*gpu.nvlink_peers, missing[0]))


TENANT = TenantHint(name="ns/new", kind="pod", share_ratio=None, memory_limit_bytes=None, memory_used_bytes=0,
                    sm_util_ratio=None)
PROFILE = MigProfileHint(profile="1g.10gb", slice_count=1, memory_bytes=10 * GIB, creatable_count=1)

CHANGES: dict[str, Change] = {
    "healthy_gpu_count": lambda h: replace(h, healthy_gpu_count=h.healthy_gpu_count + 1),
    "schedulable_share_gpus": lambda h: replace(h, schedulable_share_gpus=h.schedulable_share_gpus + 0.5),
    "node memory_free_bytes": lambda h: replace(h, memory_free_bytes=h.memory_free_bytes + 1),
    "node memory_total_bytes": lambda h: replace(h, memory_total_bytes=h.memory_total_bytes + 1),
    "a GPU more": lambda h: replace(h, gpus=(*h.gpus, h.gpus[-1])) if h.gpus else None,
    "index": _on_gpu(_any, lambda g, _: replace(g, index=g.index + 100)),
    "health": _on_gpu(_any, lambda g, _: replace(g, health="lost" if g.health == "ok" else "ok")),
    "stale": _on_gpu(_any, lambda g, _: replace(g, stale=not g.stale)),
    "mig_enabled": _on_gpu(_any, lambda g, _: replace(g, mig_enabled=not g.mig_enabled)),
    "compute_mode": _on_gpu(_any, lambda g, _: replace(
        g, compute_mode="prohibited" if g.compute_mode != "prohibited" else None)),
    "sharing_mode": _on_gpu(_any, lambda g, _: replace(
        g, sharing_mode="exclusive" if g.sharing_mode != "exclusive" else "mps")),
    "schedulable_share_ratio": _on_gpu(_any, lambda g, _: replace(
        g, schedulable_share_ratio=g.schedulable_share_ratio + 0.01)),
    "memory_free_bytes": _on_gpu(_any, lambda g, _: replace(g, memory_free_bytes=g.memory_free_bytes + GIB)),
    "memory_total_bytes": _on_gpu(_any, lambda g, _: replace(
        g, memory_total_bytes=None if g.memory_total_bytes is not None else 80 * GIB)),
    "numa_node": _on_gpu(_any, lambda g, _: replace(g, numa_node=None if g.numa_node is not None else 0)),
    "a tenant more": _on_gpu(lambda g: not_whole_gpu(g) is None, lambda g, _: replace(
        g, tenants=(*g.tenants, TENANT))),
    "a named tenant's name": _on_gpu(_named, lambda g, _: replace(
        g, tenants=(replace(g.tenants[0], name=g.tenants[0].name + "-x"), *g.tenants[1:]))),
    "a free MIG profile more": _on_gpu(_any, lambda g, _: replace(
        g, free_mig_profiles=(*g.free_mig_profiles, PROFILE))),
    "profile": _on_gpu(lambda g: bool(g.free_mig_profiles), lambda g, _: _first_profile(
        g, profile=g.free_mig_profiles[0].profile + "+me")),
    "slice_count": _on_gpu(lambda g: bool(g.free_mig_profiles), lambda g, _: _first_profile(
        g, slice_count=g.free_mig_profiles[0].slice_count + 1)),
    "profile memory_bytes": _on_gpu(lambda g: bool(g.free_mig_profiles), lambda g, _: _first_profile(
        g, memory_bytes=(g.free_mig_profiles[0].memory_bytes or 0) + GIB)),
    "creatable_count": _on_gpu(lambda g: bool(g.free_mig_profiles), lambda g, _: _first_profile(
        g, creatable_count=g.free_mig_profiles[0].creatable_count + 1)),
    "an idle instance more": _on_gpu(lambda g: bool(g.free_mig_profiles), lambda g, _: _first_profile(
        g, idle_instances=(*g.free_mig_profiles[0].idle_instances, "MIG-new"))),
    "an NVLink peer on the node more": lambda h: _on_gpu(
        lambda g: any(o.uuid not in g.nvlink_peers for o in h.gpus), _new_peer)(h),
    "a UUID repeated": lambda h: replace(h, gpus=(h.gpus[0], replace(h.gpus[1], uuid=h.gpus[0].uuid),
                                                  *h.gpus[2:])) if regular(h) and len(h.gpus) > 1 else None,
    "a UUID missing": lambda h: replace(h, gpus=(replace(h.gpus[0], uuid=""), *h.gpus[1:]))
    if regular(h) and h.gpus else None,
}


TENANT_CHANGES = {"a tenant more", "a named tenant's name"}  # read by whole-GPU kinds alone, below


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hints=node_hints())
def test_states_that_differ_in_anything_read_get_different_keys(hints: NodeHints) -> None:
    key = verdict_key(hints)
    keys = kind_keys(hints)
    assert keys.exclusive == key
    for what, change in CHANGES.items():
        changed = change(hints)
        if changed is not None:
            assert verdict_key(changed) != key, what
            if what not in TENANT_CHANGES:  # what every kind reads changes every kind's key
                other = kind_keys(changed)
                assert other.shared != keys.shared and other.mig != keys.mig, what


def _whole_held(hints: NodeHints) -> int | None:
    """A GPU a whole-GPU request could use, held exclusively by a tenant: a shared request's reason names
    it ("held exclusively by")."""
    return next((pos for pos, g in enumerate(hints.gpus) if not_whole_gpu(g) is None and g.tenants
                 and g.sharing_mode == "exclusive"), None)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hints=node_hints())
def test_a_shared_key_differs_where_a_shared_reason_reads_a_tenant(hints: NodeHints) -> None:
    shared = kind_keys(hints).shared
    pos = _whole_held(hints)
    if pos is not None:
        gpu = hints.gpus[pos]
        renamed = replace(gpu, tenants=(replace(gpu.tenants[0], name=gpu.tenants[0].name + "-x"),
                                        *gpu.tenants[1:]))
        assert kind_keys(replace(hints, gpus=(*hints.gpus[:pos], renamed, *hints.gpus[pos + 1:]))).shared \
            != shared
    for pos, gpu in enumerate(hints.gpus):  # a tenant where there was none, on a GPU shared requests may use
        if not_whole_gpu(gpu) is None and not gpu.tenants:
            held = replace(gpu, tenants=(TENANT,))
            assert kind_keys(replace(hints, gpus=(*hints.gpus[:pos], held, *hints.gpus[pos + 1:]))).shared \
                != shared


def test_every_field_read_has_a_change_that_shows_in_the_key() -> None:
    """The changes above cover each field the key holds (by name, as they are listed)."""
    named = " ".join(CHANGES)
    for field in (NODE_READ | GPU_READ) - {"gpus", "uuid", "tenants", "free_mig_profiles", "nvlink_peers"}:
        assert field in named, field
    for part in ("GPU more", "UUID", "tenant", "MIG profile", "NVLink"):
        assert part in named, part


def test_the_key_is_the_same_bytes_for_equal_hints_built_apart() -> None:
    """Equal values, not the same objects (interned or not, shared or not): the same bytes."""
    name = "".join(["ns/", "pod"])  # a string built at run time, not interned
    gpu = GpuHints(uuid="GPU-a", index=0, model="m", health="ok", pci_bus_id="", numa_node=0,
                   memory_total_bytes=80 * GIB, memory_used_bytes=0, memory_allocated_bytes=0,
                   memory_free_bytes=80 * GIB, sm_util_ratio=None, sm_util_short_ratio=None,
                   sm_util_long_ratio=None, schedulable_share_ratio=1.0, sharing_mode="time_sliced",
                   tenants=(replace(TENANT, name=name),))
    one = NodeHints(hostname="a", taken_at_unix=1.0, gpus=(gpu, replace(gpu, uuid="GPU-b", index=1)),
                    healthy_gpu_count=2)
    two = NodeHints(hostname="b", taken_at_unix=2.0,
                    gpus=(replace(gpu, tenants=(replace(TENANT, name="ns/pod"),)),
                          replace(gpu, uuid="GPU-b", index=1, tenants=gpu.tenants)),
                    healthy_gpu_count=2)
    assert verdict_key(one) == verdict_key(two)
