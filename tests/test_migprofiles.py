"""The shared MIG profile table: what the simulated NVML plays is what the recommender sizes against."""

from __future__ import annotations

from gpuagent.devices.sim.models import MODELS
from gpuagent.migprofiles import MODELS as MIG_MODELS
from gpuagent.migprofiles import mig_model


def test_every_simulated_mig_model_plays_the_shared_table() -> None:
    mig = [m for m in MODELS.values() if m.mig]
    assert {m.key for m in mig} == {"H100-SXM5-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB"}
    for model in mig:
        table = mig_model(model.name)
        assert table is not None, model.name
        assert table.profiles == model.mig_profiles  # the same objects' values, not a copy to drift
        assert (table.slices, table.memory_slices, table.max_instances) == (
            model.mig_slices, model.mig_memory_slices, model.max_mig_devices)
    assert all(mig_model(m.name) is None for m in MODELS.values() if not m.mig)


def test_profiles_are_smallest_first_and_fit_their_gpu() -> None:
    for table in MIG_MODELS:
        sizes = [(p.slices, p.memory_slices) for p in table.profiles]
        assert sizes == sorted(sizes)
        assert table.profiles[-1].slices == table.slices and table.profiles[-1].memory_slices == table.memory_slices
        for p in table.profiles:
            gb = float(p.name.split(".")[1].removesuffix("gb"))  # the name's rounded size
            assert abs(p.memory_bytes / 1e9 - gb) / gb < 0.15, p


def test_names_match_whatever_case_and_spacing() -> None:
    assert mig_model(" nvidia h100 80gb hbm3 ") is mig_model("NVIDIA H100 80GB HBM3") is not None
    assert mig_model("NVIDIA A100 80GB PCIe").profile("1g.10gb").memory_bytes == 9728 << 20  # type: ignore[union-attr]
    assert mig_model("NVIDIA L4") is None and mig_model(None) is None and mig_model("") is None
