"""``gpuagent recommend`` without a real Prometheus: grouping pods into workloads, percentiles and
histories, every rule, the savings arithmetic and first-fit decreasing packing (hand-checked), patches,
the output formats, and the command's exit 2 on anything wrong. ``tests/test_recommend_backfill.py`` runs
it on a week in a real Prometheus; ``tests/test_recommend_e2e.py`` against a real agent.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_report import serve

from gpuagent.cli import main
from gpuagent.prom.errors import ReportError
from gpuagent.prom.prices import Prices
from gpuagent.prom.timerange import TimeRange
from gpuagent.recommend.cli import parse_percent
from gpuagent.recommend.formats import renderer
from gpuagent.recommend.history import PodHistory, build_stats, distribution, percentile
from gpuagent.recommend.model import (
    GIB,
    Action,
    Distribution,
    Options,
    PoolPacking,
    Recommendation,
    Recommendations,
    Row,
    Savings,
    WorkloadKey,
    WorkloadStats,
)
from gpuagent.recommend.packing import Item, first_fit_decreasing, pack
from gpuagent.recommend.patches import patch_for, write_patches
from gpuagent.recommend.rules import recommend, round_memory, round_share
from gpuagent.recommend.savings import savings, totals
from gpuagent.recommend.workloads import group_by_workload, name_without_suffix, pod_workload, unit_workload

H100, L4, A100_40 = "NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100-SXM4-40GB"
H100_MEMORY = 81559 * 2**20
L4_MEMORY = 23034 * 2**20
WEEK = 7 * 86400.0
DEPLOYMENT = WorkloadKey("serving", "Deployment", "llm-api")


def dist(p50: float, p99: float, peak: float | None = None, *, p95: float | None = None,
         samples: int = 2016) -> Distribution:
    return Distribution(p50, p95 if p95 is not None else p99, p99, peak if peak is not None else p99, samples, p99)


def stats(key: WorkloadKey = DEPLOYMENT, **changes: Any) -> WorkloadStats:
    """A week on one whole H100, steady at 20 % SM and 9 GiB; ``changes`` as in dataclasses.replace."""
    base = WorkloadStats(
        key=key, pods=("llm-api-7d9c6b8f5d-x2k4p",), containers=("vllm",), gpu_model=H100, gpus_held=1.0,
        devices=1, device_size=1.0, devices_per_pod=1, allocated_gpu_seconds=WEEK, busy_gpu_seconds=0.2 * WEEK,
        idle_gpu_seconds=0.0, sm=dist(0.20, 0.22), memory=dist(9 * GIB, 9 * GIB),
        memory_limit_bytes=None, memory_capacity_bytes=H100_MEMORY, gpu_memory_bytes=H100_MEMORY,
        share_limit_ratio=None, mig_profile=None, throttled_seconds=0.0, ladder_restarts=0, seen_seconds=WEEK,
        days_seen=7)
    return dataclasses.replace(base, **changes)


# -- workloads from pods ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pod", "workload"), [
    ("llm-api-7d9c6b8f5d-x2k4p", "llm-api"),  # Deployment: template hash + random
    ("web-5f6d7c8b9-z9x8w", "web"),
    ("nightly-eval-29412000-h7x2k", "nightly-eval"),  # CronJob: scheduled minute + random
    ("etl-once-4kq9z", "etl-once"),  # Job or DaemonSet: random
    ("postgres-2", "postgres"),  # StatefulSet ordinal
    ("alice-0", "alice"),
    ("standalone", "standalone"),
    ("my-server-abcde", "my-server-abcde"),  # vowels: not a generated suffix
    ("trainer-v2", "trainer-v2"),
])
def test_pod_names_lose_what_kubernetes_generated(pod: str, workload: str) -> None:
    assert name_without_suffix(pod) == workload


def test_pods_are_grouped_by_their_owner_else_by_name() -> None:
    assert pod_workload("serving", "llm-api-7d9c6b8f5d-x2k4p", [("Deployment", "llm-api")]) == \
        WorkloadKey("serving", "Deployment", "llm-api", "api_server")
    # owner unknown for a while (the agent was still asking), then known: the known one
    assert pod_workload("serving", "x-7d9c6b8f5d-x2k4p", [("", ""), ("Deployment", "x")]).kind == "Deployment"
    # the walk stopped at the ReplicaSet (RBAC): its Deployment by its name; at a Job of a CronJob, likewise
    assert pod_workload("ml", "web-7d9c6b8f5d-x2k4p", [("ReplicaSet", "web-7d9c6b8f5d")]) == \
        WorkloadKey("ml", "Deployment", "web", "owner_name")
    assert pod_workload("ml", "n-29412000-h7x2k", [("Job", "n-29412000")]) == \
        WorkloadKey("ml", "CronJob", "n", "owner_name")
    assert pod_workload("ml", "etl-4kq9z", [("Job", "etl")]) == WorkloadKey("ml", "Job", "etl", "api_server")
    # both seen (the agent's RBAC was fixed mid-range): the top owner wins
    assert pod_workload("ml", "web-7d9c6b8f5d-x2k4p",
                        [("ReplicaSet", "web-7d9c6b8f5d"), ("Deployment", "web")]).kind == "Deployment"
    assert pod_workload("ml", "web-7d9c6b8f5d-x2k4p") == WorkloadKey("ml", "", "web", "pod_name")
    assert pod_workload("ml", "debug", [("Pod", "debug")]) == WorkloadKey("ml", "Pod", "debug", "api_server")
    key = unit_workload("slurm_job", "job_4242")
    assert (str(key), key.is_pod) == ("slurm_job/job_4242", False)
    assert str(WorkloadKey("ml", "", "web", "pod_name")) == "ml/~/web"


def test_one_workload_whose_pods_had_their_owners_read_differently_is_one_group_and_one_patch(
    tmp_path: Path,
) -> None:
    """docs/recommend.md groups by (namespace, owner kind, owner name): one pod read as its Deployment and
    another only as its ReplicaSet (the agent's walk was refused for it) are one Deployment; so is a pod
    whose owner was never read but whose ReplicaSet named it."""
    seen = [("web-7d9c6b8f5d-x2k4p", [("Deployment", "web")]),
            ("web-7d9c6b8f5d-b9m7q", [("ReplicaSet", "web-7d9c6b8f5d")]),
            ("web-7d9c6b8f5d-q2w4z", [("ReplicaSet", "web-7d9c6b8f5d"), ("", "")]),
            ("api-6c8d9f7b5-h7j8k", [("ReplicaSet", "api-6c8d9f7b5")])]
    grouped = group_by_workload((pod, pod_workload("ml", pod, owners), pod) for pod, owners in seen)
    assert grouped == {
        WorkloadKey("ml", "Deployment", "web", "api_server"): {p: p for p, _ in seen[:3]},
        WorkloadKey("ml", "Deployment", "api", "owner_name"): {seen[3][0]: seen[3][0]},
    }
    assert [key.source for key in grouped] == ["api_server", "owner_name"]  # the surest source names it
    # units never join a pod's group, even of the same name
    mixed = group_by_workload([("a", unit_workload("slurm_job", "x"), 1), ("b", WorkloadKey("", "slurm_job", "x",
                                                                                           "api_server"), 2)])
    assert len(mixed) == 2
    # one row per workload: one patch file, listed once in the kustomize Component
    written, _ = write_patches([row_of(SHARE, key) for key in grouped], tmp_path)
    assert len(written) == 2
    component = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    paths = [p["path"] for p in component["patches"]]
    assert sorted(paths) == sorted(set(paths)) == ["ml.deployment.api.yaml", "ml.deployment.web.yaml"]


# -- histories ----------------------------------------------------------------------------------------------------

def test_percentiles_interpolate_between_the_nearest_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.5 and percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100 and percentile(values, 0) == 1
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    d = distribution([0.1] * 90 + [0.5] * 10, peak=0.9, chosen=99)
    assert (d.p50, d.p95, d.p99, d.max, d.samples, d.chosen) == (0.1, 0.5, 0.5, 0.9, 100, 0.5)
    assert distribution([], peak=None, chosen=99) is None


def test_a_workload_pools_its_pods_and_adds_what_they_held_at_once() -> None:
    start, step = 0.0, 300.0
    a, b = PodHistory(), PodHistory()
    for k in range(1, 289):  # a: a whole day on 1 GPU
        t = start + k * step
        a.sm[t], a.memory[t], a.held[t], a.devices[t] = 0.2, 8 * GIB, 1.0, 1.0
    for k in range(145, 289):  # b: the second half, a 2g MIG slice (2/7 of a GPU)
        t = start + k * step
        b.sm[t], b.memory[t], b.held[t], b.devices[t] = 0.6, 4 * GIB, 2 / 7, 1.0
    b.held[start + 145 * step] = 1 / 7  # its first step, held for half of it: not its size
    a.totals["GPU-a"] = {"allocated_seconds": 86400.0, "busy_seconds": 17280.0, "idle_allocated_seconds": 0.0}
    b.totals["MIG-b"] = {"allocated_seconds": 43200 * 2 / 7, "busy_seconds": 5000.0, "throttled_seconds": 60.0}
    a.sm_peak, b.memory_peak, b.mig_profiles = 0.7, 5 * GIB, {"2g.20gb"}
    b.memory_limit, b.ladder_restarts, a.containers, b.containers = 6 * GIB, 1.0, {"main"}, {"main", "side"}
    s = build_stats(DEPLOYMENT, {"a": a, "b": b}, {"GPU-a": H100, "MIG-b": H100}, {H100: H100_MEMORY},
                    start, step, 99)
    assert s.pods == ("a", "b") and s.containers == ("main", "side") and s.gpu_model == H100
    assert s.devices == 2 and s.devices_per_pod == 1
    assert s.device_size == 1.0  # the median of its pods' steps: a whole GPU (288 of 432)
    assert s.gpus_held == 2.0  # 2 devices at once, of that size
    assert s.allocated_gpu_seconds == pytest.approx(86400 + 43200 * 2 / 7)
    assert s.busy_gpu_seconds == 22280.0 and s.idle_gpu_seconds == 0.0 and s.throttled_seconds == 60.0
    assert s.sm.samples == 288 + 144 and s.sm.max == 0.7 and s.sm.p50 == 0.2 and s.sm.p99 == 0.6
    assert s.memory.max == 8 * GIB  # b's 5 GiB peak is below a's samples
    assert s.memory_limit_bytes == 6 * GIB and s.memory_capacity_bytes == 6 * GIB  # under 2g's 19.6 GiB
    assert s.mig_profile == "2g.20gb"  # the one MIG profile its pods ran on
    assert s.ladder_restarts == 1 and s.seen_seconds == 288 * step and s.days_seen == 1
    only_b = build_stats(DEPLOYMENT, {"b": dataclasses.replace(b, memory_limit=None)}, {"MIG-b": H100},
                         {H100: H100_MEMORY}, start, step, 99)
    assert only_b.mig_profile == "2g.20gb" and only_b.memory_capacity_bytes == 20096 * 2**20
    assert only_b.device_size == pytest.approx(2 / 7, abs=1e-3)



def test_a_whole_gpu_read_through_the_rates_jitter_is_a_whole_gpu() -> None:
    """GPUs held are rates of allocated seconds over a short window, which scrape timing moves by a few
    percent (a median of 0.994 was read for a whole GPU under load, and packed as shared); device sizes are
    whole, k/7 MIG slices or 1/N replicas, so a median over 0.9 is whole and one of 0.57 stays 4/7."""
    start, step = 0.0, 1.0
    jittery, slice_ = PodHistory(), PodHistory()
    for k in range(1, 17):
        t = start + k * step
        jittery.held[t], jittery.devices[t] = (0.97, 1.02, 0.994, 0.99)[k % 4], 1.0
        slice_.held[t], slice_.devices[t] = 4 / 7 * (1 + 0.02 * (-1) ** k), 1.0
    jittery.totals["GPU-a"] = {"allocated_seconds": 16.0}
    slice_.totals["MIG-b"] = {"allocated_seconds": 16 * 4 / 7}
    whole = build_stats(DEPLOYMENT, {"a": jittery}, {"GPU-a": H100}, {H100: H100_MEMORY}, start, step, 99)
    assert whole.device_size == 1.0 and whole.gpus_held == 1.0
    part = build_stats(DEPLOYMENT, {"b": slice_}, {"MIG-b": H100}, {H100: H100_MEMORY}, start, step, 99)
    assert part.device_size == pytest.approx(4 / 7, abs=0.02)

# -- rules --------------------------------------------------------------------------------------------------------

def test_rounding_is_up_and_bounded() -> None:
    assert [round_share(x) for x in (0.001, 0.05, 0.051, 0.264, 0.54, 0.96, 1.3)] == \
        pytest.approx([0.05, 0.05, 0.10, 0.30, 0.55, 1.0, 1.0])
    assert round_memory(10.8 * GIB) == 11 * GIB and round_memory(6 * GIB) == 6 * GIB
    assert round_memory(3.6 * GIB) == 3840 * 2**20 and round_memory(1) == 256 * 2**20


def test_an_inference_service_at_20_percent_with_9_gib_fits_mig_2g_on_an_h100() -> None:
    rec = recommend(stats(), Options())
    assert rec.action is Action.MIG and rec.mig_profile == "2g.20gb" and rec.size == pytest.approx(2 / 7)
    assert rec.mig_slices == (2, 2, 7, 8) and rec.memory_bytes == 20096 * 2**20
    assert rec.resources == {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": 1}
    assert rec.reason.startswith("p99 SM 22%, memory peak 9.0 GiB (+20% headroom: 26.4% SM, 11Gi); MIG 2g.20gb")
    # smaller still: 1g.10gb holds 8 % SM and 3 GiB; but 12 GiB needs 2g's memory though 1g's compute would do
    assert recommend(stats(sm=dist(0.05, 0.08), memory=dist(3 * GIB, 3 * GIB)), Options()).mig_profile == "1g.10gb"
    assert recommend(stats(sm=dist(0.05, 0.08), memory=dist(12 * GIB, 12 * GIB)), Options()).mig_profile == "2g.20gb"
    # on an A100 40GB the table is its own: 2g.10gb (9856 MiB) cannot hold 10.8 GiB, 3g.20gb can
    assert recommend(stats(gpu_model=A100_40, gpu_memory_bytes=40960 * 2**20), Options()).mig_profile == "3g.20gb"


def test_without_mig_steady_use_gets_mps_and_bursty_use_a_share() -> None:
    steady = recommend(stats(gpu_model=L4, gpu_memory_bytes=L4_MEMORY, sm=dist(0.30, 0.32)), Options())
    assert steady.action is Action.MPS and steady.mps_thread_percent == 40 and steady.memory_bytes == 11 * GIB
    assert steady.env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=11264M"}
    assert steady.annotations == {"gpuagent.io/gpu-memory": "11Gi"}
    assert steady.size == pytest.approx(max(0.40, 11 * GIB / L4_MEMORY))  # memory binds: 11 of 22.5 GiB
    two = recommend(stats(gpu_model=L4, gpu_memory_bytes=L4_MEMORY, sm=dist(0.30, 0.32), devices_per_pod=2),
                    Options())
    assert two.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=11264M,1=11264M"
    bursty = recommend(stats(gpu_model=L4, gpu_memory_bytes=L4_MEMORY, sm=dist(0.10, 0.45),
                             memory=dist(3 * GIB, 5 * GIB)), Options())
    assert bursty.action is Action.SHARE and bursty.short == "share 55% 6Gi"
    assert bursty.annotations == {"gpuagent.io/gpu-share": "55%", "gpuagent.io/gpu-memory": "6Gi"}
    assert "bursty use" in bursty.reason


def test_the_sharing_flag_forces_one_way() -> None:
    assert recommend(stats(), Options(sharing="share")).short == "share 30% 11Gi"
    assert recommend(stats(), Options(sharing="mps")).short == "MPS 30% 11Gi"
    forced = recommend(stats(gpu_model=L4, gpu_memory_bytes=L4_MEMORY), Options(sharing="mig"))
    assert forced.action is Action.SHARE and "(no MIG profile table for NVIDIA L4)" in forced.reason
    with pytest.raises(ValueError, match="sharing"):
        recommend(stats(), Options(sharing="vgpu"))


def test_a_trainer_that_needs_its_gpu_is_kept_and_so_is_what_is_already_small() -> None:
    trainer = recommend(stats(sm=dist(0.95, 0.98), memory=dist(70 * GIB, 70 * GIB), devices_per_pod=2), Options())
    assert trainer.action is Action.KEEP and trainer.reason.endswith("of a GPU or more; keep them whole")
    big_memory = recommend(stats(sm=dist(0.05, 0.1), memory=dist(50 * GIB, 55 * GIB)), Options())
    assert big_memory.action is Action.KEEP  # 55 GiB x 1.2 = 66 of 79.6 GiB: 83 %
    # already on a quarter of a GPU (a time-slicing replica): a 30 % share is no smaller
    replica = recommend(stats(gpu_model=L4, gpu_memory_bytes=L4_MEMORY, sm=dist(0.1, 0.24), device_size=0.25,
                              memory=dist(GIB, GIB)), Options())
    assert replica.action is Action.KEEP and "no larger than share 30%" in replica.reason
    mig = recommend(stats(sm=None, busy_gpu_seconds=0.3 * WEEK), Options())
    assert mig.action is Action.KEEP and "no per-process SM figures" in mig.reason and "30%" in mig.reason


def test_idle_allocations_are_released() -> None:
    notebook = stats(idle_gpu_seconds=0.9 * WEEK, sm=dist(0.0, 0.5), memory=dist(4 * GIB, 12 * GIB))
    rec = recommend(notebook, Options())
    assert rec.action is Action.RELEASE and rec.size == 0.0
    assert rec.reason.startswith("idle 90% of the time it held its GPU: release it when idle")
    assert "p99 50% SM and at most 12.0 GiB" in rec.reason
    assert recommend(notebook, Options(release_idle=0.95)).action is not Action.RELEASE
    two = recommend(dataclasses.replace(notebook, gpus_held=2.0), Options())
    assert "held its 2 GPUs" in two.reason


def test_needing_more_memory_or_time() -> None:
    near_limit = stats(memory=dist(14 * GIB, 15.2 * GIB), memory_limit_bytes=16 * GIB,
                       memory_capacity_bytes=16 * GIB)
    rec = recommend(near_limit, Options())
    assert rec.action is Action.NEEDS_MORE and rec.annotations == {"gpuagent.io/gpu-memory": "19Gi"}
    assert "its memory peak 15.2 GiB is 95% of the 16.0 GiB one device holds" in rec.reason
    assert rec.short == "needs more 19Gi"
    stopped = recommend(stats(ladder_restarts=3, memory_limit_bytes=16 * GIB, memory_capacity_bytes=16 * GIB),
                        Options())
    assert stopped.action is Action.NEEDS_MORE and "terminated or evicted it 3 time(s)" in stopped.reason
    assert stopped.memory_bytes == 11 * GIB  # 9 GiB peak + 20 %: the limit was below what it used
    on_mig = recommend(stats(mig_profile="1g.10gb", memory=dist(9 * GIB, 9.5 * GIB),
                             memory_capacity_bytes=9984 * 2**20), Options())
    assert on_mig.mig_profile == "2g.20gb" and on_mig.short == "needs more MIG 2g.20gb"
    assert on_mig.resources == {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": None, "nvidia.com/mig-2g.20gb": 1}
    whole = recommend(stats(memory=dist(70 * GIB, 78 * GIB)), Options())
    assert whole.action is Action.NEEDS_MORE and "a GPU with more memory" in whole.reason and not whole.annotations
    throttled = recommend(stats(share_limit_ratio=0.3, throttled_seconds=0.2 * WEEK), Options())
    assert throttled.annotations == {"gpuagent.io/gpu-share": "45%"}  # 30 % x 1.2 / 0.8
    unlimited = recommend(stats(throttled_seconds=0.1 * WEEK), Options())
    assert unlimited.action is Action.NEEDS_MORE and "give it a larger share" in unlimited.reason
    assert recommend(stats(throttled_seconds=0.01 * WEEK), Options()).action is Action.MIG  # 1 %: not enough


def test_too_little_history_says_so_instead_of_guessing() -> None:
    rec = recommend(stats(seen_seconds=3 * 3600, days_seen=1), Options())
    assert rec.action is Action.INSUFFICIENT and rec.short == "insufficient history"
    assert rec.reason == ("too little history: it held GPUs for 3h on 1 day(s) of the range (1d needed); "
                          "no recommendation")
    assert recommend(stats(seen_seconds=3 * 3600), Options(min_history_seconds=3600)).action is Action.MIG


# -- savings and packing ------------------------------------------------------------------------------------------

def test_savings_arithmetic_by_hand() -> None:
    prices = Prices(gpu_hour_by_model=(("NVIDIA H100*", 4.0),))
    week = 168.0
    mig = savings(stats(), Recommendation(Action.MIG, "", size=2 / 7), WEEK, prices)
    assert (mig.current_gpu_hours_week, mig.recommended_gpu_hours_week) == pytest.approx((week, 48.0))
    assert mig.saved_gpu_hours_week == pytest.approx(120.0) and mig.cost_saved_week == pytest.approx(480.0)
    # half a week of history, a 25 % share: 84 GPU-hours held in it are 168 a week, 42 after
    half = savings(stats(allocated_gpu_seconds=WEEK / 2), Recommendation(Action.SHARE, "", size=0.25), WEEK / 2,
                   prices)
    assert (half.current_gpu_hours_week, half.recommended_gpu_hours_week) == pytest.approx((168.0, 42.0))
    # from a 3g MIG slice (3/7 of a GPU, as the counters count it) to 1g: a third of its GPU-hours
    slice_ = savings(stats(allocated_gpu_seconds=WEEK * 3 / 7, device_size=3 / 7),
                     Recommendation(Action.MIG, "", size=1 / 7), WEEK, prices)
    assert slice_.recommended_gpu_hours_week == pytest.approx(week * 3 / 7 / 3)
    released = savings(stats(idle_gpu_seconds=0.9 * WEEK), Recommendation(Action.RELEASE, "", size=0.0), WEEK,
                       prices)
    assert released.recommended_gpu_hours_week == pytest.approx(16.8)
    for action in (Action.KEEP, Action.NEEDS_MORE, Action.INSUFFICIENT):
        kept = savings(stats(), Recommendation(action, "", size=0.1), WEEK, prices)
        assert kept.saved_gpu_hours_week == 0 and kept.cost_saved_week == 0
    unpriced = savings(stats(gpu_model=L4), Recommendation(Action.MIG, "", size=0.5), WEEK, prices)
    assert unpriced.cost_saved_week is None
    assert savings(stats(), Recommendation(Action.MIG, "", size=0.5), WEEK, Prices()).cost_saved_week is None
    with pytest.raises(ValueError):
        savings(stats(), Recommendation(Action.KEEP, ""), 0.0, prices)
    rows = [Row(stats(), Recommendation(Action.MIG, "", size=2 / 7), mig),
            Row(stats(), Recommendation(Action.RELEASE, ""), released)]
    total = totals(rows, priced=True)
    assert total.saved_gpu_hours_week == pytest.approx(120.0 + 151.2)
    assert total.cost_saved_week == pytest.approx(480.0 + 151.2 * 4)
    assert totals([*rows, Row(stats(), Recommendation(Action.MIG, ""), unpriced)], priced=True).cost_saved_week is None


def test_first_fit_decreasing_by_hand() -> None:
    sizes = [0.5, 0.7, 0.5, 0.2, 0.4, 0.2, 0.5, 0.1, 0.6]
    bins = first_fit_decreasing([Item((s,)) for s in sizes], (1.0,))
    # .7 .6 .5 .5 | .5 .4 .2 .2 .1: [.7 .2 .1] [.6 .4] [.5 .5] [.5 .2]
    assert [sorted(i.sizes[0] for i in b) for b in bins] == [[0.1, 0.2, 0.7], [0.4, 0.6], [0.5, 0.5], [0.2, 0.5]]
    two = first_fit_decreasing([Item(s) for s in ((0.6, 0.2), (0.5, 0.5), (0.3, 0.7), (0.3, 0.2))], (1, 1))
    assert [[i.sizes for i in b] for b in two] == [[(0.3, 0.7), (0.6, 0.2)], [(0.5, 0.5), (0.3, 0.2)]]
    mig = (7, 8, 7)  # compute slices, memory slices, instances
    assert len(first_fit_decreasing([Item((2, 2, 1))] * 4, mig)) == 2  # three 2g per GPU
    assert len(first_fit_decreasing([Item((1, 1, 1))] * 7, mig)) == 1
    assert len(first_fit_decreasing([Item((1, 1, 1))] * 8, mig)) == 2
    assert len(first_fit_decreasing([Item((3, 4, 1)), Item((4, 4, 1))], mig)) == 1  # 3g + 4g
    assert len(first_fit_decreasing([Item((1.5,))], (1.0,))) == 1  # too big: a bin of its own
    assert first_fit_decreasing([], (1.0,)) == []


def test_the_pool_packing_per_model() -> None:
    def row(rec: Recommendation, **changes: Any) -> Row:
        s = stats(**changes)
        return Row(s, rec, savings(s, rec, WEEK, Prices()))

    rows = [
        row(Recommendation(Action.KEEP, ""), devices=2, gpus_held=2.0),
        row(Recommendation(Action.MIG, "", size=2 / 7, mig_slices=(2, 2, 7, 8)), devices=4, gpus_held=4.0),
        row(Recommendation(Action.SHARE, "", size=0.3, share_ratio=0.3, memory_bytes=11 * GIB)),
        row(Recommendation(Action.SHARE, "", size=0.6, share_ratio=0.6, memory_bytes=11 * GIB)),
        row(Recommendation(Action.RELEASE, "", size=0.0)),
        row(Recommendation(Action.KEEP, ""), device_size=0.25, gpus_held=0.25),  # a replica stays one
        row(Recommendation(Action.MPS, "", size=0.4, mps_thread_percent=40, memory_bytes=4 * GIB),
            gpu_model=L4, gpu_memory_bytes=L4_MEMORY, devices=3, gpus_held=3.0),
    ]
    h100, l4 = pack(rows)
    # H100: 2 + 4 + 1 + 1 + 1 + 0.25 = 9.25 -> 10 now; after: 2 whole, 4 x 2g in 2 MIG GPUs, and time-sliced
    # 0.6 + 0.3 in one (memory 2 x 11 of 79.6 GiB fits), the replica's 0.25 in a second (1.15 > 1)
    assert h100 == PoolPacking(H100, 10, whole=2, shared=2, mps=0, mig=2, released=1)
    assert h100.gpus_after == 6
    assert l4 == PoolPacking(L4, 3, whole=0, shared=0, mps=2, mig=0, released=0)  # 3 x (0.40, 0.18): 2 + 1


# -- patches ------------------------------------------------------------------------------------------------------

def row_of(rec: Recommendation, key: WorkloadKey = DEPLOYMENT, **changes: Any) -> Row:
    s = stats(key, **changes)
    return Row(s, rec, Savings(1.0, 1.0))


SHARE = Recommendation(Action.SHARE, "bursty", size=0.55, share_ratio=0.55, memory_bytes=6 * GIB,
                       annotations={"gpuagent.io/gpu-share": "55%", "gpuagent.io/gpu-memory": "6Gi"})
MIG = Recommendation(Action.MIG, "fits 2g", size=2 / 7, mig_profile="2g.20gb",
                     resources={"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": 1})


def test_patches_by_kind() -> None:
    deployment = patch_for(row_of(SHARE))
    assert not isinstance(deployment, str) and deployment.file_name == "serving.deployment.llm-api.yaml"
    assert yaml.safe_load(deployment.text) == {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm-api", "namespace": "serving"},
        "spec": {"template": {"metadata": {"annotations": {"gpuagent.io/gpu-share": "55%",
                                                           "gpuagent.io/gpu-memory": "6Gi"}}}}}
    cron = patch_for(row_of(MIG, WorkloadKey("batch", "CronJob", "etl"), containers=("etl", "uploader")))
    assert not isinstance(cron, str)
    body = yaml.safe_load(cron.text)
    assert body["apiVersion"] == "batch/v1"
    containers = body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["etl", "uploader"]
    assert containers[0]["resources"]["limits"] == {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"}
    bare = patch_for(row_of(SHARE, WorkloadKey("ml", "Pod", "debug")))
    assert not isinstance(bare, str)
    assert yaml.safe_load(bare.text)["metadata"]["annotations"]["gpuagent.io/gpu-share"] == "55%"
    assert "spec" not in yaml.safe_load(bare.text)


@pytest.mark.parametrize(("rec", "key", "changes", "why"), [
    (Recommendation(Action.KEEP, ""), DEPLOYMENT, {}, "nothing to set (keep)"),
    (Recommendation(Action.RELEASE, ""), DEPLOYMENT, {}, "nothing to set (release)"),
    (SHARE, WorkloadKey("", "slurm_job", "job_1", "unit"), {}, "not a Kubernetes workload (slurm_job)"),
    (SHARE, WorkloadKey("ml", "", "web", "pod_name"), {}, "grouped by pod name"),
    (SHARE, WorkloadKey("ml", "Notebook", "alice"), {}, "a Notebook is not a built-in kind: set "
                                                         "gpuagent.io/gpu-share=55%, gpuagent.io/gpu-memory=6Gi"),
    (MIG, WorkloadKey("ml", "Pod", "debug"), {}, "a bare Pod's containers cannot change"),
    (MIG, DEPLOYMENT, {"containers": ()}, "no container names in Prometheus: set limits nvidia.com/gpu: (removed)"),
])
def test_no_patch_says_why(rec: Recommendation, key: WorkloadKey, changes: dict, why: str) -> None:
    reason = patch_for(row_of(rec, key, **changes))
    assert isinstance(reason, str) and reason.startswith(why), reason


def test_write_patches_with_a_kustomize_component(tmp_path: Path) -> None:
    written, skipped = write_patches([row_of(SHARE), row_of(Recommendation(Action.KEEP, ""))], tmp_path / "p")
    assert [p.file_name for p in written] == ["serving.deployment.llm-api.yaml"] and len(skipped) == 1
    component = yaml.safe_load((tmp_path / "p" / "kustomization.yaml").read_text())
    assert component == {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
                         "patches": [{"path": "serving.deployment.llm-api.yaml"}]}
    (tmp_path / "file").write_text("")
    with pytest.raises(ReportError, match="--patch: cannot write in"):
        write_patches([row_of(SHARE)], tmp_path / "file")


# -- formats ------------------------------------------------------------------------------------------------------

def result(rows: list[Row], prices: Prices | None = None) -> Recommendations:
    prices = prices or Prices()
    return Recommendations("http://prometheus:9090", TimeRange(1_714_521_600.0, 1_714_521_600.0 + WEEK), 300.0,
                           Options(), tuple(rows), totals(rows, prices.prices_gpu_hours), pack(rows), prices,
                           queries=42, warnings=("a warning",))


@pytest.fixture
def sample() -> Recommendations:
    prices = Prices(gpu_hour_default=2.0, currency="EUR")
    rows = []
    for s in (stats(), stats(WorkloadKey("ml", "Notebook", "<alice>"), idle_gpu_seconds=0.9 * WEEK),
              stats(unit_workload("slurm_job", "job_1"), sm=dist(0.9, 0.99), memory=None)):
        rec = recommend(s, Options())
        rows.append(Row(s, rec, savings(s, rec, WEEK, prices)))
    return result(rows, prices)


def test_every_format_says_the_same(sample: Recommendations) -> None:
    document = json.loads(renderer("json")(sample))
    assert [w["recommendation"]["action"] for w in document["workloads"]] == ["mig", "release", "keep"]
    assert document["totals"]["cost_saved_week"] == pytest.approx(sum(r.savings.cost_saved_week for r in sample.rows))
    assert document["options"]["headroom_ratio"] == 0.2 and document["queries"] == 42
    assert document["workloads"][2]["memory_bytes"] is None and document["workloads"][2]["namespace"] is None
    table = renderer("table")(sample)
    assert "serving/Deployment/llm-api" in table and "COST SAVED EUR" in table and "warning: a warning" in table
    csv_text = renderer("csv")(sample)
    header = csv_text.splitlines()[0].split(",")
    assert header[:3] == ["start", "end", "workload"] and "recommendation_reason" in header
    assert "saved_gpu_hours_week" in header and "sm_ratio_p99" in header
    page = renderer("html")(sample)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 3
    assert "&lt;alice&gt;" in page and "<alice>" not in page  # escaped
    assert not re.search(r'(src|href)="(https?:)?//|<script|<link|@import|url\(http', page)
    assert 'data-action="mig"' in page and 'data-figure="saved_gpu_hours_week"' in page
    with pytest.raises(ValueError):
        renderer("yaml")


def test_an_empty_result_renders_everywhere() -> None:
    empty = result([])
    for name in ("table", "json", "csv", "html"):
        assert renderer(name)(empty)
    assert "(none)" in renderer("table")(empty)


# -- the command --------------------------------------------------------------------------------------------------

@dataclass
class EmptyPrometheus:
    """Answers every query with an empty result of the right type; records the requests."""

    requests: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    url: str = ""
    delay_seconds: float = 0.0

    def answer(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        kind = "matrix" if path.endswith("/query_range") else "vector"
        return 200, {"status": "success", "data": {"resultType": kind, "result": []}}


@pytest.fixture
def prometheus() -> Iterator[EmptyPrometheus]:
    with serve(EmptyPrometheus()) as fake:  # type: ignore[arg-type]
        yield fake


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["recommend", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_over_nothing_says_so(prometheus: EmptyPrometheus, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--prometheus", prometheus.url, "--quiet")
    assert code == 0 and out.startswith("GPU right-sizing ") and "(1w)" in out and "sampled every 5m" in out
    assert "warning: no GPU workloads (gpuagent_pod_gpu_allocated_seconds_total, ...) in Prometheus" in out
    assert 'no agent of job "gpuagent" was scraped there in that range' in out and err == ""  # nothing at all
    queries = [form["query"] for _, form, _ in prometheus.requests]
    assert any("gpuagent_pod_info" in q for q in queries) and any("rate(gpuagent_pod_gpu_allocated" in q for q in queries)
    code, out, err = run_cli(capsys, "--prometheus", prometheus.url, "--since", "1d", "--format", "json",
                             "--price-kwh", "0.2", "--price-gpu-hour", "3")
    assert code == 0 and json.loads(out)["step_seconds"] == 60 and "warning: no GPU workloads" in err
    assert "warning: the kWh price is not used" in err and json.loads(out)["prices"]["gpu_hour_default"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--headroom", "lots"], "--headroom: expected a percent like 20%, got 'lots'"),
    (["--headroom", "0.2"], "--headroom: ambiguous '0.2': write 20% for 20 percent"),
    (["--release-idle", "0"], "--release-idle: expected a percent from more than 0 to 100%"),
    (["--release-idle", "150%"], "--release-idle: expected a percent from more than 0 to 100%"),
    (["--percentile", "40"], "--percentile: expected a number from 50 to 100"),
    (["--percentile", "p99x"], "--percentile: expected a number from 50 to 100"),
    (["--min-history", "soon"], "--min-history: expected a duration"),
    (["--step", "0"], "--step: expected a duration > 0"),
    (["--since", "7d", "--start", "2024-05-01"], "--since and --start name the range twice"),
    (["--output", "/nonexistent/dir/r.html"], "--output: no directory /nonexistent/dir"),
    (["--prices", "/nonexistent/prices.yaml"], "--prices /nonexistent/prices.yaml: cannot read it"),
])
def test_bad_arguments_exit_2_with_one_message(prometheus: EmptyPrometheus, capsys: pytest.CaptureFixture[str],
                                               args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "--prometheus", prometheus.url, *args)
    assert code == 2 and out == ""
    assert err.startswith("gpuagent recommend: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert prometheus.requests == []  # nothing asked before the arguments were checked


def test_a_patch_directory_that_is_a_file_and_a_broken_prometheus_exit_2(
        prometheus: EmptyPrometheus, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    code, _, err = run_cli(capsys, "--prometheus", prometheus.url, "--patch", str(tmp_path / "taken"))
    assert code == 2 and err == f"gpuagent recommend: --patch: {tmp_path / 'taken'} is not a directory\n"
    code, _, err = run_cli(capsys, "--prometheus", "http://127.0.0.1:9", "--quiet")
    assert code == 2 and err.startswith("gpuagent recommend: cannot reach Prometheus at http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "--prometheus", "ftp://prometheus")
    assert code == 2 and "--prometheus: expected an http:// or https:// URL" in err
    code, _, err = run_cli(capsys, "--prometheus", prometheus.url, "--sharing", "vgpu")
    assert code == 2 and "invalid choice: 'vgpu'" in err  # argparse's own


def test_percent_arguments() -> None:
    assert parse_percent("20%", "--x", upper=100) == 0.2 and parse_percent("20", "--x", upper=100) == 0.2
    assert parse_percent("0", "--x", upper=100, zero=True) == 0.0 and parse_percent("0.5%", "--x", upper=100) == 0.005
    assert parse_percent("150%", "--x", upper=1000) == 1.5
    with pytest.raises(ReportError, match="ambiguous"):
        parse_percent(".5", "--x", upper=100)
