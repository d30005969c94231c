"""Scenarios written as JSON (what bench/bench_soak.py generates) load through ``json.loads``, the same as
their YAML form; JSON that does not parse is read as YAML, so its errors still name a line and column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuagent.devices.sim import load_scenario
from gpuagent.devices.sim.scenario import ScenarioError, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"


def test_json_scenario_equals_its_yaml_form(tmp_path: Path) -> None:
    as_json = tmp_path / "h100-8x-64proc.json"
    as_json.write_text(json.dumps(yaml.safe_load(EXAMPLE.read_text())))
    from_yaml, from_json = load_scenario(EXAMPLE), load_scenario(as_json)
    assert from_json.processes == from_yaml.processes
    assert from_json.gpus == from_yaml.gpus
    assert len(from_json.processes) == 64


def test_json_errors_name_the_path() -> None:
    text = json.dumps({"gpus": [{"model": "L4"}], "processes": [{"gpu": 3}]})
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, source="soak.json")
    assert "soak.json: processes[0].gpu: GPU index 3 does not exist (scenario has 1 GPUs)" in str(caught.value)


def test_a_yaml_flow_mapping_is_still_yaml() -> None:
    scenario = parse_scenario("{gpus: [{model: L4}], processes: [{gpu: 0, memory: 1Gi}]}")
    assert scenario.processes[0].memory.bounds() == (2.0**30, 2.0**30)


def test_broken_json_is_reported_with_line_and_column() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario('{"gpus": [{"model": "L4"}],\n "processes": [\n', source="soak.json")
    assert "soak.json: line 3, column 1: not valid YAML" in str(caught.value)
