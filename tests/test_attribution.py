"""The join of GPU processes, cgroups and kubelet allocations (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.pods.attribution import PodName, attribute, match_pods
from gpuagent.snapshot import GpuInfo, GpuSample, MigSample, NodeSnapshot, ProcessSample, SourceStatus


@dataclass(frozen=True)
class Ident:
    pod_uid: str | None = None
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
        return None if self.device_id.startswith("MIG-") else self.device_id.split("::")[0]

    @property
    def mig_uuid(self) -> str | None:
        return self.device_id.split("::")[0] if self.device_id.startswith("MIG-") else None


def gpu(index: int, *pids: int, sm: float = 30.0, migs: tuple[MigSample, ...] = (), gi: int | None = None):
    info = GpuInfo(index=index, uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3", serial=None,
                   pci_bus_id=f"00000000:{index:02x}:00.0", minor_number=index, memory_total_bytes=80 << 30,
                   power_limit_watts=700.0, mig_enabled=bool(migs))
    processes = tuple(
        ProcessSample(pid=pid, comm=f"p{pid}", kind="compute", used_memory_bytes=1 << 30,
                      sm_util_percent=None if migs else sm, memory_util_percent=None, gpu_instance_id=gi)
        for pid in pids
    )
    return GpuSample(info=info, sampled_at_unix=0.0, processes=processes, migs=migs,
                     gpu_util_percent=None if migs else 50.0)


def workloads(gpus):
    return {p.pid: p.workload for g in gpus for p in g.processes}


def test_exclusive_gpus_are_named_through_their_allocations():
    gpus = [gpu(0, 10, 11), gpu(1, 20)]
    identities = {10: Ident("uid-a", "c" * 64), 11: Ident("uid-a", "c" * 64), 20: Ident("uid-b", "d" * 64)}
    allocations = [Alloc("ml", "train", "main", "GPU-0"), Alloc("web", "infer", "server", "GPU-1")]
    out, pods = attribute(gpus, identities, allocations)
    w = workloads(out)
    assert (w[10].namespace, w[10].name, w[10].container, w[10].names_from) == ("ml", "train", "main",
                                                                               "pod_resources")
    assert w[10].pod_uid == "uid-a" and w[10].container_id == "c" * 64 and w[10].qos == "burstable"
    assert (w[20].namespace, w[20].name, w[20].container) == ("web", "infer", "server")
    by_name = {p.name: p for p in pods}
    train = by_name["train"]
    assert train.uid == "uid-a" and train.allocated_gpus == ("GPU-0",) and train.used_gpus == ("GPU-0",)
    assert train.process_count == 2 and train.gpu_memory_used_bytes == 2 << 30 and train.sm_util_percent == 60
    assert train.containers[0].name == "main" and train.containers[0].allocated_devices == ("GPU-0",)
    assert train.unallocated_use == ()


def test_shared_gpu_is_resolved_by_elimination_through_another_gpu():
    # a and b share GPU-0 (time-slicing replicas); a also holds GPU-1 alone, which names a, leaving b.
    gpus = [gpu(0, 10, 20), gpu(1, 11)]
    identities = {10: Ident("uid-a"), 11: Ident("uid-a"), 20: Ident("uid-b")}
    allocations = [Alloc("ns", "a", "c", "GPU-0::0"), Alloc("ns", "a", "c", "GPU-1"),
                   Alloc("ns", "b", "c", "GPU-0::1")]
    out, _ = attribute(gpus, identities, allocations)
    w = workloads(out)
    assert (w[10].name, w[11].name, w[20].name) == ("a", "a", "b")


def test_ambiguous_sharing_keeps_uids_and_says_so():
    gpus = [gpu(0, 10, 20)]
    identities = {10: Ident("uid-a"), 20: Ident("uid-b")}
    allocations = [Alloc("ns", "a", "c", "GPU-0::0"), Alloc("ns", "b", "c", "GPU-0::1")]
    out, pods = attribute(gpus, identities, allocations)
    w = workloads(out)
    assert (w[10].name, w[10].namespace, w[10].names_from) == ("uid-a", None, "cgroup")
    names = {(p.namespace, p.name) for p in pods}
    assert names == {("ns", "a"), ("ns", "b"), (None, "uid-a"), (None, "uid-b")}


def test_a_pod_on_a_gpu_it_was_not_allocated_is_not_given_the_idle_owners_name():
    # uid-x runs on GPU-0 (allocated to idle pod "owner") and on GPU-1 (allocated to nobody).
    gpus = [gpu(0, 10), gpu(1, 11)]
    identities = {10: Ident("uid-x"), 11: Ident("uid-x")}
    out, pods = attribute(gpus, identities, [Alloc("ns", "owner", "c", "GPU-0")])
    assert workloads(out)[10].name == "uid-x"
    interloper = next(p for p in pods if p.name == "uid-x")
    assert interloper.unallocated_use == ("GPU-0", "GPU-1")
    owner = next(p for p in pods if p.name == "owner")
    assert owner.process_count == 0 and owner.allocated_gpus == ("GPU-0",)


def test_api_server_names_win_and_name_containers_by_id():
    gpus = [gpu(0, 10)]
    identities = {10: Ident("uid-a", "c" * 64)}
    names = {"uid-a": PodName("ml", "train-0", {"c" * 64: "trainer"})}
    out, _ = attribute(gpus, identities, [Alloc("other", "wrong", "x", "GPU-0")], names)
    w = workloads(out)[10]
    assert (w.namespace, w.name, w.container, w.names_from) == ("ml", "train-0", "trainer", "api_server")


def test_non_kubernetes_and_vanished_processes():
    gpus = [gpu(0, 10, 11, 12)]
    identities = {
        10: Ident(None, is_k8s=False, workload_kind="systemd_service", unit="ollama.service", path="/system.slice/ollama.service"),
        11: Ident(None, "e" * 64, is_k8s=False, workload_kind="docker", unit=None),
        12: None,
    }
    out, pods = attribute(gpus, identities, None)
    w = workloads(out)
    assert (w[10].kind, w[10].name, w[10].cgroup) == ("systemd_service", "ollama.service", "/system.slice/ollama.service")
    assert (w[11].kind, w[11].name) == ("docker", "e" * 12)
    assert w[12] is None and pods == ()


def test_mig_devices_match_their_instance_and_count_their_parent():
    migs = (MigSample(gpu_instance_id=1, compute_instance_id=0, uuid="MIG-aaa", profile="3g.40gb",
                      slice_fraction=3 / 7, memory_total_bytes=40 << 30, memory_used_bytes=1 << 30,
                      memory_free_bytes=39 << 30),
            MigSample(gpu_instance_id=2, compute_instance_id=0, uuid="MIG-bbb", profile="3g.40gb",
                      slice_fraction=3 / 7, memory_total_bytes=40 << 30, memory_used_bytes=0,
                      memory_free_bytes=40 << 30))
    g = gpu(0, 10, migs=migs, gi=1)
    g = GpuSample(**{**{f: getattr(g, f) for f in g.__slots__},  # attach the process to its instance too
                     "migs": (MigSample(**{**{f: getattr(migs[0], f) for f in migs[0].__slots__},
                                           "processes": g.processes}), migs[1])})
    allocations = [Alloc("ns", "a", "main", "MIG-aaa"), Alloc("ns", "b", "main", "MIG-bbb")]
    out, pods = attribute([g], {10: Ident("uid-a")}, allocations)
    assert workloads(out)[10].name == "a"
    assert out[0].migs[0].processes[0].workload.name == "a"
    a = next(p for p in pods if p.name == "a")
    assert a.allocated_gpus == ("GPU-0",) and a.sm_util_percent is None


def test_match_pods_needs_consistency_on_every_device():
    assert match_pods({"G0": {"u"}, "G1": {"u"}}, {"G0": {("n", "p")}, "G1": {("n", "p")}}) == {"u": ("n", "p")}
    assert match_pods({"G0": {"u"}, "G1": {"u"}}, {"G0": {("n", "p")}}) == {}


def test_exported_pod_labels_and_families():
    gpus = [gpu(0, 10), gpu(1, 20, 21)]
    identities = {10: Ident("uid-a", "c" * 64), 20: Ident("uid-b"), 21: Ident("uid-c")}
    allocations = [Alloc("ml", "train", "main", "GPU-0"), Alloc("ml", "b", "main", "GPU-1::0"),
                   Alloc("ml", "c", "main", "GPU-1::1")]
    out, pods = attribute(gpus, identities, allocations)
    snapshot = NodeSnapshot(hostname="n", backend="sim", taken_at_unix=0.0, taken_at_monotonic=0.0,
                            poll_duration_seconds=0.0, gpus=out, pods=pods,
                            sources=(SourceStatus("nvml", True, 0.0), SourceStatus("pod_resources", True, 0.0)))
    body = generate_text(build_registry(lambda: snapshot, clock=lambda: 0.0)).decode()
    # The exclusively allocated GPU carries dcgm-exporter's pod labels; the shared one carries none.
    assert ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",'
            'modelName="NVIDIA H100 80GB HBM3",Hostname="n",container="main",namespace="ml",pod="train"}') in body
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="n"}' in body
    assert 'gpuagent_gpu_tenants{gpu="1",UUID="GPU-1",Hostname="n"} 2.0' in body
    assert 'gpuagent_gpu_tenants{gpu="0",UUID="GPU-0",Hostname="n"} 1.0' in body
    assert 'gpuagent_pod_gpu_memory_used_bytes{namespace="ml",pod="train",gpu="0",UUID="GPU-0",Hostname="n"}' in body
    assert 'gpuagent_pod_gpu_sm_utilization_ratio{namespace="ml",pod="train",gpu="0",UUID="GPU-0",Hostname="n"} 0.3' in body
    assert 'gpuagent_container_gpu_memory_used_bytes{namespace="ml",pod="train",container="main",gpu="0"' in body
    assert 'gpuagent_pod_allocated_gpus{namespace="ml",pod="train"} 1.0' in body
    assert 'gpuagent_pod_gpu_allocated{namespace="ml",pod="b",container="main",device_id="GPU-1::0"} 1.0' in body
    assert 'names_from="pod_resources"' in body
    assert 'gpuagent_process_gpu_memory_used_bytes{gpu="0",UUID="GPU-0",Hostname="n",pid="10",comm="p10",kind="compute",namespace="ml",pod="train",container="main"}' in body
