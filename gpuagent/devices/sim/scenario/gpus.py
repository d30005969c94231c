"""The ``gpus:`` section: each entry's model and overrides, checked against the model, expanded by ``count``.

A GPU starts as its model (:mod:`~gpuagent.devices.sim.models`: memory, reserved memory, power limit,
NVLink links, MIG support) and the entry overrides what it gives. The checks are the ones that need the
model or the whole entry: memory above the reserved part, NVLink links the model has, ``not_supported``
names that pynvml has, one ``serial`` or ``pci_bus_id`` per GPU (so never with ``count`` > 1), the MIG
layout (:mod:`.mig_layout`) and the telemetry curves' ranges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuagent.devices.sim.models import MODELS
from gpuagent.devices.sim.scenario.checks import Problems, did_you_mean, pynvml_fields, pynvml_functions
from gpuagent.devices.sim.scenario.curve_nodes import read_curve
from gpuagent.devices.sim.scenario.mig_layout import read_mig
from gpuagent.devices.sim.scenario.spec import GpuSpec
from gpuagent.devices.sim.scenario.values import parse_size

# The telemetry a GPU entry may give as a curve instead of the simulator's default, and its range.
_CURVES = {
    "utilization": (0.0, 100.0),
    "memory_util": (0.0, 100.0),
    "encoder_util": (0.0, 100.0),
    "decoder_util": (0.0, 100.0),
    "power_w": (0.0, 5000.0),
    "temperature": (-40.0, 150.0),
}


def read_gpus(problems: Problems, entries: list[Mapping[str, Any]]) -> list[GpuSpec]:
    """The GPUs of the ``gpus:`` entries, indexed in order (an entry with ``count: n`` gives n of them)."""
    gpus: list[GpuSpec] = []
    names = pynvml_functions() | pynvml_fields()
    for i, g in enumerate(entries):
        where = f"gpus[{i}]"
        model = MODELS[g["model"]]
        count = g.get("count", 1)
        for key in ("serial", "pci_bus_id"):
            if key in g and count > 1:
                problems.error(f"{where}.{key}", "cannot be given together with count > 1")
        memory = parse_size(g["memory"]) if "memory" in g else model.memory_bytes
        reserved = parse_size(g["memory_reserved"]) if "memory_reserved" in g else model.reserved_bytes
        if memory <= 0:
            problems.error(f"{where}.memory", "must be more than 0 bytes")
        if reserved >= memory:
            problems.error(f"{where}.memory_reserved", f"{reserved} bytes is not less than memory ({memory})")
        not_supported = []
        for j, n in enumerate(g.get("not_supported") or []):
            if n not in names:
                problems.error(f"{where}.not_supported[{j}]", f"{n!r} is neither a pynvml function nor an "
                               f"NVML_FI_* field{did_you_mean(n, names)}")
            not_supported.append(n)
        for j, link in enumerate(g.get("nvlink_down") or []):
            if link >= model.nvlink_links:
                problems.error(f"{where}.nvlink_down[{j}]", f"link {link} does not exist "
                               f"({model.key} has {model.nvlink_links} NVLink links)")
        mig_enabled, instances = read_mig(problems, g.get("mig"), model, f"{where}.mig")
        curves = {key: read_curve(problems, g[key], f"{where}.{key}", lo=lo, hi=hi) if key in g else None
                  for key, (lo, hi) in _CURVES.items()}
        for _ in range(count):
            gpus.append(GpuSpec(
                index=len(gpus), model=model, name=g.get("name", model.name), serial=g.get("serial"),
                memory_bytes=memory, reserved_bytes=reserved,
                power_limit_w=float(g.get("power_limit_w", model.power_limit_w)),
                pci_bus_id=g.get("pci_bus_id"), mig_enabled=mig_enabled, mig_instances=instances,
                not_supported=frozenset(not_supported), nvlink_down=frozenset(g.get("nvlink_down") or ()),
                where=where, numa_node=g.get("numa_node"),
                compute_mode=g.get("compute_mode", "default"), **curves,
            ))
    return gpus


def missing_gpu(index: int, gpus: Sequence[GpuSpec]) -> str:
    """The message for a GPU index the scenario does not have."""
    return f"GPU index {index} does not exist (scenario has {len(gpus)} GPUs)"


def instance_ids(gpu: GpuSpec) -> str:
    """The GPU-instance IDs of ``gpu``, for a message ("1, 2" or "none")."""
    return ", ".join(str(x.id) for x in gpu.mig_instances) or "none"
