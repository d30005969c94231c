"""``gpuagent report`` over three days of accounting counters: a real Prometheus whose TSDB was backfilled
(``promtool tsdb create-blocks-from openmetrics``) with counters whose true increase is known.

Two nodes, scraped every 10 minutes: a 2-GPU training pod busy 85 % of the time, a serving pod with a daily
cycle, two notebooks mostly idle, a batch pod that ran on the first day only, and a Slurm job (not a pod)
from the second day; node-1's agent restarts on the third day (its counters reset). The report, in 1-day
chunks with hourly efficiency points, must find the true figures within the precision of ``increase()``'s
extrapolation; in one chunk it must equal the counters' ``increase`` over the range exactly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_server import Backfilled, backfill

ROOT = Path(__file__).resolve().parents[1]
STEP_S = 600  # the scrape interval of the backfilled data
DAYS = 3
POINTS = DAYS * 86400 // STEP_S  # intervals in the range; samples are POINTS + 1
RESTART_AT = 2 * 86400 // STEP_S + 60  # node-1's agent restarts: its counters start again from 0
IDLE_THRESHOLD = 0.05
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
GPUS = {"GPU-11111111-0000-4000-8000-000000000000": ("node-1", "0", H100),
        "GPU-11111111-0000-4000-8000-000000000001": ("node-1", "1", H100),
        "GPU-11111111-0000-4000-8000-000000000002": ("node-1", "2", H100),
        "GPU-11111111-0000-4000-8000-000000000003": ("node-1", "3", H100),
        "GPU-22222222-0000-4000-8000-000000000000": ("node-2", "0", A100),
        "GPU-22222222-0000-4000-8000-000000000001": ("node-2", "1", A100)}
QUANTITIES = ("allocated_seconds", "busy_seconds", "idle_allocated_seconds", "memory_byte_seconds",
              "energy_joules")
FIGURES = {"allocated_seconds": ("allocated_gpu_hours", 3600.0), "busy_seconds": ("busy_gpu_hours", 3600.0),
           "idle_allocated_seconds": ("idle_gpu_hours", 3600.0),
           "memory_byte_seconds": ("memory_gib_hours", 1024**3 * 3600.0),
           "energy_joules": ("energy_kwh", 3.6e6)}

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Tenant:
    kind: str  # pod | workload
    group: str  # namespace or workload kind
    name: str
    uuid: str
    first: int  # first and last sample index (0..POINTS)
    last: int
    memory_gib: float

    def busy(self, k: int) -> float:
        """SM use (0-1) over interval k."""
        hour = (k * STEP_S / 3600) % 24
        if self.name == "llama-ft-0":
            return 0.85
        if self.name == "vllm-0":
            return 0.45 + 0.25 * math.sin(2 * math.pi * hour / 24)
        if self.name.startswith("notebook"):
            return 0.4 if 9 <= hour < 11 else 0.01  # two busy hours a day
        if self.name == "etl-5":
            return 0.6
        return 0.9  # the Slurm job


def tenants() -> list[Tenant]:
    uuid = list(GPUS)
    return [
        Tenant("pod", "training", "llama-ft-0", uuid[0], 0, POINTS, 70),
        Tenant("pod", "training", "llama-ft-0", uuid[1], 0, POINTS, 70),
        Tenant("pod", "serving", "vllm-0", uuid[2], 0, POINTS, 60),
        Tenant("pod", "research", "notebook-3", uuid[3], 0, POINTS, 12),
        Tenant("pod", "research", "notebook-7", uuid[4], 0, POINTS, 20),
        Tenant("pod", "batch", "etl-5", uuid[5], 10, 86400 // STEP_S, 30),  # the first day only
        Tenant("workload", "slurm_job", "job_4242", uuid[5], 86400 // STEP_S + 30, POINTS, 40),
    ]


def counters(tenant: Tenant) -> dict[str, list[tuple[int, float]]]:
    """Each counter's samples (index, value), from 0 at the tenant's first sample; node-1's reset at the
    restart."""
    out: dict[str, list[tuple[int, float]]] = {q: [] for q in QUANTITIES}
    totals = dict.fromkeys(QUANTITIES, 0.0)
    node = GPUS[tenant.uuid][0]
    for k in range(tenant.first, tenant.last + 1):
        if k > tenant.first:
            busy = tenant.busy(k - 1)
            for quantity, rate in (("allocated_seconds", 1.0), ("busy_seconds", busy),
                                   ("idle_allocated_seconds", 1.0 if busy < IDLE_THRESHOLD else 0.0),
                                   ("memory_byte_seconds", tenant.memory_gib * 1024**3),
                                   ("energy_joules", 70 + 600 * busy)):
                totals[quantity] += rate * STEP_S
        if node == "node-1" and k == RESTART_AT:
            totals = dict.fromkeys(QUANTITIES, 0.0)
        for quantity in QUANTITIES:
            out[quantity].append((k, totals[quantity]))
    return out


def true_increase(samples: list[tuple[int, float]]) -> float:
    """What the counter rose by between its first and last sample, a drop read as a reset to 0."""
    return sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(samples))


def openmetrics(start_unix: int) -> str:
    lines = []
    everyone = tenants()
    for quantity in QUANTITIES:
        for prefix in ("gpuagent_pod_gpu", "gpuagent_workload_gpu"):
            lines.append(f"# TYPE {prefix}_{quantity} counter")
            for tenant in everyone:
                if (tenant.kind == "pod") != (prefix == "gpuagent_pod_gpu"):
                    continue
                node, gpu, _ = GPUS[tenant.uuid]
                who = (f'namespace="{tenant.group}",pod="{tenant.name}"' if tenant.kind == "pod"
                       else f'workload_kind="{tenant.group}",workload="{tenant.name}"')
                labels = f'{who},gpu="{gpu}",UUID="{tenant.uuid}",Hostname="{node}",instance="{node}:9402",' \
                         f'job="gpuagent"'
                for k, value in counters(tenant)[quantity]:
                    lines.append(f"{prefix}_{quantity}_total{{{labels}}} {value!r} {start_unix + k * STEP_S}")
    lines.append("# TYPE gpuagent_gpu_info gauge")
    for uuid, (node, gpu, model) in GPUS.items():
        labels = f'gpu="{gpu}",UUID="{uuid}",Hostname="{node}",modelName="{model}",instance="{node}:9402",' \
                 f'job="gpuagent"'
        lines += [f"gpuagent_gpu_info{{{labels}}} 1 {start_unix + k * STEP_S}" for k in range(0, POINTS + 1, 6)]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    with backfill(tmp_path_factory.mktemp("report-backfill"), DAYS, openmetrics, "report") as filled:
        yield filled


def test_report_finds_the_true_figures_in_daily_chunks(backfilled: Backfilled) -> None:
    document = backfilled.json("--chunk", "1d", "--step", "1h")
    truth: dict[tuple[str, str], dict[str, float]] = {}
    for tenant in tenants():
        row = truth.setdefault((tenant.group, tenant.name), {})
        for quantity, samples in counters(tenant).items():
            figure, divisor = FIGURES[quantity]
            row[figure] = row.get(figure, 0.0) + true_increase(samples) / divisor
    rows = {(p["namespace"], p["pod"]): p for p in document["pods"]}
    rows |= {(w["workload_kind"], w["workload"]): w for w in document["workloads"]}
    assert set(rows) == set(truth)
    for key, figures in truth.items():
        for figure, value in figures.items():
            assert rows[key][figure] == pytest.approx(value, rel=0.01, abs=1e-9), (key, figure)
    assert rows[("batch", "etl-5")]["allocated_gpu_hours"] == pytest.approx(24 - 10 * STEP_S / 3600, rel=0.01)
    assert rows[("training", "llama-ft-0")]["efficiency_ratio"] == pytest.approx(0.85)
    assert rows[("research", "notebook-3")]["idle_gpu_hours"] > 60
    assert document["range"]["chunk_seconds"] == 86400 and document["queries"] == 2 * 5 * 3 + 3 + 4
    timeline = document["timeline"]
    assert len(timeline["cluster"]) == DAYS * 24
    assert {round(p["efficiency_ratio"], 3) for p in timeline["namespaces"]["training"]} == {0.85}
    assert document["warnings"] == []


def test_one_chunk_is_exactly_the_counters_increase(backfilled: Backfilled) -> None:
    document = backfilled.json("--chunk", "3d")
    # in daily pieces: within a scrape interval per piece and GPU of one query's figure (extrapolation)
    chunked = {p["pod"]: p for p in backfilled.json("--chunk", "1d")["pods"]}
    for whole in document["pods"]:
        gpus = 2 if whole["pod"] == "llama-ft-0" else 1
        assert chunked[whole["pod"]]["allocated_gpu_hours"] == pytest.approx(
            whole["allocated_gpu_hours"], abs=DAYS * gpus * STEP_S / 3600)
    at = backfilled.end_unix
    for quantity, (figure, divisor) in FIGURES.items():
        result = backfilled.prometheus.query(f"increase(gpuagent_pod_gpu_{quantity}_total[3d])", at).result
        expected: dict[tuple[str, str], float] = {}
        for series in result:
            key = (series["metric"]["namespace"], series["metric"]["pod"])
            expected[key] = expected.get(key, 0.0) + float(series["value"][1]) / divisor
        got = {(p["namespace"], p["pod"]): p[figure] for p in document["pods"]}
        assert got == pytest.approx(expected, rel=1e-9), figure


def test_per_model_prices_and_the_html_page(backfilled: Backfilled) -> None:
    prices = backfilled.workdir / "prices.yaml"
    prices.write_text('currency: USD\nkwh: 0.15\ngpu_hour:\n  "NVIDIA H100*": 4.0\n  "*A100*": 1.8\n')
    document = backfilled.json("--prices", str(prices))
    for row in [*document["pods"], *document["workloads"]]:
        rate = 4.0 if row["gpu_models"] == [H100] else 1.8
        assert row["cost"] == pytest.approx(row["allocated_gpu_hours"] * rate + row["energy_kwh"] * 0.15)
    page = backfilled.workdir / "report.html"
    done = backfilled.run("--prices", str(prices), "--format", "html", "--output", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert text.count("<svg") == 3 and "notebook-3" in text and "cost USD" in text
