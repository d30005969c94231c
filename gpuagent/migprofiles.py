"""MIG GPU-instance profiles per GPU model: slices of compute and memory, memory and SMs of each.

One table for everything that reasons about MIG without a GPU at hand: the simulated NVML plays these
models (``devices/sim/models.py``), and ``gpuagent recommend`` sizes workloads against them (the smallest
profile whose compute and memory hold a workload). A live GPU's own profiles come from NVML
(``GpuInfo.mig_profiles``); this table is for when there is none to ask.

Each profile is the one GPU instance with one full-size compute instance, without media extensions
(``+me``) or the double-memory 1-slice variants (``1g.20gb``): what every MIG-capable model of a family
offers alike. Memory figures are what NVML reports for the instance (MiB), close to the real parts'.
Models are matched by their NVML name (``modelName`` in the metrics), case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile (``3g.20gb``) with one full-size compute instance."""

    name: str
    slices: int  # compute (GPC) slices, out of the model's ``mig_slices``
    memory_slices: int  # out of the model's ``mig_memory_slices``
    memory_bytes: int
    sm_count: int
    placements: tuple[int, ...]  # the GPU-instance IDs NVML hands out for this profile, in order


@dataclass(frozen=True)
class MigModel:
    """The MIG profiles of a family of GPU models (their NVML names) and the slices a GPU has."""

    names: tuple[str, ...]  # NVML's names of the models with this table
    profiles: tuple[MigProfile, ...]  # smallest first
    slices: int = 7
    memory_slices: int = 8
    max_instances: int = 7

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


def _profiles(
    sizes: tuple[tuple[str, int, int, int, int, tuple[int, ...]], ...],
) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(n, s, ms, mib * MIB, sm, ids) for n, s, ms, mib, sm, ids in sizes)


# GPU-instance IDs per profile follow the placements an A100/H100 driver uses: 7g -> 0, 4g -> 1,
# 3g -> 1 or 2, 2g -> 3..5, 1g -> 7..13.
A100_40GB_PROFILES = _profiles((
    ("1g.5gb", 1, 1, 4864, 14, (7, 8, 9, 10, 11, 12, 13)),
    ("2g.10gb", 2, 2, 9856, 28, (3, 4, 5)),
    ("3g.20gb", 3, 4, 19968, 42, (1, 2)),
    ("4g.20gb", 4, 4, 19968, 56, (1,)),
    ("7g.40gb", 7, 8, 40192, 98, (0,)),
))
A100_80GB_PROFILES = _profiles((
    ("1g.10gb", 1, 1, 9728, 14, (7, 8, 9, 10, 11, 12, 13)),
    ("2g.20gb", 2, 2, 19968, 28, (3, 4, 5)),
    ("3g.40gb", 3, 4, 40192, 42, (1, 2)),
    ("4g.40gb", 4, 4, 40192, 56, (1,)),
    ("7g.80gb", 7, 8, 80384, 98, (0,)),
))
H100_80GB_PROFILES = _profiles((
    ("1g.10gb", 1, 1, 9984, 16, (7, 8, 9, 10, 11, 12, 13)),
    ("2g.20gb", 2, 2, 20096, 32, (3, 4, 5)),
    ("3g.40gb", 3, 4, 40320, 60, (1, 2)),
    ("4g.40gb", 4, 4, 40320, 64, (1,)),
    ("7g.80gb", 7, 8, 80896, 132, (0,)),
))

MODELS: tuple[MigModel, ...] = (
    MigModel(("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), A100_40GB_PROFILES),
    MigModel(("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), A100_80GB_PROFILES),
    MigModel(("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H800"), H100_80GB_PROFILES),
)
_BY_NAME = {name.casefold(): model for model in MODELS for name in model.names}


def mig_model(model_name: str | None) -> MigModel | None:
    """The MIG table of the GPU model NVML calls ``model_name``; None for a model without MIG (or one this
    table does not know)."""
    return _BY_NAME.get(model_name.strip().casefold()) if model_name else None
