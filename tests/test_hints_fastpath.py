"""The extender's fast path (``node_index`` + ``fit_node``, reasons written on demand) against the full
answer of ``score_node`` (what ``/v1/hints/score`` returns), over random hints and requests: same fit, GPUs,
score and reasons, and the extender's one-line reason is the one the full reasons give."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuagent.hints.agents import AgentEntry
from gpuagent.hints.codec import hints_from_jsonable, hints_to_jsonable
from gpuagent.hints.extender_protocol import extender_score
from gpuagent.hints.extender_verdict import Verdict, entry_verdict, shown_reason
from gpuagent.hints.score import NO_INDEX, FitRequest, FitResult, fit_node, node_index, score_node
from gpuagent.snapshot.hints import GpuHints, MigProfileHint, NodeHints, TenantHint

pytestmark = pytest.mark.long  # property tests of many seconds: handed out early (conftest.py)

GIB = 2**30
UUIDS = ("GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e", "GPU-f", "GPU-g", "GPU-h", "")
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")
RATIOS = st.one_of(st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 1.0]), st.floats(0.0, 1.0))

tenants = st.builds(
    TenantHint,
    name=st.sampled_from(["ns/a", "ns/b", "ns/c", "ns/d", "unknown"]),
    kind=st.sampled_from(["pod", "unknown"]),
    share_ratio=st.none() | RATIOS,
    memory_limit_bytes=st.none() | st.integers(0, 80).map(lambda n: n * GIB),
    memory_used_bytes=st.integers(0, 80 * GIB),
    sm_util_ratio=st.none() | RATIOS,
)
mig_profiles = st.builds(
    MigProfileHint,
    profile=st.sampled_from(PROFILES),
    slice_count=st.sampled_from([1, 2, 3, 7]),
    memory_bytes=st.none() | st.sampled_from([10 * GIB, 20 * GIB, 40 * GIB, 80 * GIB]),
    creatable_count=st.integers(-1, 3),
    idle_instances=st.lists(st.sampled_from(["MIG-1", "MIG-2", "MIG-3"]), max_size=3).map(tuple),
)


@st.composite
def gpu_hints(draw: st.DrawFn) -> GpuHints:
    total = draw(st.none() | st.sampled_from([0, 16 * GIB, 40 * GIB, 80 * GIB]))
    free = draw(st.integers(0, total or 80 * GIB))
    return GpuHints(
        uuid=draw(st.sampled_from(UUIDS)),
        index=draw(st.integers(0, 9)),
        model="sim",
        health=draw(st.sampled_from(["ok", "ok", "ok", "lost", "error"])),
        pci_bus_id="",
        numa_node=draw(st.none() | st.integers(0, 1)),
        memory_total_bytes=total,
        memory_used_bytes=None,
        memory_allocated_bytes=0,
        memory_free_bytes=free,
        sm_util_ratio=draw(st.none() | RATIOS),
        sm_util_short_ratio=None,
        sm_util_long_ratio=draw(st.none() | RATIOS),
        schedulable_share_ratio=draw(RATIOS),
        sharing_mode=draw(st.sampled_from(["none", "exclusive", "time_sliced", "mps", "mig"])),
        compute_mode=draw(st.sampled_from([None, "default", "exclusive_process", "prohibited"])),
        mig_enabled=draw(st.booleans()),
        tenants=tuple(draw(st.lists(tenants, max_size=5))),
        free_mig_profiles=tuple(draw(st.lists(mig_profiles, max_size=4))),
        nvlink_peers=tuple(draw(st.lists(st.sampled_from(UUIDS[:-1]), max_size=4, unique=True))),
        stale=draw(st.booleans()),
    )


@st.composite
def node_hints(draw: st.DrawFn) -> NodeHints:
    gpus = tuple(draw(st.lists(gpu_hints(), max_size=8)))
    if draw(st.booleans()):  # usually keys and indexes as an agent writes them: unique, in order
        gpus = tuple(replace(g, index=i, uuid=UUIDS[i] if g.uuid else "") for i, g in enumerate(gpus))
    healthy = [g for g in gpus if g.health == "ok"]
    return NodeHints(
        hostname="node",
        taken_at_unix=1000.0,
        gpus=gpus,
        gpu_count=len(gpus),
        healthy_gpu_count=len(healthy),
        memory_total_bytes=sum(g.memory_total_bytes or 0 for g in healthy),
        memory_free_bytes=sum(g.memory_free_bytes for g in healthy),
        schedulable_share_gpus=sum(g.schedulable_share_ratio for g in healthy),
    )


@st.composite
def requests(draw: st.DrawFn) -> FitRequest:
    kind = draw(st.sampled_from(["shared", "exclusive", "mig"]))
    memory = draw(st.none() | st.sampled_from([1 * GIB, 8 * GIB, 20 * GIB, 50 * GIB]) | st.integers(1, 90 * GIB))
    return FitRequest(
        gpus=draw(st.integers(1, 4)),
        memory_bytes=memory,
        share=draw(st.none() | st.sampled_from([0.1, 0.3, 0.5, 1.0]) | st.floats(0.01, 1.0))
        if kind == "shared" else None,
        mig_profile=draw(st.sampled_from(PROFILES)) if kind == "mig" else None,
        exclusive=kind == "exclusive",
        policy=draw(st.sampled_from(["binpack", "spread"])),
    )


def summary(hints: NodeHints, result: FitResult) -> str:
    """The extender's one-line reason, written from the full reasons (the rule the fast path must keep):
    the node's reason, then the first GPU's by index (GPUs without a UUID last) and how many more."""
    index = {gpu.uuid: gpu.index for gpu in hints.gpus}
    parts = [result.reasons["node"]] if "node" in result.reasons else []
    per_gpu = sorted((index.get(k, NO_INDEX), k, v) for k, v in result.reasons.items() if k != "node")
    if per_gpu:
        gpu, uuid, why = per_gpu[0]
        more = f" (+{len(per_gpu) - 1} more GPUs)" if len(per_gpu) > 1 else ""
        parts.append(f"GPU {gpu if gpu != NO_INDEX else uuid}: {why}{more}")
    return shown_reason("; ".join(parts) or "does not fit")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hints=node_hints(), request=requests())
def test_fast_path_answers_as_score_node(hints: NodeHints, request: FitRequest) -> None:
    full = score_node(hints, request, now=hints.taken_at_unix + 1)
    fit = fit_node(node_index(hints), request)
    assert (fit.fits, fit.score) == (full.fits, full.score)
    assert fit.reasons() == dict(full.reasons) and list(fit.reasons()) == list(full.reasons)
    if full.fits:
        assert fit.gpus == full.gpus
        expected = Verdict(True, score=extender_score(full.score))
    else:
        expected = Verdict(False, reason=summary(hints, full))
    verdict = entry_verdict(AgentEntry(node="node", url=None, hints=hints, index=node_index(hints)), request)
    assert verdict == expected
    # The index is built from the hints alone: a decoded copy (what the extender holds) answers alike.
    copy = hints_from_jsonable(hints_to_jsonable(hints))
    assert score_node(copy, request, now=hints.taken_at_unix + 1) == full


def test_extender_entry_without_index_is_indexed_on_demand() -> None:
    gpu = GpuHints(uuid="GPU-a", index=0, model="sim", health="ok", pci_bus_id="", numa_node=0,
                   memory_total_bytes=80 * GIB, memory_used_bytes=0, memory_allocated_bytes=0,
                   memory_free_bytes=80 * GIB, sm_util_ratio=0.0, sm_util_short_ratio=0.0,
                   sm_util_long_ratio=0.0, schedulable_share_ratio=1.0, sharing_mode="none")
    hints = NodeHints(hostname="n", taken_at_unix=1.0, gpus=(gpu,), gpu_count=1, healthy_gpu_count=1,
                      memory_total_bytes=80 * GIB, memory_free_bytes=80 * GIB, schedulable_share_gpus=1.0)
    other = node_index(replace(hints, hostname="other"))  # an index of other hints is not used
    request = FitRequest(gpus=2, exclusive=True)
    for index in (None, other):
        verdict = entry_verdict(AgentEntry(node="n", url=None, hints=hints, index=index), request)
        assert verdict == Verdict(False, reason="gpuagent: needs 2 GPUs, 1 can take it")
