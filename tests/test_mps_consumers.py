"""What the consumers make of an MPS GPU (hand-built snapshots): the server is infrastructure (no tenant, not
billed, never acted on), the clients' limits are exported, promised in hints, held in accounting, and not
fought by the enforcer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from simclock import FakeClock
from snapshots import GIB, two_gpu_node

from gpuagent.accounting.rates import Owner, poll_rates
from gpuagent.enforce.actions import Actions
from gpuagent.enforce.enforcer import Enforcer
from gpuagent.enforce.journal import Journal
from gpuagent.enforce.memory import LadderSettings, MemoryLadder
from gpuagent.enforce.rules import node_defaults
from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.hints.engine import HintsEngine
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import (
    MPS_CLIENT,
    MPS_SERVER,
    MpsLimits,
    ProcessSample,
    Workload,
    combined_mps_limits,
    sm_share_ratio,
)


def workload(pod: str, namespace: str = "ml") -> Workload:
    slice_uid = f"uid-{pod}".replace("-", "_")
    return Workload(kind="pod", name=pod, namespace=namespace, container="main", pod_uid=f"uid-{pod}",
                    names_from="pod_resources", cgroup=f"/kubepods.slice/kubepods-pod{slice_uid}.slice/x",
                    cgroup_v2=f"/kubepods.slice/kubepods-pod{slice_uid}.slice/x")


def client(pid: int, pod: str, memory: int, sm: float | None, threads: float | None = None,
           limit: int | None = None, known: bool = True) -> ProcessSample:
    return ProcessSample(pid, pod, MPS_CLIENT, memory, sm, 0.0, workload=workload(pod),
                         mps=MpsLimits(threads, limit) if known else None)


SERVER = ProcessSample(5, "nvidia-cuda-mps", MPS_SERVER, 40 << 20, 55.0, 0.0,
                       workload=workload("nvidia-device-plugin-mps-control-daemon", "kube-system"))


def mps_node(*clients: ProcessSample, allocated: bool = True) -> NodeSnapshot:
    """GPU 0 served by MPS: the server, the clients; each client pod holds a replica of GPU 0 (2 of them)."""
    snap = two_gpu_node()
    gpu0 = replace(snap.gpus[0], processes=(SERVER, *clients), gpu_util_percent=100.0,
                   memory_free_bytes=60 * GIB)
    uuid = gpu0.info.uuid
    names = sorted({p.workload.name for p in clients if p.workload is not None})
    pods = tuple(
        PodUse(name=name, namespace="ml", uid=f"uid-{name}", names_from="pod_resources",
               containers=(ContainerUse("main", allocated_devices=(f"{uuid}::{n}",) if allocated else ()),),
               allocated_gpus=(uuid,) if allocated else (), used_gpus=(uuid,))
        for n, name in enumerate(names)
    )
    sources = (SourceStatus("nvml", True, 0.0), SourceStatus("pod_resources", True, 0.0))
    return replace(snap, gpus=(gpu0, replace(snap.gpus[1], processes=())), pods=pods, sources=sources)


# -- the model ---------------------------------------------------------------------------------------------


def test_limits_add_up_per_client_and_one_unlimited_client_unlimits() -> None:
    a1, a2 = client(10, "a", GIB, 50.0, 30, 4 * GIB), client(11, "a", GIB, 50.0, 20, 2 * GIB)
    assert combined_mps_limits([a1, a2]) == MpsLimits(50.0, 6 * GIB)
    assert combined_mps_limits([a1, client(12, "a", GIB, 1.0, None, 2 * GIB)]) == MpsLimits(None, 6 * GIB)
    assert combined_mps_limits([a1, client(12, "a", GIB, 1.0, known=False)]) == MpsLimits(None, None)
    assert combined_mps_limits([a1, replace(a2, kind="compute")]) == MpsLimits(None, None)
    assert combined_mps_limits([replace(a1, kind="compute")]) is None
    assert combined_mps_limits([client(10, "a", 0, 0.0, 80), client(11, "a", 0, 0.0, 80)]).active_thread_percent == 100


def test_an_mps_client_s_share_of_the_sms_is_its_time_times_its_share_of_them() -> None:
    assert sm_share_ratio(client(10, "a", GIB, 100.0, 30)) == pytest.approx(0.30)
    assert sm_share_ratio(client(10, "a", GIB, 50.0)) == 0.5  # no cap: the whole GPU while it runs
    assert sm_share_ratio(client(10, "a", GIB, None, 30)) is None
    assert sm_share_ratio(ProcessSample(1, "x", "compute", GIB, 40.0, 0.0, mps=MpsLimits(10, None))) == 0.4


# -- export ------------------------------------------------------------------------------------------------


def test_exported_limits_and_the_server_as_infrastructure() -> None:
    snap = mps_node(client(10, "a", 10 * GIB, 80.0, 30, 12 * GIB), client(11, "a", 2 * GIB, 10.0, 20, 4 * GIB),
                    client(12, "b", 6 * GIB, 20.0))
    body = generate_text(build_registry(lambda: snap, clock=lambda: 0.0)).decode()
    gpu = f'gpu="0",UUID="{snap.gpus[0].info.uuid}",Hostname="{snap.hostname}"'
    lines = body.splitlines()
    assert f'gpuagent_pod_gpu_mps_active_thread_ratio{{namespace="ml",pod="a",{gpu}}} 0.5' in lines
    assert f'gpuagent_pod_gpu_mps_memory_limit_bytes{{namespace="ml",pod="a",{gpu}}} 1.7179869184e+10' in lines
    assert 'gpuagent_pod_gpu_mps_active_thread_ratio{namespace="ml",pod="b"' not in body  # not limited: absent
    assert ('gpuagent_process_mps_active_thread_ratio{' + gpu + ',pid="10",comm="a",'
            'kind="mps_client",namespace="ml",pod="a",container="main"} 0.3') in lines
    assert 'gpuagent_process_mps_memory_limit_bytes{' in body and 'pid="12",comm="b",kind="mps_client"' in body
    # the server: a process series of its kind, under the daemon's pod labels, and no pod use of it
    assert 'pid="5",comm="nvidia-cuda-mps",kind="mps_server",namespace="kube-system"' in body
    assert 'gpuagent_pod_gpu_memory_used_bytes{namespace="kube-system"' not in body
    assert f'gpuagent_gpu_tenants{{{gpu}}} 2.0' in lines


# -- hints ------------------------------------------------------------------------------------------------


def test_hints_promise_the_thread_shares_and_take_the_smaller_memory_limit() -> None:
    snap = mps_node(client(10, "a", 10 * GIB, 80.0, 30, 12 * GIB), client(11, "b", 4 * GIB, 40.0, 20),
                    client(12, "c", 6 * GIB, 25.0))
    pods = tuple(replace(p, annotations={"gpuagent.io/gpu-memory": "8Gi"}) if p.name == "a" else p for p in snap.pods)
    hints = HintsEngine().update(replace(snap, pods=pods))
    gpu = hints.gpus[0]
    assert gpu.sharing_mode == "mps"
    tenants = {t.name: t for t in gpu.tenants}
    assert set(tenants) == {"ml/a", "ml/b", "ml/c"}  # the server is no tenant
    assert tenants["ml/a"].mps_active_thread_ratio == pytest.approx(0.30)
    assert tenants["ml/a"].mps_memory_limit_bytes == 12 * GIB
    assert tenants["ml/a"].memory_limit_bytes == 8 * GIB  # the smaller: its gpu-memory annotation
    assert tenants["ml/b"].memory_limit_bytes is None and tenants["ml/b"].mps_memory_limit_bytes is None
    assert tenants["ml/a"].sm_util_ratio == pytest.approx(0.24)  # 80 % of the time on 30 % of the SMs
    # 1 - (0.30 + 0.20 promised by MPS + 0.25 taken now by c, whom MPS does not cap); the GPU's 100 %
    # time-based utilization says nothing of the SMs under MPS
    assert gpu.schedulable_share_ratio == pytest.approx(0.25)


# -- accounting --------------------------------------------------------------------------------------------


def test_accounting_holds_the_thread_share_not_one_replica_and_bills_no_server() -> None:
    snap = mps_node(client(10, "a", 10 * GIB, 80.0, 30), client(11, "b", 4 * GIB, 40.0))
    units = poll_rates(snap)[snap.gpus[0].info.uuid].units
    a = units[(Owner("pod", "ml", "a", "main"), None)]
    b = units[(Owner("pod", "ml", "b", "main"), None)]
    assert a.allocated == pytest.approx(0.30) and a.busy == pytest.approx(0.24)  # not 1/2 of the GPU
    assert b.allocated == pytest.approx(0.5) and b.busy == pytest.approx(0.40)  # no limit: its replica
    assert all(owner.namespace != "kube-system" for owner, _ in units)
    # off Kubernetes (no allocations known), a capped client holds its share, not the whole GPU
    off = replace(snap, pods=(), sources=(SourceStatus("nvml", True, 0.0),))
    units = poll_rates(off)[snap.gpus[0].info.uuid].units
    assert units[(Owner("pod", "ml", "a", "main"), None)].allocated == pytest.approx(0.30)
    assert units[(Owner("pod", "ml", "b", "main"), None)].allocated == 1.0


# -- enforcement --------------------------------------------------------------------------------------------


def enforcer(tmp_path: Path, clock: FakeClock, *, share: float | None = None, memory: str | None = None
             ) -> Enforcer:
    actions = Actions(mode="audit", journal=Journal(tmp_path / "journal.json"))
    return Enforcer(mode="audit", actions=actions, ladder=MemoryLadder(LadderSettings(term_after=0.0)),
                    defaults=node_defaults(share, memory), clock=clock)


def test_the_server_is_never_acted_on_and_mps_memory_limits_are_not_fought(tmp_path: Path) -> None:
    # every pod may use 8 GiB. a: two clients held by MPS to 3 + 4 GiB, using 9 GiB by NVML (their CUDA
    # contexts count there, not in the pinned limit): left to MPS. b: held to 12 GiB, above 8: the ladder acts.
    snap = mps_node(client(10, "a", 5 * GIB, 10.0, 50, 3 * GIB), client(11, "a", 4 * GIB, 10.0, 50, 4 * GIB),
                    client(12, "b", 10 * GIB, 10.0, 50, 12 * GIB))
    state = enforcer(tmp_path, FakeClock(start=1000.0), memory="8Gi").update(snap)
    stages = {m.pod: m for m in state.memory}
    assert "nvidia-device-plugin-mps-control-daemon" not in stages
    assert stages["b"].stage != "ok" and stages["b"].limit_bytes == 8 * GIB
    assert "a" not in stages or stages["a"].limit_bytes is None
    assert all(s.pod != "nvidia-device-plugin-mps-control-daemon" for s in state.shares)


def test_a_client_held_within_its_share_by_mps_is_not_throttled(tmp_path: Path) -> None:
    # both at 100 % of the time; a is held by MPS to 20 % of the SMs (share 30 %): within it. b runs
    # uncapped over its 30 %: the controller throttles b only.
    snap = mps_node(client(10, "a", GIB, 100.0, 20), client(11, "b", GIB, 100.0))
    clock = FakeClock(start=1000.0)
    engine = enforcer(tmp_path, clock, share=30.0)
    for _ in range(10):
        state = engine.update(snap)
        clock.advance(1.0)
    shares = {s.pod: s for s in state.shares}
    assert shares["a"].frozen_ratio == 0.0 and shares["a"].achieved_ratio == pytest.approx(0.2, abs=0.02)
    assert shares["b"].frozen_ratio > 0.3
