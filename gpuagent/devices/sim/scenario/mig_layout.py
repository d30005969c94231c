"""A GPU entry's ``mig:``: MIG mode and its GPU instances, placed as the driver would place them.

Each instance is a profile of the GPU's model (``3g.20gb``) at a GPU-instance ID that is one of the
profile's placements; an instance without an ``id`` gets the profile's first placement still free, after
the instances that name theirs. The instances must fit the GPU's compute and memory slices, and their IDs
be unique: a layout the driver would refuse is an error here, not a simulator that reports the impossible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuagent.devices.sim.models import GpuModel, MigProfile
from gpuagent.devices.sim.scenario.checks import Problems
from gpuagent.devices.sim.scenario.spec import MigInstanceSpec


def read_mig(problems: Problems, mig: Mapping[str, Any] | None, model: GpuModel,
             where: str) -> tuple[bool, tuple[MigInstanceSpec, ...]]:
    """(MIG enabled, its instances by ID) for the ``mig:`` at ``where`` of a GPU of ``model``."""
    if mig is None:
        return False, ()
    if not model.mig:
        problems.error(where, f"model {model.key} does not support MIG")
        return False, ()
    enabled = bool(mig.get("enabled", True))
    entries = mig.get("instances") or []
    if entries and not enabled:
        problems.error(f"{where}.instances", "MIG instances need MIG enabled (enabled: true)")
        return False, ()
    known = ", ".join(p.name for p in model.mig_profiles)
    chosen: list[tuple[int, MigProfile, int | None]] = []
    for j, inst in enumerate(entries):
        profile = model.profile(inst["profile"])
        if profile is None:
            problems.error(f"{where}.instances[{j}].profile",
                           f"unknown profile {inst['profile']!r} for {model.key}; known: {known}")
            continue
        gi = inst.get("id")
        if gi is not None and gi not in profile.placements:
            places = ", ".join(map(str, profile.placements))
            problems.error(f"{where}.instances[{j}].id",
                           f"GPU instance ID {gi} is not a placement of {profile.name} (one of {places})")
            continue
        chosen.append((j, profile, gi))
    used = {gi for _, _, gi in chosen if gi is not None}
    if len(used) != len([1 for _, _, gi in chosen if gi is not None]):
        problems.error(f"{where}.instances", "GPU instance IDs must be unique")
    out: list[MigInstanceSpec] = []
    for j, profile, gi in chosen:
        if gi is None:
            free = [p for p in profile.placements if p not in used]
            if not free:
                problems.error(f"{where}.instances[{j}]", f"no free placement left for {profile.name}")
                continue
            gi = free[0]
            used.add(gi)
        out.append(MigInstanceSpec(gi, profile))
    slices = sum(i.profile.slices for i in out)
    memory_slices = sum(i.profile.memory_slices for i in out)
    if slices > model.mig_slices:
        problems.error(f"{where}.instances",
                       f"the instances need {slices} compute slices; {model.key} has {model.mig_slices}")
    elif memory_slices > model.mig_memory_slices:
        problems.error(f"{where}.instances", f"the instances need {memory_slices} memory slices; "
                       f"{model.key} has {model.mig_memory_slices}")
    return enabled, tuple(sorted(out, key=lambda i: i.id))
