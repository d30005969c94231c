"""NVML reads that cost milliseconds on a real GPU run on their own cadence: the energy counter every
``energy_interval`` (about 3 ms a read on an H100), the ledger sharing each reading's delta out over the polls
since the last one, weighted by the power then; GPM samples every ``profiling_interval`` (1.7 ms)."""

from __future__ import annotations

from pathlib import Path

import pytest
from simclock import FakeClock

from gpuagent.accounting.ledger import Ledger
from gpuagent.accounting.rates import GpuRates, Owner, Rate
from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario

ROOT = Path(__file__).resolve().parent.parent
LAPTOP = ROOT / "examples" / "scenarios" / "laptop-1gpu.yaml"


@pytest.mark.parametrize(("interval", "reads"), [(10.0, 3), (0.5, 21)])
async def test_the_counter_is_read_every_energy_interval(interval: float, reads: int) -> None:
    clock = FakeClock(start=1.0)
    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(LAPTOP), "poll_interval": 1.0, "energy_interval": interval})
    nvml = SimulatedNvml(load_scenario(LAPTOP), clock=clock)
    clock.t = clock.start
    agent = Agent(config, nvml=nvml, backend="sim", clock=clock, monotonic=clock)
    seen = []
    try:
        for _ in range(21):  # 20 s at 1 s polls
            snapshot = await agent.poll_once()
            gpu = snapshot.gpus[0]
            assert gpu.energy_joules_total is not None  # carried between reads, never absent
            seen.append((gpu.energy_read_at_unix, gpu.energy_joules_total))
            clock.advance(1.0)
    finally:
        await agent.devices.close()
    read_times = sorted({at for at, _ in seen})
    assert len(read_times) == reads
    for at, energy in seen:  # a reading's value stays with its time
        assert energy == next(e for a, e in seen if a == at)


def _gpu(energy: float, read_at: float, power: float, busy: dict[str, float]) -> GpuRates:
    rates = GpuRates(uuid="GPU-0", index=0, usable=True, energy_joules_total=energy, energy_read_at_unix=read_at,
                     power_watts=power)
    for name, ratio in busy.items():
        rates.units[(Owner("pod", "ns", name, None), None)] = Rate(allocated=1.0, busy=ratio)
    return rates


def test_a_reading_is_shared_out_over_the_polls_since_the_last_by_power() -> None:
    ledger = Ledger()
    # t=0 read: 0 J. Then 4 s at 100 W with only a busy, 4 s at 300 W with only b busy; read again at t=8.
    ledger.update({"GPU-0": _gpu(0.0, 0.0, 100.0, {"a": 1.0, "b": 0.0})}, 0.0, 1.0)
    for t in range(1, 5):
        ledger.update({"GPU-0": _gpu(0.0, 0.0, 100.0, {"a": 1.0, "b": 0.0})}, float(t), 1.0)
    for t in range(5, 8):
        ledger.update({"GPU-0": _gpu(0.0, 0.0, 300.0, {"a": 0.0, "b": 1.0})}, float(t), 1.0)
    energy = {key.name: s.energy_joules for key, s in ledger if key.level == "pod"}
    assert energy == {"a": 0.0, "b": 0.0}  # nothing settled before the next reading
    ledger.update({"GPU-0": _gpu(2000.0, 8.0, 300.0, {"a": 0.0, "b": 1.0})}, 8.0, 1.0)
    energy = {key.name: s.energy_joules for key, s in ledger if key.level == "pod"}
    assert sum(energy.values()) == pytest.approx(2000.0, abs=1e-9)  # the counter's delta, exactly
    # estimates: a 4 x 100 J, b 3 x 300 J, and the 4 -> 5 ramp (200 J: power 100 -> 300) half each
    a_estimate, b_estimate = 400 + 100, 900 + 100
    assert energy["a"] / energy["b"] == pytest.approx(a_estimate / b_estimate)
    assert ledger.gpus["GPU-0"].energy_joules == pytest.approx(2000.0)


def test_a_gap_drops_what_was_pending_and_restarts_at_the_next_reading() -> None:
    ledger = Ledger()
    ledger.update({"GPU-0": _gpu(0.0, 0.0, 100.0, {"a": 1.0})}, 0.0, 1.0)
    ledger.update({"GPU-0": _gpu(0.0, 0.0, 100.0, {"a": 1.0})}, 1.0, 1.0)
    ledger.update({"GPU-0": _gpu(5000.0, 30.0, 100.0, {"a": 1.0})}, 30.0, 1.0)  # 29 s gap
    ledger.update({"GPU-0": _gpu(5000.0, 30.0, 100.0, {"a": 1.0})}, 31.0, 1.0)
    ledger.update({"GPU-0": _gpu(5200.0, 32.0, 100.0, {"a": 1.0})}, 32.0, 1.0)
    (series,) = [s for k, s in ledger if k.level == "pod"]
    assert series.energy_joules == pytest.approx(200.0)  # only the 30 -> 32 readings, nothing of the gap
    assert ledger.gpus["GPU-0"].gap_seconds == pytest.approx(29.0)


@pytest.mark.parametrize(("interval", "samples"), [(5.0, 6), (0.5, 22)])
async def test_gpm_is_sampled_every_profiling_interval(interval: float, samples: int) -> None:
    """A pair at the first poll (the first metrics at once), then one sample once ``interval`` has passed:
    5 s, at t = 1, 1, 6, 11, 16, 21 (polls at t = 1..21); 0.5 s, every poll."""
    clock = FakeClock(start=1.0)
    h100 = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"
    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(h100), "poll_interval": 1.0, "profiling_interval": interval})
    nvml = SimulatedNvml(load_scenario(h100), clock=clock)
    clock.t = clock.start
    agent = Agent(config, nvml=nvml, backend="sim", clock=clock, monotonic=clock)
    profiles = []
    try:
        for _ in range(21):
            snapshot = await agent.poll_once()
            profiles.append(snapshot.gpus[0].profiling)
            clock.advance(1.0)
    finally:
        await agent.devices.close()
    assert nvml.call_counts()["nvmlGpmSampleGet"] == samples * len(snapshot.gpus)
    assert all(p is not None for p in profiles)  # from the first poll, carried between samples
