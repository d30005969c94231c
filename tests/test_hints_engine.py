"""HintsEngine on hand-built snapshots: moving averages by elapsed time, tenants from allocations, processes,
annotations and the enforcer's decisions, sharing modes, memory and share accounting, network summary."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from snapshots import GIB, TAKEN_AT, lost_gpu_node, mig_node, two_gpu_node

from gpuagent.hints.engine import HintsEngine, network_hints
from gpuagent.snapshot.enforcement import EnforcementState, MemoryState, ShareState
from gpuagent.snapshot.network import LinkSample, NetworkState, RdmaPort
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import ProcessSample, Workload


def _with_util(snapshot: NodeSnapshot, percent: float, at: float) -> NodeSnapshot:
    gpus = tuple(replace(g, gpu_util_percent=percent) for g in snapshot.gpus)
    return replace(snapshot, gpus=gpus, taken_at_monotonic=at, taken_at_unix=TAKEN_AT + at)


def test_moving_averages_follow_elapsed_time() -> None:
    engine = HintsEngine(short_seconds=10.0, long_seconds=300.0)
    base = two_gpu_node()
    first = engine.update(_with_util(base, 0.0, 0.0)).gpus[0]
    assert first.sm_util_short_ratio == 0.0 and first.sm_util_long_ratio == 0.0  # starts at the first reading
    after = engine.update(_with_util(base, 100.0, 10.0)).gpus[0]  # a step to 100 %, 10 s later
    assert after.sm_util_ratio == 1.0
    assert math.isclose(after.sm_util_short_ratio, 1 - math.exp(-1), abs_tol=1e-4)
    assert math.isclose(after.sm_util_long_ratio, 1 - math.exp(-10 / 300), abs_tol=1e-4)
    # Many short polls add up to the same as one long one: the weighting is by time, not by count.
    stepped = HintsEngine()
    stepped.update(_with_util(base, 0.0, 0.0))
    for i in range(1, 101):
        hints = stepped.update(_with_util(base, 100.0, i * 0.1))
    assert math.isclose(hints.gpus[0].sm_util_short_ratio, after.sm_util_short_ratio, abs_tol=1e-4)


def test_engine_rejects_bad_time_constants() -> None:
    with pytest.raises(ValueError, match="short_seconds"):
        HintsEngine(short_seconds=0)
    with pytest.raises(ValueError, match="short_seconds"):
        HintsEngine(short_seconds=600, long_seconds=300)


def _pod(name: str, devices: tuple[str, ...], gpus: tuple[str, ...], **annotations: str) -> PodUse:
    return PodUse(name=name, namespace="ml", uid=f"uid-{name}", names_from="api_server",
                  containers=(ContainerUse("main", allocated_devices=devices),), allocated_gpus=gpus,
                  annotations=annotations)


def _pod_process(pid: int, pod: str, memory: int, sm: float) -> ProcessSample:
    workload = Workload(kind="pod", name=pod, namespace="ml", container="main", pod_uid=f"uid-{pod}")
    return ProcessSample(pid, "python", "compute", memory, sm, 0.0, workload=workload)


def test_tenants_shares_and_modes() -> None:
    snap = two_gpu_node()
    gpu0, gpu1 = snap.gpus
    u0, u1 = gpu0.info.uuid, gpu1.info.uuid
    # GPU 0: two pods on time-slicing replicas, one with annotations; GPU 1: one pod holds it whole.
    pods = (
        _pod("a", (f"{u0}::0",), (u0,), **{"gpuagent.io/gpu-share": "30%", "gpuagent.io/gpu-memory": "20Gi"}),
        _pod("b", (f"{u0}::1", f"{u0}::2"), (u0,), **{"gpuagent.io/gpu-share": "bogus"}),
        _pod("c", (u1,), (u1,)),
    )
    gpu0 = replace(gpu0, gpu_util_percent=50.0, memory_reserved_bytes=GIB, memory_free_bytes=80 * GIB,
                   processes=(_pod_process(11, "a", 8 * GIB, 30.0), _pod_process(12, "b", 2 * GIB, 20.0),
                              ProcessSample(13, "stray", "compute", GIB, 0.0, 0.0)))
    snap = replace(snap, gpus=(gpu0, gpu1), pods=pods)
    hints = HintsEngine().update(snap)
    h0, h1 = hints.gpus
    assert [t.name for t in h0.tenants] == ["ml/a", "ml/b", "unattributed"]
    a, b, stray = h0.tenants
    assert (a.share_ratio, a.memory_limit_bytes, a.replicas, a.allocated) == (0.3, 20 * GIB, 1, True)
    assert a.memory_used_bytes == 8 * GIB and a.sm_util_ratio == 0.3
    assert b.share_ratio is None and b.replicas == 2  # a bad annotation counts as no limit (reported elsewhere)
    assert stray.kind == "unknown" and not stray.allocated and stray.memory_used_bytes == GIB
    assert h0.sharing_mode == "time_sliced"
    assert h0.memory_allocated_bytes == 20 * GIB
    # 80 GiB less 1 GiB reserve, less a's 20 GiB limit (above its 8 GiB use), b's 2 GiB and the stray 1 GiB
    assert h0.memory_free_bytes == 80 * GIB - GIB - 20 * GIB - 2 * GIB - GIB
    assert math.isclose(h0.schedulable_share_ratio, 0.5)  # the 50 % use is above the 30 % promised
    assert h1.sharing_mode == "exclusive" and h1.schedulable_share_ratio == 0.0 and h1.memory_free_bytes == 0
    assert hints.free_gpu_count == 0


def test_enforcer_decisions_override_annotations() -> None:
    snap = two_gpu_node()
    u0 = snap.gpus[0].info.uuid
    pods = (_pod("a", (f"{u0}::0",), (u0,), **{"gpuagent.io/gpu-share": "30%"}),)
    enforcement = EnforcementState(
        mode="enforce",
        shares=(ShareState("a", "ml", u0, 0, limit_ratio=0.6, achieved_ratio=0.5, frozen_ratio=0.0,
                           throttled_seconds_total=0.0),),
        memory=(MemoryState("a", "ml", limit_bytes=10 * GIB, used_bytes=GIB, stage="ok"),),
    )
    gpu0 = replace(snap.gpus[0], gpu_util_percent=10.0, processes=(_pod_process(11, "a", GIB, 10.0),))
    hints = HintsEngine().update(replace(snap, gpus=(gpu0, snap.gpus[1]), pods=pods, enforcement=enforcement))
    tenant = hints.gpus[0].tenants[0]
    assert tenant.share_ratio == 0.6 and tenant.memory_limit_bytes == 10 * GIB
    assert math.isclose(hints.gpus[0].schedulable_share_ratio, 0.4)  # the promise is above the use


def test_mps_server_marks_the_mode_and_is_no_tenant() -> None:
    snap = two_gpu_node()
    # the devices name the server's kind (its /proc comm is cut to "nvidia-cuda-mps"): kind decides
    gpu0 = replace(snap.gpus[0], processes=(ProcessSample(5, "nvidia-cuda-mps", "mps_server", 0, 0.0, 0.0),
                                            ProcessSample(6, "client", "mps_client", GIB, 10.0, 0.0)))
    hints = HintsEngine().update(replace(snap, gpus=(gpu0, snap.gpus[1])))
    assert hints.gpus[0].sharing_mode == "mps"
    assert [t.name for t in hints.gpus[0].tenants] == ["unattributed"]


def test_mig_without_nvml_capacity_counts_the_unpartitioned_part() -> None:
    hints = HintsEngine().update(mig_node())
    gpu = hints.gpus[0]
    assert gpu.mig_enabled and gpu.sharing_mode == "mig" and gpu.mig_instances
    used = sum(i.slice_ratio for i in gpu.mig_instances)
    idle = sum(i.slice_ratio for i in gpu.mig_instances if i.idle)
    assert math.isclose(gpu.schedulable_share_ratio, idle + max(0.0, 1 - used), abs_tol=1e-5)


def test_unhealthy_and_stale_gpus() -> None:
    hints = HintsEngine().update(lost_gpu_node())
    for gpu, sample in zip(hints.gpus, lost_gpu_node().gpus, strict=True):
        assert gpu.health == sample.health.value and gpu.stale == sample.stale
        if sample.health.value != "ok":
            assert gpu.memory_free_bytes == 0 and gpu.schedulable_share_ratio == 0.0
        if sample.stale or sample.health.value != "ok":
            assert gpu.sm_util_short_ratio is None
    assert hints.healthy_gpu_count == sum(1 for g in hints.gpus if g.health == "ok")


def test_network_summary() -> None:
    assert network_hints(None) is None
    assert network_hints(NetworkState(error="netlink failed")) is None
    state = NetworkState(
        links=(
            LinkSample("eth0", "physical", "up", 9000, 100_000_000_000, 0, 0, 1e9, 2e9),
            LinkSample("ib0", "infiniband", "up", 4092, 400_000_000_000, 0, 0, 3e9, None),
            LinkSample("eth1", "physical", "down", 1500, None, 0, 0, None, None),
            LinkSample("veth1", "veth", "up", 1500, 10_000_000_000, 0, 0, 5e9, 5e9),
        ),
        rdma=(
            RdmaPort("mlx5_0", 1, "active", "infiniband", 400_000_000_000, "ib0", None, None, None, None),
            RdmaPort("mlx5_1", 1, "down", "ethernet", None, None, None, None, None, None),
        ),
    )
    summary = network_hints(state)
    assert summary is not None
    assert summary.links_up == 2 and summary.fastest_link_bits_per_second == 400_000_000_000
    assert summary.rx_bytes_per_second == 4e9 and summary.tx_bytes_per_second == 2e9
    assert summary.rdma_ports_active == 1 and summary.rdma_rate_bits_per_second == 400_000_000_000
    hints = HintsEngine().update(replace(two_gpu_node(), network=state))
    assert hints.network == summary


def test_a_gpu_gone_is_forgotten() -> None:
    engine = HintsEngine()
    snap = two_gpu_node()
    engine.update(snap)
    engine.update(replace(snap, gpus=snap.gpus[:1], taken_at_monotonic=snap.taken_at_monotonic + 1))
    back = engine.update(replace(_with_util(snap, 0.0, snap.taken_at_monotonic + 2)))
    assert back.gpus[1].sm_util_long_ratio == 0.0  # started afresh at its new reading
