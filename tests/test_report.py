"""``gpuagent report`` without a real Prometheus: time ranges, PromQL, prices, the HTTP client and its
errors, the model, every output format, and the command's exit 2 on anything wrong.

The server here is a small HTTP server answering ``/api/v1/query`` and ``/api/v1/query_range`` with bodies
shaped exactly like Prometheus's (``{"status": "success", "data": {"resultType": "vector", "result":
[{"metric": {...}, "value": [t, "v"]}]}}``, errors as ``{"status": "error", "errorType", "error"}`` with
4xx/5xx). ``tests/test_report_e2e.py`` runs the same command against a real Prometheus and agent.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import itertools
import json
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuagent.cli import main
from gpuagent.formats.numbers import money, percent, quantity
from gpuagent.prom import queries as q
from gpuagent.prom.client import Auth, PrometheusClient, parse_headers
from gpuagent.prom.errors import ReportError
from gpuagent.prom.prices import Prices, load_prices
from gpuagent.prom.progress import Progress
from gpuagent.prom.timerange import (
    TimeRange,
    chunks,
    default_step_seconds,
    format_duration,
    parse_duration_seconds,
    parse_time_unix,
    promql_duration,
    resolve_range,
)
from gpuagent.report.collect import Request, collect
from gpuagent.report.formats import renderer
from gpuagent.report.model import Report, Usage

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
GPU = {"GPU-aaaa": H100, "GPU-bbbb": H100, "GPU-cccc": A100}
END = 1_714_608_000.0  # 2024-05-02T00:00:00Z
DAY = 86400.0

# What each pod accumulated on each GPU over the day, in the counters' base units:
# (namespace, pod, UUID) -> (allocated s, busy s, idle s, memory byte-s, energy J)
POD_DAY = {
    ("training", "llama-ft-0", "GPU-aaaa"): (86400.0, 69120.0, 0.0, 86400.0 * 60 * 2**30, 86400.0 * 550),
    ("training", "llama-ft-0", "GPU-bbbb"): (86400.0, 60480.0, 3600.0, 86400.0 * 58 * 2**30, 86400.0 * 510),
    ("research", "notebook-7", "GPU-cccc"): (43200.0, 2160.0, 39600.0, 43200.0 * 6 * 2**30, 43200.0 * 90),
}
WORKLOAD_DAY = {("slurm_job", "job_4242", "GPU-cccc"): (21600.0, 17280.0, 0.0, 21600.0 * 30 * 2**30, 21600.0 * 300)}


# -- a Prometheus HTTP API fake ----------------------------------------------------------------------------

@dataclass
class FakePrometheus:
    """Answers the report's queries from POD_DAY/WORKLOAD_DAY, scaled by each query's range (so a chunked
    report adds up to the same day), and records every request."""

    pods: dict[tuple[str, str, str], tuple[float, ...]] = field(default_factory=lambda: dict(POD_DAY))
    workloads: dict[tuple[str, str, str], tuple[float, ...]] = field(default_factory=lambda: dict(WORKLOAD_DAY))
    error: tuple[int, dict[str, Any] | str] | None = None  # (status, body) for every request
    delay_seconds: float = 0.0
    agents: int = 2  # gpuagent_build_info series over any range
    requests: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    url: str = ""

    def answer(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any] | str]:
        if self.error is not None:
            return self.error
        expr = form["query"]
        if path.endswith("/query_range"):
            return 200, self._matrix(expr, float(form["start"]), float(form["end"]), float(form["step"]))
        if path.endswith("/query"):
            return 200, {"status": "success", "data": {"resultType": "vector", "result": self._vector(expr)}}
        return 404, "404 page not found\n"

    def _vector(self, expr: str) -> list[dict[str, Any]]:
        at = time.time()
        if expr.startswith("max by (UUID, modelName)"):
            return [{"metric": {"UUID": uuid, "modelName": model}, "value": [at, "1"]} for uuid, model in GPU.items()]
        if expr.startswith("count(count_over_time(gpuagent_build_info"):  # why a result is empty
            return [{"metric": {}, "value": [at, str(self.agents)]}] if self.agents else []
        match = re.search(r"increase\((gpuagent_(pod|workload)_gpu_(\w+)_total)(\{[^}]*\})?\[(\d+)(ms|s)\]\)", expr)
        assert match, expr
        kind, quantity, matchers, size, unit = match.group(2, 3, 4, 5, 6)
        scale = int(size) / (1000 if unit == "ms" else 1) / DAY
        index = q.QUANTITIES.index(quantity)
        table, labels = ((self.pods, ("namespace", "pod")) if kind == "pod"
                         else (self.workloads, ("workload_kind", "workload")))
        out = []
        for (group, name, uuid), values in table.items():
            if values[index] is None:  # no such series (busy time unknown)
                continue
            if matchers and 'namespace=~"' in matchers:
                allowed = re.search(r'namespace=~"([^"]*)"', matchers).group(1).replace("\\\\", "\\")
                if not re.fullmatch(allowed, group):
                    continue
            out.append({"metric": {labels[0]: group, labels[1]: name, "UUID": uuid},
                        "value": [at, repr(values[index] * scale)]})
        return out

    def _matrix(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        match = re.search(r"gpuagent_(pod|workload)_gpu_(\w+)_total", expr)
        assert match and "sum" in expr, expr
        kind, quantity = match.groups()
        index = q.QUANTITIES.index(quantity)
        table = self.pods if kind == "pod" else self.workloads
        groups: dict[str, float] = {}
        for (group, _, _), values in table.items():
            if values[q.QUANTITIES.index(q.BUSY)] is None:  # `and increase(busy)`: no busy, not counted
                continue
            key = group if kind == "pod" else ""
            groups[key] = groups.get(key, 0.0) + values[index] * step / DAY
        times = [start + i * step for i in range(round((end - start) / step) + 1)]
        result = [{"metric": {"namespace": g} if g else {}, "values": [[t, repr(v)] for t in times]}
                  for g, v in sorted(groups.items())]
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@contextlib.contextmanager
def serve(fake: FakePrometheus, prefix: str = "") -> Iterator[FakePrometheus]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            form = dict(urllib.parse.parse_qsl(body))
            fake.requests.append((self.path, form, self.headers))  # names case-insensitive, as in HTTP
            if fake.delay_seconds:
                time.sleep(fake.delay_seconds)
            if not self.path.startswith(prefix + "/api/v1/"):
                status, reply = 404, "404 page not found\n"
            else:
                status, reply = fake.answer(self.path, form)
            data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(reply, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            # A client that gave up on a connection (a timeout, a keep-alive closed under load) is the
            # client's business: socketserver's traceback would land in the next test's captured stderr.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}{prefix}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    with serve(FakePrometheus()) as fake:
        yield fake


NO_PRICES = Prices()


def day_report(fake: FakePrometheus, prices: Prices = NO_PRICES, chunk: float = DAY, **kwargs: Any) -> Report:
    client = PrometheusClient(fake.url)
    request = Request(TimeRange(END - DAY, END), 3600.0, chunk, prices=prices, **kwargs)
    return collect(client, request, Progress(None, in_place=False))


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


# -- time ranges --------------------------------------------------------------------------------------------

def test_durations_and_times() -> None:
    assert parse_duration_seconds("7d", "--since") == 7 * DAY
    assert parse_duration_seconds("1h30m", "--since") == 5400
    assert parse_duration_seconds("1w", "--since") == 7 * DAY
    assert parse_duration_seconds("250ms", "--step") == 0.25
    assert parse_duration_seconds("90", "--step") == 90
    assert parse_time_unix("2024-05-02T00:00:00Z", "--end") == END
    assert parse_time_unix("2024-05-02T02:00:00+02:00", "--end") == END
    assert parse_time_unix("2024-05-02", "--end") == END
    assert parse_time_unix("1714608000.5", "--end") == END + 0.5
    for bad in ("7 days", "-1h", "0s", "h", ""):
        with pytest.raises(ReportError, match="--since: expected a duration"):
            parse_duration_seconds(bad, "--since")
    with pytest.raises(ReportError, match=r"--start: expected Unix seconds, an RFC 3339 time .* got 'yesterday'"):
        parse_time_unix("yesterday", "--start")


def test_resolve_range() -> None:
    now = END + 12.3456
    assert resolve_range("1d", None, None, now) == TimeRange(END - DAY + 12.346, END + 12.346)
    assert resolve_range(None, "2024-05-01", "2024-05-02", now) == TimeRange(END - DAY, END)
    assert resolve_range("2h", None, "2024-05-02", now) == TimeRange(END - 7200, END)
    problems = {("7d", "2024-05-01", None): "--since and --start name the range twice",
                (None, None, None): "no time range: give --since",
                (None, "2024-05-02", "2024-05-01"): "--start: 2024-05-02T00:00:00Z is not before the end",
                ("1d", None, "2030-01-01"): "--end: 2030-01-01T00:00:00Z is in the future"}
    for (since, start, end), message in problems.items():
        with pytest.raises(ReportError, match=re.escape(message)):
            resolve_range(since, start, end, now)


def test_chunks_are_adjacent_and_cover_the_range() -> None:
    week = TimeRange(END - 7 * DAY - 100, END)
    pieces = chunks(week, DAY)
    assert len(pieces) == 8 and pieces[0].start_unix == week.start_unix and pieces[-1].end_unix == END
    assert all(a.end_unix == b.start_unix for a, b in itertools.pairwise(pieces))
    assert [p.seconds for p in pieces[:7]] == [DAY] * 7 and pieces[-1].seconds == pytest.approx(100)
    assert chunks(TimeRange(0, 10), 60) == [TimeRange(0, 10)]
    assert chunks(TimeRange(0, 120), 60) == [TimeRange(0, 60), TimeRange(60, 120)]


def test_promql_durations_steps_and_formatting() -> None:
    assert promql_duration(DAY) == "86400s" and promql_duration(30.5) == "30500ms"
    assert default_step_seconds(7 * DAY) == 7200 and default_step_seconds(3600) == 60
    assert default_step_seconds(365 * DAY) == 7 * DAY
    assert format_duration(7 * DAY) == "1w" and format_duration(5400) == "1h30m" and format_duration(1.5) == "1.5s"


# -- PromQL -------------------------------------------------------------------------------------------------

def test_queries() -> None:
    assert q.total_query(q.PODS, q.ALLOCATED, DAY, []) == (
        "sum by (namespace, pod, UUID) (increase(gpuagent_pod_gpu_allocated_seconds_total[86400s]))")
    matchers = ['cluster="prod"', q.namespace_matcher(["ml-team", "a.b"])]
    assert q.total_query(q.WORKLOADS, q.ENERGY, 90, matchers) == (
        'sum by (workload_kind, workload, UUID) (increase(gpuagent_workload_gpu_energy_joules_total'
        '{cluster="prod", namespace=~"ml\\\\-team|a\\\\.b"}[90s]))')
    assert q.timeline_query(q.PODS, q.BUSY, 3600, []) == (  # busy on allocated GPUs only (not a stray's)
        "sum by (namespace) (increase(gpuagent_pod_gpu_busy_seconds_total[3600s]) "
        "and increase(gpuagent_pod_gpu_allocated_seconds_total[3600s]) > 0)")
    assert q.timeline_query(q.PODS, q.ALLOCATED, 60, []) == (
        "sum by (namespace) (increase(gpuagent_pod_gpu_allocated_seconds_total[60s]) "
        "and increase(gpuagent_pod_gpu_busy_seconds_total[60s]))")
    assert q.timeline_query(q.WORKLOADS, q.BUSY, 3600, []) == (
        "sum (increase(gpuagent_workload_gpu_busy_seconds_total[3600s]) "
        "and increase(gpuagent_workload_gpu_allocated_seconds_total[3600s]) > 0)")
    assert q.models_query(60, []) == "max by (UUID, modelName) (last_over_time(gpuagent_gpu_info[60s]))"
    assert q.check_matchers('{cluster="prod", Hostname=~"gpu-.*"}') == 'cluster="prod", Hostname=~"gpu-.*"'
    with pytest.raises(ReportError, match="--selector: expected label matchers"):
        q.check_matchers("prod")
    assert q.promql_string('a"b\\c') == 'a\\"b\\\\c'


# -- prices -------------------------------------------------------------------------------------------------

def test_price_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text('currency: EUR\nkwh: 0.25\ngpu_hour:\n  "NVIDIA H100*": 4.1\n  "*a100*": 2\n  default: 1.5\n')
    prices = load_prices(str(path), None, None)
    assert prices == Prices(1.5, (("NVIDIA H100*", 4.1), ("*a100*", 2.0)), 0.25, "EUR")
    assert prices.gpu_hour(H100) == 4.1 and prices.gpu_hour(A100) == 2.0  # patterns ignore case
    assert prices.gpu_hour("Tesla T4") == 1.5 and prices.gpu_hour(None) == 1.5
    assert load_prices(str(path), 3.0, 0.1) == Prices(3.0, prices.gpu_hour_by_model, 0.1, "EUR")
    (tmp_path / "flat.json").write_text('{"gpu_hour": 2, "kwh": null}')
    assert load_prices(str(tmp_path / "flat.json"), None, None) == Prices(2.0)


@pytest.mark.parametrize(("text", "message"), [
    ("gpu_hour: {H100: cheap}", "gpu_hour.H100: expected a price (a number >= 0), got 'cheap'"),
    ("gpu_hour: -1", "gpu_hour: expected a price (a number >= 0), got -1"),
    ("kwh: true", "kwh: expected a price (a number >= 0), got True"),
    ("kwhs: 1", "kwhs: unknown key (expected one of currency, kwh, gpu_hour)"),
    ("- 1\n- 2", "expected a map with currency, kwh, gpu_hour, got list"),
    ("gpu_hour: [1", "not YAML or JSON"),
    ("currency: 3", "currency: expected a string like USD, got 3"),
])
def test_bad_price_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ReportError, match=re.escape(message)) as raised:
        load_prices(str(path), None, None)
    assert str(raised.value).startswith(f"--prices {path}: ")


# -- the client ---------------------------------------------------------------------------------------------

def test_client_posts_forms_with_auth_and_headers(prometheus: FakePrometheus) -> None:
    client = PrometheusClient(prometheus.url + "/", auth=Auth(username="me", password="s3cret",
                                                              headers={"X-Scope-OrgID": "gpu"}))
    samples = client.query(q.models_query(60, []), END)
    assert {s.labels["UUID"]: s.labels["modelName"] for s in samples} == GPU
    path, form, headers = prometheus.requests[-1]
    assert path == "/api/v1/query" and form == {"query": q.models_query(60, []), "time": "1714608000.000"}
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"me:s3cret").decode()
    assert headers["X-Scope-OrgID"] == "gpu"
    series = PrometheusClient(prometheus.url, auth=Auth(bearer_token="tok")).query_range(
        q.timeline_query(q.PODS, q.BUSY, 3600, []), END - 7200, END, 3600)
    assert [len(s.points) for s in series] == [3, 3] and series[0].labels == {"namespace": "research"}
    assert prometheus.requests[-1][2]["Authorization"] == "Bearer tok"
    assert parse_headers(["X-Scope-OrgID: a", "X-Other:b"]) == {"X-Scope-OrgID": "a", "X-Other": "b"}
    with pytest.raises(ReportError, match="--header: expected 'Name: value'"):
        parse_headers(["nocolon"])


def test_client_works_under_a_path_prefix() -> None:
    with serve(FakePrometheus(), prefix="/prometheus") as fake:  # Mimir's /prometheus/api/v1/...
        assert PrometheusClient(fake.url).query(q.models_query(60, []), END)


@pytest.mark.parametrize(("error", "message"), [
    ((400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected '{'"}),
     r"refused a query \(bad_data: 1:5: parse error: unexpected '\{'\)\n  query: max by"),
    ((422, {"status": "error", "errorType": "execution",
            "error": "query processing would load too many samples into memory in query execution"}),
     r"too many samples.*--chunk"),
    ((404, "404 page not found\n"), r"did not answer like Prometheus's HTTP API: HTTP 404 text/plain: '404 page"),
    ((401, "Unauthorized"), r"HTTP 401 text/plain \(wrong credentials\?\)"),
    ((200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
     r"expected a vector from 'max by .*', got 'matrix'"),
])
def test_client_errors_say_what_the_server_said(error: tuple[int, Any], message: str) -> None:
    with serve(FakePrometheus(error=error)) as fake, pytest.raises(ReportError, match=message):
        PrometheusClient(fake.url).query(q.models_query(60, []), END)


def test_client_errors_without_a_server() -> None:
    from prometheus_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ReportError, match=re.escape(f"cannot reach Prometheus at {url}: connection refused")):
        PrometheusClient(url).query("up", END)
    with pytest.raises(ReportError, match="unknown host"):
        PrometheusClient("http://no-such-host.invalid:9090").query("up", END)
    with pytest.raises(ReportError, match=r"--prometheus: expected an http:// or https:// URL, got 'prom:9090'"):
        PrometheusClient("prom:9090")
    with serve(FakePrometheus(delay_seconds=1.0)) as fake, \
            pytest.raises(ReportError, match=r"did not answer within 0.2 s"):
        PrometheusClient(fake.url, timeout_seconds=0.2).query("up", END)


# -- the model ----------------------------------------------------------------------------------------------

def test_a_day_per_pod_namespace_and_workload(prometheus: FakePrometheus) -> None:
    report = day_report(prometheus)
    assert [(p.namespace, p.pod) for p in report.pods] == [("training", "llama-ft-0"), ("research", "notebook-7")]
    llama = report.pods[0].usage
    assert llama.allocated_gpu_hours == pytest.approx(48) and llama.busy_gpu_hours == pytest.approx(36)
    assert llama.efficiency_ratio == pytest.approx(0.75) and llama.idle_gpu_hours == pytest.approx(1)
    assert llama.memory_gib_hours == pytest.approx(24 * 118) and llama.energy_kwh == pytest.approx(24 * 1.06)
    assert report.pods[0].gpu_models == (H100,) and report.pods[1].gpu_models == (A100,)
    assert [(n.namespace, n.pods) for n in report.namespaces] == [("training", 1), ("research", 1)]
    assert report.workloads[0].workload_kind == "slurm_job" and report.workloads[0].usage.allocated_gpu_hours == 6
    assert report.total.allocated_gpu_hours == pytest.approx(48 + 12 + 6)
    assert report.total.cost is None and not report.has_cost
    assert [p.pod for p in report.top_idle_pods()] == ["notebook-7", "llama-ft-0"]
    # the timeline: 24 hourly points of busy / allocated, the cluster's including the Slurm job
    assert len(report.timeline.cluster) == 24
    assert report.timeline.cluster[0].efficiency_ratio == pytest.approx((69120 + 60480 + 2160 + 17280) /
                                                                        (86400 * 2 + 43200 + 21600))
    assert report.timeline.namespaces["training"][5].efficiency_ratio == pytest.approx(129600 / 172800)
    assert report.warnings == ()


def test_chunked_day_adds_up_and_queries_in_pieces(prometheus: FakePrometheus) -> None:
    whole, chunked = day_report(prometheus), day_report(prometheus, chunk=6 * 3600)
    assert chunked.total.allocated_gpu_seconds == pytest.approx(whole.total.allocated_gpu_seconds)
    for a, b in zip(whole.pods, chunked.pods, strict=True):
        assert a.usage.energy_joules == pytest.approx(b.usage.energy_joules)
    # 2 subjects x 5 counters x 4 chunks + 4 model queries + 2 subjects x 2 timeline queries
    assert chunked.queries == 2 * 5 * 4 + 4 + 4 and whole.queries == 2 * 5 + 1 + 4
    ends = sorted({float(form["time"]) for path, form, _ in prometheus.requests if path.endswith("/query")})
    assert ends == [END - 18 * 3600, END - 12 * 3600, END - 6 * 3600, END]


def test_costs_per_model_and_unpriced_models(prometheus: FakePrometheus) -> None:
    prices = Prices(None, (("*H100*", 4.0), ("*A100*", 2.0)), 0.1, "EUR")
    report = day_report(prometheus, prices)
    llama, notebook = report.pods[0].usage, report.pods[1].usage
    assert llama.cost == pytest.approx(48 * 4.0 + llama.energy_kwh * 0.1)
    assert notebook.cost == pytest.approx(12 * 2.0 + notebook.energy_kwh * 0.1)
    assert report.total.cost == pytest.approx(llama.cost + notebook.cost + report.workloads[0].usage.cost)
    partial = day_report(prometheus, Prices(None, (("*H100*", 4.0),)))
    assert partial.pods[0].usage.cost == pytest.approx(192) and partial.pods[1].usage.cost is None
    assert partial.total.cost is None
    assert partial.warnings == (f"no GPU-hour price for GPU model(s) {A100}: their pods have no cost (add them "
                                "to the price file, or a default)",)
    energy_only = day_report(prometheus, Prices(kwh=0.5))
    assert energy_only.pods[0].usage.cost == pytest.approx(energy_only.pods[0].usage.energy_kwh * 0.5)


def test_gpus_without_busy_figures_do_not_count_as_idle(prometheus: FakePrometheus) -> None:
    """A MIG instance without GPM (A100) has allocated time and no busy series: its pod's efficiency is
    unknown, and its namespace's is that of its other GPUs."""
    prometheus.pods[("training", "mig-job", "GPU-cccc")] = (43200.0, None, 0.0, 0.0, 43200.0 * 100)
    report = day_report(prometheus)
    pods = {p.pod: p.usage for p in report.pods}
    assert pods["mig-job"].busy_gpu_seconds is None and pods["mig-job"].efficiency_ratio is None
    training = next(n.usage for n in report.namespaces if n.namespace == "training")
    assert training.allocated_gpu_hours == pytest.approx(60)
    assert training.efficiency_ratio == pytest.approx(0.75)  # llama-ft-0's alone
    assert report.total.efficiency_ratio == pytest.approx((69120 + 60480 + 2160 + 17280) /
                                                          (86400 * 2 + 43200 + 21600))


def test_namespace_filter_and_an_empty_range(prometheus: FakePrometheus) -> None:
    report = day_report(prometheus, namespaces=("research",))
    assert [p.pod for p in report.pods] == ["notebook-7"] and report.workloads == ()
    assert 'namespace=~"research"' in prometheus.requests[0][1]["query"]
    prometheus.pods.clear()
    prometheus.workloads.clear()
    empty = day_report(prometheus)
    assert empty.pods == () and empty.total == Usage()
    assert "no accounting series (gpuagent_pod_gpu_allocated_seconds_total, ...)" in empty.warnings[0]
    # the agents were scraped, and saw no workload: the hint says so, not "are the agents scraped there?"
    assert "though 2 agent(s) were scraped there: they saw no workload" in empty.warnings[0]
    job = ('job=~"gpuagent"',)  # the CLI's default --job: the agents counted are that job's
    empty = day_report(prometheus, matchers=job)
    assert 'though 2 agent(s) of job "gpuagent" were scraped there' in empty.warnings[0]
    assert prometheus.requests[-1][1]["query"] == 'count(count_over_time(gpuagent_build_info{job=~"gpuagent"}[86400s]))'
    prometheus.agents = 0
    empty = day_report(prometheus, matchers=job)
    assert 'no agent of job "gpuagent" was scraped there in that range' in empty.warnings[0]
    assert "(--job)" in empty.warnings[0] and "selection" not in empty.warnings[0]
    selected = day_report(prometheus, namespaces=("research",))
    assert "for that range and selection" in selected.warnings[0]


def test_a_strays_busy_time_is_busy_but_not_efficiency(prometheus: FakePrometheus) -> None:
    """A pod's process on a GPU its pod was not given (a stray: allocated 0 there) adds busy GPU-hours, not
    efficiency: the demo's notebook read 130 % efficient."""
    prometheus.pods.clear()
    prometheus.workloads.clear()
    allocated = (43200.0, 21600.0, 0.0, 0.0, 0.0)  # QUANTITIES order: allocated, busy, idle, memory, energy
    stray = (0.0, 28800.0, 0.0, 0.0, 0.0)
    assert q.QUANTITIES[:2] == (q.ALLOCATED, q.BUSY)
    prometheus.pods[("research", "notebook", "GPU-aaaa")] = allocated
    prometheus.pods[("research", "notebook", "GPU-bbbb")] = stray
    usage = day_report(prometheus).pods[0].usage
    assert usage.busy_gpu_hours == pytest.approx(14.0) and usage.allocated_gpu_hours == pytest.approx(12.0)
    assert usage.efficiency_ratio == pytest.approx(0.5)  # 6 of its 12 allocated hours busy, not 14 of 12


def test_usage_arithmetic_keeps_none_apart_from_zero() -> None:
    assert (Usage(1.0, None) + Usage(2.0, None)) == Usage(3.0, None)
    assert (Usage(1.0, None) + Usage(None, 0.0)) == Usage(1.0, 0.0)
    assert Usage(0.0, 0.0).efficiency_ratio is None and Usage(10.0, None).efficiency_ratio is None
    assert quantity(None) == "-" and quantity(0.0) == "0" and quantity(12345.67) == "12,345.7"
    assert quantity(12.345) == "12.35" and quantity(0.0083333) == "0.00833" and quantity(0.00001) == "1.00e-05"
    assert percent(0.75) == "75.0%" and money(1234.5) == "1,234.50" and percent(None) == "-"


# -- formats ------------------------------------------------------------------------------------------------

def test_table(prometheus: FakePrometheus) -> None:
    text = renderer("table")(day_report(prometheus, Prices(2.0, (), 0.1, "USD")))
    lines = text.splitlines()
    assert lines[0] == f"GPU accounting 2024-05-01T00:00:00Z .. 2024-05-02T00:00:00Z (1d) from {prometheus.url}"
    assert lines[1] == "prices: 2 USD/GPU-hour; 0.1 USD/kWh"
    assert re.split(r"\s{2,}", lines[3]) == ["NAMESPACE", "PODS", "GPU-h ALLOCATED", "GPU-h BUSY", "EFFICIENCY",
                                            "GPU-h IDLE", "MEMORY GiB-h", "ENERGY kWh", "COST USD"]
    assert re.split(r"\s{2,}", lines[4]) == ["training", "1", "48.00", "36.00", "75.0%", "1.00", "2,832.0",
                                            "25.44", "98.54"]
    assert re.split(r"\s{2,}", lines[6]) == ["TOTAL", "2", "60.00", "36.60", "61.0%", "12.00", "2,904.0",
                                            "26.52", "122.65"]
    assert "slurm_job" in text and "job_4242" in text
    assert lines[-1].split()[:2] == ["ALL", "66.00"]


def test_csv(prometheus: FakePrometheus) -> None:
    rows = list(csv.DictReader(io.StringIO(renderer("csv")(day_report(prometheus)))))
    assert [r["level"] for r in rows] == ["namespace", "namespace", "pod", "pod", "workload", "total"]
    assert rows[2]["pod"] == "llama-ft-0" and float(rows[2]["allocated_gpu_hours"]) == 48.0
    assert rows[2]["cost"] == "" and rows[2]["start"] == "2024-05-01T00:00:00Z"
    assert rows[4]["workload_kind"] == "slurm_job" and float(rows[-1]["allocated_gpu_hours"]) == 66.0


def test_json(prometheus: FakePrometheus) -> None:
    document = json.loads(renderer("json")(day_report(prometheus, Prices(gpu_hour_default=1.0))))
    assert document["range"] == {"start": "2024-05-01T00:00:00Z", "end": "2024-05-02T00:00:00Z",
                                 "start_unix": END - DAY, "end_unix": END, "seconds": DAY, "chunk_seconds": DAY}
    assert document["pods"][0] == {
        "namespace": "training", "pod": "llama-ft-0", "gpu_models": [H100], "allocated_gpu_hours": 48.0,
        "busy_gpu_hours": 36.0, "busy_elsewhere_gpu_hours": 0.0, "efficiency_ratio": 0.75, "idle_gpu_hours": 1.0,
        "memory_gib_hours": 2832.0, "energy_kwh": pytest.approx(25.44), "cost": 48.0, "notes": []}
    assert document["notes"] == {}  # every figure adds up: nothing to explain
    assert document["prices"]["gpu_hour_default"] == 1.0
    assert len(document["timeline"]["cluster"]) == 24 and set(document["timeline"]["namespaces"]) == {
        "training", "research"}


def test_html(prometheus: FakePrometheus) -> None:
    page = renderer("html")(day_report(prometheus, Prices(2.0, (), 0.1, "USD")))
    assert page.count("<svg") == 3 and "<metadata" not in page
    assert not re.search(r'(src|href)="(https?:)?//|<script|<link|@import|url\(http', page)
    for table in ("namespaces-table", "idle-table", "pods-table", "workloads-table"):
        assert f'<table id="{table}">' in page
    assert '<td class="num" data-figure="allocated_gpu_hours" data-value="48.0">48.00</td>' in page
    assert ">llama-ft-0<" in page and ">notebook-7<" in page
    svg = re.search(r'id="plot-namespaces"><svg.*?</svg>', page, re.DOTALL).group(0)
    assert ">training<" in svg and ">research<" in svg  # text kept as text
    clip_ids = re.findall(r'<clipPath id="([^"]+)"', page)
    assert len(clip_ids) == len(set(clip_ids)), "plots share clip-path ids"
    weird = FakePrometheus()
    weird.pods = {("<b>ns</b>", 'pod"&', "GPU-aaaa"): POD_DAY[("training", "llama-ft-0", "GPU-aaaa")]}
    with serve(weird) as fake:
        escaped = renderer("html")(day_report(fake))
    assert "<b>ns</b>" not in escaped and "&lt;b&gt;ns&lt;/b&gt;" in escaped and "pod&quot;&amp;" in escaped


# -- the command --------------------------------------------------------------------------------------------

def test_command_prints_each_format(prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    base = ["--prometheus", prometheus.url, "--start", "2024-05-01", "--end", "2024-05-02", "--quiet"]
    code, out, err = run_cli(capsys, *base)
    assert code == 0 and out.startswith("GPU accounting 2024-05-01") and err == ""
    code, out, _ = run_cli(capsys, *base, "--format", "json", "--step", "6h", "--chunk", "12h")
    document = json.loads(out)
    assert code == 0 and len(document["timeline"]["cluster"]) == 4 and document["range"]["chunk_seconds"] == 43200
    page = tmp_path / "day.html"
    code, out, _ = run_cli(capsys, *base, "--format", "html", "--output", str(page))
    assert code == 0 and out == "" and page.read_text().startswith("<!DOCTYPE html>")
    code, out, err = run_cli(capsys, *base[:-1], "--format", "csv", "--progress")
    assert code == 0 and out.startswith("level,namespace,pod,")
    first, progress = err.split("\n", 1)
    assert first == 'gpuagent report: reading series {job=~"gpuagent"}'
    assert re.match(r"\[1/15\] \[\.+\]\s+\d+\.\ds  gpuagent_pod_gpu_allocated_seconds_total", progress)
    assert err.splitlines()[-1].startswith("15 queries in ")


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "7d", "--start", "2024-05-01"], "--since and --start name the range twice"),
    ([], "no time range: give --since"),
    (["--since", "seven days"], "--since: expected a duration like 30s"),
    (["--start", "tomorrow"], "--start: expected Unix seconds, an RFC 3339 time"),
    (["--start", "2024-05-02", "--end", "2024-05-01"], "is not before the end"),
    (["--since", "1d", "--price-gpu-hour", "two"], "--price-gpu-hour: expected a price (a number >= 0), got 'two'"),
    (["--since", "1d", "--price-kwh", "-1"], "--price-kwh: expected a price (a number >= 0)"),
    (["--since", "1d", "--prices", "/nonexistent/prices.yaml"], "--prices /nonexistent/prices.yaml: cannot read it"),
    (["--since", "1d", "--step", "0"], "--step: expected a duration > 0"),
    (["--since", "1d", "--chunk", "x"], "--chunk: expected a duration"),
    (["--since", "1d", "--output", "/nonexistent/dir/r.html"], "--output: no directory /nonexistent/dir"),
    (["--since", "1d", "--selector", "prod"], "--selector: expected label matchers"),
    (["--since", "1d", "--namespace", " "], "--namespace: expected a namespace name"),
    (["--since", "1d", "--password-file", "/nonexistent"], "--password-file: cannot read /nonexistent"),
])
def test_bad_arguments_exit_2_with_one_message(prometheus: FakePrometheus, capsys: pytest.CaptureFixture[str],
                                               args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "--prometheus", prometheus.url, *args)
    assert code == 2 and out == ""
    assert err.startswith("gpuagent report: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert prometheus.requests == []  # nothing was asked before the arguments were checked


def test_unreachable_or_broken_prometheus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from prometheus_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run_cli(capsys, "--prometheus", url, "--since", "1d")
    assert (code, out) == (2, "")
    assert err == f"gpuagent report: cannot reach Prometheus at {url}: connection refused (is it running, on " \
                  "that port?)\n"
    with serve(FakePrometheus(error=(503, "upstream connect error"))) as fake:
        code, _, err = run_cli(capsys, "--prometheus", fake.url, "--since", "1d")
    assert code == 2 and "HTTP 503" in err and "upstream connect error" in err
    code, _, err = run_cli(capsys, "--since", "1d")  # argparse: --prometheus is required
    assert code == 2 and "--prometheus" in err
