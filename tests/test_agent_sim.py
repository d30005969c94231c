"""The real NVML backend and agent, run against the simulated NVML: every example scenario, every fault."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from simclock import FakeClock

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, default_scenario_path, load_scenario
from gpuagent.export.exposition import generate_text
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.node import NodeSnapshot

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = [*sorted((ROOT / "examples" / "scenarios").glob("*.yaml")), default_scenario_path()]
FAULTS = ROOT / "examples" / "scenarios" / "faults.yaml"


def make_agent(
    scenario: Path, clock: FakeClock | None = None, **overrides: object
) -> tuple[Agent, SimulatedNvml]:
    settings = {"backend": "sim", "scenario": str(scenario), "poll_interval": 0.05,
                "slow_poll_interval": 0.05, "nvml_timeout": 2.0, **overrides}
    config = load_config(None, env={}, overrides=settings)
    nvml = SimulatedNvml(load_scenario(scenario), **({"clock": clock} if clock else {}))
    if clock is not None:
        clock.t = clock.start
    return Agent(config, nvml=nvml, backend="sim"), nvml


def live_pids(nvml: SimulatedNvml) -> set[int]:
    """What the simulator itself lists, to check the agent missed and invented nothing."""
    nvml.nvmlInit()
    pids = set()
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        for fn in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses,
                   nvml.nvmlDeviceGetMPSComputeRunningProcesses_v3):  # MPS clients: only on that list
            pids.update(p.pid for p in fn(handle))
    return pids


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
async def test_every_scenario_polls_completely(scenario: Path) -> None:
    clock = FakeClock(start=3.0)  # past the faults scenario's driver start-up failure
    agent, nvml = make_agent(scenario, clock)
    try:
        await agent.poll_once()
        clock.advance(1.0)
        snap = await agent.poll_once()
    finally:
        await agent.devices.close()
    expected_gpus = len(load_scenario(scenario).gpus)
    if scenario == FAULTS:  # before t=5 the driver does not load: stale nothing, NVML down
        assert snap.sources[0].ok is False and "DRIVER_NOT_LOADED" in snap.sources[0].error
        return
    assert snap.sources[0].ok, snap.sources[0].error
    assert len(snap.gpus) == expected_gpus
    assert snap.driver_version and snap.cuda_driver_version
    assert {p.pid for g in snap.gpus for p in g.processes} == live_pids(nvml)
    for gpu in snap.gpus:
        assert gpu.health is Health.OK and not gpu.stale
        assert gpu.info.uuid.startswith("GPU-") and gpu.info.pci_bus_id and gpu.info.name
        assert gpu.info.memory_total_bytes and gpu.memory_used_bytes is not None
        assert gpu.temperature_celsius is not None and gpu.power_watts is not None
        assert gpu.sm_clock_hz and gpu.energy_joules_total is not None
        if gpu.info.mig_enabled:
            assert gpu.gpu_util_percent is None  # NVML has no GPU utilization on MIG, and we do not fake it
            assert gpu.migs and all(m.uuid.startswith("MIG-") and m.profile for m in gpu.migs)
            assert all(p.sm_util_percent is None for p in gpu.processes)
            in_instances = {p.pid for m in gpu.migs for p in m.processes}
            assert in_instances == {p.pid for p in gpu.processes if p.gpu_instance_id is not None}
        else:
            assert gpu.gpu_util_percent is not None and not gpu.migs
            assert all(p.sm_util_percent is not None for p in gpu.processes)
        if gpu.info.gpm_supported:  # Hopper: profiling counters from GPM, on the GPU or per instance
            assert gpu.profiling is not None or all(m.profiling for m in gpu.migs)
        else:
            assert gpu.profiling is None
    body = generate_text(agent.registry).decode()
    for gpu in snap.gpus:
        assert f'DCGM_FI_DEV_FB_USED{{gpu="{gpu.info.index}",UUID="{gpu.info.uuid}"' in body


async def test_8xh100_node_exports_every_default_dcgm_field() -> None:
    agent, _ = make_agent(ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml")
    try:
        await agent.poll_once()
        await asyncio.sleep(0.2)
        snap = await agent.poll_once()
    finally:
        await agent.devices.close()
    body = generate_text(agent.registry).decode()
    defaults = ["SM_CLOCK", "MEM_CLOCK", "MEMORY_TEMP", "GPU_TEMP", "POWER_USAGE", "TOTAL_ENERGY_CONSUMPTION",
                "PCIE_REPLAY_COUNTER", "GPU_UTIL", "MEM_COPY_UTIL", "ENC_UTIL", "DEC_UTIL", "XID_ERRORS",
                "FB_FREE", "FB_USED", "FB_RESERVED", "NVLINK_BANDWIDTH_TOTAL", "UNCORRECTABLE_REMAPPED_ROWS",
                "CORRECTABLE_REMAPPED_ROWS", "ROW_REMAP_FAILURE"]
    profiling = ["GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES"]
    names = [f"DCGM_FI_DEV_{n}" for n in defaults] + [f"DCGM_FI_PROF_{n}" for n in profiling]
    for name in names:
        series = [line for line in body.splitlines() if line.startswith(name + "{")]
        assert len(series) == 8, f"{name}: {len(series)} series"
    assert all(len(g.info.nvlink_peers) == 7 for g in snap.gpus)
    processes = sum(len(g.processes) for g in snap.gpus)
    assert body.count("gpuagent_process_gpu_memory_used_bytes{") == processes > 50


async def test_laptop_gpu_unsupported_fields_are_absent_not_zero() -> None:
    agent, _ = make_agent(ROOT / "examples" / "scenarios" / "laptop-1gpu.yaml")
    try:
        snap = await agent.poll_once()
    finally:
        await agent.devices.close()
    (gpu,) = snap.gpus
    assert gpu.ecc is None and gpu.remapped_rows is None and gpu.profiling is None
    assert gpu.info.nvlink_peers == () and not gpu.info.mig_enabled
    body = generate_text(agent.registry).decode()
    for absent in ("DCGM_FI_DEV_ECC_", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_PROF_",
                   "DCGM_FI_DEV_MEMORY_TEMP{"):
        assert absent not in body, absent
    assert not snap.nvml_errors  # unsupported is not an error


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_fault_timeline(caplog: pytest.LogCaptureFixture) -> None:
    """examples/scenarios/faults.yaml, walked through in scenario time with the agent polling."""
    clock = FakeClock(start=0.0)
    agent, nvml = make_agent(FAULTS, clock, nvml_timeout=0.5)
    caplog.set_level(logging.INFO)
    try:
        # t < 5: the driver does not load. The agent answers, says NVML is down, and retries.
        snap = await agent.poll_once()
        assert not snap.sources[0].ok and snap.gpus == ()
        assert 'gpuagent_up 0.0' in generate_text(agent.registry).decode()
        clock.t = 6.0
        snap = await agent.poll_once()
        assert snap.sources[0].ok and len(snap.gpus) == 4
        assert "gpuagent_up 1.0" in generate_text(agent.registry).decode()

        # t = 20: XID 31 on GPU 1, from the event set (watcher thread), shown as the last XID in the window.
        clock.t = 20.5
        await wait_for(lambda: agent.devices.xids.record_for(1).totals.get(31) == 1)
        snap = await agent.poll_once()
        assert snap.gpus[1].xid.last_code == 31 and snap.gpus[0].xid.last_code is None
        body = generate_text(agent.registry).decode()
        assert 'DCGM_FI_DEV_XID_ERRORS{gpu="1"' in body and 'err_code="31"' in body

        # t = 40: a double-bit ECC error on GPU 2 and its XID 48, read on the slow cadence.
        clock.t = 41.0
        await asyncio.sleep(0.06)
        snap = await agent.poll_once()
        assert snap.gpus[2].ecc is not None and snap.gpus[2].ecc.dbe_volatile_total >= 1
        assert snap.gpus[2].ecc.sbe_volatile_total >= 1  # the t=30 single-bit error too

        # t = 61: GPU 3 fell off the bus. It alone is unhealthy; the rest keep their fresh values.
        clock.t = 62.0
        snap = await agent.poll_once()
        assert snap.gpus[3].health is Health.LOST and "GPU_IS_LOST" in snap.gpus[3].health_detail
        assert all(g.health is Health.OK and not g.stale for g in snap.gpus[:3])
        body = generate_text(agent.registry).decode()
        assert 'gpuagent_gpu_health{gpu="3"' in body and 'state="lost"} 1.0' in body
        assert f'DCGM_FI_DEV_GPU_UTIL{{gpu="3",UUID="{snap.gpus[3].info.uuid}"' not in body
        assert any(e.code == "GPU_IS_LOST" for e in snap.nvml_errors)

        # t = 90: an XID storm of 5000 events drains quickly, is counted exactly, and is logged once.
        clock.t = 90.5
        started = time.monotonic()
        await wait_for(lambda: agent.devices.xids.record_for(0).totals.get(13) == 5000, timeout=5)
        assert time.monotonic() - started < 5
        assert sum("XID 13 on GPU 0" in r.getMessage() for r in caplog.records) == 1

        # t = 120: a call on GPU 1 hangs. GPU 1 goes stale after the timeout, the others stay fresh,
        # and no second call is stacked behind the stuck one.
        clock.t = 121.0
        snap = await agent.poll_once()
        assert snap.gpus[1].stale and snap.gpus[1].health is Health.UNRESPONSIVE
        assert not snap.gpus[0].stale and snap.gpus[0].health is Health.OK
        hung_calls = nvml.call_counts()["nvmlDeviceGetUtilizationRates"]
        for _ in range(2):
            snap = await agent.poll_once()
            assert snap.gpus[1].stale
        assert nvml.call_counts()["nvmlDeviceGetUtilizationRates"] - hung_calls <= 2 * 3  # GPUs 0, 2 only
        body = generate_text(agent.registry).decode()
        assert 'gpuagent_gpu_stale{gpu="1"' in body
        nvml.release_hangs()
        await wait_for(lambda: not agent.devices._gpus[1].worker.busy)
        snap = await agent.poll_once()
        assert not snap.gpus[1].stale and snap.gpus[1].health is Health.OK
    finally:
        nvml.release_hangs()
        await agent.devices.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is unresponsive" in m for m in messages) == 1
    assert sum("healthy again" in m for m in messages) == 1


async def test_driver_loss_and_reload_recovers() -> None:
    """NVML failing as a whole mid-run (driver unloaded) serves stale samples, then re-initialises."""
    agent, nvml = make_agent(ROOT / "examples" / "scenarios" / "laptop-1gpu.yaml")
    try:
        first = await agent.poll_once()
        assert first.sources[0].ok
        real_util = nvml.nvmlDeviceGetUtilizationRates

        def unloaded(handle):
            raise nvml.NVMLError(nvml.NVML_ERROR_DRIVER_NOT_LOADED)

        nvml.nvmlDeviceGetUtilizationRates = unloaded  # the module attribute, as a driver unload looks
        snap = await agent.poll_once()
        assert not snap.sources[0].ok and "DRIVER_NOT_LOADED" in snap.sources[0].error
        assert snap.gpus[0].stale and snap.gpus[0].info.uuid == first.gpus[0].info.uuid
        nvml.nvmlDeviceGetUtilizationRates = real_util
        snap = await agent.poll_once()
        assert snap.sources[0].ok and not snap.gpus[0].stale
    finally:
        await agent.devices.close()


async def test_poll_snapshot_carries_timing_and_nvml_accounting() -> None:
    agent, _ = make_agent(ROOT / "examples" / "scenarios" / "laptop-1gpu.yaml")
    try:
        for _ in range(3):
            snap: NodeSnapshot = await agent.poll_once()
    finally:
        await agent.devices.close()
    assert snap.polls_total == 3 and snap.poll_histogram.count == 3
    assert snap.poll_histogram.cumulative_counts[-1] <= 3
    calls = {c.function: c.calls_total for c in snap.nvml_calls}
    # The tiers: the process lists once per poll each, static info only on the slow cadence.
    assert calls["nvmlDeviceGetComputeRunningProcesses"] == 3
    assert calls["nvmlDeviceGetUtilizationRates"] == 3
    assert calls["nvmlDeviceGetSerial"] <= 3


def test_a_one_shot_look_acts_on_nothing_whatever_the_config_says(tmp_path: Path) -> None:
    """``gpuagent snapshot``/``hints`` with a node's production config: the figures, no enforcement (no
    freeze, journal or signal beside the live agent), no Node written, nothing published, no Event."""
    from gpuagent.agent import poll_once, read_only

    journal = tmp_path / "journal.json"
    config = load_config(None, env={}, overrides={
        "backend": "sim", "mode": "enforce", "journal_path": str(journal), "health_mode": "enforce",
        "publish_state": "on", "idle_events": "on", "pod_resources_socket": None,
        "policies": [{"match_namespace": "*", "gpu_memory": "1Mi", "gpu_share": 1}],  # everyone over both
    })
    looked = read_only(config)
    assert (looked.enforce.mode, looked.health.mode, looked.publish.state, looked.accounting.idle_events) == (
        "off", "audit", "off", "off")
    assert looked.enforce.policies == config.enforce.policies and looked.devices.scenario == config.devices.scenario
    assert read_only(load_config(None, env={}, overrides={"health_mode": "off"})).health.mode == "off"
    snap = poll_once(config)
    assert snap.gpus and snap.pods is not None  # the figures, as the live agent would see them
    assert snap.enforcement is None and not journal.exists()
