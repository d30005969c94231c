"""The read tiers that keep NVML's lock under 1 % on 8 GPUs (docs/nvml-cost.md): per-process utilization every
poll only where the share controller acts, every ``process_utilization_interval`` elsewhere, with a cursor
that loses no window; the detail figures every ``detail_interval``; the figures carried in between."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from simclock import FakeClock
from test_accounting import NamedTenants, sim_agent

from gpuagent.devices.guard import NvmlGuard
from gpuagent.devices.procutil import ProcessUtilization
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import Workload

SCENARIO = {
    "version": 1,
    "name": "tiers",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],
    "processes": [
        {"name": "a", "gpu": 0, "memory": "4Gi", "sm_util": 50},
        {"name": "b", "gpu": 0, "memory": "4Gi", "sm_util": 30},
        {"name": "c", "gpu": 1, "memory": "4Gi", "sm_util": 70},
        {"name": "late", "gpu": 1, "memory": "1Gi", "sm_util": 10, "start": 13},
    ],
}
TENANTS = {name: Workload(kind="systemd_service", name=f"{name}.service") for name in ("a", "b", "c", "late")}


async def run(tmp_path: Path, seconds: int, **config: Any) -> tuple[list[NodeSnapshot], dict[str, int]]:
    clock = FakeClock()
    settings = {"profiling_interval": 10.0, "energy_interval": 30.0, "slow_poll_interval": 30.0, **config}
    agent, nvml = sim_agent(tmp_path, SCENARIO, clock, **settings)
    agent.pods = NamedTenants(TENANTS)  # type: ignore[assignment]
    snapshots = []
    try:
        for _ in range(seconds + 1):
            snapshots.append(await agent.poll_once())
            clock.advance(1.0)
    finally:
        await agent.devices.close()
    return snapshots, nvml.call_counts()


def process(snapshot: NodeSnapshot, gpu: int, name: str) -> Any:
    return next(p for p in snapshot.gpus[gpu].processes if p.comm == name)


async def test_off_reads_per_process_use_every_interval_and_holds_it_in_between(tmp_path: Path) -> None:
    snapshots, calls = await run(tmp_path, 20)
    assert calls["nvmlDeviceGetProcessUtilization"] == 2 * 3  # t = 0, 10, 20 on each GPU
    windows = [s.gpus[0].process_util_window_seconds for s in snapshots]
    assert windows[:10] == [None] * 10 and windows[10:20] == [10.0] * 10 and windows[20] == 10.0
    reads = [s.gpus[0].process_util_read_at_unix for s in snapshots]
    assert len(set(reads)) == 3
    assert [process(s, 0, "a").sm_util_percent for s in snapshots] == [50.0] * 21  # held between reads
    # "late" starts at t=13: unmeasured (None, no series) until the read at t=20, never a made-up 0
    late = [process(s, 1, "late").sm_util_percent for s in snapshots if any(p.comm == "late"
                                                                               for p in s.gpus[1].processes)]
    assert late[:-1] == [None] * (len(late) - 1) and late[-1] == 10.0


async def test_audit_reads_every_poll_where_the_controller_acts_and_on_the_interval_elsewhere(
    tmp_path: Path,
) -> None:
    snapshots, calls = await run(tmp_path, 20, mode="audit", journal_path=str(tmp_path / "journal.json"))
    # GPU 0 has two tenants: every poll from the poll after the first. GPU 1 has one until "late" arrives
    # at t=13: t = 0 and 10, then every poll from t=14 (a 4 s window first, since the read at 10)
    assert calls["nvmlDeviceGetProcessUtilization"] == 21 + 2 + 7
    assert [s.gpus[0].process_util_window_seconds for s in snapshots[2:]] == [1.0] * 19
    assert [s.gpus[1].process_util_window_seconds for s in snapshots[10:]] == [10.0] * 4 + [4.0] + [1.0] * 6


async def test_the_detail_figures_are_read_every_detail_interval_and_carried(tmp_path: Path) -> None:
    snapshots, calls = await run(tmp_path, 20, detail_interval=10.0)
    assert calls["nvmlDeviceGetEncoderUtilization"] == 2 * 3
    assert calls["nvmlDeviceGetDecoderUtilization"] == 2 * 3
    assert calls["nvmlDeviceGetClockInfo"] == 2 * (21 + 2 * 3)  # the SM clock every poll, two others 3 times
    # one batched field read every poll (the power) plus the detail batch on the interval, per GPU
    assert calls["nvmlDeviceGetFieldValues"] >= 2 * (21 + 3)
    for s in snapshots:
        gpu = s.gpus[0]
        assert gpu.memory_clock_hz is not None and gpu.graphics_clock_hz is not None
        assert gpu.pcie_tx_bytes_total is not None and gpu.power_watts is not None
    tx = [s.gpus[0].pcie_tx_bytes_total for s in snapshots]
    assert len(set(tx[:10])) == 1 and tx[10] > tx[9]  # a counter held, then read again


async def test_intervals_at_or_under_the_poll_read_every_poll(tmp_path: Path) -> None:
    _, calls = await run(tmp_path, 5, process_utilization_interval=1.0, detail_interval=0.5)
    assert calls["nvmlDeviceGetProcessUtilization"] == 2 * 6
    assert calls["nvmlDeviceGetEncoderUtilization"] == 2 * 6


# -- the cursor ----------------------------------------------------------------------------------------------

class _Sample:
    def __init__(self, pid: int, sm: int, stamp: int) -> None:
        self.pid, self.smUtil, self.memUtil, self.timeStamp = pid, sm, sm // 2, stamp


class ScriptedNvml:
    """pynvml's constants and errors, and a per-process utilization call that answers from a script."""

    NVMLError = pynvml.NVMLError

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.cursors: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, cursor: int) -> Any:
        self.cursors.append(cursor)
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            raise pynvml.NVMLError(answer)
        return answer


def test_the_cursor_moves_only_on_a_read_that_worked_so_no_window_is_lost() -> None:
    nvml = ScriptedNvml([
        [_Sample(1, 40, 1_000), _Sample(2, 20, 1_100)],
        pynvml.NVML_ERROR_UNKNOWN,  # failed: the figures stand, the cursor stays
        [_Sample(1, 60, 3_000)],  # covers both windows; pid 2 ran nothing since 1_100
        pynvml.NVML_ERROR_NOT_FOUND,  # nobody ran kernels: a reading of zeros, not a failure
    ])
    now = [100.0]
    util = ProcessUtilization(NvmlGuard(nvml), object(), 0, interval=10.0, clock=lambda: now[0])
    util.update([1, 2])
    assert util.figures(1) == (40.0, 20.0) and util.figures(2) == (20.0, 10.0)
    assert util.read_at == 100.0 and util.window_seconds is None
    now[0] = 105.0
    util.update([1, 2])  # not due yet
    now[0] = 110.0
    util.update([1, 2])
    assert util.figures(1) == (40.0, 20.0) and util.read_at == 100.0
    now[0] = 120.0
    util.update([1, 2, 3])
    assert util.figures(1) == (60.0, 30.0) and util.figures(2) == (0.0, 0.0) and util.figures(3) == (0.0, 0.0)
    assert util.window_seconds == 20.0  # the failed read's window is in this one
    now[0] = 130.0
    util.update([1])
    assert util.figures(1) == (0.0, 0.0) and util.figures(2) == (None, None) and util.window_seconds == 10.0
    assert nvml.cursors == [0, 1_100, 1_100, 3_000]


def test_an_unsupported_call_leaves_the_figures_unknown_and_is_not_repeated() -> None:
    nvml = ScriptedNvml([pynvml.NVML_ERROR_NOT_SUPPORTED])
    now = [0.0]
    util = ProcessUtilization(NvmlGuard(nvml), object(), 0, interval=1.0, clock=lambda: now[0])
    util.every_poll = True
    for t in range(5):
        now[0] = float(t)
        util.update([7])
    assert util.figures(7) == (None, None) and util.read_at is None and len(nvml.cursors) == 1


@pytest.mark.parametrize("exempt", [False, True])
def test_contended_gpus_are_those_with_two_non_exempt_tenants(exempt: bool) -> None:
    from gpuagent.assembly import build_enforcer
    from gpuagent.config import load_config
    from gpuagent.snapshot.gpu import GpuInfo, GpuSample
    from gpuagent.snapshot.processes import ProcessSample

    policies = [{"match_name": "b.service", "exempt": True}] if exempt else []
    enforcer = build_enforcer(load_config(None, env={}, overrides={
        "mode": "audit", "journal_path": None, "policies": policies}))
    assert enforcer is not None

    def gpu(index: int, names: list[str]) -> GpuSample:
        info = GpuInfo(index=index, uuid=f"GPU-{index}", name="", serial=None, pci_bus_id="",
                       minor_number=None, memory_total_bytes=None, power_limit_watts=None, mig_enabled=False)
        return GpuSample(info=info, sampled_at_unix=0.0, processes=tuple(
            ProcessSample(100 * index + i, n, "compute", 1, None, None, workload=TENANTS[n])
            for i, n in enumerate(names)))

    enforcer.update(NodeSnapshot(hostname="n", backend="sim", taken_at_unix=0.0, taken_at_monotonic=0.0,
                                 poll_duration_seconds=0.0, gpus=(gpu(0, ["a", "b"]), gpu(1, ["c"]))))
    assert enforcer.contended_gpus == (frozenset() if exempt else frozenset({"GPU-0"}))
