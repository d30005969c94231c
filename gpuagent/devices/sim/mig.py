"""MIG placement on a simulated GPU: which GPU-instance profiles still fit beside the existing instances.

A profile's placements are the GPU-instance IDs the driver hands out for it (``MigProfile.placements``);
placement ``i`` of a profile spanning ``m`` memory slices starts at memory slice ``i * m`` (A100/H100:
1g at 0..6, 2g at 0/2/4, 3g at 0/4, 4g and 7g at 0). A new instance fits where its span overlaps no
existing instance's span and enough compute slices are left, as NVML's
``nvmlDeviceGetGpuInstanceRemainingCapacity`` counts it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuagent.devices.sim.models import GpuModel, MigProfile

# NVML's GPU-instance profile index (NVML_GPU_INSTANCE_PROFILE_<n>_SLICE) by compute slices.
PROFILE_INDEX_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def _span(profile: MigProfile, gpu_instance_id: int) -> range:
    start = profile.placements.index(gpu_instance_id) * profile.memory_slices
    return range(start, start + profile.memory_slices)


def remaining_capacity(
    model: GpuModel, instances: Iterable[tuple[MigProfile, int]], profile: MigProfile
) -> int:
    """How many more instances of ``profile`` can be created beside ``instances`` (profile, GI id)."""
    occupied: set[int] = set()
    slices = 0
    for existing, gi in instances:
        occupied.update(_span(existing, gi))
        slices += existing.slices
    free = sum(1 for gi in profile.placements if occupied.isdisjoint(_span(profile, gi)))
    return min(free, max(0, model.mig_slices - slices) // profile.slices)


def profile_by_index(model: GpuModel, index: int) -> MigProfile | None:
    """The model's profile for an NVML profile index, None when it has none."""
    for profile in model.mig_profiles:
        if PROFILE_INDEX_BY_SLICES.get(profile.slices) == index:
            return profile
    return None
