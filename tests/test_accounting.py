"""Accounting: counters against analytic integrals on a simulated node, the energy split, gaps, churn.

The simulated node runs the real device code (``devices/nvml.py`` on the simulated NVML) under a hand-moved
clock; tenants are named by a stand-in for the pods source (the scenario's fake PIDs have no cgroups).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from simclock import FakeClock

from gpuagent.accounting import Accountant, AccountingSettings
from gpuagent.accounting.rates import pod_allocations, poll_rates
from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.pods.source import PodsReading
from gpuagent.snapshot.accounting import WorkloadGpuUsage
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, Health, MigSample, ProfilingSample
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import ProcessSample, Workload
from gpuagent.snapshot.views import to_jsonable

GIB = 1024**3
WALL = 1_790_000_000.0


# -- a stand-in for the pods source: names the scenario's processes by their scenario name --------------
class NamedTenants:
    """``attribute(gpus)`` like ``PodsSource``: each process gets the workload its comm maps to."""

    metadata = None

    def __init__(self, workloads: Mapping[str, Workload], pods: Sequence[PodUse] = ()) -> None:
        self.workloads = dict(workloads)
        self.pods = tuple(pods)

    async def attribute(self, gpus: tuple[GpuSample, ...]) -> Any:
        def named(p: ProcessSample) -> ProcessSample:
            return replace(p, workload=self.workloads.get(p.comm))

        out = []
        for gpu in gpus:
            migs = tuple(replace(m, processes=tuple(named(p) for p in m.processes)) for m in gpu.migs)
            out.append(replace(gpu, processes=tuple(named(p) for p in gpu.processes), migs=migs))
        status = SourceStatus("pod_resources", True, 0.0)
        return PodsReading(gpus=tuple(out), pods=self.pods, statuses=(status,))  # what the agent reads, whole

    async def close(self) -> None:
        pass


def pod(namespace: str, name: str, container: str, devices: Sequence[str], uid: str = "") -> PodUse:
    return PodUse(name=name, namespace=namespace, uid=uid or f"uid-{name}", names_from="pod_resources",
                  containers=(ContainerUse(container, allocated_devices=tuple(devices)),))


def pod_workload(namespace: str, name: str, container: str) -> Workload:
    return Workload(kind="pod", name=name, namespace=namespace, container=container, names_from="pod_resources")


def sim_agent(tmp_path: Path, scenario: dict[str, Any], clock: FakeClock, **overrides: Any) -> tuple[Agent, SimulatedNvml]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    settings = {"backend": "sim", "scenario": str(path), "poll_interval": 1.0, "slow_poll_interval": 1.0,
                "nvml_timeout": 5.0, "idle_events": "off", "kubernetes_api": "off",
                "pod_resources_socket": None, "network": False,
                # MIG busy comes from GPM: sampled every poll here, so the integrals are checked poll by poll
                "profiling_interval": 1.0, **overrides}
    config = load_config(None, env={}, overrides=settings)
    nvml = SimulatedNvml(load_scenario(path), clock=clock)
    agent = Agent(config, nvml=nvml, backend="sim", clock=lambda: WALL + clock(), monotonic=clock)
    return agent, nvml


def uuids(nvml: SimulatedNvml) -> tuple[list[str], dict[tuple[int, int], str]]:
    """The GPUs' UUIDs by index, and the MIG devices' by (GPU index, GPU-instance ID), as NVML names them."""
    nvml.nvmlInit()
    gpus, migs = [], {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        gpus.append(nvml.nvmlDeviceGetUUID(handle))
        if not nvml.nvmlDeviceGetMigMode(handle)[0]:
            continue
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue
            migs[(i, nvml.nvmlDeviceGetGpuInstanceId(mig))] = nvml.nvmlDeviceGetUUID(mig)
    return gpus, migs


def usage(snap: NodeSnapshot, level: str, name: str, gpu: int, instance: int | None = None) -> WorkloadGpuUsage:
    assert snap.accounting is not None
    found = [u for u in snap.accounting.usage
             if u.level == level and u.name == name and u.gpu_index == gpu and u.gpu_instance_id == instance]
    assert len(found) == 1, (level, name, gpu, instance, found)
    return found[0]


def sine_integral(lo: float, hi: float, period: float, t0: float, t1: float) -> float:
    """∫ (mid + amp·sin(2πt/period)) dt from t0 to t1."""
    mid, amp, w = (lo + hi) / 2, (hi - lo) / 2, 2 * math.pi / period
    return mid * (t1 - t0) + amp / w * (math.cos(w * t0) - math.cos(w * t1))


KNOWN_CURVES = {
    "version": 1,
    "name": "accounting-known-curves",
    "gpus": [
        {"model": "H100-SXM5-80GB", "count": 2},  # 0: one pod, whole GPU; 1: two pods on replicas
        {"model": "H100-SXM5-80GB",
         "mig": {"instances": [{"profile": "3g.40gb", "id": 2}, {"profile": "2g.20gb", "id": 3}]}},
        {"model": "H100-SXM5-80GB"},  # 3: a systemd service, off Kubernetes
    ],
    "processes": [
        {"name": "trainer", "gpu": 0, "sm_util": {"sine": {"min": 20, "max": 80, "period": 60}},
         "memory": {"points": [[0, 10 * GIB], [400, 30 * GIB]]}},
        {"name": "replica-a", "gpu": 1, "sm_util": 30, "memory": 4 * GIB},
        {"name": "replica-b", "gpu": 1, "sm_util": {"sine": {"min": 0, "max": 40, "period": 30}},
         "memory": 8 * GIB},
        {"name": "mig-infer", "gpu": 2, "mig_instance": 2, "sm_util": 50, "memory": 12 * GIB},
        {"name": "mig-batch", "gpu": 2, "mig_instance": 3, "sm_util": {"steps": [[0, 10], [60, 90]]},
         "memory": 6 * GIB},
        {"name": "render", "gpu": 3, "sm_util": 60, "memory": 2 * GIB},
    ],
}


async def poll_every(agent: Agent, clock: FakeClock, *, until: float, step: float = 1.0) -> NodeSnapshot:
    snap = None
    while clock.t < until - 1e-9:
        clock.advance(step)
        snap = await agent.poll_once()
    assert snap is not None
    return snap


async def test_counters_match_the_analytic_integrals_and_energy_adds_up(tmp_path: Path) -> None:
    clock = FakeClock()
    agent, nvml = sim_agent(tmp_path, KNOWN_CURVES, clock)
    gpu_ids, mig_uuid = uuids(nvml)
    agent.pods = NamedTenants(  # type: ignore[assignment]
        workloads={
            "trainer": pod_workload("ml", "train-0", "trainer"),
            "replica-a": pod_workload("ml", "share-a", "main"),
            "replica-b": pod_workload("ml", "share-b", "main"),
            "mig-infer": pod_workload("serve", "infer-0", "server"),
            "mig-batch": pod_workload("serve", "batch-0", "worker"),
            "render": Workload(kind="systemd_service", name="render.service"),
        },
        pods=[
            pod("ml", "train-0", "trainer", [gpu_ids[0]]),
            pod("ml", "share-a", "main", [gpu_ids[1] + "::0"]),
            pod("ml", "share-b", "main", [gpu_ids[1] + "::1"]),
            pod("serve", "infer-0", "server", [mig_uuid[(2, 2)]]),
            pod("serve", "batch-0", "worker", [mig_uuid[(2, 3)]]),
        ],
    )
    try:
        clock.t = 10.0
        start = await agent.poll_once()
        t0 = clock.t
        end = await poll_every(agent, clock, until=t0 + 120)
        t1 = clock.t
    finally:
        await agent.devices.close()
    T = t1 - t0
    assert pytest.approx(120) == T

    def grew(level: str, name: str, gpu: int, field: str, instance: int | None = None) -> float:
        before = [u for u in start.accounting.usage  # type: ignore[union-attr]
                  if (u.level, u.name, u.gpu_index, u.gpu_instance_id) == (level, name, gpu, instance)]
        after = getattr(usage(end, level, name, gpu, instance), field)
        return after - ((getattr(before[0], field) or 0.0) if before else 0.0)

    rel = 0.02
    # GPU 0: one pod on a whole GPU: sine SM, linear memory
    assert grew("pod", "train-0", 0, "allocated_gpu_seconds_total") == pytest.approx(T, rel=rel)
    busy = sine_integral(20, 80, 60, t0, t1) / 100
    assert grew("pod", "train-0", 0, "busy_gpu_seconds_total") == pytest.approx(busy, rel=rel)
    memory = (10 * GIB + 20 * GIB * (t0 + t1) / 2 / 400) * T  # the mean of a linear curve
    assert grew("pod", "train-0", 0, "memory_byte_seconds_total") == pytest.approx(memory, rel=rel)
    # the container series of a one-container pod is the pod's
    assert grew("container", "train-0", 0, "busy_gpu_seconds_total") == pytest.approx(busy, rel=1e-9)
    # GPU 1: two replicas of one GPU: each holds half of it
    for name in ("share-a", "share-b"):
        assert grew("pod", name, 1, "allocated_gpu_seconds_total") == pytest.approx(T / 2, rel=rel)
    assert grew("pod", "share-a", 1, "busy_gpu_seconds_total") == pytest.approx(0.3 * T, rel=rel)
    assert grew("pod", "share-b", 1, "busy_gpu_seconds_total") == pytest.approx(
        sine_integral(0, 40, 30, t0, t1) / 100, rel=rel)
    assert grew("pod", "share-b", 1, "memory_byte_seconds_total") == pytest.approx(8 * GIB * T, rel=rel)
    # GPU 2: MIG slices count as their fraction; busy from the instance's GPM activity
    assert grew("pod", "infer-0", 2, "allocated_gpu_seconds_total", 2) == pytest.approx(3 / 7 * T, rel=rel)
    assert grew("pod", "batch-0", 2, "allocated_gpu_seconds_total", 3) == pytest.approx(2 / 7 * T, rel=rel)
    assert grew("pod", "infer-0", 2, "busy_gpu_seconds_total", 2) == pytest.approx(0.5 * 3 / 7 * T, rel=rel)
    batch_busy = (0.1 * (60 - t0) + 0.9 * (t1 - 60)) * 2 / 7  # the step at t=60
    assert grew("pod", "batch-0", 2, "busy_gpu_seconds_total", 3) == pytest.approx(batch_busy, rel=rel)
    # GPU 3: off Kubernetes, a process holds the whole GPU
    assert grew("workload", "render.service", 3, "allocated_gpu_seconds_total") == pytest.approx(T, rel=rel)
    assert grew("workload", "render.service", 3, "busy_gpu_seconds_total") == pytest.approx(0.6 * T, rel=rel)

    # Energy: the per-GPU split adds up to the GPU's own counter over the interval (tight), nothing is
    # left unattributed where tenants are, and a sole tenant gets all of it.
    assert start.accounting is not None and end.accounting is not None
    for index in range(4):
        measured = end.gpus[index].energy_joules_total - start.gpus[index].energy_joules_total  # type: ignore[operator]
        assert measured > 0
        tenants = sum(
            u.energy_joules_total - next((b.energy_joules_total or 0.0 for b in start.accounting.usage
                                          if (b.level, b.name, b.gpu_index, b.gpu_instance_id)
                                          == (u.level, u.name, u.gpu_index, u.gpu_instance_id)), 0.0)
            for u in end.accounting.usage if u.gpu_index == index and u.level in ("pod", "workload")
            and u.energy_joules_total is not None
        )
        assert tenants == pytest.approx(measured, rel=1e-9), index
        gpu = next(g for g in end.accounting.gpus if g.gpu_index == index)
        assert gpu.energy_unattributed_joules_total == pytest.approx(0.0, abs=1e-9)
    sole = grew("pod", "train-0", 0, "energy_joules_total")
    assert sole == pytest.approx(end.gpus[0].energy_joules_total - start.gpus[0].energy_joules_total, rel=1e-9)
    # the busier replica pays more of the shared GPU's energy
    assert grew("pod", "share-a", 1, "energy_joules_total") > grew("pod", "share-b", 1, "energy_joules_total")

    # the same counters on /metrics, as Prometheus counters
    body = generate_text(agent.registry).decode()
    assert "# TYPE gpuagent_pod_gpu_allocated_seconds_total counter" in body
    assert f'gpuagent_pod_gpu_busy_seconds_total{{namespace="ml",pod="train-0",gpu="0",UUID="{gpu_ids[0]}"' in body
    assert ('gpuagent_pod_gpu_energy_joules_total{namespace="serve",pod="infer-0",gpu="2",'
            f'UUID="{gpu_ids[2]}",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"') in body
    assert ('gpuagent_container_gpu_memory_byte_seconds_total{namespace="ml",pod="share-b",container="main",'
            'gpu="1"') in body
    assert ('gpuagent_workload_gpu_allocated_seconds_total{workload_kind="systemd_service",'
            'workload="render.service",gpu="3"') in body
    assert 'gpuagent_pod_gpu_efficiency_ratio{namespace="ml",pod="share-a",gpu="1"' in body


async def test_gaps_are_counted_nowhere_but_in_the_gap_counter(tmp_path: Path) -> None:
    clock = FakeClock()
    agent, nvml = sim_agent(tmp_path, KNOWN_CURVES, clock)
    gpu_ids, _ = uuids(nvml)
    agent.pods = NamedTenants({"trainer": pod_workload("ml", "train-0", "trainer")},  # type: ignore[assignment]
                              [pod("ml", "train-0", "trainer", [gpu_ids[0]])])
    try:
        clock.t = 5.0
        await agent.poll_once()
        snap = await poll_every(agent, clock, until=15.0)
        before = usage(snap, "pod", "train-0", 0)
        clock.advance(60.0)  # the agent was stopped (or starved) for a minute
        snap = await agent.poll_once()
        after = usage(snap, "pod", "train-0", 0)
        snap = await poll_every(agent, clock, until=clock.t + 2)
    finally:
        await agent.devices.close()
    assert after.allocated_gpu_seconds_total == before.allocated_gpu_seconds_total
    assert after.energy_joules_total == before.energy_joules_total
    assert snap.accounting is not None
    gap = next(g for g in snap.accounting.gpus if g.gpu_index == 0)
    assert gap.gap_seconds_total == pytest.approx(60.0)
    assert usage(snap, "pod", "train-0", 0).allocated_gpu_seconds_total == pytest.approx(
        before.allocated_gpu_seconds_total + 2.0)
    body = generate_text(agent.registry).decode()
    assert f'gpuagent_accounting_gap_seconds_total{{gpu="0",UUID="{gpu_ids[0]}",Hostname=' in body


ALONE_AND_SHARED = {
    "version": 1,
    "name": "accounting-alone-and-shared",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],  # 0: one tenant alone; 1: two tenants share it
    "processes": [
        {"name": "alone", "gpu": 0, "sm_util": 60, "memory": 4 * GIB},
        {"name": "share-a", "gpu": 1, "sm_util": 30, "memory": 4 * GIB},
        {"name": "share-b", "gpu": 1, "sm_util": 20, "memory": 4 * GIB},
    ],
}


async def test_tenants_alone_or_sharing_a_gpu_are_exact_over_any_minute(tmp_path: Path) -> None:
    """Alone on its GPU, a tenant's busy is the device's utilization, read and integrated every poll; two
    tenants sharing a GPU keep their 10 s per-process readings, counted between them by their latest figures
    (scaled to the GPU's utilization, read every poll) and settled by each reading. Either way busy /
    allocated over any 50-60 s range is the constant use within 1 % (10 s lumps made a shared tenant's
    0.300 read 0.322, or less, by how many readings the range held; an alone one's 0.600 read 0.63-0.64)."""
    clock = FakeClock()
    agent, _ = sim_agent(tmp_path, ALONE_AND_SHARED, clock)  # process_utilization_interval: 10 s
    agent.pods = NamedTenants({name: Workload(kind="systemd_service", name=f"{name}.service")  # type: ignore[assignment]
                               for name in ("alone", "share-a", "share-b")})
    seen: list[tuple[float, dict[str, tuple[float, float]]]] = []
    try:
        clock.t = 3.0
        await agent.poll_once()
        while clock.t < 180.0:
            clock.advance(1.0)
            snap = await agent.poll_once()
            assert snap.accounting is not None
            seen.append((clock.t, {u.name: (u.allocated_gpu_seconds_total, u.busy_gpu_seconds_total or 0.0)
                                   for u in snap.accounting.usage if u.level == "workload"}))
    finally:
        await agent.devices.close()
    for name, use in (("alone.service", 0.6), ("share-a.service", 0.3), ("share-b.service", 0.2)):
        ratios = []
        for i, (_, first) in enumerate(seen[10:], start=10):
            for _, last in seen[i + 50:i + 61]:  # every range of 50 to 60 s from every poll on
                allocated = last[name][0] - first[name][0]
                ratios.append((last[name][1] - first[name][1]) / allocated)
        assert len(ratios) > 500
        assert min(ratios) == pytest.approx(use, rel=0.01) and max(ratios) == pytest.approx(use, rel=0.01)
    # shared: counted at every poll, no lumps
    busy = [used["share-a.service"][1] for _, used in seen[10:]]
    assert all(b - a == pytest.approx(0.3) for a, b in itertools.pairwise(busy))


# -- hand-built snapshots: rules at the edges -----------------------------------------------------------
def gpu_sample(index: int, *, processes: Sequence[ProcessSample] = (), energy: float | None = 1000.0,
               migs: Sequence[MigSample] = (), health: Health = Health.OK, stale: bool = False) -> GpuSample:
    info = GpuInfo(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", name="NVIDIA H100",
                   serial=None, pci_bus_id=f"00000000:{index + 16:02X}:00.0", minor_number=index,
                   memory_total_bytes=80 * GIB, power_limit_watts=700.0, mig_enabled=bool(migs))
    return GpuSample(info=info, sampled_at_unix=WALL, health=health, stale=stale, processes=tuple(processes),
                     energy_joules_total=energy, migs=tuple(migs))


def proc(pid: int, workload: Workload | None, sm: float | None, memory: int = GIB,
         instance: int | None = None) -> ProcessSample:
    return ProcessSample(pid=pid, comm=f"p{pid}", kind="compute", used_memory_bytes=memory,
                         sm_util_percent=sm, memory_util_percent=None, gpu_instance_id=instance,
                         workload=workload)


def node(t: float, gpus: Sequence[GpuSample], pods: Sequence[PodUse] = (), *,
         kubelet: bool = True, interval: float = 1.0) -> NodeSnapshot:
    sources = (SourceStatus("pod_resources", True, 0.0),) if kubelet else ()
    return NodeSnapshot(hostname="node-1", backend="sim", taken_at_unix=WALL + t, taken_at_monotonic=t,
                        poll_duration_seconds=0.001, gpus=tuple(gpus), pods=tuple(pods), sources=sources,
                        poll_interval_seconds=interval)


def accountant(**settings: float) -> Accountant:
    return Accountant(AccountingSettings(**settings))


def test_energy_split_by_use_then_idle_remainder_by_allocation() -> None:
    a, b = pod_workload("ns", "a", "c"), pod_workload("ns", "b", "c")
    g = gpu_sample(0).info.uuid
    pods = [pod("ns", "a", "c", [g + "::0"]), pod("ns", "b", "c", [g + "::1"])]
    acct = accountant()
    procs = [proc(1, a, 60), proc(2, b, 0)]
    acct.update(node(0, [gpu_sample(0, processes=procs, energy=0.0)], pods, interval=10))
    state = acct.update(node(10, [gpu_sample(0, processes=procs, energy=1000.0)], pods, interval=10))
    by_name = {u.name: u for u in state.usage if u.level == "pod"}
    # 60 % of the energy follows use (all to a), the idle 40 % is split by what each holds (half each)
    assert by_name["a"].energy_joules_total == pytest.approx(600 + 200)
    assert by_name["b"].energy_joules_total == pytest.approx(200)
    assert by_name["a"].allocated_gpu_seconds_total == pytest.approx(5.0)
    assert by_name["b"].idle_allocated_gpu_seconds_total == pytest.approx(5.0)
    assert by_name["a"].idle_allocated_gpu_seconds_total == 0.0


def test_unnamed_processes_and_empty_gpus_leave_energy_unattributed() -> None:
    acct = accountant()
    acct.update(node(0, [gpu_sample(0, processes=[proc(1, None, 50)], energy=0.0), gpu_sample(1, energy=0.0)]))
    state = acct.update(node(2, [gpu_sample(0, processes=[proc(1, None, 50)], energy=100.0),
                                 gpu_sample(1, energy=40.0)]))
    assert state.usage == ()
    assert {g.gpu_index: g.energy_unattributed_joules_total for g in state.gpus} == {0: 100.0, 1: 40.0}


def test_energy_counter_absent_or_reset_splits_nothing() -> None:
    w = Workload(kind="slurm_job", name="job-7")
    acct = accountant()
    acct.update(node(0, [gpu_sample(0, processes=[proc(1, w, 50)], energy=None)], kubelet=False))
    state = acct.update(node(1, [gpu_sample(0, processes=[proc(1, w, 50)], energy=None)], kubelet=False))
    (u,) = state.usage
    assert u.energy_joules_total is None and u.allocated_gpu_seconds_total == pytest.approx(1.0)
    body = render(state_snapshot(state))
    assert "gpuagent_workload_gpu_energy_joules_total" not in body
    assert 'gpuagent_workload_gpu_busy_seconds_total{workload_kind="slurm_job",workload="job-7"' in body
    acct = accountant()
    acct.update(node(0, [gpu_sample(0, processes=[proc(1, w, 50)], energy=5000.0)], kubelet=False))
    acct.update(node(1, [gpu_sample(0, processes=[proc(1, w, 50)], energy=5300.0)], kubelet=False))
    state = acct.update(node(2, [gpu_sample(0, processes=[proc(1, w, 50)], energy=20.0)], kubelet=False))  # reset
    state = acct.update(node(3, [gpu_sample(0, processes=[proc(1, w, 50)], energy=320.0)], kubelet=False))
    (u,) = state.usage
    assert u.energy_joules_total == pytest.approx(600.0)  # 300 + 300, the backwards step counted nowhere


def test_mig_without_gpm_has_no_busy_and_is_never_flagged_idle() -> None:
    mig = MigSample(gpu_instance_id=1, compute_instance_id=0, uuid="MIG-aaaa", profile="3g.40gb",
                    slice_fraction=3 / 7, memory_total_bytes=40 * GIB, memory_used_bytes=GIB,
                    memory_free_bytes=39 * GIB, profiling=None)
    w = pod_workload("ns", "infer", "c")
    pods = [pod("ns", "infer", "c", ["MIG-aaaa"])]
    acct = accountant(idle_window_seconds=5.0)
    for t in range(0, 20):
        state = acct.update(node(t, [gpu_sample(0, processes=[proc(1, w, None, instance=1)], migs=[mig])], pods))
    u = next(u for u in state.usage if u.level == "pod")
    assert u.busy_gpu_seconds_total is None and u.efficiency_ratio is None
    assert u.allocated_gpu_seconds_total == pytest.approx(19 * 3 / 7)
    assert state.idle == () and u.idle_seconds == 0.0
    assert "gpuagent_pod_gpu_busy_seconds_total" not in render(state_snapshot(state))
    # with GPM, the instance's activity times its fraction
    busy_mig = replace(mig, profiling=ProfilingSample(graphics_active_ratio=0.5))
    acct = accountant()
    for t in range(0, 11):
        state = acct.update(node(t, [gpu_sample(0, processes=[proc(1, w, None, instance=1)], migs=[busy_mig])],
                                 pods))
    u = next(u for u in state.usage if u.level == "pod")
    assert u.busy_gpu_seconds_total == pytest.approx(10 * 0.5 * 3 / 7)
    assert u.efficiency_ratio == pytest.approx(0.5)


def test_allocation_rules_replicas_mig_and_legacy_ids() -> None:
    mig = MigSample(gpu_instance_id=2, compute_instance_id=0, uuid="MIG-bbbb", profile="1g.10gb",
                    slice_fraction=1 / 7, memory_total_bytes=10 * GIB, memory_used_bytes=0, memory_free_bytes=0)
    g0, g1 = gpu_sample(0), gpu_sample(1, migs=[mig])
    u0, u1 = g0.info.uuid, g1.info.uuid
    pods = [pod("ns", "r0", "c", [u0 + "::0"]), pod("ns", "r1", "c", [u0 + "::3"]),
            pod("ns", "r2", "c", [u0 + "::7"]), pod("ns", "m", "c", ["MIG-bbbb"]),
            pod("ns", "legacy", "c", [f"MIG-{u1}/2/0"]), pod("ns", "other", "c", ["GPU-not-on-this-node"])]
    allocations = pod_allocations(node(0, [g0, g1], pods))
    fractions = {(owner.name, uuid, gi): f for (owner, uuid, gi), f in allocations.items()}
    assert fractions == {("r0", u0, None): pytest.approx(1 / 3), ("r1", u0, None): pytest.approx(1 / 3),
                         ("r2", u0, None): pytest.approx(1 / 3), ("m", u1, 2): pytest.approx(1 / 7),
                         ("legacy", u1, 2): pytest.approx(1 / 7)}
    # allocations known: a pod's process on a GPU it was not allocated holds nothing there
    w = pod_workload("ns", "stray", "c")
    rates = poll_rates(node(0, [gpu_sample(0, processes=[proc(1, w, 20)])], pods))
    (rate,) = [r for (owner, _), r in rates[u0].units.items() if owner.name == "stray"]
    assert rate.allocated == 0.0 and rate.busy == pytest.approx(0.2)
    # no kubelet: the same process holds the GPU
    rates = poll_rates(node(0, [gpu_sample(0, processes=[proc(1, w, 20)])], kubelet=False))
    (rate,) = rates[u0].units.values()
    assert rate.allocated == 1.0


def test_counters_are_monotonic_and_ended_workloads_keep_them_for_the_retention_window() -> None:
    w = Workload(kind="docker", name="jupyter")
    acct = accountant(retention_seconds=30.0)
    totals = []
    for t in range(0, 10):
        state = acct.update(node(t, [gpu_sample(0, processes=[proc(1, w, 40)], energy=100.0 * t)], kubelet=False))
        totals.append(state.usage[0])
    for older, newer in itertools.pairwise(totals):
        for field in ("allocated_gpu_seconds_total", "busy_gpu_seconds_total", "memory_byte_seconds_total",
                      "energy_joules_total"):
            assert getattr(newer, field) >= getattr(older, field)
    last = totals[-1]
    for t in range(10, 41):  # gone from t=10: kept until 30 s after it was last seen (t=9)
        state = acct.update(node(t, [gpu_sample(0, energy=100.0 * t)], kubelet=False))
        if t - 9 <= 30:
            (kept,) = state.usage
            assert kept.ended_at_unix == pytest.approx(WALL + 9)
            assert kept.allocated_gpu_seconds_total == pytest.approx(last.allocated_gpu_seconds_total + 0.5)
            body = render(state_snapshot(state))
            assert "gpuagent_workload_gpu_allocated_seconds_total{" in body
            assert "gpuagent_workload_gpu_idle_seconds{" not in body  # gauges go with the workload
        else:
            assert state.usage == ()


def test_churn_of_a_thousand_short_workloads_leaves_no_series_behind() -> None:
    acct = accountant(retention_seconds=20.0)
    gpus = [gpu_sample(i) for i in range(4)]
    started, t, lifetime, concurrent = 0, 0.0, 3, 12
    live: dict[int, int] = {}  # workload number -> polls left
    most = 0
    while started < 1000 or live:
        while len(live) < concurrent and started < 1000:
            live[started] = lifetime
            started += 1
        processes: dict[int, list[ProcessSample]] = {i: [] for i in range(4)}
        pods = []
        for n in live:
            name = f"job-{n}"
            processes[n % 4].append(proc(10_000 + n, pod_workload("batch", name, "main"), 50 if n % 3 else 1))
            pods.append(pod("batch", name, "main", [gpus[n % 4].info.uuid + f"::{n}"]))
        snap = node(t, [replace(g, processes=tuple(processes[i]), energy_joules_total=300.0 * t)
                        for i, g in enumerate(gpus)], pods)
        state = acct.update(snap)
        most = max(most, len(acct.ledger))
        # bounded: live workloads plus those ended within the retention window, pod + container series each
        assert len(state.usage) <= 2 * concurrent * (1 + 20 // lifetime + 1)
        for n in list(live):
            live[n] -= 1
            if live[n] == 0:
                del live[n]
        t += 1.0
    busy_snapshot = replace(snap, accounting=state)
    assert "gpuagent_pod_gpu_allocated_seconds_total{" in render(busy_snapshot)
    for _ in range(25):  # past the retention window
        state = acct.update(node(t, [replace(g, energy_joules_total=300.0 * t) for g in gpus]))
        t += 1.0
    assert len(acct.ledger) == 0 and len(acct.idle) == 0 and state.usage == ()
    body = render(state_snapshot(state, gpus))
    for family in ("gpuagent_pod_gpu_", "gpuagent_container_gpu_", "gpuagent_workload_gpu_"):
        assert not [line for line in body.splitlines() if line.startswith(family)], family
    assert "gpuagent_accounting_series 0.0" in body
    assert 0 < most < 200


def test_state_lists_idle_workloads_first_and_small() -> None:
    w = pod_workload("ns", "notebook", "c")
    g = gpu_sample(0)
    pods = [pod("ns", "notebook", "c", [g.info.uuid], uid="1234-uid")]
    acct = accountant(idle_window_seconds=10.0)
    for t in range(0, 12):
        state = acct.update(node(t, [gpu_sample(0, processes=[proc(1, w, 1)])], pods))
    (idle,) = state.idle
    assert (idle.namespace, idle.name, idle.pod_uid, idle.gpu_index) == ("ns", "notebook", "1234-uid", 0)
    assert idle.idle_seconds == pytest.approx(11.0) and idle.idle_since_unix == pytest.approx(WALL)
    doc = to_jsonable(state_snapshot(state))["accounting"]
    assert next(iter(doc)) == "idle" and doc["idle"][0]["name"] == "notebook"


def test_gpu_seconds_today_count_from_midnight_utc_or_the_first_poll() -> None:
    """``allocated_gpu_seconds_today`` (what ``gpuagent top`` shows as GPU-hours today): from the agent's first
    poll on its first day, then from the first poll after 00:00 UTC; a series born today starts at 0."""
    early, late = pod_workload("ns", "early", "c"), pod_workload("ns", "late", "c")
    g = gpu_sample(0).info.uuid
    pods = [pod("ns", "early", "c", [g + "::0"]), pod("ns", "late", "c", [g + "::1"])]
    midnight = (WALL // 86400 + 1) * 86400 - WALL  # seconds from WALL to the next 00:00 UTC
    acct = accountant()

    def poll(t: float, *workloads: Workload) -> tuple[dict[str, WorkloadGpuUsage], float | None]:
        procs = [proc(i + 1, w, 50) for i, w in enumerate(workloads)]
        state = acct.update(node(t, [gpu_sample(0, processes=procs)], pods[:len(workloads)]))
        return {u.name: u for u in state.usage if u.level == "pod"}, state.day_started_at_unix

    first = midnight - 4
    for t in range(int(first), int(midnight)):  # 4 s before midnight: early alone holds the GPU
        usage, started = poll(t, early)
        assert started == WALL + first  # the agent's first day starts at its first poll
    assert usage["early"].allocated_gpu_seconds_today == pytest.approx(3.0)
    for t in range(int(midnight), int(midnight) + 5):  # from midnight on, late holds the other replica
        usage, started = poll(t, early, late)
    assert started == WALL + midnight
    # the interval across midnight went to yesterday (with the first poll of the day); since then 4 s of half
    # a GPU, out of a total of 3 + 0.75 (the interval across midnight, from 1 GPU to 1/2) + 2
    assert usage["early"].allocated_gpu_seconds_today == pytest.approx(4 * 0.5)
    assert usage["early"].allocated_gpu_seconds_total == pytest.approx(3 + 0.75 + 2)
    # late's first quarter GPU-second (the trapezoid of the interval across midnight) is yesterday's too
    assert usage["late"].allocated_gpu_seconds_today == pytest.approx(2.0)
    assert usage["late"].allocated_gpu_seconds_total == pytest.approx(2.25)
    doc = to_jsonable(state_snapshot(acct.update(node(midnight + 5, [gpu_sample(0)], pods))))["accounting"]
    assert doc["day_started_at_unix"] == WALL + midnight
    assert {u["name"] for u in doc["usage"] if u["allocated_gpu_seconds_today"] > 0} == {"early", "late"}


def state_snapshot(state: Any, gpus: Sequence[GpuSample] = ()) -> NodeSnapshot:
    return replace(node(0, gpus), accounting=state)


def render(snapshot: NodeSnapshot) -> str:
    return generate_text(build_registry(lambda: snapshot)).decode()


def test_bad_config_values_name_the_key() -> None:
    from gpuagent.config import ConfigError

    for key, value in (("idle_threshold", "1.5"), ("idle_window", "-1"), ("accounting_retention", "x"),
                       ("efficiency_window", "0"), ("idle_events", "sometimes")):
        with pytest.raises(ConfigError) as err:
            load_config(None, env={f"GPUAGENT_{key.upper()}": value})
        assert f"GPUAGENT_{key.upper()}" in str(err.value)
    config = load_config(None, env={})
    assert (config.accounting.retention, config.accounting.efficiency_window, config.accounting.idle_threshold, config.accounting.idle_window,
            config.accounting.idle_events) == (300.0, 3600.0, 0.05, 1800.0, "auto")


async def test_accounting_failure_costs_accounting_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    agent, _ = sim_agent(tmp_path, KNOWN_CURVES, clock)

    def broken(snapshot: NodeSnapshot) -> Any:
        raise RuntimeError("ledger bug")

    agent.accountant.update = broken  # type: ignore[method-assign]
    try:
        for _ in range(3):
            clock.advance(1.0)
            snap = await agent.poll_once()
    finally:
        await agent.devices.close()
    assert snap.accounting is None and snap.gpus
    assert sum("accounting failed" in r.message for r in caplog.records) == 1
    asyncio.get_running_loop()  # the poll went on; the loop is fine


def test_a_stale_or_lost_gpu_counts_its_time_as_a_gap_not_as_use() -> None:
    w = Workload(kind="slurm_job", name="job-9")
    acct = accountant()
    for t in range(0, 9):
        unusable = t in (4, 5)
        sample = gpu_sample(0, processes=[proc(1, w, 80)], energy=100.0 * t, stale=t == 4,
                            health=Health.LOST if t == 5 else Health.OK)
        state = acct.update(node(t, [sample], kubelet=False))
        if unusable:
            assert state.gpus[0].gap_seconds_total == t - 3
    (u,) = state.usage
    assert u.allocated_gpu_seconds_total == pytest.approx(3 + 2)  # 0-3 and 6-8; 3-6 was a gap
    assert u.busy_gpu_seconds_total == pytest.approx(0.8 * 5)
    assert u.energy_joules_total == pytest.approx(100.0 * 5)
    assert state.gpus[0].gap_seconds_total == pytest.approx(3.0)
    assert state.gpus[0].energy_joules_total == pytest.approx(100.0 * 5)
