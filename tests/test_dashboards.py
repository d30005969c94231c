"""The Grafana dashboards (``dashboards/*.json``): our conventions for them, their variables and queries, and
that ``dashboards/build.py`` writes them byte for byte.

Whether every query returns data from a real Prometheus scraping real agents is proved by
``tests/test_prometheus_queries.py``, and whether the JSON is what Grafana's published schema allows by
``tests/test_dashboard_schema.py``; here, without any server: the JSON follows our conventions (a JSON schema
of them below: the data source variable, Prometheus targets, multi-value ``label_values`` variables), ids and
refIds are unique, panels do not overlap, every variable a query uses is defined (and every variable is
used), variables sit only inside ``=~`` label matchers and interval variables only inside ranges (what the
query test's substitution relies on), and, when ``promtool`` is installed, every expression parses.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))
COMPAT = DASHBOARDS / "compat" / "dcgm-exporter-queries.txt"
EXPECTED = {"gpuagent-node-overview.json", "gpuagent-pods.json", "gpuagent-agent.json",
            "gpuagent-accounting.json"}

# Grafana's variable syntax: $var, ${var}, ${var:format}, ${var.path:format}, [[var]], [[var:format]]
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?:\.[^:}]+)?(?::[^}]+)?\}|\[\[(\w+)(?::\w+)?\]\]")
INTERVALS = {"__rate_interval", "__interval", "__range"}
REGEX_MATCHER = re.compile(r'[a-zA-Z_]\w*\s*=~\s*"(?:[^"\\]|\\.)*"')
RANGE = re.compile(r"\[[^\[\]]*\]")
PANEL_TYPES = ["row", "timeseries", "stat", "table", "state-timeline"]

GRID_POS = {
    "type": "object", "required": ["h", "w", "x", "y"],
    "properties": {"h": {"type": "integer", "minimum": 1}, "w": {"type": "integer", "minimum": 1, "maximum": 24},
                   "x": {"type": "integer", "minimum": 0, "maximum": 23}, "y": {"type": "integer", "minimum": 0}},
}
PROMETHEUS = {
    "type": "object", "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
}
TARGET = {
    "type": "object", "required": ["refId", "expr", "datasource"],
    "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"},
                   "expr": {"type": "string", "minLength": 1, "pattern": r"\S"},
                   "datasource": PROMETHEUS, "legendFormat": {"type": "string"},
                   "format": {"enum": ["time_series", "table"]}, "instant": {"type": "boolean"},
                   "range": {"type": "boolean"}},
}
PANEL = {
    "type": "object", "required": ["id", "type", "title", "gridPos"],
    "properties": {"id": {"type": "integer", "minimum": 1}, "type": {"enum": PANEL_TYPES},
                   "title": {"type": "string", "minLength": 1}, "gridPos": GRID_POS},
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["collapsed", "panels"], "properties": {"panels": {"maxItems": 0}}},
    "else": {
        "required": ["datasource", "targets", "fieldConfig", "description"],
        "properties": {
            "datasource": PROMETHEUS,
            "targets": {"type": "array", "minItems": 1, "items": TARGET},
            "fieldConfig": {"type": "object", "required": ["defaults"],
                            "properties": {"defaults": {"type": "object", "required": ["unit"]}}},
            "description": {"type": "string", "minLength": 1},
        },
    },
}
VARIABLE_SCHEMA = {
    "type": "object", "required": ["name", "type", "label"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z]\w*$"},
                   "type": {"enum": ["datasource", "query"]}},
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {"required": ["query", "datasource", "includeAll", "multi", "refresh", "current"],
             "properties": {"query": {"type": "string", "pattern": r"^label_values\("},
                            "datasource": PROMETHEUS, "multi": {"const": True},
                            "includeAll": {"const": True}}},
    "else": {"required": ["query"], "properties": {"query": {"const": "prometheus"}}},
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time", "tags", "editable",
                 "annotations", "refresh"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": r"^[a-zA-Z0-9_-]{1,40}$"},
        "schemaVersion": {"const": 39},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "templating": {"type": "object", "required": ["list"],
                       "properties": {"list": {"type": "array", "minItems": 2, "items": VARIABLE_SCHEMA}}},
        "time": {"type": "object", "required": ["from", "to"]},
        "tags": {"type": "array", "contains": {"const": "gpuagent"}, "items": {"type": "string"}},
    },
}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    found = [(f"variable ${v['name']}", v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for panel in panels(dashboard):
        for target in panel["targets"]:
            found.append((f"panel {panel['title']!r} target {target['refId']}", target["expr"]))
    return found


def variables_in(expr: str) -> set[str]:
    return {next(name for name in m.groups() if name) for m in VARIABLE.finditer(expr)}


def substitute(expr: str) -> str:
    """As Grafana renders it with All selected, intervals as 1m."""
    return VARIABLE.sub(lambda m: "1m" if next(n for n in m.groups() if n) in INTERVALS else ".*", expr)


def compat_lines() -> list[str]:
    lines = [line.strip() for line in COMPAT.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


# dashboards/build.py builds with grafana-foundation-sdk (the `dashboards` extra), which needs Python 3.11
NEEDS_BUILDER = pytest.mark.skipif(sys.version_info < (3, 11),
                                   reason="dashboards/build.py needs grafana-foundation-sdk: Python 3.11 or later")


def builder() -> Any:
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=FILES, ids=[p.name for p in FILES])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


# -- the files --------------------------------------------------------------------------------------------

def test_the_three_dashboards_are_there() -> None:
    assert {p.name for p in FILES} == EXPECTED
    assert COMPAT.is_file()


@NEEDS_BUILDER
def test_build_py_writes_the_committed_json_byte_for_byte() -> None:
    rendered = builder().render()
    assert set(rendered) == {p.name for p in FILES}, "build.py and dashboards/*.json name different files"
    for name, text in rendered.items():
        committed = (DASHBOARDS / name).read_text(encoding="utf-8")
        assert committed == text, f"{name} is not what dashboards/build.py writes: run `python dashboards/build.py`"


@NEEDS_BUILDER
def test_build_py_writes_the_same_bytes_twice_and_its_check_passes(tmp_path: Path) -> None:
    script = str(DASHBOARDS / "build.py")
    subprocess.run([sys.executable, script, "--out", str(tmp_path)], check=True, timeout=60)
    for name in EXPECTED:
        assert (tmp_path / name).read_bytes() == (DASHBOARDS / name).read_bytes()
    assert subprocess.run([sys.executable, script, "--check"], timeout=60).returncode == 0
    (tmp_path / "gpuagent-pods.json").write_text("{}")
    check = subprocess.run([sys.executable, script, "--check", "--out", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 1 and "gpuagent-pods.json" in check.stderr


def test_every_dashboard_opens_with_the_simulated_banner(dashboard: dict[str, Any]) -> None:
    """The first panel, full width above every row: red with SIMULATED in it while a selected agent says
    ``gpuagent_simulated 1``, green otherwise (0 agents, or none reporting yet)."""
    banner = dashboard["panels"][0]
    assert banner["type"] == "stat" and banner["gridPos"]["y"] == 0 and banner["gridPos"]["w"] == 24
    (target,) = banner["targets"]
    assert "gpuagent_simulated{" in target["expr"] and "== 1" in target["expr"]
    assert "or on() vector(0)" in target["expr"]
    defaults = banner["fieldConfig"]["defaults"]
    assert banner["options"]["colorMode"] == "background"
    steps = defaults["thresholds"]["steps"]
    assert steps[0]["color"] == "green" and {"value": 1, "color": "red"} in steps
    texts = {}
    for mapping in defaults["mappings"]:
        if mapping["type"] == "value":
            texts.update({value: result["text"] for value, result in mapping["options"].items()})
        else:
            assert mapping["type"] == "range" and mapping["options"]["from"] == 1
            texts["1.."] = mapping["options"]["result"]["text"]
            assert mapping["options"]["result"]["color"] == "red"
    assert "SIMULATED" in texts["1.."] and "Real GPUs" in texts["0"]


def test_uids_and_titles_are_unique() -> None:
    loaded = [load(p) for p in FILES]
    assert len({d["uid"] for d in loaded}) == len(loaded)
    assert len({d["title"] for d in loaded}) == len(loaded)


# -- one dashboard ----------------------------------------------------------------------------------------

def test_matches_the_schema(dashboard: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(DASHBOARD_SCHEMA)
    errors = sorted(jsonschema.Draft202012Validator(DASHBOARD_SCHEMA).iter_errors(dashboard), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:20])


def test_panel_ids_and_ref_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    for panel in panels(dashboard):
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    boxes = []
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((panel["title"], pos["x"], pos["y"], pos["x"] + pos["w"], pos["y"] + pos["h"]))
    for (a, ax0, ay0, ax1, ay1), (b, bx0, by0, bx1, by1) in itertools.combinations(boxes, 2):
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a!r} overlaps {b!r}"


def test_has_a_prometheus_datasource_variable_first(dashboard: dict[str, Any]) -> None:
    first = dashboard["templating"]["list"][0]
    assert (first["name"], first["type"], first["query"]) == ("datasource", "datasource", "prometheus")


def test_every_variable_used_is_defined_before_and_every_one_defined_is_used(dashboard: dict[str, Any]) -> None:
    defined: list[str] = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            missing = variables_in(variable["query"]) - set(defined)
            assert not missing, f"${variable['name']} uses {missing}, not defined before it"
        defined.append(variable["name"])
    assert len(defined) == len(set(defined)), "a variable is defined twice"
    used: set[str] = set()
    for where, expr in queries(dashboard):
        names = variables_in(expr)
        missing = {n for n in names - INTERVALS if n not in defined}
        assert not missing, f"{where} uses undefined {missing}: {expr}"
        used |= names
    unused = set(defined) - used - {"datasource"}
    assert not unused, f"variables that filter nothing: {unused}"


def test_query_variables_are_multi_value_with_all(dashboard: dict[str, Any]) -> None:
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["current"]["value"] == ["$__all"], variable["name"]
            assert variable.get("allValue") in (".*", None), variable["name"]


def test_variables_only_in_regex_matchers_and_intervals_only_in_ranges(dashboard: dict[str, Any]) -> None:
    for where, expr in queries(dashboard):
        outside_matchers = REGEX_MATCHER.sub("", expr)
        for name in variables_in(outside_matchers):
            if name in INTERVALS:
                inside_ranges = "".join(RANGE.findall(outside_matchers))
                assert name in variables_in(inside_ranges), f"{where}: ${name} outside a [range]: {expr}"
                assert name not in variables_in(RANGE.sub("", outside_matchers)), f"{where}: {expr}"
            else:
                pytest.fail(f"{where}: ${name} outside a `label=~\"...\"` matcher: {expr}")


def test_panels_and_targets_use_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]


def test_tables_are_instant_and_time_series_are_ranges(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        for target in panel["targets"]:
            if panel["type"] == "table":
                assert (target.get("format"), target.get("instant")) == ("table", True), panel["title"]
            else:
                assert target.get("range") is True and not target.get("instant"), panel["title"]


def test_series_that_may_be_absent_have_a_fallback(dashboard: dict[str, Any]) -> None:
    """Families that exist only in rare states are never queried bare: a panel that reads them says 0 (or
    "none") rather than "No data" on a healthy node."""
    rare = ("gpuagent_gpu_xid_errors_total", "gpuagent_nvml_errors_total", "gpuagent_enforcement_actions_total",
            "gpuagent_pod_policy_problem", "gpuagent_pod_gpu_unallocated_use", "gpuagent_mig_info",
            "gpuagent_pod_gpu_latency_standing", "gpuagent_pod_gpu_preemptions_total")
    for where, expr in queries(dashboard):
        if where.startswith("variable"):
            continue
        for family in rare:
            if family in expr:
                assert " or " in expr, f"{where}: {family} has no fallback: {expr}"


# -- PromQL -----------------------------------------------------------------------------------------------

def test_the_dcgm_exporter_dashboard_queries_are_kept() -> None:
    lines = compat_lines()
    assert len(lines) == 8
    metrics = {name for line in lines for name in re.findall(r"(\w+)\{", line)}
    assert metrics == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
                       "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
    for line in lines:
        assert variables_in(line) == {"instance", "gpu"}, line
        assert not variables_in(REGEX_MATCHER.sub("", line)), line


def test_every_expression_parses(tmp_path: Path) -> None:
    """``promtool check rules`` parses each expression (variables substituted as the query test does)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: scripts/install-system-deps.sh (run by `make test`) installs it")
    rules, where = [], []
    for path in FILES:
        for place, expr in queries(load(path)):
            if place.startswith("variable"):
                match = re.match(r"^label_values\((.+),\s*(\w+)\)$", expr)
                assert match, f"{path.name} {place}: {expr}"
                expr = f"group by ({match.group(2)}) ({match.group(1)})"
            rules.append({"record": f"check:expr_{len(rules)}", "expr": substitute(expr)})
            where.append(f"{path.name} {place}")
    for number, line in enumerate(compat_lines(), 1):
        rules.append({"record": f"check:expr_{len(rules)}", "expr": substitute(line)})
        where.append(f"{COMPAT.name} line {number}")
    rules_file = tmp_path / "dashboards.rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        broken = [f"{where[int(m)]}: {rules[int(m)]['expr']}"
                  for m in re.findall(r"check:expr_(\d+)", result.stdout + result.stderr)]
        pytest.fail(f"promtool check rules failed:\n{result.stdout}{result.stderr}\n" + "\n".join(broken))
