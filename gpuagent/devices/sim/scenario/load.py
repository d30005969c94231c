"""Loading a scenario: a file or text to a mapping, the mapping against the JSON Schema, then the build.

Validation runs in two passes: the JSON Schema (``schema.json``, ``additionalProperties: false``
everywhere, so a typo is an error, not a silently ignored key), then the semantic checks a schema cannot
express (:mod:`.build`). Either pass reports every problem it finds, as :class:`ScenarioError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from gpuagent.config import ConfigError, read_regular_file
from gpuagent.devices.sim.scenario.build import build
from gpuagent.devices.sim.scenario.checks import Problems
from gpuagent.devices.sim.scenario.messages import explain, path_sort_key
from gpuagent.devices.sim.scenario.spec import Scenario
from gpuagent.devices.sim.scenario.values import show

SCHEMA_PATH = Path(__file__).parent.with_name("schema.json")
MAX_SCENARIO_BYTES = 256 << 20  # a generated churn scenario of 5,000 processes is a few MiB


class ScenarioError(ValueError):
    """A scenario that does not load; the message names the file and the path inside it."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        self.source = source
        self.errors = tuple(errors)
        super().__init__("\n".join(f"{source}: {p}: {m}" if p else f"{source}: {m}" for p, m in errors))


def load_scenario(path: str | Path) -> Scenario:
    """Read, validate and build the scenario in ``path``; :class:`ScenarioError` names what is wrong."""
    p = Path(path)
    source = str(path)
    try:  # a regular file of bounded size (the path comes from a config: never /dev/zero nor a FIFO)
        text = read_regular_file(source, MAX_SCENARIO_BYTES).decode("utf-8")
    except ConfigError as exc:
        raise ScenarioError(source, [("", exc.message)]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, [("", f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_scenario(text, source=source, name=p.stem)


def parse_scenario(
    data: Mapping[str, Any] | str, *, source: str = "<scenario>", name: str | None = None
) -> Scenario:
    """Validate and build a scenario from a mapping (as YAML loads it) or from YAML text."""
    if isinstance(data, str):
        try:
            data = _load_text(data)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ScenarioError(source, [(where, f"not valid YAML: {problem}")]) from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        got = f"a string of {len(data)} characters" if isinstance(data, str) else show(data)  # not its text
        raise ScenarioError(source, [("", f"expected a mapping at the top level, got {got}")])
    schema_errors = _schema_errors(data)
    if schema_errors:
        raise ScenarioError(source, schema_errors)
    problems = Problems()
    scenario = build(problems, data, source, name)
    if problems.errors:
        raise ScenarioError(source, problems.errors)
    return scenario


def _load_text(text: str) -> Any:
    """The document in ``text``. JSON (a YAML subset, as generated scenarios are written) goes through
    ``json.loads``: PyYAML builds a node graph with a source mark per scalar first, about 30 MiB (libyaml)
    to 48 MiB (pure Python) for a 5,000-process churn scenario, and the freed graph's memory stays with
    the agent process (its arenas are pinned by the scenario objects built meanwhile); ``json.loads``
    allocates only the result (under 1 MiB). Anything else, or JSON that does not parse, is YAML, read by
    libyaml where PyYAML has it, so YAML errors keep their line and column."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow mapping, or broken JSON: YAML names the line and column
    return yaml.load(text, Loader=_YAML_LOADER)  # a SafeLoader: plain data only


_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_validator: jsonschema.protocols.Validator | None = None


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _schema_errors(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    global _validator
    if _validator is None:
        _validator = jsonschema.Draft202012Validator(schema())
    out = [explain(e) for e in _validator.iter_errors(data)]
    return sorted(set(out), key=lambda pm: path_sort_key(pm[0]))
