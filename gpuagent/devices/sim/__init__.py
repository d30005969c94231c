"""The simulated NVML: a scenario-driven test double of the ``pynvml`` module.

``SimulatedNvml(load_scenario(path))`` stands where ``pynvml`` would; the agent's backend cannot tell them
apart. ``default_scenario_path()`` is the small demo node served when there is no driver and no scenario.
"""

from __future__ import annotations

from pathlib import Path

from gpuagent.devices.sim.nvml import SimulatedNvml
from gpuagent.devices.sim.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = [
    "Scenario",
    "ScenarioError",
    "SimulatedNvml",
    "default_scenario_path",
    "kubernetes_demo_path",
    "load_scenario",
    "parse_scenario",
]


def default_scenario_path() -> Path:
    """The demo scenario shipped in the package (2 GPUs, a few processes)."""
    return Path(__file__).with_name("scenarios") / "demo.yaml"


def kubernetes_demo_path() -> Path:
    """``gpuagent demo``'s scenario shipped in the package: an 8-GPU Kubernetes node with its pods
    (``examples/scenarios/demo-k8s-node.yaml`` links to it)."""
    return Path(__file__).with_name("scenarios") / "demo-k8s-node.yaml"
