"""The per-poll caches of attribution and accounting: what they keep between polls never changes a result.

Each test runs a sequence of polls through the cached path (one ``Attributor`` / ``RateReader`` / ``Ledger``
for all of them) and checks every poll against the plain computation from scratch, while the inputs the
caches key on change: the allocations, the API server's names, a process's identity, its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from gpuagent.accounting.ledger import CONTAINER, POD, Ledger
from gpuagent.accounting.rates import GpuRates, Owner, Rate, RateReader, poll_rates
from gpuagent.pods.attribution import Attributor, PodName, attribute
from gpuagent.snapshot.gpu import GpuInfo, GpuSample
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import ProcessSample, Workload


@dataclass(frozen=True)
class Ident:
    pod_uid: str | None
    container_id: str | None = None
    qos: str | None = "burstable"
    is_k8s: bool = True
    workload_kind: str = "pod"
    unit: str | None = None
    path: str = "/kubepods.slice/x"
    unified_path: str | None = "/kubepods.slice/x"
    freezer_path: str | None = None


@dataclass(frozen=True)
class Alloc:
    namespace: str
    pod: str
    container: str
    device_id: str

    @property
    def gpu_uuid(self) -> str | None:
        return self.device_id.split("::")[0]

    @property
    def mig_uuid(self) -> str | None:
        return None


def gpu(index: int, *pids: int, sm: float = 30.0) -> GpuSample:
    info = GpuInfo(index=index, uuid=f"GPU-{index}", name="NVIDIA H100", serial=None,
                   pci_bus_id=f"00000000:{index:02x}:00.0", minor_number=index, memory_total_bytes=80 << 30,
                   power_limit_watts=700.0, mig_enabled=False)
    processes = tuple(ProcessSample(pid=pid, comm=f"p{pid}", kind="compute", used_memory_bytes=1 << 30,
                                    sm_util_percent=sm, memory_util_percent=None) for pid in pids)
    return GpuSample(info=info, sampled_at_unix=0.0, processes=processes, energy_joules_total=100.0)


def test_attributor_matches_attribute_while_every_input_changes() -> None:
    identities = {10: Ident("uid-a", "c" * 64), 11: Ident("uid-b"), 20: Ident(None, is_k8s=False,
                                                                           workload_kind="systemd_service",
                                                                           unit="train.service")}
    allocations = [Alloc("ns", "a", "main", "GPU-0::0"), Alloc("ns", "b", "main", "GPU-0::1")]
    names = {"uid-a": PodName("ns", "a", {"c" * 64: "main"}, {"gpuagent.io/gpu-share": "50%"})}
    polls = [
        ([gpu(0, 10, 11), gpu(1, 20)], identities, allocations, names),
        ([gpu(0, 10, 11), gpu(1, 20)], identities, allocations, names),  # nothing changed
        ([gpu(0, 10, 11, sm=70.0), gpu(1, 20)], identities, allocations, names),  # figures
        ([gpu(0, 10, 11), gpu(1, 20)], identities, [*allocations[:1], Alloc("ns", "c", "x", "GPU-1")], names),
        ([gpu(0, 10, 11), gpu(1, 20)], {**identities, 10: Ident("uid-a", "d" * 64)}, allocations, names),
        ([gpu(0, 10, 11), gpu(1, 20)], identities, allocations,
         {**names, "uid-b": PodName("ns", "b", {}, {}, qos="guaranteed")}),
        ([gpu(0, 10), gpu(1, 11, 20)], identities, allocations, None),  # a process moved; names gone
        ([gpu(0, 10), gpu(1, 11, 20)], identities, allocations, None),  # idle: matched through the GPUs
    ]
    cached = Attributor()
    for index, (gpus, ids, allocs, by_uid) in enumerate(polls):
        assert cached.attribute(gpus, ids, allocs, by_uid) == attribute(gpus, ids, allocs, by_uid), index


def test_attributor_reuses_what_did_not_change_and_rebuilds_what_did() -> None:
    identities = {10: Ident("uid-a"), 11: Ident("uid-b")}
    allocations = (Alloc("ns", "a", "main", "GPU-0"), Alloc("ns", "b", "main", "GPU-1"))
    cached = Attributor()
    first_gpus, first_pods = cached.attribute([gpu(0, 10), gpu(1, 11)], identities, allocations)
    gpus, pods = cached.attribute([gpu(0, 10), gpu(1, 11, sm=80.0)], identities, allocations)
    assert gpus[0].processes[0].workload is first_gpus[0].processes[0].workload
    assert pods[0] is first_pods[0]  # pod a: same allocation, same figures
    assert pods[1] is not first_pods[1] and pods[1].sm_util_percent == 80.0
    # the kubelet gives pod a's GPU to pod c: a new allocations object rebuilds the index
    moved = (Alloc("ns", "c", "main", "GPU-0"), Alloc("ns", "b", "main", "GPU-1"))
    _, pods = cached.attribute([gpu(0, 10), gpu(1, 11)], identities, moved)
    assert pods == attribute([gpu(0, 10), gpu(1, 11)], identities, moved)[1]
    assert [(p.name, p.allocated_gpus, p.process_count) for p in pods] == [("b", ("GPU-1",), 1),
                                                                           ("c", ("GPU-0",), 1)]
    # a process's cgroup read again (a new identity object) with another pod UID: a new workload
    gpus, _ = cached.attribute([gpu(0, 10), gpu(1, 11)], {**identities, 10: Ident("uid-z")}, moved)
    assert gpus[0].processes[0].workload is not None
    assert gpus[0].processes[0].workload.pod_uid == "uid-z"


def test_attributor_passes_a_pods_annotations_on_while_its_names_are_the_same() -> None:
    """A pod rebuilt for new figures keeps the annotations object of its last PodUse (consumers key their
    limits on it) while the API server's names are the same; new names give a new one."""
    identities = {10: Ident("uid-a")}
    allocations = (Alloc("ns", "a", "main", "GPU-0"),)
    names = {"uid-a": PodName("ns", "a", {}, {"gpuagent.io/gpu-share": "30%"})}
    cached = Attributor()
    _, (first,) = cached.attribute([gpu(0, 10, sm=10.0)], identities, allocations, names)
    _, (second,) = cached.attribute([gpu(0, 10, sm=20.0)], identities, allocations, names)
    assert second is not first and second.sm_util_percent == 20.0
    assert second.annotations is first.annotations
    renamed = {"uid-a": PodName("ns", "a", {}, {"gpuagent.io/gpu-share": "40%"})}
    _, (third,) = cached.attribute([gpu(0, 10, sm=30.0)], identities, allocations, renamed)
    assert third.annotations == {"gpuagent.io/gpu-share": "40%"} and third.annotations is not first.annotations
    assert (third,) == attribute([gpu(0, 10, sm=30.0)], identities, allocations, renamed)[1]


def node(t: float, gpus: list[GpuSample], pods: list[PodUse]) -> NodeSnapshot:
    return NodeSnapshot(hostname="n", backend="sim", taken_at_unix=1e9 + t, taken_at_monotonic=t,
                        poll_duration_seconds=0.001, gpus=tuple(gpus), pods=tuple(pods),
                        sources=(SourceStatus("pod_resources", True, 0.0),), poll_interval_seconds=1.0)


def holder(name: str, *devices: str) -> PodUse:
    return PodUse(name=name, namespace="ns", containers=(ContainerUse("main", allocated_devices=devices),))


def test_rate_reader_follows_changed_allocations() -> None:
    snapshots = [
        node(0, [gpu(0), gpu(1)], [holder("a", "GPU-0::0"), holder("b", "GPU-0::1")]),
        node(1, [gpu(0), gpu(1)], [holder("a", "GPU-0::0"), holder("b", "GPU-0::1")]),
        node(2, [gpu(0), gpu(1)], [holder("a", "GPU-0::0"), holder("b", "GPU-1")]),  # b moved
        node(3, [gpu(0), gpu(1)], [holder("a", "GPU-0::0")]),  # b ended
        node(4, [gpu(0)], [holder("a", "GPU-0::0"), holder("b", "GPU-1")]),  # GPU 1 gone
        replace(node(5, [gpu(0), gpu(1)], [holder("a", "GPU-0")]), sources=()),  # kubelet silent, pods carry
        replace(node(6, [gpu(0), gpu(1)], []), sources=()),  # nothing known: processes count
    ]
    reader = RateReader()
    for snapshot in snapshots:
        assert reader.read(snapshot) == poll_rates(snapshot), snapshot.taken_at_monotonic


def test_rate_reader_follows_each_process_workload_from_poll_to_poll() -> None:
    """Each process's owner is kept while its Workload is the same object: a new one (renamed, another
    container, gone) is read afresh, the same one shared by two GPUs is read once."""
    def named(g: GpuSample, *workloads: Workload | None) -> GpuSample:
        return replace(g, processes=tuple(replace(p, workload=w)
                                          for p, w in zip(g.processes, workloads, strict=True)))

    main = Workload(kind="pod", name="a", namespace="ns", container="main")
    service = Workload(kind="systemd_service", name="train.service")
    polls = [
        [named(gpu(0, 10, 11), main, service), named(gpu(1, 12), main)],
        [named(gpu(0, 10, 11), main, service), named(gpu(1, 12), main)],  # the same objects
        [named(gpu(0, 10, 11), replace(main, container="side"), service), named(gpu(1, 12), main)],
        [named(gpu(0, 10, 11), replace(main, name="b"), None), named(gpu(1, 12), None)],
        [named(gpu(0, 10, 11), main, service), named(gpu(1, 12), main)],  # back: the old objects again
    ]
    reader = RateReader()
    for t, gpus in enumerate(polls):
        snapshot = replace(node(t, gpus, []), sources=())
        assert reader.read(snapshot) == poll_rates(snapshot), t


def test_ledger_sums_a_pods_containers_without_touching_the_rates() -> None:
    """A pod's series sums its containers; the rates read (kept as the previous poll's) stay as they were."""
    ledger = Ledger()
    c1, c2 = Owner("pod", "ns", "p", "c1"), Owner("pod", "ns", "p", "c2")

    def rates(t: float) -> dict[str, GpuRates]:
        units = {(c1, None): Rate(0.5, 0.25, 10.0), (c2, None): Rate(0.5, 0.5, 20.0)}
        return {"GPU-0": GpuRates("GPU-0", 0, True, 100.0 + 700 * t, power_watts=700.0, units=units)}

    for t in range(4):
        current = rates(t)
        ledger.update(current, float(t), 1.0)
        assert current == rates(t)
    by_level = {(k.level, k.container): s for k, s in ledger}
    pod, first, second = by_level[(POD, None)], by_level[(CONTAINER, "c1")], by_level[(CONTAINER, "c2")]
    assert pod.allocated_now == 1.0 and pod.busy_now == 0.75
    assert (first.allocated_now, second.busy_now) == (0.5, 0.5)
    assert pod.allocated_gpu_seconds == pytest.approx(3.0)
    assert pod.busy_gpu_seconds == pytest.approx(first.busy_gpu_seconds + second.busy_gpu_seconds)
    assert pod.energy_joules == pytest.approx(first.energy_joules + second.energy_joules)
