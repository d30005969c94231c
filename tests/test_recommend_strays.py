"""``gpuagent recommend`` sizes a workload from the GPUs allocated to it, shows its strays apart, and agrees
with the memory ladder (issue 30 items 3 and 4), without a real Prometheus.

The demo's research/notebook-alice holds a third of GPU 2 (gpu-share 20 %, gpu-memory 12Gi) and runs a
benchmark on GPU 6, which it was not given: recommend said "keep" on that stray GPU's 60 % SM while ``gpuagent
top`` showed the memory ladder killing it (9 GiB on GPU 2 and 4 GiB on GPU 6: 13 GiB over its 12 GiB). Here:
the figures from the queries' answers (the stray's busy time apart), the rule that reads the memory on every
GPU against the limit, the queries that leave strays out, and the table that says it all.
"""

from __future__ import annotations

import dataclasses

from test_recommend import H100, H100_MEMORY, WEEK, dist, result, stats

from gpuagent.prom.prices import Prices
from gpuagent.prom.queries import PODS
from gpuagent.recommend.formats import renderer
from gpuagent.recommend.formats.json_doc import as_document
from gpuagent.recommend.formats.table import render_table
from gpuagent.recommend.history import PodHistory, build_stats
from gpuagent.recommend.model import (
    GIB,
    Action,
    Options,
    PoolPacking,
    Recommendation,
    Row,
    Strays,
    WorkloadKey,
)
from gpuagent.recommend.packing import pack
from gpuagent.recommend.queries import SM, all_gpus_memory_query, stray_query, use_query
from gpuagent.recommend.rules import recommend
from gpuagent.recommend.savings import savings

ALICE = WorkloadKey("research", "StatefulSet", "notebook-alice")
OWN, STRAY = "GPU-2", "GPU-6"


def alice_history(step: float = 300.0) -> PodHistory:
    """A day as the queries answer it: samples on its own GPU only (37 % SM, 9 GiB), the stray's peaks
    apart, the accounting totals per GPU (none allocated on the stray, busy there), 13 GiB on all GPUs."""
    pod = PodHistory()
    for k in range(1, 289):
        t = k * step
        pod.sm[t], pod.memory[t], pod.held[t], pod.devices[t] = 0.37, 9 * GIB, 1 / 3, 1.0
    pod.totals[OWN] = {"allocated_seconds": 28800.0, "busy_seconds": 32229.0, "idle_allocated_seconds": 0.0}
    pod.totals[STRAY] = {"allocated_seconds": 0.0, "busy_seconds": 34560.0, "idle_allocated_seconds": 0.0}
    pod.stray_sm_peak[STRAY], pod.stray_memory_peak[STRAY] = 0.6, 4 * GIB
    pod.all_gpus_memory_peak, pod.memory_limit, pod.share_limit = 13 * GIB, 12 * GIB, 0.2
    return pod


def test_a_strays_busy_time_and_peaks_stay_apart_from_the_workloads_figures() -> None:
    s = build_stats(ALICE, {"notebook-alice-0": alice_history()}, {OWN: H100, STRAY: H100}, {H100: H100_MEMORY},
                    0.0, 300.0, 99)
    assert s.allocated_gpu_seconds == 28800.0
    assert s.busy_gpu_seconds == 32229.0  # GPU 2's only: with the stray's it was 66789, 2.3 x what it held
    assert s.strays == Strays(gpus=1, busy_gpu_seconds=34560.0, sm_peak=0.6, memory_peak_bytes=4 * GIB)
    assert s.sm.max == 0.37 and s.memory.max == 9 * GIB  # its own GPU's figures, as the queries gave them
    assert s.memory_all_gpus_bytes == 13 * GIB and s.memory_limit_bytes == 12 * GIB
    none = build_stats(ALICE, {"a": dataclasses.replace(alice_history(), totals={OWN: {"allocated_seconds": 1.0,
                                                                                        "busy_seconds": 1.0}},
                                                        stray_sm_peak={}, stray_memory_peak={})},
                       {OWN: H100}, {H100: H100_MEMORY}, 0.0, 300.0, 99)
    assert none.strays is None


def test_a_pod_over_its_limit_on_all_its_gpus_needs_more_and_says_the_stray_made_it() -> None:
    s = build_stats(ALICE, {"notebook-alice-0": alice_history()}, {OWN: H100, STRAY: H100}, {H100: H100_MEMORY},
                    0.0, 300.0, 99)
    rec = recommend(s, Options(min_history_seconds=3600))
    assert rec.action is Action.NEEDS_MORE, rec.reason  # was "keep" on the stray's 60 % SM
    assert "its GPU memory on all its GPUs peaked at 13.0 GiB, 4.0 GiB of it on 1 GPU(s) not allocated to it: " \
           "108.3% of its gpuagent.io/gpu-memory limit 12.0 GiB, over which the memory ladder stops it" in rec.reason
    assert rec.memory_bytes == 16 * GIB and rec.annotations == {"gpuagent.io/gpu-memory": "16Gi"}  # 13 x 1.2
    assert rec.reason.endswith("or keep it on the GPU(s) allocated to it, its peak there 9.0 GiB")
    # at 90 % of the limit it is said too, as "just under"; well under, and without strays, nothing is
    near = recommend(dataclasses.replace(s, memory_all_gpus_bytes=11 * GIB, strays=None), Options())
    assert near.action is Action.NEEDS_MORE and "just under where the memory ladder stops it" in near.reason
    assert "not allocated" not in near.reason and near.memory_bytes == 14 * GIB
    under = recommend(dataclasses.replace(s, memory_all_gpus_bytes=9 * GIB, strays=None), Options())
    assert under.action is not Action.NEEDS_MORE, under.reason


def test_the_limit_is_read_on_all_gpus_for_a_pod_of_two() -> None:
    """Two GPUs of 30 GiB each under a 40 GiB limit: the ladder stops it; each GPU alone looked fine."""
    two = stats(devices=2, devices_per_pod=2, gpus_held=2.0, memory=dist(30 * GIB, 30 * GIB),
                memory_limit_bytes=40 * GIB, memory_capacity_bytes=40 * GIB, memory_all_gpus_bytes=60 * GIB)
    rec = recommend(two, Options())
    assert rec.action is Action.NEEDS_MORE and "peaked at 60.0 GiB" in rec.reason
    assert rec.memory_bytes == 72 * GIB and "one device holds" not in rec.reason  # said once, for the limit


def test_the_queries_leave_strays_out_of_the_samples_and_read_them_apart() -> None:
    flag = 'unless on (namespace, pod, UUID) gpuagent_pod_gpu_unallocated_use{job=~"gpuagent"}'
    assert use_query(PODS, SM, ['job=~"gpuagent"']).endswith(f"{flag})")
    assert use_query(PODS, SM, ['job=~"gpuagent"'], 300).startswith(
        'max by (namespace, pod) (max_over_time(gpuagent_pod_gpu_sm_utilization_ratio{job=~"gpuagent"}[300s]) unless')
    assert stray_query(SM, 86400, 300, []) == (
        "max by (namespace, pod, UUID) (max_over_time((max_over_time(gpuagent_pod_gpu_sm_utilization_ratio[300s]) "
        "and on (namespace, pod, UUID) gpuagent_pod_gpu_unallocated_use)[86400s:300s]))")
    assert all_gpus_memory_query(86400, 300, []) == (
        "max by (namespace, pod) (max_over_time((sum by (namespace, pod) "
        "(max_over_time(gpuagent_pod_gpu_memory_used_bytes[300s])))[86400s:300s]))")


def test_the_table_says_the_strays_and_where_its_pool_figures_come_from() -> None:
    alice = build_stats(ALICE, {"notebook-alice-0": alice_history()}, {OWN: H100, STRAY: H100},
                        {H100: H100_MEMORY}, 0.0, 300.0, 99)
    rows = [Row(s, rec, savings(s, rec, 86400.0, Prices()))
            for s in (alice, stats()) for rec in [recommend(s, Options(min_history_seconds=3600))]]
    text = render_table(result(rows))
    head, alice_line = [line for line in text.splitlines() if "STRAY" in line.split() or "notebook-alice" in line][:2]
    at = head.index("STRAY")
    assert alice_line[at:at + len("STRAY")].strip() == "1"  # right-aligned under its title
    assert "  research/StatefulSet/notebook-alice: 1 GPU(s), SM peak 60%, memory peak 4.0 GiB, 9.60 GPU-hours busy" \
        in text.splitlines()
    assert "Left out of its SM, memory and GPU-hours above and of its size" in text
    [pool_note] = [line for line in text.splitlines() if line.startswith(f"  {H100}: GPUS add up to")]
    saved = sum(r.savings.saved_gpu_hours_week for r in rows)
    assert pool_note == (f"  {H100}: GPUS add up to 1.33 (NOW 2); SAVED/WEEK {saved:.1f} GPU-hours is "
                         f"{saved / 168:.3g} GPUs over a week, the packing frees 0 whole GPU(s)")
    doc = {w["workload"]: w for w in as_document(result(rows))["workloads"]}
    assert doc[str(ALICE)]["strays"] == {"gpus": 1, "busy_gpu_hours": 9.6, "sm_peak_ratio": 0.6,
                                         "memory_peak_bytes": 4 * GIB}
    assert doc[str(ALICE)]["memory_all_gpus_bytes"] == 13 * GIB
    assert doc["serving/Deployment/llm-api"]["strays"]["gpus"] == 0
    page = renderer("html")(result(rows))
    assert '<td class="num" data-figure="strays_gpus" data-value="1.0">1</td>' in page
    assert f'data-figure="memory_all_gpus_bytes" data-value="{13 * GIB}">13.0 GiB</td>' in page


def test_a_workload_kept_on_its_mig_instance_is_packed_into_mig_not_time_sliced() -> None:
    """The demo's whisper (3g), notebook-bob (2g) and ocr-backfill (1g) keep their instances; reranker
    moves to a 2g: 3 + 2 + 1 + 2 = 8 compute slices of 7, two MIG GPUs (they were time-sliced items)."""
    def row(rec: Recommendation, **changes: object) -> Row:
        s = stats(**changes)
        return Row(s, rec, savings(s, rec, WEEK, Prices()))

    keep = Recommendation(Action.KEEP, "")
    rows = [row(keep, mig_profile="3g.40gb", device_size=3 / 7, gpus_held=3 / 7),
            row(keep, mig_profile="2g.20gb", device_size=2 / 7, gpus_held=2 / 7),
            row(keep, mig_profile="1g.10gb", device_size=1 / 7, gpus_held=1 / 7),
            row(Recommendation(Action.MIG, "", size=2 / 7, mig_profile="2g.20gb", mig_slices=(2, 2, 7, 8)))]
    assert pack(rows) == (PoolPacking(H100, 2, whole=0, shared=0, mps=0, mig=2, released=0),)
