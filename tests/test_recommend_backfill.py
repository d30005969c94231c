"""``gpuagent recommend`` over a week of synthetic workloads whose right answers are known: a real
Prometheus whose TSDB was backfilled (``promtool tsdb create-blocks-from openmetrics``), as
``tests/test_report_backfill.py`` does for the report.

Scraped every 5 minutes for 7 days, on H100s (MIG-capable), L40S and L4 (no MIG) and an A100:

- ``training/PyTorchJob/llama-ft``: a steady trainer on 2 GPUs at 93-98 % SM, 70 GiB: keep;
- ``serving/Deployment/llm-api``: an inference service, 2 replicas at 18-22 % SM with 9 GiB: MIG 2g.20gb
  (22 % + 20 % headroom is 26.4 %: over 1g's 1/7, under 2g's 2/7; 10.8 GiB fits 2g's 19.6 GiB);
- ``serving/Deployment/embedder``: 2 replicas steady at 28-32 % with 6 GiB on L40S (no MIG): MPS at 40 %
  of the threads (32 % x 1.2 = 38.4 %, up to 5 points), 8 GiB pinned;
- ``research/Notebook/alice``: a notebook idle 9 intervals in 10: release;
- ``batch/CronJob/etl-nightly``: a bursty job, 12 hours a night (a new pod each), 10 % SM with bursts to
  45 % a third of the time, on an L4: a time-slicing share of 55 % (45 % x 1.2 = 54 %) and 6 GiB;
- ``ml/Deployment/ranker``: at 15.2 GiB of its 16 GiB gpu-memory limit, stopped twice by the memory
  ladder: needs more, 19 GiB;
- ``ml/Deployment/scorer``: held at its 30 % share, frozen a fifth of its time: needs more, 45 %;
- ``batch/Job/smoke-test``: 3 hours in the week: too little history;
- ``slurm_job/job_4242`` (not a pod): 3 days at 97 % on an H100: keep;
- ``legacy-infer-5f6d7c8b9-x8k2p``: no ``gpuagent_pod_info`` (an agent without the API server): grouped by
  its name as ``legacy-infer``; 5-8 % SM, 3 GiB: MIG 1g.10gb.

Every recommendation, the savings arithmetic (GPU-hours a week, cost at per-model prices), the packing per
GPU model, the patches (against the Kubernetes schemas, and through ``kubectl patch --local``) and the
figures behind them (percentiles and peaks against the generated samples) are checked.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_server import Backfilled, backfill

ROOT = Path(__file__).resolve().parents[1]
STEP_S = 300
DAYS = 7
POINTS = DAYS * 86400 // STEP_S  # 2016 intervals; samples 0..POINTS
GIB = 1024**3
MIB = 1024**2
IDLE_THRESHOLD = 0.05
H100, L40S, L4, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA L4", "NVIDIA A100-SXM4-80GB"
MEMORY = {H100: 81559 * MIB, L40S: 46068 * MIB, L4: 23034 * MIB, A100: 81920 * MIB}
PRICES = {H100: 4.0, L40S: 1.5, L4: 0.8, A100: 2.5}

pytestmark = pytest.mark.integration


@dataclass
class Pod:
    """One pod (or, with ``workload_kind``, one non-Kubernetes workload) and its GPUs' samples."""

    namespace: str
    name: str
    model: str
    first: int
    last: int
    sm: Callable[[int], float]
    memory: Callable[[int], float]
    owner: tuple[str, str] | None = None
    read_as: tuple[str, str] | None = None  # the owner the agent exported, when its walk stopped below `owner`
    gpus: int = 1
    container: str = "main"
    workload_kind: str | None = None
    memory_limit: float | None = None
    share_limit: float | None = None
    throttled: float = 0.0  # frozen this share of each interval
    ladder_stops: tuple[int, ...] = ()  # samples at which the ladder's "terminating" stage is 1
    uuids: list[str] = field(default_factory=list)


def cycle(*values: float) -> Callable[[int], float]:
    return lambda k: values[k % len(values)]


def pods() -> list[Pod]:
    everyone = [
        Pod("training", "llama-ft-worker-0", H100, 0, POINTS, cycle(0.93, 0.95, 0.96, 0.98), lambda k: 70 * GIB,
            owner=("PyTorchJob", "llama-ft"), gpus=2, container="pytorch"),
        # one replica's owner read as the Deployment, the other's only as its ReplicaSet (RBAC refused the walk)
        *[Pod("serving", f"llm-api-7d9c6b8f5d-{s}", H100, 0, POINTS, cycle(0.18, 0.19, 0.20, 0.21, 0.22),
              lambda k: 9 * GIB, owner=("Deployment", "llm-api"), read_as=read_as, container="vllm")
          for s, read_as in (("x2k4p", None), ("b9m7q", ("ReplicaSet", "llm-api-7d9c6b8f5d")))],
        *[Pod("serving", f"embedder-6c8d9f7b5-{s}", L40S, 0, POINTS, cycle(0.28, 0.29, 0.30, 0.31, 0.32),
              lambda k: 6 * GIB, owner=("Deployment", "embedder"), container="server") for s in ("h7j8k", "q2w4z")],
        Pod("research", "alice-0", A100, 0, POINTS, lambda k: 0.5 if k % 10 == 0 else 0.0,
            lambda k: 12 * GIB if k % 10 == 0 else 4 * GIB, owner=("Notebook", "alice"), container="notebook"),
        *[Pod("batch", f"etl-nightly-{29412000 + 1440 * d}-{s}", L4, d * 288, d * 288 + 144,
              lambda k: 0.45 if k % 3 == 0 else 0.10, lambda k: 5 * GIB if k % 3 == 0 else 3 * GIB,
              owner=("CronJob", "etl-nightly"), container="etl")
          for d, s in enumerate(("h7x2k", "b4n6m", "c5p7q", "d6r8s", "f7t9v", "g8w2x", "j9z4b"))],
        Pod("ml", "ranker-5b7c9d2f4-k8m2n", H100, 0, POINTS, cycle(0.25, 0.30, 0.35),
            lambda k: 15.2 * GIB if k % 50 == 0 else 14.5 * GIB, owner=("Deployment", "ranker"),
            memory_limit=16 * GIB, ladder_stops=(1000, 1500), container="ranker"),
        Pod("ml", "scorer-8f9d6c7b5-p4q6r", H100, 0, POINTS, cycle(0.28, 0.30), lambda k: 5 * GIB,
            owner=("Deployment", "scorer"), share_limit=0.3, throttled=0.2, container="scorer"),
        Pod("batch", "smoke-test-x7k2p", H100, 500, 536, cycle(0.6), lambda k: 20 * GIB,
            owner=("Job", "smoke-test")),
        Pod("", "job_4242", H100, POINTS - 3 * 288, POINTS, cycle(0.96, 0.97, 0.98), lambda k: 60 * GIB,
            workload_kind="slurm_job"),
        Pod("serving", "legacy-infer-5f6d7c8b9-x8k2p", H100, 0, POINTS, cycle(0.05, 0.06, 0.07, 0.08),
            lambda k: 3 * GIB),
    ]
    serial = 0
    for pod in everyone:
        for _ in range(pod.gpus):
            pod.uuids.append(f"GPU-{serial:08x}-0000-4000-8000-{list(MEMORY).index(pod.model):012d}")
            serial += 1
    return everyone


# The spike only --step 10m misses in its samples, but not in its peaks: memory 15.6 GiB at an odd sample.
SPIKE_AT = 1201


def memory_of(pod: Pod, k: int) -> float:
    if pod.name.startswith("ranker") and k == SPIKE_AT:
        return 15.6 * GIB
    return pod.memory(k)


def openmetrics(start: int, everyone: list[Pod]) -> str:
    lines: list[str] = []
    families: dict[str, tuple[str, list[str]]] = {}

    def add(family: str, kind: str, labels: str, samples: list[tuple[int, float]], suffix: str = "") -> None:
        families.setdefault(family, (kind, []))[1].extend(
            f"{family}{suffix}{{{labels}}} {value!r} {start + k * STEP_S}" for k, value in samples)

    def gauge(pod: Pod, value: Callable[[int], float]) -> list[tuple[int, float]]:
        """A gauge's samples; NaN after the last where the pod ends early (what a scrape's staleness marker
        does: the series is gone, not held for Prometheus's 5-minute lookback)."""
        samples = [(k, value(k)) for k in range(pod.first, pod.last + 1)]
        return samples + ([(pod.last + 1, math.nan)] if pod.last < POINTS else [])

    for pod in everyone:
        ks = range(pod.first, pod.last + 1)
        for gpu, uuid in enumerate(pod.uuids):
            host = f'gpu="{gpu}",UUID="{uuid}",Hostname="node-{uuid[4:12]}",instance="node:9402",job="gpuagent"'
            who = (f'workload_kind="{pod.workload_kind}",workload="{pod.name}"' if pod.workload_kind
                   else f'namespace="{pod.namespace}",pod="{pod.name}"')
            level = "workload" if pod.workload_kind else "pod"
            totals = {"allocated_seconds": 0.0, "busy_seconds": 0.0, "idle_allocated_seconds": 0.0,
                      "throttled_seconds": 0.0}
            counters: dict[str, list[tuple[int, float]]] = {q: [] for q in totals}
            for k in ks:
                if k > pod.first:
                    sm = pod.sm(k - 1)
                    totals["allocated_seconds"] += STEP_S
                    totals["busy_seconds"] += sm * STEP_S
                    totals["idle_allocated_seconds"] += STEP_S if sm < IDLE_THRESHOLD else 0.0
                    totals["throttled_seconds"] += pod.throttled * STEP_S
                for quantity, value in totals.items():
                    counters[quantity].append((k, value))
            for quantity, samples in counters.items():
                if quantity == "throttled_seconds" and (pod.workload_kind or not pod.throttled):
                    continue
                add(f"gpuagent_{level}_gpu_{quantity}", "counter", f"{who},{host}", samples, "_total")
            if pod.workload_kind:  # its processes' series
                process = f'{host},pid="4242",comm="python",kind="compute",{who}'
                add("gpuagent_process_sm_utilization_ratio", "gauge", process, gauge(pod, pod.sm))
                add("gpuagent_process_gpu_memory_used_bytes", "gauge", process,
                    gauge(pod, lambda k, p=pod: memory_of(p, k)))
                continue
            add("gpuagent_pod_gpu_sm_utilization_ratio", "gauge", f"{who},{host}", gauge(pod, pod.sm))
            add("gpuagent_pod_gpu_memory_used_bytes", "gauge", f"{who},{host}",
                gauge(pod, lambda k, p=pod: memory_of(p, k)))
            add("gpuagent_pod_gpu_allocated", "gauge",
                f'{who},container="{pod.container}",device_id="{uuid}",instance="node:9402",job="gpuagent"',
                [(k, 1.0) for k in ks])
        if pod.workload_kind:
            continue
        who = f'namespace="{pod.namespace}",pod="{pod.name}",instance="node:9402",job="gpuagent"'
        if pod.owner:
            kind, name = pod.read_as or pod.owner
            add("gpuagent_pod_info", "gauge", f'{who},uid="u-{pod.name}",qos="burstable",names_from="api_server",'
                f'owner_kind="{kind}",owner_name="{name}"', [(k, 1.0) for k in ks])
        if pod.memory_limit:
            add("gpuagent_pod_gpu_memory_limit_bytes", "gauge", who, [(k, pod.memory_limit) for k in ks])
            for stage in ("ok", "warned", "terminating", "killed", "evicted"):
                add("gpuagent_pod_gpu_memory_limit_stage", "gauge", f'{who},stage="{stage}"',
                    [(k, _stage(pod, k, stage)) for k in ks])
        if pod.share_limit:
            add("gpuagent_pod_gpu_share_limit_ratio", "gauge", who, [(k, pod.share_limit) for k in ks])
    for pod in everyone:
        for gpu, uuid in enumerate(pod.uuids):
            host = f'gpu="{gpu}",UUID="{uuid}",Hostname="node-{uuid[4:12]}",instance="node:9402",job="gpuagent"'
            every = [k for k in range(0, POINTS + 1, 6)]
            add("gpuagent_gpu_info", "gauge", f'{host},modelName="{pod.model}"', [(k, 1.0) for k in every])
            add("gpuagent_gpu_memory_total_bytes", "gauge", host, [(k, float(MEMORY[pod.model])) for k in every])
    for family, (kind, samples) in families.items():
        lines.append(f"# TYPE {family} {kind}")
        lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _stage(pod: Pod, k: int, stage: str) -> float:
    stopped = {k0 for k0 in pod.ladder_stops}
    killed = {k0 + 1 for k0 in pod.ladder_stops}
    if stage == "terminating":
        return 1.0 if k in stopped else 0.0
    if stage == "killed":
        return 1.0 if k in killed else 0.0
    if stage == "ok":
        return 0.0 if k in stopped | killed else 1.0
    return 0.0


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    """The week in a real Prometheus; ``run``/``json`` run ``gpuagent recommend`` over it, sampled as scraped."""
    with backfill(tmp_path_factory.mktemp("recommend-backfill"), DAYS, lambda start: openmetrics(start, pods()),
                  "recommend", ("--step", "5m", "--chunk", "7d")) as filled:
        yield filled


@pytest.fixture(scope="module")
def document(backfilled: Backfilled) -> dict:
    return backfilled.json()


def by_workload(document: dict) -> dict[str, dict]:
    return {w["workload"]: w for w in document["workloads"]}


EXPECTED = {  # workload -> (action, summary)
    "training/PyTorchJob/llama-ft": ("keep", "keep"),
    "serving/Deployment/llm-api": ("mig", "MIG 2g.20gb"),
    "serving/Deployment/embedder": ("mps", "MPS 40% 8Gi"),
    "research/Notebook/alice": ("release", "release"),
    "batch/CronJob/etl-nightly": ("share", "share 55% 6Gi"),
    "ml/Deployment/ranker": ("needs_more", "needs more 19Gi"),  # 15.6 GiB x 1.2 = 18.7
    "ml/Deployment/scorer": ("needs_more", "needs more share 45%"),
    "batch/Job/smoke-test": ("insufficient_history", "insufficient history"),
    "slurm_job/job_4242": ("keep", "keep"),
    "serving/~/legacy-infer": ("mig", "MIG 1g.10gb"),
}
WEEK_H = 168.0
# GPU-hours a week now -> after, by hand: the range is a week, so now is what each held
SAVINGS = {
    "training/PyTorchJob/llama-ft": (2 * WEEK_H, 2 * WEEK_H),
    "serving/Deployment/llm-api": (2 * WEEK_H, 2 * WEEK_H * 2 / 7),  # 2 slices of 7
    "serving/Deployment/embedder": (2 * WEEK_H, 2 * WEEK_H * 0.40),  # 40 % of the threads
    "research/Notebook/alice": (WEEK_H, WEEK_H * 202 / 2016),  # only its 202 busy intervals of 2016
    "batch/CronJob/etl-nightly": (7 * 12.0, 7 * 12.0 * 0.55),  # 12 h a night at a 55 % share
    "ml/Deployment/ranker": (WEEK_H, WEEK_H),
    "ml/Deployment/scorer": (WEEK_H, WEEK_H),
    "batch/Job/smoke-test": (3.0, 3.0),
    "slurm_job/job_4242": (72.0, 72.0),
    "serving/~/legacy-infer": (WEEK_H, WEEK_H / 7),
}


def test_every_recommendation_is_the_right_one(document: dict) -> None:
    rows = by_workload(document)
    assert {w: (r["recommendation"]["action"], r["recommendation"]["summary"]) for w, r in rows.items()} == EXPECTED
    # one row for the Deployment whose replicas' owners were read differently, named by the surer reading
    assert [w["workload"] for w in document["workloads"]].count("serving/Deployment/llm-api") == 1
    assert rows["serving/Deployment/llm-api"]["pods"] == ["llm-api-7d9c6b8f5d-b9m7q", "llm-api-7d9c6b8f5d-x2k4p"]
    assert rows["serving/Deployment/llm-api"]["grouped_by"] == "api_server"
    assert len(rows["batch/CronJob/etl-nightly"]["pods"]) == 7  # a new pod every night, one workload
    assert rows["serving/~/legacy-infer"]["grouped_by"] == "pod_name"
    assert rows["slurm_job/job_4242"]["grouped_by"] == "unit" and rows["slurm_job/job_4242"]["namespace"] is None
    # the reasons say it in words, with the figures
    reason = {w: r["recommendation"]["reason"] for w, r in rows.items()}
    assert "needs 75% of a GPU or more" in reason["training/PyTorchJob/llama-ft"]
    assert "p99 SM 22%" in reason["serving/Deployment/llm-api"] and "MIG 2g.20gb holds it" in reason[
        "serving/Deployment/llm-api"]
    assert "steady use" in reason["serving/Deployment/embedder"]
    assert reason["research/Notebook/alice"].startswith("idle 90% of the time it held its GPU")
    assert "bursty use" in reason["batch/CronJob/etl-nightly"]
    assert "terminated or evicted it 2 time(s)" in reason["ml/Deployment/ranker"]
    # the 15.6 GiB spike, on its one GPU: all the memory the ladder compares with its 16 GiB limit
    assert ("its GPU memory on all its GPUs peaked at 15.6 GiB: 97.5% of its gpuagent.io/gpu-memory limit 16.0 GiB, "
            "just under where the memory ladder stops it") in reason["ml/Deployment/ranker"]
    assert "frozen) 20% of its time at gpuagent.io/gpu-share 30%: raise it to 45%" in reason["ml/Deployment/scorer"]
    assert reason["batch/Job/smoke-test"].startswith("too little history: it held GPUs for 3h")
    # what the patches would set
    rec = {w: r["recommendation"] for w, r in rows.items()}
    assert rec["serving/Deployment/llm-api"]["resources"] == {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": 1}
    assert rec["serving/Deployment/embedder"]["env"] == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
                                                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
    assert rec["batch/CronJob/etl-nightly"]["annotations"] == {"gpuagent.io/gpu-share": "55%",
                                                              "gpuagent.io/gpu-memory": "6Gi"}
    assert rec["ml/Deployment/ranker"]["annotations"] == {"gpuagent.io/gpu-memory": "19Gi"}
    assert rec["ml/Deployment/scorer"]["annotations"] == {"gpuagent.io/gpu-share": "45%"}
    assert rec["training/PyTorchJob/llama-ft"]["annotations"] == {}


GPUS_HELD = {"training/PyTorchJob/llama-ft": 2, "serving/Deployment/llm-api": 2, "serving/Deployment/embedder": 2}


def test_the_figures_behind_them_are_the_samples(document: dict) -> None:
    rows = by_workload(document)
    everyone = pods()
    for workload, row in rows.items():
        mine = [p for p in everyone if _workload(p) == workload]
        # read every step from the range's start (exclusive): one sample a pod (its busiest device) a step
        sampled = [k for p in mine for k in range(max(p.first, 1), p.last + 1)]
        sm = sorted(p.sm(k) for p in mine for k in range(max(p.first, 1), p.last + 1))
        memory = sorted(memory_of(p, k) for p in mine for k in range(max(p.first, 1), p.last + 1))
        assert row["sm_ratio"]["samples"] == row["memory_bytes"]["samples"] == len(sampled), workload
        for q in (50, 95, 99):
            assert row["sm_ratio"][f"p{q}"] == pytest.approx(_percentile(sm, q), abs=1e-9), (workload, q)
            assert row["memory_bytes"][f"p{q}"] == pytest.approx(_percentile(memory, q), rel=1e-9), (workload, q)
        assert row["sm_ratio"]["max"] == pytest.approx(max(p.sm(k) for p in mine for k in range(p.first, p.last + 1)))
        assert row["memory_bytes"]["max"] == max(memory_of(p, k) for p in mine for k in range(p.first, p.last + 1))
        assert row["gpus_held"] == pytest.approx(GPUS_HELD.get(workload, 1), abs=1e-6), workload
    assert rows["research/Notebook/alice"]["idle_ratio"] == pytest.approx(1814 / 2016, abs=1e-3)
    assert rows["ml/Deployment/scorer"]["throttled_ratio"] == pytest.approx(0.2, abs=0.01)
    assert rows["ml/Deployment/ranker"]["memory_ladder_restarts"] == 2
    assert rows["ml/Deployment/ranker"]["memory_limit_bytes"] == 16 * GIB
    assert rows["batch/CronJob/etl-nightly"]["days_seen"] == 7
    assert rows["slurm_job/job_4242"]["days_seen"] == 3
    assert rows["training/PyTorchJob/llama-ft"]["devices"] == 2 and rows["serving/Deployment/llm-api"]["devices"] == 2
    assert rows["serving/Deployment/llm-api"]["containers"] == ["vllm"]


def test_the_savings_arithmetic(backfilled: Backfilled) -> None:
    prices = backfilled.workdir / "prices.yaml"
    prices.write_text(yaml.safe_dump({"currency": "USD", "gpu_hour": {m: p for m, p in PRICES.items()}}))
    document = backfilled.json("--prices", str(prices))
    rows = by_workload(document)
    slack = 0.0
    for workload, (now, after) in SAVINGS.items():
        saved = rows[workload]["savings"]
        # increase() carries a series that ends inside the range on by half a scrape interval: per pod ending
        # early, up to 150 s of GPU time more than the truth (Prometheus's extrapolation, not ours)
        early = sum(1 for p in pods() if _workload(p) == workload and p.last < POINTS)
        allowed = early * STEP_S / 2 / 3600 + 1e-6 * now
        slack += allowed
        assert saved["current_gpu_hours_week"] == pytest.approx(now, abs=allowed), workload
        assert saved["recommended_gpu_hours_week"] == pytest.approx(after, abs=allowed), workload
        price = PRICES[rows[workload]["gpu_model"]]
        assert saved["cost_saved_week"] == pytest.approx((now - after) * price, abs=allowed * price), workload
        # and the arithmetic on what Prometheus gave, exactly: after = now x the new size (or the busy share)
        ratio = after / now
        assert saved["recommended_gpu_hours_week"] == pytest.approx(saved["current_gpu_hours_week"] * ratio,
                                                                    rel=1e-3 if workload.endswith("alice") else 1e-9)
        assert saved["cost_saved_week"] == pytest.approx(saved["saved_gpu_hours_week"] * price, rel=1e-9)
    totals = document["totals"]
    assert totals["current_gpu_hours_week"] == pytest.approx(sum(n for n, _ in SAVINGS.values()), abs=slack)
    assert totals["saved_gpu_hours_week"] == pytest.approx(sum(n - a for n, a in SAVINGS.values()), abs=slack)
    assert totals["cost_saved_week"] == pytest.approx(sum(r["savings"]["cost_saved_week"] for r in rows.values()))
    assert totals["cost_saved_week"] == pytest.approx(
        sum((n - a) * PRICES[rows[w]["gpu_model"]] for w, (n, a) in SAVINGS.items()), abs=slack * 4)
    assert document["workloads"][0]["workload"] == "serving/Deployment/llm-api"  # most GPU-hours freed first
    assert document["prices"]["currency"] == "USD"


def test_the_packing_per_gpu_model(document: dict) -> None:
    packing = {p["gpu_model"]: p for p in document["packing"]}
    # H100: llama-ft 2 + ranker + scorer + smoke-test + job_4242 whole; llm-api 2 x 2g + legacy 1g in one MIG GPU
    assert packing[H100] == {"gpu_model": H100, "gpus_now": 9, "gpus_after": 7, "whole": 6, "shared": 0, "mps": 0,
                             "mig": 1, "released_devices": 0}
    assert packing[L40S]["gpus_now"] == 2 and packing[L40S]["mps"] == 1 and packing[L40S]["gpus_after"] == 1
    assert packing[L4]["gpus_now"] == 1 and packing[L4]["shared"] == 1
    assert packing[A100] == {"gpu_model": A100, "gpus_now": 1, "gpus_after": 0, "whole": 0, "shared": 0, "mps": 0,
                             "mig": 0, "released_devices": 1}
    assert [p["gpu_model"] for p in document["packing"]] == [H100, L40S, A100, L4]


def test_a_coarser_step_keeps_the_peaks(backfilled: Backfilled) -> None:
    """Sampled every 10 minutes, half the samples are read, but the peaks still come from every scrape."""
    rows = by_workload(backfilled.json("--step", "10m"))
    ranker = rows["ml/Deployment/ranker"]
    assert ranker["memory_bytes"]["max"] == 15.6 * GIB  # at an odd sample: not among the 10-minute ones
    assert ranker["memory_bytes"]["samples"] < 1100


def test_policy_flags_change_the_answers(backfilled: Backfilled) -> None:
    rows = by_workload(backfilled.json("--sharing", "share", "--headroom", "50%", "--percentile", "50"))
    llm = rows["serving/Deployment/llm-api"]["recommendation"]
    assert llm["summary"] == "share 30% 14Gi"  # p50 20 % x 1.5; 9 GiB x 1.5 = 13.5 -> 14 GiB
    assert rows["research/Notebook/alice"]["recommendation"]["action"] == "release"
    looser = by_workload(backfilled.json("--release-idle", "95%", "--min-history", "2h"))
    assert looser["research/Notebook/alice"]["recommendation"]["action"] != "release"
    # 3 hours are enough now: 60 % SM x 1.2 = 72 %, more than 4g's 4/7, steady: MPS
    assert looser["batch/Job/smoke-test"]["recommendation"]["summary"] == "MPS 75% 24Gi"


def test_namespace_and_selector_narrow_it(backfilled: Backfilled) -> None:
    document = backfilled.json("--namespace", "serving")
    assert set(by_workload(document)) == {"serving/Deployment/llm-api", "serving/Deployment/embedder",
                                          "serving/~/legacy-infer"}
    document = backfilled.json("--selector", 'job="elsewhere"')
    assert document["workloads"] == [] and "no GPU workloads" in document["warnings"][0]


def test_table_and_csv_say_the_same(backfilled: Backfilled, document: dict) -> None:
    table = backfilled.run("--format", "table")
    assert table.returncode == 0, table.stderr
    text = table.stdout
    assert text.startswith("GPU right-sizing ") and "Why:" in text and "Node pool" in text
    for workload, (_, summary) in EXPECTED.items():
        line = next(line for line in text.splitlines() if line.startswith(workload + " "))
        assert summary in line, (workload, line)
    assert "warning: 1 workload(s) grouped by pod name" in text
    csv_done = backfilled.run("--format", "csv")
    import csv as csvlib
    import io

    rows = {r["workload"]: r for r in csvlib.DictReader(io.StringIO(csv_done.stdout))}
    for workload, row in by_workload(document).items():
        assert float(rows[workload]["saved_gpu_hours_week"]) == row["savings"]["saved_gpu_hours_week"]
        assert rows[workload]["recommendation_action"] == row["recommendation"]["action"]
        assert float(rows[workload]["sm_ratio_p99"]) == row["sm_ratio"]["p99"]


# -- the patches ------------------------------------------------------------------------------------------------

PATCHED = {  # file -> the object's kind
    "serving.deployment.llm-api.yaml": "Deployment",
    "serving.deployment.embedder.yaml": "Deployment",
    "batch.cronjob.etl-nightly.yaml": "CronJob",
    "ml.deployment.ranker.yaml": "Deployment",
    "ml.deployment.scorer.yaml": "Deployment",
}


@pytest.fixture(scope="module")
def patches(backfilled: Backfilled) -> Path:
    directory = backfilled.workdir / "patches"
    done = backfilled.run("--format", "json", "--output", str(backfilled.workdir / "out.json"),
                                "--patch", str(directory))
    assert done.returncode == 0, done.stderr
    assert "5 patch(es) in" in done.stderr and "serving/~/legacy-infer: grouped by pod name" in done.stderr
    assert "training/PyTorchJob/llama-ft: nothing to set (keep)" in done.stderr
    return directory


def workload_object(kind: str, name: str, namespace: str, container: str) -> dict:
    """A realistic object of ``kind`` running ``container`` with one whole GPU."""
    pod_spec = {"containers": [{"name": container, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "32Gi"},
                                              "requests": {"nvidia.com/gpu": "1", "cpu": "4"}},
                                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
                               {"name": "sidecar", "image": "busybox:1.36"}],
                "restartPolicy": "OnFailure" if kind == "CronJob" else "Always"}
    template = {"metadata": {"labels": {"app": name}, "annotations": {"team": "ml"}}, "spec": pod_spec}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": namespace},
                "spec": {"schedule": "0 20 * * *", "jobTemplate": {"spec": {"template": template}}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": template}}


def test_one_patch_per_workload_to_change_and_a_kustomize_component(patches: Path) -> None:
    assert sorted(p.name for p in patches.iterdir()) == sorted([*PATCHED, "kustomization.yaml"])
    component = yaml.safe_load((patches / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and sorted(p["path"] for p in component["patches"]) == sorted(PATCHED)
    llm = yaml.safe_load((patches / "serving.deployment.llm-api.yaml").read_text())
    assert llm == {"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "llm-api", "namespace": "serving"},
                   "spec": {"template": {"spec": {"containers": [{"name": "vllm", "resources": {
                       "limits": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"},
                       "requests": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"}}}]}}}}
    text = (patches / "serving.deployment.llm-api.yaml").read_text()
    assert text.startswith("# gpuagent recommend: serving/Deployment/llm-api\n# recommendation: MIG 2g.20gb\n")
    assert "# apply: kubectl patch deployment llm-api -n serving --type strategic --patch-file " in text


def _kubernetes_validate():
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (test extra)")


def kubectl_binary() -> str:
    path = shutil.which("kubectl")
    if path is None:
        message = "`kubectl` is not installed: run scripts/install-system-deps.sh (Debian's kubernetes-client)"
        if os.environ.get("GPUAGENT_REQUIRE_PROMETHEUS"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def kubectl_minor(kubectl: str) -> int:
    done = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True,
                          timeout=30)
    return int(json.loads(done.stdout)["clientVersion"]["minor"].rstrip("+"))


@pytest.mark.parametrize("file_name", sorted(PATCHED))
def test_patches_apply_with_kubectl_and_validate_against_the_schemas(patches: Path, file_name: str,
                                                                     tmp_path: Path) -> None:
    kv = _kubernetes_validate()
    patch = yaml.safe_load((patches / file_name).read_text())
    kind, name, namespace = patch["kind"], patch["metadata"]["name"], patch["metadata"]["namespace"]
    assert kind == PATCHED[file_name]
    containers = {"llm-api": "vllm", "embedder": "server", "etl-nightly": "etl", "ranker": "ranker",
                  "scorer": "scorer"}
    original = workload_object(kind, name, namespace, containers[name])
    source = tmp_path / "object.yaml"
    source.write_text(yaml.safe_dump(original))
    kubectl = kubectl_binary()
    if kind == "CronJob" and kubectl_minor(kubectl) < 21:
        pytest.skip("this kubectl (< 1.21: Debian 12's kubernetes-client is 1.20) has no batch/v1 CronJob to "
                    "merge a strategic patch into locally; a newer kubectl, or the API server, does")
    done = subprocess.run([kubectl, "patch", "--local", "--dry-run=client", "-f", str(source),
                           "--type", "strategic", "-p", (patches / file_name).read_text(), "-o", "yaml"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    patched = yaml.safe_load(done.stdout)
    for version in ("1.30", kv_latest()):
        kv.validate(patched, version, strict=True)
    template = patched["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else patched["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    main, sidecar = template["spec"]["containers"]
    assert annotations["team"] == "ml" and sidecar == original_sidecar()  # the rest untouched
    if name == "llm-api":
        assert main["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/mig-2g.20gb": "1"}
        assert main["resources"]["requests"] == {"cpu": "4", "nvidia.com/mig-2g.20gb": "1"}
    elif name == "embedder":
        assert {e["name"]: e["value"] for e in main["env"]} == {
            "NCCL_DEBUG": "WARN", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}
        assert annotations["gpuagent.io/gpu-memory"] == "8Gi"
    elif name == "etl-nightly":
        assert annotations["gpuagent.io/gpu-share"] == "55%" and annotations["gpuagent.io/gpu-memory"] == "6Gi"
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    elif name == "ranker":
        assert annotations["gpuagent.io/gpu-memory"] == "19Gi"
    else:
        assert annotations["gpuagent.io/gpu-share"] == "45%"


def kv_latest() -> str:
    import kubernetes_validate.utils as kv

    return kv.major_minor(kv.latest_version())


def original_sidecar() -> dict:
    return {"name": "sidecar", "image": "busybox:1.36"}


# -- helpers the checks share -----------------------------------------------------------------------------------


def _workload(pod: Pod) -> str:
    if pod.workload_kind:
        return f"{pod.workload_kind}/{pod.name}"
    if pod.owner is None:
        return f"{pod.namespace}/~/{pod.name.rsplit('-', 2)[0]}"
    return f"{pod.namespace}/{pod.owner[0]}/{pod.owner[1]}"


def _percentile(ordered: list[float], q: float) -> float:
    """numpy's default percentile (linear between the nearest ranks), written out."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
