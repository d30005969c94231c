"""``gpuagent report`` end to end: a real agent (simulated node) scraped every second by a real Prometheus,
then the report over the whole run, in every format, against the counters' ``increase`` asked directly.

The node (5 simulated H100s): ``ml/train-0`` busy on GPU 0, ``ml/idle-0`` holding GPU 1 and doing nothing,
``serving/llm-0`` half busy on GPU 2, ``batch/short-0`` on GPU 3 for the first seconds only, and a
systemd service (not a pod) on GPU 4. Pods are named and given their GPUs by a real kubelet pod-resources
gRPC server, and found from their processes' cgroup files (a fake ``/proc``).

The run, about 20 s: the range starts before the agent does (series that begin inside the range);
``short-0`` ends, leaves the kubelet, and its series are retired (retention 2 s) long before the end (a
series that ended inside the range must still be counted); then the agent restarts (every counter resets).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agent_runner
import pytest
import yaml
from agent_runner import AgentRunner, run_gpuagent
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from prometheus_server import PrometheusServer, free_port, prometheus_binary
from tenant_node import LoopThread, gpu_uuids

ROOT = Path(__file__).resolve().parents[1]
FAKE_PID = 4_200_000  # the simulator's PID of scenario process i (without a pid of its own) is FAKE_PID + i
SHORT_STOP_S = 6.0  # scenario time at which short-0's process exits
MODEL = "NVIDIA H100 80GB HBM3"
QUANTITIES = {  # report figure -> (counter quantity, divisor from base units)
    "allocated_gpu_hours": ("allocated_seconds", 3600.0),
    "busy_gpu_hours": ("busy_seconds", 3600.0),
    "idle_gpu_hours": ("idle_allocated_seconds", 3600.0),
    "memory_gib_hours": ("memory_byte_seconds", 1024**3 * 3600.0),
    "energy_kwh": ("energy_joules", 3.6e6),
}

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Tenant:
    namespace: str
    pod: str
    container: str
    gpu: int
    sm_util: float
    uid: str


TENANTS = (
    Tenant("ml", "train-0", "trainer", 0, 80, "0a1b2c3d-0000-4000-8000-000000000001"),
    Tenant("ml", "idle-0", "notebook", 1, 0, "0a1b2c3d-0000-4000-8000-000000000002"),
    Tenant("serving", "llm-0", "server", 2, 40, "0a1b2c3d-0000-4000-8000-000000000003"),
    Tenant("batch", "short-0", "job", 3, 60, "0a1b2c3d-0000-4000-8000-000000000004"),
)
SERVICE = "render.service"  # a systemd service on GPU 4: a workload, not a pod


def scenario(short_runs: bool) -> dict[str, Any]:
    """The node; ``short_runs`` False (after the restart): short-0's process never starts."""
    processes: list[dict[str, Any]] = []
    for t in TENANTS:
        process: dict[str, Any] = {"name": t.container, "gpu": t.gpu, "memory": "4Gi", "sm_util": t.sm_util}
        if t.pod == "short-0":
            process.update({"stop": SHORT_STOP_S} if short_runs else {"start": 100_000})
        processes.append(process)
    processes.append({"name": "render", "gpu": 4, "memory": "1Gi", "sm_util": 30})
    return {"version": 1, "name": "report-e2e", "gpus": [{"model": "H100-SXM5-80GB", "count": 5}],
            "processes": processes}


def write_proc(root: Path) -> Path:
    """``/proc/<pid>/cgroup`` of every scenario process: kubelet's cgroup v2 layout, and a service."""
    return agent_runner.write_proc(root, FAKE_PID, [(t.uid, f"{i + 1:064x}") for i, t in enumerate(TENANTS)],
                                   SERVICE)


@dataclass
class Run:
    prometheus: PrometheusServer
    start_unix: float
    end_unix: float
    workdir: Path
    outputs: dict[str, str] = field(default_factory=dict)  # format -> what the report printed

    @property
    def range_ms(self) -> int:
        return round((self.end_unix - self.start_unix) * 1000)

    def report(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``gpuagent report`` over the run's range, as a separate process."""
        return run_gpuagent("report", "--prometheus", self.prometheus.url, "--start", f"{self.start_unix:.3f}",
                            "--end", f"{self.end_unix:.3f}", "--step", "2s", *args, timeout=60)

    def increases(self, quantity: str, prefix: str = "gpuagent_pod_gpu") -> list[tuple[dict[str, str], float]]:
        """Every series' ``increase`` over the run's range, evaluated at its end, as Prometheus gives it."""
        result = self.prometheus.query(f"increase({prefix}_{quantity}_total[{self.range_ms}ms])", self.end_unix)
        return [(s["metric"], float(s["value"][1])) for s in result.result]

    def expected(self, figure: str, labels: tuple[str, str] = ("namespace", "pod"),
                 prefix: str = "gpuagent_pod_gpu") -> dict[tuple[str, str], float]:
        """Per (namespace, pod) (or other labels): the report's figure from the counters' increases."""
        quantity, divisor = QUANTITIES[figure]
        out: dict[tuple[str, str], float] = {}
        for metric, value in self.increases(quantity, prefix):
            key = (metric[labels[0]], metric[labels[1]])
            out[key] = out.get(key, 0.0) + value / divisor
        return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prometheus_binary()  # skips, saying how to install it, when it is missing
    work = tmp_path_factory.mktemp("report-e2e")
    scenario_a, scenario_b = work / "node-a.yaml", work / "node-b.yaml"
    scenario_a.write_text(yaml.safe_dump(scenario(short_runs=True)))
    scenario_b.write_text(yaml.safe_dump(scenario(short_runs=False)))
    proc_root = write_proc(work / "proc")
    uuids = gpu_uuids(scenario_a)
    served = [Pod(t.pod, t.namespace, [Container(t.container, [gpus(uuids[t.gpu])])]) for t in TENANTS]
    target = f"127.0.0.1:{free_port()}"
    loop = LoopThread()
    agents: list[AgentRunner] = []
    try:
        with short_socket_dir() as sockets:
            kubelet = PodResourcesServer(sockets / "kubelet.sock", pods=served,
                                         allocatable=[gpus(*uuids[:4])])
            loop.run(kubelet.start())
            config = {"backend": "sim", "poll_interval": 0.5, "listen": target, "hostname": "report-node",
                      "proc_root": str(proc_root), "pod_resources_socket": str(kubelet.socket_path),
                      "pod_resources_interval": 0.5, "kubernetes_api": "off", "mode": "off",
                      "journal_path": str(work / "journal.json"), "accounting_retention": 2,
                      "idle_window": 3, "energy_interval": 0.5,  # read every poll: a short run
                      "process_utilization_interval": 0.5}
            with PrometheusServer([target], work / "prometheus") as prom:
                start = round(time.time(), 3)
                agents.append(AgentRunner("agent-a", {**config, "scenario": str(scenario_a)}, work))
                agents[-1].wait_ready()
                started = time.monotonic()
                prom.wait_for('count(gpuagent_pod_gpu_allocated_seconds_total{pod="short-0"})',
                              lambda r: r.has_data, 20, "short-0's counters scraped")
                # short-0's process exits at SHORT_STOP_S; then the kubelet forgets the pod
                time.sleep(max(0.0, SHORT_STOP_S + 0.5 - (time.monotonic() - started)))
                kubelet.set_pods([p for p in served if p.name != "short-0"])
                prom.wait_for('absent(gpuagent_pod_gpu_allocated_seconds_total{pod="short-0"})',
                              lambda r: r.has_data, 20, "short-0's series retired by the agent")
                agents[-1].stop()
                agents.append(AgentRunner("agent-b", {**config, "scenario": str(scenario_b)}, work))
                agents[-1].wait_ready()
                prom.wait_for('resets(gpuagent_pod_gpu_allocated_seconds_total{pod="train-0"}[1m]) >= 1 '
                              'and on() gpuagent_pod_gpu_allocated_seconds_total{pod="train-0"} >= 3',
                              lambda r: r.has_data, 20, "train-0's counter reset and counting again")
                end = round(time.time(), 3)
                time.sleep(1.5)  # every scrape stamped before the end is in Prometheus
                yield Run(prom, start, end, work)
            loop.run(kubelet.stop(0))
    finally:
        for agent in agents:
            agent.stop()
        loop.close()



# -- the figures, in every format -----------------------------------------------------------------------------

FIGURES = tuple(QUANTITIES)


@pytest.fixture(scope="module")
def reports(run: Run) -> dict[str, str]:
    """What ``gpuagent report`` printed in each format (the HTML page written to a file)."""
    out: dict[str, str] = {}
    for fmt in ("json", "csv", "table"):
        done = run.report("--format", fmt)
        assert done.returncode == 0, done.stderr
        out[fmt] = done.stdout
    page = run.workdir / "report.html"
    done = run.report("--format", "html", "--output", str(page))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    out["html"] = page.read_text()
    return out


def test_the_run_has_what_the_report_must_handle(run: Run) -> None:
    """Series began inside the range, one ended (and was retired) inside it, and the restart reset them."""
    at_end = run.prometheus.query("gpuagent_pod_gpu_allocated_seconds_total", run.end_unix).result
    assert {s["metric"]["pod"] for s in at_end} == {"train-0", "idle-0", "llm-0"}  # short-0's series is gone
    resets = run.prometheus.query(f'resets(gpuagent_pod_gpu_allocated_seconds_total{{pod="train-0"}}'
                                  f"[{run.range_ms}ms])", run.end_unix).result
    assert float(resets[0]["value"][1]) >= 1
    expected = run.expected("allocated_gpu_hours")
    assert set(expected) == {(t.namespace, t.pod) for t in TENANTS}
    assert all(value > 0 for value in expected.values()), expected
    # short-0 held its GPU for about SHORT_STOP_S; the others for the whole run less the restart
    assert 1 / 3600 < expected[("batch", "short-0")] < 2 * SHORT_STOP_S / 3600
    assert expected[("batch", "short-0")] < expected[("ml", "train-0")] <= run.range_ms / 1000 / 3600


def test_json_figures_are_the_counters_increase(run: Run, reports: dict[str, str]) -> None:
    document = json.loads(reports["json"])
    assert document["range"]["start_unix"] == run.start_unix and document["range"]["end_unix"] == run.end_unix
    pods = {(p["namespace"], p["pod"]): p for p in document["pods"]}
    assert set(pods) == {(t.namespace, t.pod) for t in TENANTS}
    for figure in FIGURES:
        expected = run.expected(figure)
        for key, row in pods.items():
            assert row[figure] == pytest.approx(expected.get(key, 0.0), rel=1e-9, abs=1e-15), (figure, key)
        for ns in document["namespaces"]:
            total = sum(v for (namespace, _), v in expected.items() if namespace == ns["namespace"])
            assert ns[figure] == pytest.approx(total, rel=1e-9, abs=1e-15), (figure, ns["namespace"])
        workloads = run.expected(figure, ("workload_kind", "workload"), "gpuagent_workload_gpu")
        assert {(w["workload_kind"], w["workload"]): w[figure] for w in document["workloads"]} == \
            pytest.approx(workloads, rel=1e-9)
        assert document["total"][figure] == pytest.approx(sum(expected.values()) + sum(workloads.values()),
                                                          rel=1e-9)
    # non-zero where the node says so
    assert pods[("ml", "train-0")]["busy_gpu_hours"] > 0 and pods[("ml", "train-0")]["energy_kwh"] > 0
    assert pods[("ml", "idle-0")]["busy_gpu_hours"] == 0 and pods[("ml", "idle-0")]["idle_gpu_hours"] > 0
    assert pods[("ml", "train-0")]["efficiency_ratio"] == pytest.approx(0.8, abs=0.02)
    assert pods[("serving", "llm-0")]["efficiency_ratio"] == pytest.approx(0.4, abs=0.02)
    assert all(p["memory_gib_hours"] > 0 for p in pods.values())
    assert document["workloads"][0]["workload"] == SERVICE
    assert document["warnings"] == []


def test_csv_figures_are_the_counters_increase_in_full_precision(run: Run, reports: dict[str, str]) -> None:
    rows = list(csv.DictReader(io.StringIO(reports["csv"])))
    pods = {(r["namespace"], r["pod"]): r for r in rows if r["level"] == "pod"}
    assert set(pods) == {(t.namespace, t.pod) for t in TENANTS}
    for figure in FIGURES:
        for key, value in run.expected(figure).items():
            assert float(pods[key][figure]) == pytest.approx(value, rel=1e-9, abs=1e-15), (figure, key)
    assert [r["level"] for r in rows].count("total") == 1
    assert {r["workload"] for r in rows if r["level"] == "workload"} == {SERVICE}


def shown(cell: str, value: float) -> bool:
    """Whether a rounded table cell shows ``value`` (to the digits it has)."""
    if cell == "0":
        return value == 0
    number = float(cell.replace(",", "").rstrip("%"))
    mantissa = cell.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(cell.split("e")[1]) if "e" in cell else 0
    return abs(number - value) <= 0.5 * 10 ** (exponent - decimals) * 1.0001


def test_table_shows_the_counters_increase(run: Run, reports: dict[str, str]) -> None:
    lines = reports["table"].splitlines()
    assert lines[0].startswith("GPU accounting ")
    header = next(line for line in lines if line.startswith("NAMESPACE") and " POD " in line)
    columns = re.split(r"\s{2,}", header.strip())  # columns are 2+ spaces apart; titles have single ones
    rows = {}
    for line in lines[lines.index(header) + 1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[(cells[0], cells[1])] = dict(zip(columns, cells, strict=True))
    assert set(rows) == {(t.namespace, t.pod) for t in TENANTS}
    titles = {"allocated_gpu_hours": "ALLOCATED", "busy_gpu_hours": "BUSY", "idle_gpu_hours": "IDLE",
              "memory_gib_hours": "GiB-h", "energy_kwh": "kWh"}
    assert columns[:2] == ["NAMESPACE", "POD"] and "EFFICIENCY" in columns
    for figure, title in titles.items():
        column = next(c for c in columns if title in c)
        for key, value in run.expected(figure).items():
            assert shown(rows[key][column], value), (figure, key, rows[key][column], value)


def test_html_page_has_the_tables_and_plots_and_nothing_external(run: Run, reports: dict[str, str]) -> None:
    page = reports["html"]
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for table in ("namespaces-table", "pods-table", "idle-table", "workloads-table"):
        assert f'<table id="{table}">' in page
    for plot in ("namespaces", "efficiency", "idle"):
        match = re.search(rf'<div class="plot" id="plot-{plot}"><svg[^>]*>(.*?)</svg>', page, re.DOTALL)
        assert match and "<path" in match.group(1), plot
    assert page.count("<svg") == 3
    assert not re.search(r'(src|href)="(https?:)?//|<script|<link|@import|url\(http', page)
    # every pod's row, with each figure's full value in data-value
    pods = page[page.index('<table id="pods-table">'):]
    pods = pods[:pods.index("</table>")]
    for t in TENANTS:
        assert f"<td>{t.namespace}</td><td>{t.pod}</td><td>{MODEL}</td>" in pods
    for figure in FIGURES:
        values = [float(v) for v in re.findall(rf'data-figure="{figure}" data-value="([^"]+)"', pods)]
        assert sorted(values) == pytest.approx(sorted(run.expected(figure).values()), rel=1e-9, abs=1e-15)
    assert ">idle-0<" in page[page.index('<table id="idle-table">'):]


def test_costs_at_flat_and_per_model_prices(run: Run, tmp_path: Path) -> None:
    flat = json.loads(run.report("--format", "json", "--price-gpu-hour", "2.5", "--price-kwh", "0.2").stdout)
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({"currency": "EUR", "kwh": 0.2,
                                      "gpu_hour": {"*A100*": 1.0, "NVIDIA H100*": 4.0}}))
    by_model = json.loads(run.report("--format", "json", "--prices", str(prices)).stdout)
    for document, gpu_hour in ((flat, 2.5), (by_model, 4.0)):
        for pod in document["pods"]:
            assert pod["cost"] == pytest.approx(pod["allocated_gpu_hours"] * gpu_hour + pod["energy_kwh"] * 0.2)
            assert pod["gpu_models"] == [MODEL]
        assert document["total"]["cost"] == pytest.approx(
            sum(p["cost"] for p in document["pods"]) + sum(w["cost"] for w in document["workloads"]))
    assert by_model["prices"]["currency"] == "EUR"
    unpriced = tmp_path / "a100-only.yaml"
    unpriced.write_text(yaml.safe_dump({"gpu_hour": {"*A100*": 1.0}}))
    done = run.report("--format", "json", "--prices", str(unpriced))
    document = json.loads(done.stdout)
    assert all(p["cost"] is None for p in document["pods"]) and document["total"]["cost"] is None
    assert MODEL in done.stderr and "no GPU-hour price" in done.stderr


def test_chunked_queries_add_up_to_the_whole_range(run: Run, reports: dict[str, str]) -> None:
    """Totals asked in 6 s pieces (what --chunk does for long ranges) are close to one query's: each
    piece's increase() extrapolates to its edges from the samples nearest them, so a series may differ by
    about a scrape interval per edge, and the 1 s interval stretches on a loaded machine: 3 s a piece is
    allowed. (tests/test_report_backfill.py checks daily pieces over days against the true figures.)"""
    done = run.report("--format", "json", "--chunk", "6s", "--progress")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    pieces = math.ceil(run.range_ms / 6000)
    whole = {(p["namespace"], p["pod"]): p for p in json.loads(reports["json"])["pods"]}
    chunked = {(p["namespace"], p["pod"]): p for p in document["pods"]}
    assert set(chunked) == set(whole)
    for key, row in whole.items():
        assert chunked[key]["allocated_gpu_hours"] == pytest.approx(row["allocated_gpu_hours"],
                                                                    abs=pieces * 3 / 3600), key
    total = json.loads(reports["json"])["total"]["allocated_gpu_hours"]
    assert document["total"]["allocated_gpu_hours"] == pytest.approx(total, abs=len(whole) * pieces * 3 / 3600)
    selector, *progress = done.stderr.splitlines()
    assert selector == 'gpuagent report: reading series {job=~"gpuagent"}'
    assert re.match(r"\[1/\d+\] ", progress[0]) and progress[-1].endswith("s") and "queries in" in progress[-1]


def test_timeline_covers_the_run(reports: dict[str, str]) -> None:
    timeline = json.loads(reports["json"])["timeline"]
    assert timeline["step_seconds"] == 2
    assert len(timeline["cluster"]) >= 2  # 2 s points with data (none across the restart's gap)
    assert {"ml", "serving", "batch"} <= set(timeline["namespaces"])
    train = [p["efficiency_ratio"] for p in timeline["namespaces"]["ml"] if p["efficiency_ratio"] is not None]
    assert train and all(0.35 <= r <= 0.45 for r in train)  # train-0 at 80 % and idle-0 at 0 %


def test_namespace_filter_leaves_out_the_rest(run: Run) -> None:
    done = run.report("--format", "json", "--namespace", "ml")
    document = json.loads(done.stdout)
    assert {p["pod"] for p in document["pods"]} == {"train-0", "idle-0"}
    assert document["workloads"] == [] and [n["namespace"] for n in document["namespaces"]] == ["ml"]
    assert document["total"]["allocated_gpu_hours"] == pytest.approx(
        sum(v for (ns, _), v in run.expected("allocated_gpu_hours").items() if ns == "ml"), rel=1e-9)
