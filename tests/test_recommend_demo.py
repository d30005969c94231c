"""``gpuagent recommend`` on the demo node's day (``make demo``'s history, backfilled into a real Prometheus
with ``promtool``), where research/notebook-alice holds a third of GPU 2 and runs a benchmark on GPU 6, which
it was not given (issue 30 item 4).

It said "keep" on "p99 SM 60 %", the stray GPU's figure, while ``gpuagent top`` showed the memory ladder
killing the pod for 13 GiB over its 12 GiB limit (9 GiB on GPU 2, 4 GiB on GPU 6). Now its figures are GPU
2's, the stray is shown apart, and the recommendation is the ladder's: it needs more memory, or to stay on
its own GPU. The real queries (``unless`` the agent's stray flag, the subqueries) run on a real Prometheus.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_server import Backfilled, backfill

from gpuagent.demo.history import write_history
from gpuagent.recommend.model import GIB

pytestmark = pytest.mark.integration

ALICE = "research/StatefulSet/notebook-alice"


def history(start: int) -> str:
    """The demo node's day from ``start``, polled every 5 minutes."""
    out = io.StringIO()
    write_history(out, days=1, step=300, end_unix=start + 86400 + 300)
    return out.getvalue()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    with backfill(tmp_path_factory.mktemp("recommend-demo"), 1, history, "recommend",
                  ("--step", "5m", "--min-history", "12h")) as filled:
        yield filled


@pytest.fixture(scope="module")
def rows(demo: Backfilled) -> dict[str, Any]:
    return {w["workload"]: w for w in demo.json()["workloads"]}


def test_notebook_alice_is_sized_from_its_own_gpu_and_needs_more_as_the_ladder_says(rows: dict[str, Any]) -> None:
    alice = rows[ALICE]
    sm = alice["sm_ratio"]
    # alice-kernel on GPU 2: a sine of 30-45 %; the benchmark's 60 % on GPU 6 is no longer its p99
    assert 0.29 <= sm["p50"] <= sm["p99"] <= sm["max"] <= 0.46, sm
    assert alice["memory_bytes"]["max"] == 9 * GIB  # GPU 2's, not the fullest of GPU 2 and 6
    assert alice["strays"] == {"gpus": 1, "busy_gpu_hours": pytest.approx(9.6, rel=0.05), "sm_peak_ratio": 0.6,
                               "memory_peak_bytes": 4 * GIB}
    assert alice["busy_gpu_hours"] < 10  # GPU 2's busy time; with the stray's it was 18.6 of 8 allocated
    assert alice["memory_all_gpus_bytes"] == 13 * GIB and alice["memory_limit_bytes"] == 12 * GIB
    rec = alice["recommendation"]
    assert rec["action"] == "needs_more", rec["reason"]
    assert "peaked at 13.0 GiB, 4.0 GiB of it on 1 GPU(s) not allocated to it" in rec["reason"]
    assert "over which the memory ladder stops it" in rec["reason"]
    assert rec["annotations"] == {"gpuagent.io/gpu-memory": "16Gi"}


def test_workloads_without_strays_keep_their_figures_and_the_table_shows_the_stray_apart(
        demo: Backfilled, rows: dict[str, Any]) -> None:
    assert [w for w, row in rows.items() if row["strays"]["gpus"]] == [ALICE]
    assert rows["batch/CronJob/eval-nightly"]["recommendation"]["action"] == "release"
    assert rows["serving/Deployment/reranker"]["recommendation"]["action"] == "mig"
    table = demo.run()
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert f"  {ALICE}: 1 GPU(s), SM peak 60%, memory peak 4.0 GiB, 9.60 GPU-hours busy" in lines
    # the MIG instances kept (whisper 3g, notebook-bob 2g, ocr-backfill 1g) and reranker's new 2g: 8 of 7
    # slices, two MIG GPUs; the time-sliced ones (chat-api, notebook-alice, embedder) in two
    [pool] = [line for line in lines if line.startswith("NVIDIA H100 80GB HBM3 ")]
    assert pool.split()[-7:] == ["7", "6", "2", "2", "0", "2", "1"], pool
