"""Every PromQL expression the repository ships, ready to send to a real Prometheus.

Where they come from:

- Grafana dashboards (``dashboards/*.json``, the dashboard itself or an export wrapped in ``{"dashboard":
  ...}``): every panel's ``targets[].expr``, panels nested in rows (``panels[].panels[]``, and the old
  ``rows[].panels[]``), templating variables of type ``query`` (``label_values(metric, label)`` is evaluated
  as ``group by (label) (metric)``, ``label_values(label)`` as ``group by (label) ({label!=""})``,
  ``query_result(q)`` as ``q``, ``metrics(re)`` as a ``__name__`` match, a bare selector as itself) and
  annotation queries. Targets and variables of a datasource that is clearly not Prometheus are left out.
- ``dashboards/compat/*.txt``: one PromQL per line (blank lines and ``#`` comments skipped).
- Prometheus rules files (``alerts/*.yml``): ``groups[].rules[].expr`` of alerting and recording rules.

Grafana variables are substituted the way a dashboard with "All" selected renders them: ``$var``,
``${var}``, ``${var:fmt}`` and ``[[var]]`` become ``.*`` inside a quoted label value; the interval
built-ins ``$__rate_interval``, ``$__interval``, ``$__range`` become ``1m`` (``$__interval_ms`` and
``$__range_ms`` ``60000``, ``$__range_s`` ``60``), as does any variable inside a range ``[...]`` or after
``offset``; a variable elsewhere (``topk($n, ...)``) takes its current value when the dashboard gives one.
A variable in an ``=``/``!=`` matcher is sent as ``=~``/``!~`` (Grafana renders one value there); when the
variable is multi-value or has "All", that is a bug of the dashboard (Grafana renders ``a|b`` or the
all-value, which ``=`` matches literally) and is reported in :attr:`Expression.problems`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

INTERVAL = "1m"
BUILTINS = {
    "__rate_interval": INTERVAL, "__interval": INTERVAL, "__range": INTERVAL, "__auto_interval": INTERVAL,
    "__interval_ms": "60000", "__range_ms": "60000", "__range_s": "60", "__rate_interval_ms": "60000",
}
ALL = ".*"

# Grafana's own variable syntax (public/app/features/variables/utils.ts): $var, [[var:fmt]], ${var.path:fmt}
VARIABLE_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
# Grafana's Prometheus variable functions (public/app/plugins/datasource/prometheus/metric_find_query.ts)
LABEL_NAMES_RE = re.compile(r"^label_names\(\)\s*$")
LABEL_VALUES_RE = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_$][a-zA-Z0-9_]*)\)\s*$", re.DOTALL)
METRICS_RE = re.compile(r"^metrics\((.+)\)\s*$", re.DOTALL)
QUERY_RESULT_RE = re.compile(r"^query_result\((.+)\)\s*$", re.DOTALL)
# A label matcher whose value holds a variable: name op "...$var..."
MATCHER_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
NOT_PROMETHEUS = {"-- grafana --", "grafana", "-- dashboard --", "datasource"}

RULES_SUFFIXES = (".yml", ".yaml")


class ExtractionError(Exception):
    """The file cannot be read as what its place says it is (bad JSON or YAML, wrong shape)."""


@dataclass(frozen=True)
class Expression:
    file: Path
    where: str  # "panel 'GPU utilization' (id 3) / target A", "alert 'GpuHot' (group 'gpu')", "line 4"
    kind: str  # panel | variable | annotation | compat | alert | record
    expr: str  # as written in the file
    promql: str  # as sent to Prometheus, variables substituted
    needs_data: bool  # dashboards: a query that returns nothing is a broken panel; rules may be quiet
    problems: tuple[str, ...] = ()  # what is wrong without asking Prometheus
    values_label: str | None = None  # label_values(..., label): the label whose values fill the variable
    include_all: bool = False  # a variable with "All": an empty list still renders (the all-value)

    def label(self, root: Path | None = None) -> str:
        path = self.file
        if root is not None:
            with contextlib.suppress(ValueError):
                path = self.file.resolve().relative_to(root.resolve())
        return f"{path}: {self.where}"


# -- discovery --------------------------------------------------------------------------------------------

def expression_files(root: Path) -> list[Path]:
    """The files that hold PromQL under a repository root, in a stable order."""
    root = Path(root)
    files = sorted((root / "dashboards").glob("*.json"))
    files += sorted((root / "dashboards" / "compat").glob("*.txt"))
    files += sorted(p for suffix in RULES_SUFFIXES for p in (root / "alerts").glob("*" + suffix))
    return files


def is_rules_file(path: Path) -> bool:
    return Path(path).suffix in RULES_SUFFIXES


def expressions_in(path: Path) -> list[Expression]:
    path = Path(path)
    if path.suffix == ".json":
        return dashboard_expressions(path)
    if path.suffix == ".txt":
        return compat_expressions(path)
    if is_rules_file(path):
        return rules_expressions(path)
    raise ExtractionError(f"{path}: not a dashboard (.json), query list (.txt) or rules file (.yml)")


# -- rules ------------------------------------------------------------------------------------------------

def rules_expressions(path: Path) -> list[Expression]:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ExtractionError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(document, Mapping) or not isinstance(document.get("groups"), list):
        raise ExtractionError(f"{path}: a rules file has a top-level `groups:` list")
    found = []
    for g, group in enumerate(document["groups"]):
        group_name = group.get("name", f"#{g}") if isinstance(group, Mapping) else f"#{g}"
        rules = group.get("rules") if isinstance(group, Mapping) else None
        for r, rule in enumerate(rules or []):
            if not isinstance(rule, Mapping):
                continue
            kind = "alert" if "alert" in rule else "record"
            name = rule.get(kind, f"rules[{r}]")
            expr = rule.get("expr")
            where = f"{kind} {name!r} (group {group_name!r})"
            if expr is None or str(expr).strip() == "":
                found.append(Expression(Path(path), where, kind, "", "", False, ("no expr",)))
                continue
            text = str(expr)
            found.append(Expression(Path(path), where, kind, text, text.strip(), needs_data=False))
    return found


# -- query lists ------------------------------------------------------------------------------------------

def compat_expressions(path: Path) -> list[Expression]:
    found = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        promql, problems = substitute(text, {})
        found.append(Expression(Path(path), f"line {number}", "compat", text, promql, True, problems))
    return found


# -- Grafana ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variable:
    name: str
    type: str
    multi: bool = False
    include_all: bool = False
    current: str | None = None  # the current (or first) value when the dashboard stores one


@dataclass
class _Dashboard:
    variables: dict[str, Variable] = field(default_factory=dict)
    datasource: Any = None


def dashboard_expressions(path: Path) -> list[Expression]:
    try:
        document = json.loads(Path(path).read_text())
    except ValueError as exc:
        raise ExtractionError(f"{path}: not JSON: {exc}") from exc
    if isinstance(document, Mapping) and isinstance(document.get("dashboard"), Mapping):
        document = document["dashboard"]  # an export through the HTTP API
    if not isinstance(document, Mapping):
        raise ExtractionError(f"{path}: a dashboard is a JSON object")
    variables = {v.name: v for v in _variables(document)}
    found: list[Expression] = []
    for item in _list(document.get("templating"), "list"):
        if not isinstance(item, Mapping) or item.get("type") != "query" or not _is_prometheus(
                item.get("datasource")):
            continue
        query = _variable_query(item)
        if not query:
            continue
        promql = variable_query_promql(query)
        if promql is None:
            continue
        where = f"variable ${item.get('name')}"
        sent, problems = substitute(promql, variables)
        match = LABEL_VALUES_RE.match(query)
        found.append(Expression(Path(path), where, "variable", query, sent, True, problems,
                                values_label=match.group(2) if match else None,
                                include_all=bool(item.get("includeAll"))))
    for item in _list(document.get("annotations"), "list"):
        if not isinstance(item, Mapping) or not isinstance(item.get("expr"), str) or not item["expr"].strip():
            continue
        if not _is_prometheus(item.get("datasource")):
            continue
        sent, problems = substitute(item["expr"], variables)
        found.append(Expression(Path(path), f"annotation {item.get('name')!r}", "annotation", item["expr"],
                                sent, False, problems))
    panels = list(_panels(document.get("panels") or [], ""))
    for r, row in enumerate(document.get("rows") or []):  # the schema before Grafana 5
        if isinstance(row, Mapping):
            panels += _panels(row.get("panels") or [], f"row {row.get('title') or r!r} / ")
    for where, panel in panels:
        panel_ds = panel.get("datasource")
        for t, target in enumerate(panel.get("targets") or []):
            if not isinstance(target, Mapping):
                continue
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                continue
            ds = target.get("datasource") or panel_ds
            if not _is_prometheus(ds):
                continue
            ref = target.get("refId") or f"#{t}"
            sent, problems = substitute(expr, variables)
            found.append(Expression(Path(path), f"{where} / target {ref}", "panel", expr, sent, True, problems))
    return found


def _list(container: Any, key: str) -> list[Any]:
    if isinstance(container, Mapping) and isinstance(container.get(key), list):
        return container[key]
    return []


def _panels(panels: Iterable[Any], prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for panel in panels:
        if not isinstance(panel, Mapping):
            continue
        title = panel.get("title") or "(untitled)"
        where = f"{prefix}panel {title!r} (id {panel.get('id')})"
        if panel.get("type") == "row":
            yield from _panels(panel.get("panels") or [], f"{prefix}row {title!r} / ")
            continue
        yield where, panel
        if panel.get("panels"):  # any other panel that nests panels
            yield from _panels(panel["panels"], f"{where} / ")


def _is_prometheus(datasource: Any) -> bool:
    """Whether a target or variable with this datasource is PromQL (no datasource: the default, assumed
    Prometheus; a ``$datasource`` variable: Prometheus, as a dashboard's datasource variable is)."""
    if datasource is None:
        return True
    if isinstance(datasource, str):
        return datasource.strip().lower() not in NOT_PROMETHEUS and datasource.strip() != "-- Mixed --"
    if isinstance(datasource, Mapping):
        kind = str(datasource.get("type") or "prometheus")
        uid = str(datasource.get("uid") or "")
        if uid.lower() in NOT_PROMETHEUS or uid in ("-- Mixed --", "-- Dashboard --", "-- Grafana --"):
            return False
        return kind == "prometheus" or kind.startswith("$")
    return True


def _variables(document: Mapping[str, Any]) -> Iterator[Variable]:
    for item in _list(document.get("templating"), "list"):
        if not isinstance(item, Mapping) or not item.get("name"):
            continue
        current = None
        value = item.get("current", {}).get("value") if isinstance(item.get("current"), Mapping) else None
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, (str, int, float)) and str(value) not in ("$__all", ""):
            current = str(value)
        elif item.get("options"):
            first = item["options"][0]
            if isinstance(first, Mapping) and str(first.get("value", "")) not in ("$__all", ""):
                current = str(first["value"])
        elif item.get("type") in ("constant", "textbox") and isinstance(item.get("query"), (str, int, float)):
            current = str(item["query"])
        elif item.get("type") in ("custom", "interval") and isinstance(item.get("query"), str):
            current = item["query"].split(",")[0].strip() or None
        yield Variable(str(item["name"]), str(item.get("type", "")), bool(item.get("multi")),
                       bool(item.get("includeAll")), current)


def _variable_query(item: Mapping[str, Any]) -> str | None:
    query = item.get("query")
    if isinstance(query, Mapping):  # Grafana 9+: {"query": "...", "refId": ..., "qryType": ...}
        text = query.get("query")
        if not text and query.get("label"):
            metric = query.get("metric") or ""
            text = f"label_values({metric}, {query['label']})" if metric else f"label_values({query['label']})"
        query = text
    if not query:
        query = item.get("definition")
    return str(query).strip() if query else None


def variable_query_promql(query: str) -> str | None:
    """The PromQL that gives a Prometheus-datasource variable's values, ``None`` when there is none
    (``label_names()`` asks the label-names API, not the query engine)."""
    query = query.strip()
    if LABEL_NAMES_RE.match(query):
        return None
    match = LABEL_VALUES_RE.match(query)
    if match:
        selector, label = match.group(1), match.group(2)
        if selector is None or not selector.strip():
            return f'group by ({label}) ({{{label}!=""}})'
        return f"group by ({label}) ({selector.strip()})"
    match = METRICS_RE.match(query)
    if match:
        return f'group by (__name__) ({{__name__=~"{match.group(1).strip()}"}})'
    match = QUERY_RESULT_RE.match(query)
    if match:
        return match.group(1).strip()
    return query  # Grafana asks the series API with it: a selector


def substitute(expr: str, variables: Mapping[str, Variable]) -> tuple[str, tuple[str, ...]]:
    """``expr`` with Grafana variables replaced (see the module docstring), and the problems found."""
    problems: list[str] = []

    def rewrite_matcher(match: re.Match[str]) -> str:
        label, op, value = match.group(1), match.group(2), match.group(3)
        names = [m.group(1) or m.group(2) or m.group(4) for m in VARIABLE_RE.finditer(value)]
        names = [n for n in names if n and not n.startswith("__")]
        if not names or op in ("=~", "!~"):
            return match.group(0)
        for name in names:
            variable = variables.get(name)
            if variable is not None and (variable.multi or variable.include_all):
                problems.append(
                    f'${name} is multi-value/"All" but used as {label}{op}"{value}": Grafana renders '
                    f'several values as a regex (a|b, or the all-value), which {op} matches literally: '
                    f'use {"=~" if op == "=" else "!~"}')
        return f'{label}{"=~" if op == "=" else "!~"}"{value}"'

    text = MATCHER_RE.sub(rewrite_matcher, expr)
    out: list[str] = []
    position = 0
    for match in VARIABLE_RE.finditer(text):
        out.append(text[position:match.start()])
        position = match.end()
        name = match.group(1) or match.group(2) or match.group(4)
        out.append(_value_for(name, text, match.start(), variables))
    out.append(text[position:])
    return "".join(out), tuple(dict.fromkeys(problems))


def _value_for(name: str, text: str, at: int, variables: Mapping[str, Variable]) -> str:
    if name in BUILTINS:
        return BUILTINS[name]
    if _in_quotes(text, at):
        return ALL
    before = text[:at]
    if before.rfind("[") > before.rfind("]") or re.search(r"\boffset\s*$", before):
        return INTERVAL  # a range or an offset: only a duration parses here
    variable = variables.get(name)
    if variable is not None and variable.type == "interval":
        return INTERVAL
    if variable is not None and variable.current is not None:
        return variable.current
    return ALL


def _in_quotes(text: str, at: int) -> bool:
    quote = None
    i = 0
    while i < at:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        i += 1
    return quote is not None


# -- metric names -----------------------------------------------------------------------------------------

_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST_RE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_TOKEN_RE = re.compile(r"(?P<number>\d[\w.]*)|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<call>\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "inf", "nan", "start", "end", "atan2"}


def metric_names(promql: str) -> set[str]:
    """The metric names an expression selects (``foo`` in ``rate(foo{a="b"}[1m])``), not functions,
    keywords, labels or durations; a selector without a name (``{__name__=~"..."}``) names none."""
    text = _STRING_RE.sub('""', promql)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges and subqueries
    text = _LABEL_LIST_RE.sub(" ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    text = re.sub(r"@\s*[\w.]+(\s*\(\s*\))?", " ", text)
    names = set()
    for match in _TOKEN_RE.finditer(text):
        name = match.group("name")
        if name and not match.group("call") and name.lower() not in _KEYWORDS:
            names.add(name)
    return names
