"""Every PromQL expression the repository ships, proved against a real Prometheus scraping real agents.

Two ``gpuagent run`` processes on loopback, scraped every second by Debian's ``prometheus``:

- ``gpu-node-1``: the simulated 8xH100 node (``examples/scenarios/h100-8x-64proc.yaml``, plus an XID on GPU 5,
  an XID on GPU 2, single-bit ECC errors on GPU 6 and PCIe replays on GPU 0 early on, so the fault panels
  have something to show) WITH TENANTS: a ``/proc`` tree of kubelet-shaped cgroup files for the scenario's
  fake PIDs, the fake API server (a kubeconfig) naming the pods and giving them ``gpuagent.io/*``
  annotations, and the real gRPC pod-resources server giving their GPUs (time-slicing replicas
  ``GPU-…::n``; GPU 7 whole to one pod; one pod uses a GPU it was not given). ``mode: audit``,
  ``default_gpu_share: 20``, ``default_gpu_memory: 4Gi`` and two ``policies`` rules, so the enforcement
  families (shares, frozen ratios, the memory ladder, actions, policy problems) exist. Poll every 0.5 s.
- ``gpu-node-2``: the simulated A100 MIG node (``examples/scenarios/a100-mig.yaml``), pods known from their
  cgroups only, enforcement off: MIG labels exist, and every query is asked of a two-node Prometheus, as in
  production (a join that forgets ``Hostname``/``instance`` fails here as it would there).

The rules files that ``promtool check rules`` accepts are loaded into that Prometheus (evaluated every
second), so a dashboard may use their recording rules. After about twelve scrapes (``rate(...[1m])`` has
points to work with; ranges and Grafana's interval variables are ``1m``):

- every dashboard expression (panel targets, query variables, ``dashboards/compat/*.txt``) must parse and
  evaluate without error and return data (an instant query now, or failing that a range over the scrapes);
  annotation queries must only parse and evaluate;
- every alerting and recording rule expression must parse and evaluate (it may be quiet), its file must
  pass ``promtool check rules``, and Prometheus must report its evaluation healthy;
- every metric name any of them selects must exist: in Prometheus, as a recording rule, or in the agent's
  source (a series of a rare state). A typo behind ``or on() vector(0)`` or in a quiet alert is caught so.

Each file is its own test (``test_expressions[dashboards/x.json]``) and lists every broken expression of
that file at once: where (panel title, variable, line, alert name), the expression as written and as sent,
and Prometheus' error. ``test_the_harness_classifies_queries`` proves the harness on files of its own.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_server import (
    PrometheusQueryError,
    PrometheusServer,
    prometheus_binary,
    promtool_binary,
)
from promql_sources import (
    Expression,
    ExtractionError,
    expression_files,
    expressions_in,
    is_rules_file,
    metric_names,
)
from tenant_node import FAKE_PID, H100, ROOT, Agent, fake_kubernetes, gpu_uuids, h100_tenants, write_proc

A100_MIG = ROOT / "examples" / "scenarios" / "a100-mig.yaml"
NODE_1, NODE_2 = "gpu-node-1", "gpu-node-2"  # NODE_1 is fake_apiserver.NODE: the pods' spec.nodeName
SCRAPES = 12  # scrapes of each agent before the queries: rate(...[1m]) has points, counters have moved
ALERTS_TEST = ROOT / "tests" / "test_alerts.py"
# Series Prometheus makes itself (ALERTS only while an alert is pending or firing).
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
                     "scrape_samples_post_metric_relabeling", "ALERTS", "ALERTS_FOR_STATE"}
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")

pytestmark = pytest.mark.integration

FILES = expression_files(ROOT)


# -- the stack ---------------------------------------------------------------------------------------------

@dataclass
class Stack:
    prometheus: PrometheusServer
    agents: list[Agent]
    promtool_errors: dict[Path, str]  # rules file -> what `promtool check rules` said (not loaded)
    started: float  # when the first scrape could happen (time.time())
    timings: dict[str, float]
    known_names: set[str] = field(default_factory=set, repr=False)  # metric names a query may select

    def unknown(self, names: set[str]) -> set[str]:
        return {n for n in names if n not in self.known_names
                and not any(n.endswith(s) and n[: -len(s)] in self.known_names for s in SUFFIXES)}


def harness_files(directory: Path) -> dict[str, Path]:
    """The harness's own dashboard, query list and rules files, with one query of every outcome."""
    directory.mkdir(parents=True, exist_ok=True)
    dashboard = {
        "title": "harness", "uid": "harness",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "node", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(gpuagent_up, Hostname)", "refId": "A"}, "multi": True,
             "includeAll": True},
            {"name": "gpu", "type": "query", "datasource": "$datasource",
             "query": 'label_values(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node"}, gpu)', "includeAll": True},
            {"name": "nothing", "type": "query", "query": "label_values(gpuagent_no_such_metric, gpu)"},
            {"name": "cluster", "type": "query", "query": "label_values(gpuagent_up, cluster)", "includeAll": True},
            {"name": "region", "type": "query", "query": "label_values(gpuagent_up, region)"},
            {"name": "top", "type": "custom", "query": "5,10", "current": {"value": "5"}},
            {"name": "window", "type": "interval", "query": "1m,5m"},
            {"name": "names", "type": "query", "query": "label_names()"},
        ]},
        "annotations": {"list": [
            {"name": "Annotations & Alerts", "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}},
            {"name": "xids", "datasource": {"type": "prometheus"}, "expr": "changes(gpuagent_gpu_xid_errors_total[$__interval]) > 1000"},
        ]},
        "panels": [
            {"id": 1, "type": "timeseries", "title": "GPU utilization",
             "targets": [{"refId": "A", "expr": 'avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node", gpu=~"$gpu"})'},
                         {"refId": "B", "expr": "topk($top, rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$__rate_interval]))"}]},
            {"id": 2, "type": "row", "title": "Pods", "collapsed": True, "panels": [
                {"id": 3, "type": "timeseries", "title": "Pod SM use",
                 "targets": [{"refId": "A", "expr": 'sum by (namespace, pod) (gpuagent_pod_gpu_sm_utilization_ratio{Hostname=~"${node:regex}"})'},
                             {"refId": "B", "expr": "harness:gpu_util:avg_over_time_window"}]},
                {"id": 4, "type": "stat", "title": "A GPU that does not exist",
                 "targets": [{"refId": "A", "expr": 'DCGM_FI_DEV_GPU_UTIL{gpu="99"}'}]},
                {"id": 5, "type": "stat", "title": "Broken",
                 "targets": [{"refId": "A", "expr": "sum(rate(DCGM_FI_DEV_GPU_UTIL[5m])"}]},
            ]},
            {"id": 6, "type": "timeseries", "title": "Equality on a multi-value variable",
             "targets": [{"refId": "A", "expr": 'max_over_time(gpuagent_up{Hostname="$node"}[$window])'}]},
            {"id": 7, "type": "timeseries", "title": "Many-to-many",
             "targets": [{"refId": "A", "expr": "DCGM_FI_DEV_GPU_UTIL * on (gpu) group_left DCGM_FI_DEV_FB_USED"}]},
            {"id": 8, "type": "text", "title": "Notes"},
            {"id": 10, "type": "stat", "title": "A typo behind a fallback",
             "targets": [{"refId": "A", "expr": "count(gpuagent_pod_gpu_frozn_ratio > 0) or on() vector(0)"}]},
            {"id": 9, "type": "timeseries", "title": "Logs", "datasource": {"type": "loki", "uid": "loki"},
             "targets": [{"refId": "A", "expr": '{job="gpuagent"} |= "XID"'}]},
        ],
    }
    rules = {"groups": [{"name": "harness", "rules": [
        {"record": "harness:gpu_util:avg_over_time_window", "expr": "avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m])"},
        {"alert": "HarnessGpuOnFire", "expr": "DCGM_FI_DEV_GPU_TEMP > 1000", "for": "1m",
         "labels": {"severity": "critical"}, "annotations": {"summary": "GPU {{ $labels.gpu }} melts"}},
        {"alert": "HarnessManyToMany", "expr": "DCGM_FI_DEV_GPU_UTIL > on (gpu) group_left DCGM_FI_DEV_FB_USED"},
        {"alert": "HarnessTypo", "expr": "increase(gpuagent_gpu_xid_error_total[5m]) > 0"},
        {"alert": "HarnessRareSeries", "expr": "increase(gpuagent_nvml_errors_total[5m]) > 0"},
    ]}]}
    broken_rules = {"groups": [{"name": "harness-broken", "rules": [
        {"alert": "HarnessUnbalanced", "expr": "sum(rate(DCGM_FI_DEV_GPU_UTIL[1m])"},
    ]}]}
    files = {
        "dashboard": directory / "harness.json",
        "compat": directory / "harness-compat.txt",
        "rules": directory / "harness.yml",
        "broken_rules": directory / "harness-broken.yml",
    }
    import json

    files["dashboard"].write_text(json.dumps(dashboard, indent=1))
    files["compat"].write_text(
        "# dcgm-exporter queries community dashboards use\n\n"
        'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}\n'
        "avg(DCGM_FI_DEV_GPU_TEMP) by (gpu\n"
        "DCGM_FI_DEV_NO_SUCH_FIELD\n")
    files["rules"].write_text(yaml.safe_dump(rules, sort_keys=False))
    files["broken_rules"].write_text(yaml.safe_dump(broken_rules, sort_keys=False))
    return files


def promtool_check(path: Path) -> str | None:
    """``None`` when ``promtool check rules`` accepts the file, else what it said."""
    out = subprocess.run([promtool_binary(), "check", "rules", str(path)], capture_output=True, text=True,
                         timeout=60)
    return None if out.returncode == 0 else (out.stdout + out.stderr).strip()


@pytest.fixture(scope="module")
def harness_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("promql-harness")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, harness_dir: Path) -> Iterator[Stack]:
    prometheus_binary()  # skips, saying how to install it, when it is missing
    began = time.monotonic()
    timings: dict[str, float] = {}
    work = tmp_path_factory.mktemp("promql")
    harness = harness_files(harness_dir)
    rule_files = [p for p in FILES if is_rules_file(p)] + [harness["rules"], harness["broken_rules"]]
    promtool_errors = {p: err for p in rule_files if (err := promtool_check(p)) is not None}
    loaded = [p for p in rule_files if p not in promtool_errors]

    scenario = yaml.safe_load(H100.read_text())
    scenario["faults"] = [*scenario.get("faults", []),
                          {"xid": {"gpu": 5, "at": 2, "code": 31}}, {"xid": {"gpu": 2, "at": 3, "code": 48}},
                          {"ecc_sbe": {"gpu": 6, "at": 2}}, {"pcie_replay": {"gpu": 0, "at": 2, "count": 3}}]
    h100 = work / "h100-tenants.yaml"
    h100.write_text(yaml.safe_dump(scenario, sort_keys=False))
    tenants, cgroups = h100_tenants(scenario["processes"])
    proc_1 = write_proc(work / "node-1" / "proc", cgroups)
    mig = yaml.safe_load(A100_MIG.read_text())
    proc_2 = write_proc(work / "node-2" / "proc", {
        FAKE_PID + i: (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                       f"{i:08x}_0000_4000_8000_a100000{i:05x}.slice/cri-containerd-{i:064x}.scope\n")
        for i in range(len(mig["processes"]))})
    agents: list[Agent] = []
    prom: PrometheusServer | None = None
    with fake_kubernetes(tenants, gpu_uuids(h100), work) as (kubeconfig, socket_path):
        try:
            agents.append(Agent(NODE_1, {
                "backend": "sim", "scenario": str(h100), "poll_interval": 0.5, "proc_root": str(proc_1),
                "pod_resources_socket": str(socket_path), "pod_resources_interval": 1,
                "kubernetes_api": "on", "kubeconfig": str(kubeconfig),
                "mode": "audit", "default_gpu_share": 20, "default_gpu_memory": "4Gi",
                "memory_term_after": 3, "journal_path": str(work / "node-1" / "journal.json"),
                "cgroup_root": str(work / "node-1" / "cgroup"),
                "policies": [{"match_kind": "systemd_service", "gpu_share": 10, "gpu_memory": "8Gi"},
                             {"match_namespace": "research", "gpu_share": 15}],
            }, work / "node-1"))
            agents.append(Agent(NODE_2, {
                "backend": "sim", "scenario": str(A100_MIG), "poll_interval": 0.5, "proc_root": str(proc_2),
                "pod_resources_socket": None, "kubernetes_api": "off", "mode": "off",
                "journal_path": str(work / "node-2" / "journal.json"),
            }, work / "node-2"))
            # Prometheus applies new targets up to 5 s after it starts: let that overlap the agents' start.
            prom = PrometheusServer([a.target for a in agents], work / "prometheus", rule_files=loaded)
            prom.start()
            started = time.time()
            timings["prometheus_ready_s"] = time.monotonic() - began
            for agent in agents:
                agent.wait_ready()
            timings["agents_ready_s"] = time.monotonic() - began
            prom.wait_for_samples("gpuagent_up", SCRAPES, timeout=45)
            timings["scraped_s"] = time.monotonic() - began
            yield Stack(prom, agents, promtool_errors, started, timings,
                        known_names(prom, rule_files))
        finally:
            if prom is not None:
                prom.stop()
            for agent in agents:
                agent.stop()


# -- checking ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    expression: Expression | None
    category: str  # extraction | promtool | lint | parse | execution | unknown-metric | no-data | rule-health
    detail: str
    where: str = ""

    def render(self, root: Path = ROOT) -> str:
        if self.expression is None:
            return f"[{self.category}] {self.where}\n    {self.detail}"
        e = self.expression
        lines = [f"[{self.category}] {e.label(root)}", f"    expr:  {' '.join(e.expr.split())}"]
        if e.promql != e.expr.strip():
            lines.append(f"    sent:  {' '.join(e.promql.split())}")
        lines.append(f"    error: {self.detail}")
        return "\n".join(lines)


def known_names(prom: PrometheusServer, rule_files: Sequence[Path]) -> set[str]:
    """Every metric name a query may rightly select: what Prometheus holds now, what recording rules
    define, what Prometheus makes, and every identifier of the agent's source (a series that shows only in
    a rare state, an NVML error or an eviction, is named there though it was never scraped here)."""
    names = set(prom.api("label/__name__/values")) | PROMETHEUS_SERIES
    for path in rule_files:
        with contextlib.suppress(ExtractionError):
            names |= {e.where.split("'")[1] for e in expressions_in(path) if e.kind == "record"}
    for source in (ROOT / "gpuagent").rglob("*.py"):
        names |= set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", source.read_text()))
    return names


def check_expression(stack: Stack, expression: Expression) -> list[Failure]:
    prom = stack.prometheus
    failures = [Failure(expression, "lint", problem) for problem in expression.problems]
    if not expression.promql:
        return failures
    try:
        result = prom.query(expression.promql)
    except PrometheusQueryError as exc:
        category = "parse" if exc.error_type == "bad_data" else "execution"
        return [*failures, Failure(expression, category, f"{exc.error_type}: {exc.error}")]
    for name in sorted(stack.unknown(metric_names(expression.promql))):
        failures.append(Failure(expression, "unknown-metric",
                                f"{name}: no such series in Prometheus, no recording rule and no such name "
                                f"in gpuagent/ (a typo? it can only ever return nothing)"))
    if expression.needs_data and result.has_data and expression.values_label and not expression.include_all:
        label = expression.values_label
        if not any(series["metric"].get(label) for series in result.result):
            failures.append(Failure(expression, "no-data",
                                    f"no series has a {label!r} label: the variable has no values (and no All)"))
    if expression.needs_data and not result.has_data:
        end = time.time()
        try:
            ranged = prom.query_range(expression.promql, max(stack.started, end - 60), end, step=1)
        except PrometheusQueryError as exc:
            return [*failures, Failure(expression, "execution", f"{exc.error_type}: {exc.error} (range query)")]
        if not ranged.has_data:
            failures.append(Failure(expression, "no-data",
                                    f"empty result ({result.result_type}), now and over the last "
                                    f"{end - max(stack.started, end - 60):.0f} s of scrapes"))
    return failures


def rule_health(prom: PrometheusServer, path: Path) -> list[Failure]:
    """What Prometheus says of the evaluation of the rules loaded from ``path``."""
    failures = []
    resolved = str(path.resolve())
    groups = [group for group in prom.rules() if group.get("file") == resolved]
    if not groups:
        failures.append(Failure(None, "rule-health", "Prometheus has no rule group from this file",
                                where=f"{_rel(path)}: loading"))
    for group in groups:
        for rule in group.get("rules", []):
            if rule.get("health") == "err" or rule.get("lastError"):
                kind = "alert" if rule.get("type") == "alerting" else "record"
                failures.append(Failure(None, "rule-health", f"{rule.get('lastError')}",
                                        where=f"{_rel(path)}: {kind} {rule.get('name')!r} (group "
                                              f"{group.get('name')!r}): evaluation"))
    return failures


def check_file(stack: Stack, path: Path) -> tuple[list[Expression], list[Failure]]:
    try:
        expressions = expressions_in(path)
    except ExtractionError as exc:
        return [], [Failure(None, "extraction", str(exc), where=_rel(path))]
    failures: list[Failure] = []
    if path in stack.promtool_errors:
        failures.append(Failure(None, "promtool", stack.promtool_errors[path],
                                where=f"{_rel(path)}: promtool check rules (not loaded into Prometheus)"))
    for expression in expressions:
        failures += check_expression(stack, expression)
    if is_rules_file(path) and path not in stack.promtool_errors:
        failures += rule_health(stack.prometheus, path)
    return expressions, failures


def _rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(ROOT))
    return str(path)


def report(path: Path, expressions: list[Expression], failures: list[Failure]) -> str:
    head = f"{_rel(path)}: {len(failures)} problem(s) in {len(expressions)} expression(s)"
    return "\n".join([head, *(f.render() for f in failures)])


# -- tests -------------------------------------------------------------------------------------------------

def test_extraction_without_prometheus(tmp_path: Path) -> None:
    """promql_sources alone (no Prometheus needed): where expressions hide, how variables are sent."""
    import json

    dashboard = tmp_path / "old.json"
    dashboard.write_text(json.dumps({"dashboard": {  # an API export, with the pre-5.0 rows schema
        "templating": {"list": [
            {"name": "node", "type": "query", "query": "label_values(instance)", "multi": True},
            {"name": "q", "type": "query", "query": "query_result(topk(3, up))"},
            {"name": "m", "type": "query", "query": "metrics(DCGM_.*)"},
            {"name": "ln", "type": "query", "query": "label_names()"},
            {"name": "step", "type": "interval", "query": "30s,1m"},
            {"name": "logs", "type": "query", "datasource": {"type": "loki"}, "query": "label_values(app)"},
        ]},
        "rows": [{"title": "r", "panels": [{"id": 1, "title": "p", "targets": [
            {"refId": "A", "expr": 'sum(rate(x{instance="[[node]]"}[$step])) by (gpu) / $__range_s'},
            {"refId": "B", "expr": "rate(x[${__rate_interval}]) * $__interval_ms + y offset $step"},
            {"refId": "C", "expr": ""},
            {"refId": "D", "datasource": "-- Grafana --", "expr": "ignored"},
        ]}]}],
    }}))
    found = {e.where: e for e in expressions_in(dashboard)}
    assert {w: e.promql for w, e in found.items()} == {
        "variable $node": 'group by (instance) ({instance!=""})',
        "variable $q": "topk(3, up)",
        "variable $m": 'group by (__name__) ({__name__=~"DCGM_.*"})',
        "row 'r' / panel 'p' (id 1) / target A": 'sum(rate(x{instance=~".*"}[1m])) by (gpu) / 60',
        "row 'r' / panel 'p' (id 1) / target B": "rate(x[1m]) * 60000 + y offset 1m",
    }
    assert found["row 'r' / panel 'p' (id 1) / target A"].problems  # multi-value $node with =
    assert not found["row 'r' / panel 'p' (id 1) / target B"].problems
    assert all(e.needs_data for e in found.values())

    rules = tmp_path / "r.yml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - record: a:b\n    expr: sum(x)\n"
                     "  - alert: A\n    expr: a:b > 1\n")
    assert [(e.kind, e.where, e.needs_data) for e in expressions_in(rules)] == [
        ("record", "record 'a:b' (group 'g')", False), ("alert", "alert 'A' (group 'g')", False)]
    (tmp_path / "bad.yml").write_text("groups: {}\n")
    with pytest.raises(ExtractionError):
        expressions_in(tmp_path / "bad.yml")
    assert metric_names('sum by (gpu) (rate(a_total{b="c d"}[1m] offset 5m)) / on (gpu) group_left(pod) '
                        'b:rec or on() vector(0) and bool 1e3') == {"a_total", "b:rec"}


def test_the_stack_has_tenants_enforcement_and_two_nodes(stack: Stack) -> None:
    """What the queries run against: named pods, allocations, audit-mode shares and memory stages, MIG."""
    prom = stack.prometheus

    def values(expr: str) -> dict[str, float]:
        return {",".join(f"{k}={v}" for k, v in sorted(s["metric"].items())): float(s["value"][1])
                for s in prom.query(expr).result}

    assert values("sum by (instance) (gpuagent_up)") == {f"instance={a.target}": 1 for a in stack.agents}
    assert set(values("count by (Hostname) (DCGM_FI_DEV_FB_USED)")) == {f"Hostname={NODE_1}", f"Hostname={NODE_2}"}
    node_1 = f'instance="{stack.agents[0].target}"'  # the agent-level families carry no Hostname
    pods = values(f"count by (namespace) (gpuagent_pod_info{{{node_1}}})")
    assert pods == {"namespace=research": 7, "namespace=serving": 14, "namespace=training": 22}, pods
    assert values(f'count(gpuagent_pod_gpu_share_limit_ratio{{Hostname="{NODE_1}"}})')
    assert values('sum by (instance) (gpuagent_enforcement_mode{mode="audit"})') == {
        f"instance={stack.agents[0].target}": 1}
    stages = values('count by (stage) (gpuagent_pod_gpu_memory_limit_stage == 1)')
    assert set(stages) - {"stage=ok"}, stages  # eval-g's 7-9 GiB are over the 4Gi default
    assert values('gpuagent_pod_policy_problem{pod="notebook-0"}')
    assert values("count(gpuagent_pod_gpu_allocated)")
    assert values('count(DCGM_FI_DEV_GPU_UTIL{pod="pretrain-0"})')  # GPU 7: one pod, dcgm's labels
    assert values('count(DCGM_FI_DEV_FB_USED{GPU_I_PROFILE!=""})')  # the MIG node
    assert values("sum(gpuagent_gpu_xid_errors_total)")
    assert all(t["health"] == "up" for t in prom.targets_health())
    print("timings:", {k: round(v, 1) for k, v in stack.timings.items()})


def test_the_harness_classifies_queries(stack: Stack, harness_dir: Path) -> None:
    """The harness's own files: a query of every outcome lands where it belongs."""
    files = {p.name: p for p in harness_dir.iterdir()}
    outcome: dict[tuple[str, str], set[str]] = {}
    extracted: dict[str, list[Expression]] = {}
    for name, path in files.items():
        expressions, failures = check_file(stack, path)
        extracted[name] = expressions
        for expression in expressions:
            outcome[(name, expression.where)] = set()
        for failure in failures:
            key = (name, failure.expression.where if failure.expression else failure.where)
            outcome.setdefault(key, set()).add(failure.category)
        print(report(path, expressions, failures))

    dashboard = {where: kinds for (name, where), kinds in outcome.items() if name == "harness.json"}
    assert dashboard == {
        "variable $node": set(),
        "variable $gpu": set(),
        "variable $nothing": {"no-data", "unknown-metric"},
        "variable $cluster": set(),  # no series has the label, and "All" renders anyway
        "variable $region": {"no-data"},  # no series has the label: an empty dropdown
        "annotation 'xids'": set(),  # quiet, and annotations may be
        "panel 'GPU utilization' (id 1) / target A": set(),
        "panel 'GPU utilization' (id 1) / target B": set(),
        "row 'Pods' / panel 'Pod SM use' (id 3) / target A": set(),
        "row 'Pods' / panel 'Pod SM use' (id 3) / target B": set(),  # the harness's recording rule
        "row 'Pods' / panel 'A GPU that does not exist' (id 4) / target A": {"no-data"},
        "row 'Pods' / panel 'Broken' (id 5) / target A": {"parse"},
        "panel 'Equality on a multi-value variable' (id 6) / target A": {"lint"},
        "panel 'Many-to-many' (id 7) / target A": {"execution"},
        "panel 'A typo behind a fallback' (id 10) / target A": {"unknown-metric"},
    }, dashboard
    sent = {e.where: e.promql for e in extracted["harness.json"]}
    assert sent["variable $gpu"] == 'group by (gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname=~".*"})'
    assert sent["panel 'GPU utilization' (id 1) / target B"] == "topk(5, rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]))"
    assert sent["panel 'Equality on a multi-value variable' (id 6) / target A"] == \
        'max_over_time(gpuagent_up{Hostname=~".*"}[1m])'

    compat = {where: kinds for (name, where), kinds in outcome.items() if name == "harness-compat.txt"}
    assert compat == {"line 3": set(), "line 4": {"parse"}, "line 5": {"unknown-metric", "no-data"}}, compat

    rules = {where: kinds for (name, where), kinds in outcome.items() if name == "harness.yml"}
    assert rules == {
        "record 'harness:gpu_util:avg_over_time_window' (group 'harness')": set(),
        "alert 'HarnessGpuOnFire' (group 'harness')": set(),  # quiet is fine for an alert
        "alert 'HarnessManyToMany' (group 'harness')": {"execution"},
        "alert 'HarnessTypo' (group 'harness')": {"unknown-metric"},  # quiet forever
        "alert 'HarnessRareSeries' (group 'harness')": set(),  # never scraped here, but the agent has it
        f"{_rel(files['harness.yml'])}: alert 'HarnessManyToMany' (group 'harness'): evaluation": {"rule-health"},
    }, rules
    broken = {where: kinds for (name, where), kinds in outcome.items() if name == "harness-broken.yml"}
    assert broken == {
        f"{_rel(files['harness-broken.yml'])}: promtool check rules (not loaded into Prometheus)": {"promtool"},
        "alert 'HarnessUnbalanced' (group 'harness-broken')": {"parse"},
    }, broken


@pytest.mark.parametrize("path", FILES, ids=[_rel(p) for p in FILES])
def test_expressions(stack: Stack, path: Path) -> None:
    expressions, failures = check_file(stack, path)
    print(f"{_rel(path)}: {len(expressions)} expression(s) checked")
    if failures:
        pytest.fail(report(path, expressions, failures), pytrace=False)
    assert expressions or not path.read_text().strip(), f"{_rel(path)}: no expression found in it"


def _promtool_tests_run_elsewhere() -> bool:
    """Whether the alerts' own test module runs ``promtool test rules`` (it is theirs to run, not ours)."""
    if not ALERTS_TEST.exists():
        return False
    text = ALERTS_TEST.read_text()
    return "promtool" in text and re.search(r"[\"']test[\"']\s*,\s*[\"']rules[\"']|test rules", text) is not None


def test_promtool_unit_tests_of_the_rules() -> None:
    """``promtool test rules alerts/tests/*.test.yml``, unless ``tests/test_alerts.py`` already does."""
    if _promtool_tests_run_elsewhere():
        pytest.skip(f"{_rel(ALERTS_TEST)} runs `promtool test rules`")
    tests = sorted((ROOT / "alerts" / "tests").glob("*.test.y*ml"))
    if not tests:
        pytest.skip("no alerts/tests/*.test.yml yet")
    failed = []
    for path in tests:
        out = subprocess.run([promtool_binary(), "test", "rules", path.name], capture_output=True, text=True,
                             timeout=60, cwd=path.parent)
        if out.returncode != 0:
            failed.append(f"{_rel(path)}:\n{out.stdout}{out.stderr}")
    assert not failed, "\n".join(failed)
