"""``make demo``'s pre-filled history: the demo node's past, written by the agent itself, backfilled into a real
Prometheus with ``promtool``, gives ``recommend`` recommendations and ``report`` named pods at once.

A day of history (the week ``make demo`` writes, shortened) polled every 5 minutes of simulated time, then
``gpuagent recommend`` and ``gpuagent report`` over exactly that range, as a user runs them against
``make demo``'s Prometheus.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import re
from collections.abc import Iterator

import pytest
from agent_runner import run_gpuagent
from prometheus_server import Backfilled, backfill

from gpuagent.demo.history import KEPT, write_history

pytestmark = pytest.mark.integration

STEP_S = 300


@functools.cache
def history(start: int) -> str:
    """The demo node's day from ``start``, written once however many tests read it."""
    out = io.StringIO()
    write_history(out, days=1, step=STEP_S, end_unix=start + 86400 + STEP_S)  # the day from start
    return out.getvalue()


@pytest.fixture(scope="module")
def recommend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    with backfill(tmp_path_factory.mktemp("demo-history"), 1, history, "recommend",
                  ("--step", "5m", "--min-history", "12h")) as filled:
        yield filled


def test_recommend_names_every_workload_and_sizes_them(recommend: Backfilled) -> None:
    rows = {w["workload"]: w["recommendation"] for w in recommend.json()["workloads"]}
    assert set(rows) == {
        "training/StatefulSet/llama-pretrain", "serving/Deployment/chat-api",
        "research/StatefulSet/notebook-alice", "serving/Deployment/embedder", "inference/Deployment/whisper",
        "research/StatefulSet/notebook-bob", "batch/Job/ocr-backfill", "batch/CronJob/eval-nightly",
        "serving/Deployment/reranker"}
    assert rows["batch/CronJob/eval-nightly"]["action"] == "release"  # its GPU idle all day
    assert rows["training/StatefulSet/llama-pretrain"]["action"] == "keep"  # two busy GPUs
    assert rows["serving/Deployment/reranker"]["action"] in ("mig", "share", "mps")  # a fifth of a whole GPU
    assert not [w for w, row in rows.items() if row["action"] == "insufficient_history"]


def test_report_bills_every_pod_by_name(recommend: Backfilled) -> None:
    done = run_gpuagent("report", "--prometheus", recommend.prometheus.url, "--start", str(recommend.start_unix),
                        "--end", str(recommend.end_unix), "--format", "json")
    assert done.returncode == 0, done.stderr
    pods = {(p["namespace"], p["pod"]): p for p in json.loads(done.stdout)["pods"]}
    assert len(pods) == 12 and ("batch", "eval-nightly-29012340-5xq7c") in pods
    idle = pods[("batch", "eval-nightly-29012340-5xq7c")]
    assert idle["allocated_gpu_hours"] > 23 and idle["busy_gpu_hours"] == 0


def test_the_history_is_the_agents_own_series_with_the_scrapes_labels(recommend: Backfilled) -> None:
    start = recommend.start_unix
    text = history(start)
    assert text.endswith("# EOF\n")
    families = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
    assert families and all(name.startswith(KEPT) for name, _ in families)
    assert ("gpuagent_pod_gpu_allocated_seconds", "counter") in families
    assert ("gpuagent_pod_info", "gauge") in families and ("gpuagent_simulated", "gauge") in families
    owners = set(re.findall(r'^gpuagent_pod_info\{[^}]*owner_kind="(\w+)",owner_name="([\w-]+)"', text, re.MULTILINE))
    assert ("CronJob", "eval-nightly") in owners and ("StatefulSet", "llama-pretrain") in owners
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all('instance="127.0.0.1:9402",job="gpuagent"}' in line for line in samples)
    times = sorted({float(line.rsplit(" ", 1)[1]) for line in samples})
    assert times[0] == start and times[-1] == start + 86400
    assert {b - a for a, b in itertools.pairwise(times)} == {STEP_S}

