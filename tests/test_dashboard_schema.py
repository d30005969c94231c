"""Every dashboard against Grafana's published JSON schemas, and their builder against Grafana's types.

The schemas are the ones Grafana's Foundation SDK publishes for Grafana 10.4 (``tests/fixtures/grafana-schema``,
whose README says where they come from): the dashboard (panels, field config, variables, links, annotations),
the time series and table panel plugins (their ``options`` and ``fieldConfig.defaults.custom``), and the
Prometheus query (every target). Stat and state-timeline panels have no plugin schema there: the dashboard
schema checks their envelope and field config, the SDK's types (mypy on ``dashboards/build.py``) their options.

The JSON schemas are generated from Grafana's CUE and are narrower than Grafana in four places; each is widened
here, and checked to be still as published, so that a newer schema that fixes one says so:

- ``Threshold.value`` is a number, yet Grafana writes the first step's -Infinity as null (the schema's own
  description says so);
- ``MatcherConfig.options`` and ``DynamicConfigValue.value`` are objects (CUE's "any", ``_``, became
  ``object``), yet a ``byName`` matcher takes a field name and a ``unit`` property a string;
- the table's ``TableCellOptions`` is a ``oneOf`` whose variants do not fix their ``type``, so
  ``{"type": "auto"}`` matches several and no cell option at all would pass: it is checked as an ``anyOf``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "tests" / "fixtures" / "grafana-schema"
FILES = sorted((ROOT / "dashboards").glob("*.json"))
PLUGINS = ("timeseries", "table")  # panel types with a plugin schema in SCHEMAS

Json = dict[str, Any]


def published(name: str) -> Json:
    return json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text(encoding="utf-8"))


def _at(schema: Json, *path: str) -> Json:
    node = schema
    for key in path:
        node = node[key]
    return node


def _nullable(node: Json) -> None:
    assert node["type"] == "number", node
    node["type"] = ["number", "null"]


def _any(node: Json) -> None:
    assert (node["type"], node["additionalProperties"]) == ("object", {}), node
    del node["type"], node["additionalProperties"]


def _any_of(node: Json) -> None:
    variants = [v["$ref"].rsplit("/", 1)[1] for v in node["oneOf"]]
    assert len(variants) == 8 and variants[0] == "TableAutoCellOptions", node
    node["anyOf"] = node.pop("oneOf")


# (schema, path to the node, how it is widened): the four places named in the module's docstring
WIDENED: list[tuple[str, tuple[str, ...], Callable[[Json], None]]] = [
    ("dashboard", ("definitions", "Threshold", "properties", "value"), _nullable),
    ("dashboard", ("definitions", "MatcherConfig", "properties", "options"), _any),
    ("dashboard", ("definitions", "DynamicConfigValue", "properties", "value"), _any),
    ("table", ("definitions", "TableCellOptions"), _any_of),
]


def checked(name: str) -> Json:
    """A published schema with its places in WIDENED widened (each asserted to be as published first)."""
    schema = published(name)
    for which, path, widen in WIDENED:
        if which == name:
            widen(_at(schema, *path))
    return schema


def validator(name: str, definition: str | None = None) -> jsonschema.Draft7Validator:
    """A validator of a schema, or of one of its definitions (the panel plugins' schemas have no root)."""
    schema = checked(name)
    if definition is not None:
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


DASHBOARD = validator("dashboard")
QUERY = validator("prometheus")
OPTIONS = {kind: validator(kind, "Options") for kind in PLUGINS}
CUSTOM = {kind: validator(kind, "FieldConfig") for kind in PLUGINS}


def problems(dashboard: Json) -> Iterator[str]:
    """Every place where the dashboard, a panel plugin's options or field config, or a query is not what
    Grafana's schemas allow, as ``where: what``."""
    for error in DASHBOARD.iter_errors(dashboard):
        for leaf in (error.context or [error]) if error.validator == "oneOf" else [error]:
            yield f"{leaf.json_path}: {leaf.message}"
    for panel in dashboard.get("panels", []):
        where = f"panel {panel.get('title')!r}"
        if panel.get("type") in PLUGINS:
            kind = panel["type"]
            if "options" in panel:
                yield from (f"{where} options{e.json_path[1:]}: {e.message}"
                            for e in OPTIONS[kind].iter_errors(panel["options"]))
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
            if custom is not None:
                yield from (f"{where} custom{e.json_path[1:]}: {e.message}"
                            for e in CUSTOM[kind].iter_errors(custom))
        for target in panel.get("targets", []):
            yield from (f"{where} target {target.get('refId')}{e.json_path[1:]}: {e.message}"
                        for e in QUERY.iter_errors(target))


@pytest.fixture(scope="module", params=FILES, ids=[p.name for p in FILES])
def dashboard(request: pytest.FixtureRequest) -> Json:
    return json.loads(request.param.read_text(encoding="utf-8"))


def test_the_widened_places_are_as_published() -> None:
    for name, path, widen in WIDENED:
        node = copy.deepcopy(_at(published(name), *path))
        widen(node)  # asserts the published form first
        assert node != _at(published(name), *path)


def test_every_dashboard_matches_grafanas_schemas(dashboard: Json) -> None:
    found = list(problems(dashboard))
    assert not found, f"{dashboard['uid']}:\n" + "\n".join(found[:30])


def test_every_panel_kind_used_is_checked_by_a_plugin_schema_or_the_builders_types(dashboard: Json) -> None:
    kinds = {p["type"] for p in dashboard["panels"]} - {"row"}
    assert kinds <= {*PLUGINS, "stat", "state-timeline"}, f"a new panel kind needs its plugin schema: {kinds}"


MUTATIONS: list[tuple[str, Callable[[Json], None], str]] = [
    ("a panel wider than the grid", lambda d: d["panels"][0]["gridPos"].update(w=25), "25 is greater"),
    ("a misspelt panel key", lambda d: d["panels"][0].update(titel="x"), "'titel' was unexpected"),
    ("a variable refreshed by a code Grafana lacks", lambda d: d["templating"]["list"][1].update(refresh=3),
     "3 is not one of"),
    ("a threshold given as text", lambda d: d["panels"][0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
     .append({"value": "80", "color": "red"}), "'80' is not of type"),
    ("a misspelt query field", lambda d: d["panels"][0]["targets"][0].update(exprr="up"),
     "'exprr' was unexpected"),
    ("a legend mode Grafana lacks", lambda d: next(p for p in d["panels"] if p["type"] == "timeseries")
     ["options"]["legend"].update(displayMode="tabel"), "'tabel' is not one of"),
    ("a table column aligned nowhere", lambda d: next(p for p in d["panels"] if p["type"] == "table")
     ["fieldConfig"]["defaults"]["custom"].update(align="middle"), "'middle' is not one of"),
]


@pytest.mark.parametrize(("what", "mutate", "message"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_schemas_reject_what_grafana_would_misread(what: str, mutate: Callable[[Json], None],
                                                       message: str) -> None:
    broken = json.loads(FILES[0].read_text(encoding="utf-8"))
    assert not list(problems(broken))
    mutate(broken)
    found = list(problems(broken))
    assert any(message in p for p in found), f"{what}: {found}"


@pytest.mark.skipif(sys.version_info < (3, 11),
                    reason="dashboards/build.py needs grafana-foundation-sdk: Python 3.11 or later")
def test_the_builder_passes_grafanas_types_and_they_are_enforced(tmp_path: Path) -> None:
    """Python does not check the SDK's types at run time: mypy does. It passes on the builder, and fails on a
    builder call given a plain string where Grafana has an enum."""
    def mypy(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
                               str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT)

    result = mypy(ROOT / "dashboards" / "build.py")
    assert result.returncode == 0, result.stdout + result.stderr
    wrong = tmp_path / "wrong.py"
    wrong.write_text("from grafana_foundation_sdk.builders import timeseries\n"
                     "timeseries.Panel().draw_style('bar')\n")
    result = mypy(wrong)
    assert result.returncode == 1 and 'incompatible type "str"; expected "GraphDrawStyle"' in result.stdout, \
        result.stdout + result.stderr
