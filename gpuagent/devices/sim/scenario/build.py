"""Building a scenario: the semantic checks a schema cannot express, and the specs they produce.

GPU indices, MIG profiles of the GPU's model, PID uniqueness, curve ranges: every message names the path
inside the file (``processes[3].gpu: GPU index 9 does not exist (scenario has 8 GPUs)``), and every
problem found is reported, in the order of the file. Each section has its module (:mod:`.gpus` with
:mod:`.mig_layout`, :mod:`.processes` with :mod:`.mps`, :mod:`.faults`, :mod:`.pods`; curves in
:mod:`.curve_nodes`);
this one reads the top level and the ``driver:`` section, and puts them together in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.devices.sim.scenario.checks import Problems, pynvml_functions
from gpuagent.devices.sim.scenario.faults import read_faults
from gpuagent.devices.sim.scenario.gpus import read_gpus
from gpuagent.devices.sim.scenario.pods import read_pods
from gpuagent.devices.sim.scenario.processes import read_processes
from gpuagent.devices.sim.scenario.spec import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_DRIVER_VERSION,
    DriverSpec,
    Scenario,
)


def build(problems: Problems, data: Mapping[str, Any], source: str, name: str | None) -> Scenario:
    """The scenario of ``data`` (schema-valid); what is wrong with it is in ``problems`` afterwards, and
    the scenario is then not to be used. ``name`` is the file's stem, when ``data`` names none."""
    name = data.get("name") or name or "scenario"
    driver = _driver(problems, data.get("driver") or {})
    gpus = read_gpus(problems, data.get("gpus") or [])
    processes = read_processes(problems, data.get("processes") or [], gpus)
    faults = read_faults(problems, data.get("faults") or [], gpus)
    seed = str(data.get("seed", name))
    pods = read_pods(problems, data.get("pods") or [], gpus, processes, seed)
    return Scenario(
        name=name,
        hostname=data.get("hostname", "sim-node"),
        seed=seed,
        driver=driver,
        gpus=tuple(gpus),
        processes=tuple(processes),
        faults=tuple(faults),
        source=source,
        description=data.get("description", ""),
        pods=tuple(pods),
    )


def _driver(problems: Problems, d: Mapping[str, Any]) -> DriverSpec:
    version = d.get("version", DEFAULT_DRIVER_VERSION)
    cuda = d.get("cuda_version", DEFAULT_CUDA_VERSION)
    if isinstance(cuda, str):
        major, minor = cuda.split(".")
        cuda = int(major) * 1000 + int(minor) * 10
    latency = dict(d.get("latency_ms") or {})
    functions = pynvml_functions()
    for fn in latency:
        if fn != "default" and fn not in functions:
            problems.error(f"driver.latency_ms.{fn}", "not a pynvml function (or 'default')")
    return DriverSpec(
        version=version, nvml_version=d.get("nvml_version", f"12.{version}"), cuda_version=cuda,
        latency_ms=latency, mps_utilization=d.get("mps_utilization", "per_client"),
    )
