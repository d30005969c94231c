"""The alerting rules in ``alerts/``: valid for promtool, unit-tested, documented, and reading real metrics.

- ``promtool check rules`` on every rules file and ``promtool test rules`` on every test file (skipped, with
  the reason, where promtool is not installed: ``apt-get install prometheus``).
- Every alert has a ``severity`` label (critical, warning or info) and ``summary``, ``description`` and
  ``runbook`` annotations; a runbook that is not a URL is ``docs/runbooks.md#<alert name, lowercase>`` and
  that section exists.
- Every alert is in at least one promtool test case where it fires and one where it does not, so a new rule
  without tests fails here. A test case naming an alert that does not exist fails too.
- Every ``DCGM_*``/``gpuagent_*`` metric an alert reads, and every metric a test feeds in, is one the
  agent's exporter (``gpuagent/export``) names: a rule cannot test green on a metric the agent never emits.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
RULE_FILES = sorted([*ALERTS.glob("*.yml"), *ALERTS.glob("*.yaml")])
TEST_FILES = sorted(ALERTS.glob("tests/*.test.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
EXPORT = ROOT / "gpuagent" / "export"

SEVERITIES = {"critical", "warning", "info"}
REQUIRED_ANNOTATIONS = ("summary", "description", "runbook")
# Metrics of Prometheus itself that rules may read besides the agent's.
PROMETHEUS_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
OUR_METRIC_RE = re.compile(r"\b(?:DCGM_[A-Z0-9_]+|gpuagent_[a-z0-9_]+)\b")
SERIES_NAME_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
SUFFIXES = ("_bucket", "_count", "_sum")


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def _alert_rules() -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(file, group name, rule) for every alerting rule."""
    for path in RULE_FILES:
        for group in _load(path).get("groups") or []:
            for rule in group.get("rules") or []:
                if "alert" in rule:
                    yield path, group["name"], rule


ALERT_RULES = list(_alert_rules())
ALERT_NAMES = sorted({rule["alert"] for _, _, rule in ALERT_RULES})


def _test_cases() -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(test file, test name, alert_rule_test entry) for every alert test case."""
    for path in TEST_FILES:
        for test in _load(path).get("tests") or []:
            for case in test.get("alert_rule_test") or []:
                yield path, test.get("name", "?"), case


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu: apt-get install prometheus)")
    return promtool


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_there_are_rules_and_tests() -> None:
    assert RULE_FILES, f"no rules files in {ALERTS}"
    assert ALERT_NAMES, "no alerting rules"
    assert TEST_FILES, f"no promtool test files (alerts/tests/*.test.yml) in {ALERTS}"
    duplicates = sorted({n for n in ALERT_NAMES if sum(r["alert"] == n for _, _, r in ALERT_RULES) > 1})
    assert not duplicates, f"alert names defined more than once: {duplicates}"


def test_promtool_check_rules() -> None:
    result = _run(_promtool(), "check", "rules", *(str(p.relative_to(ROOT)) for p in RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = _run(_promtool(), "test", "rules", *(str(p.relative_to(ROOT)) for p in TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rule", [r for _, _, r in ALERT_RULES], ids=[r["alert"] for _, _, r in ALERT_RULES])
def test_alert_has_severity_and_annotations(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    severity = (rule.get("labels") or {}).get("severity")
    assert severity in SEVERITIES, f"{name}: severity label {severity!r}, expected one of {sorted(SEVERITIES)}"
    annotations = rule.get("annotations") or {}
    for key in REQUIRED_ANNOTATIONS:
        value = annotations.get(key)
        assert isinstance(value, str) and value.strip(), f"{name}: missing or empty {key!r} annotation"
    runbook = annotations["runbook"].strip()
    if not re.match(r"^https?://\S+$", runbook):
        expected = f"docs/runbooks.md#{name.lower()}"
        assert runbook == expected, f"{name}: runbook {runbook!r}, expected a URL or {expected!r}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    """Anchor -> heading text of every ``##`` section of docs/runbooks.md."""
    if not RUNBOOKS.exists():
        return {}
    headings = re.findall(r"^##\s+(.+?)\s*#*\s*$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {_anchor(h): h for h in headings}


def test_every_runbook_link_has_its_section() -> None:
    sections = _runbook_sections()
    missing = []
    for _, _, rule in ALERT_RULES:
        runbook = (rule.get("annotations") or {}).get("runbook", "")
        if runbook.startswith("docs/runbooks.md#"):
            anchor = runbook.partition("#")[2]
            if anchor not in sections:
                missing.append(f"{rule['alert']} -> {runbook}")
    assert not missing, f"runbook links without a section in {RUNBOOKS.relative_to(ROOT)}: {missing}"


def test_every_runbook_section_is_an_alert() -> None:
    """A section titled like an alert (one CamelCase word) must name an alert that exists."""
    stale = [h for h in _runbook_sections().values() if re.fullmatch(r"[A-Z][A-Za-z0-9]+", h)
             and h not in ALERT_NAMES]
    assert not stale, f"runbook sections for alerts that do not exist: {stale}"


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fires: dict[str, list[str]] = {name: [] for name in ALERT_NAMES}
    quiet: dict[str, list[str]] = {name: [] for name in ALERT_NAMES}
    unknown = []
    for path, test_name, case in _test_cases():
        name = case.get("alertname")
        where = f"{path.name}: {test_name!r} at {case.get('eval_time')}"
        if name not in fires:
            unknown.append(f"{where}: {name!r}")
            continue
        (fires if case.get("exp_alerts") else quiet)[name].append(where)
    assert not unknown, f"test cases for alerts that are not in {ALERTS.name}/*.yml: {unknown}"
    never_fires = [n for n, cases in fires.items() if not cases]
    never_quiet = [n for n, cases in quiet.items() if not cases]
    assert not never_fires, f"alerts with no promtool test case where they fire: {never_fires}"
    assert not never_quiet, f"alerts with no promtool test case where they do not fire: {never_quiet}"


def test_test_files_load_the_rules_files() -> None:
    """Each test file loads rules files of alerts/, and together they load every one."""
    loaded: set[Path] = set()
    for path in TEST_FILES:
        rule_files = _load(path).get("rule_files") or []
        assert rule_files, f"{path.name}: no rule_files"
        for entry in rule_files:
            resolved = (path.parent / entry).resolve()
            assert resolved in {p.resolve() for p in RULE_FILES}, f"{path.name}: {entry} is not a rules file"
            loaded.add(resolved)
    assert loaded == {p.resolve() for p in RULE_FILES}, "a rules file is loaded by no test file"


def _exported_metrics() -> set[str]:
    """Every DCGM_*/gpuagent_* name quoted in the exporter's source."""
    names: set[str] = set()
    for source in EXPORT.glob("*.py"):
        names.update(re.findall(r"[\"']((?:DCGM_[A-Z0-9_]+|gpuagent_[a-z0-9_]+))[\"']",
                                source.read_text(encoding="utf-8")))
    return names


def _known(name: str, exported: set[str]) -> bool:
    if name in exported or name in PROMETHEUS_METRICS:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in exported for s in SUFFIXES)


def test_rules_and_tests_use_metrics_the_agent_exports() -> None:
    exported = _exported_metrics()
    assert {"gpuagent_up", "DCGM_FI_DEV_GPU_TEMP"} <= exported, "cannot find the exporter's metric names"
    unknown = []
    for path, _, rule in ALERT_RULES:
        for name in OUR_METRIC_RE.findall(rule["expr"]):
            if not _known(name, exported):
                unknown.append(f"{path.name}: alert {rule['alert']}: {name}")
    for path in TEST_FILES:
        for test in _load(path).get("tests") or []:
            for series in test.get("input_series") or []:
                match = SERIES_NAME_RE.match(series["series"])
                name = match.group(1) if match else series["series"]
                if not _known(name, exported):
                    unknown.append(f"{path.name}: test {test.get('name')!r}: input series {name}")
    assert not unknown, f"metrics the agent does not export (see gpuagent/export): {unknown}"
