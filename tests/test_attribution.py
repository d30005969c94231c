"""The join of GPU processes, cgroups and kubelet allocations (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.pods.attribution import PodName, attribute
from gpuagent.pods.matching import match_pods
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, MigSample
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.processes import ProcessSample


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


def test_without_evidence_a_uid_also_on_another_pods_gpu_is_not_given_either_name():
    # uid-x runs on GPU-0 (allocated to idle pod "owner") and on GPU-1 (allocated to idle pod "other").
    gpus = [gpu(0, 10), gpu(1, 11)]
    identities = {10: Ident("uid-x"), 11: Ident("uid-x")}
    out, pods = attribute(gpus, identities, [Alloc("ns", "owner", "c", "GPU-0"), Alloc("ns", "other", "c", "GPU-1")])
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
    # G1 allocated to nobody: u is p straying onto a free GPU; allocated to another pod: u is neither
    assert match_pods({"G0": {"u"}, "G1": {"u"}}, {"G0": {("n", "p")}}) == {"u": ("n", "p")}
    assert match_pods({"G0": {"u"}, "G1": {"u"}}, {"G0": {("n", "p")}, "G1": {("n", "q")}}) == {}


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


# -- a pod that strays, pods that share, and the evidence of their environments -------------------------------
# The case: a pod allocated GPU 1 whose process also runs on GPU 7, which nobody was allocated.
# The devices alone cannot tell it from an unallocated pod running on an idle pod's GPU; the processes'
# environments can (HOSTNAME, the devices the device plugin gave them).


def env(hostname: str | None = None, devices: str | None = None) -> dict[str, str]:
    out = {}
    if hostname is not None:
        out["HOSTNAME"] = hostname
    if devices is not None:
        out["NVIDIA_VISIBLE_DEVICES"] = devices
    return out


STRAY_GPUS = [gpu(1, 10), gpu(7, 11)]
STRAY_IDS = {10: Ident("uid-a", "a" * 64), 11: Ident("uid-a", "a" * 64)}
STRAY_ALLOC = [Alloc("ml", "trainer-0", "main", "GPU-1")]


@pytest.mark.parametrize("environ", [
    env(hostname="trainer-0"),  # the runtime's HOSTNAME is the pod's name
    env(devices="GPU-1"),  # the device plugin gave it GPU 1 (privileged: it also sees GPU 7)
    env(hostname="trainer-0", devices="all"),  # NVIDIA_VISIBLE_DEVICES=all: the hostname still tells
])
def test_a_pod_straying_onto_an_unallocated_gpu_keeps_its_name(environ: dict[str, str]) -> None:
    out, pods = attribute(STRAY_GPUS, STRAY_IDS, STRAY_ALLOC, environs={10: environ, 11: environ})
    w = workloads(out)
    for pid in (10, 11):
        assert (w[pid].namespace, w[pid].name, w[pid].names_from) == ("ml", "trainer-0", "pod_resources")
    assert w[10].container == "main"
    trainer = next(p for p in pods if p.name == "trainer-0")
    assert trainer.uid == "uid-a" and trainer.allocated_gpus == ("GPU-1",)
    assert trainer.used_gpus == ("GPU-1", "GPU-7") and trainer.unallocated_use == ("GPU-7",)
    assert trainer.process_count == 2 and trainer.gpu_memory_used_bytes == 2 << 30
    assert {p.name for p in pods} == {"trainer-0"}  # no UID-named shadow of it


def test_without_evidence_a_pod_straying_onto_a_free_gpu_is_named_by_its_devices() -> None:
    # No environment readable (no CAP_SYS_PTRACE): GPU 7 is allocated to nobody, so the likelier reading wins.
    out, pods = attribute(STRAY_GPUS, STRAY_IDS, STRAY_ALLOC, environs={10: {}, 11: None})
    w = workloads(out)
    assert [(w[p].name, w[p].names_from) for p in (10, 11)] == [("trainer-0", "pod_resources")] * 2
    (trainer,) = pods
    assert trainer.name == "trainer-0" and trainer.unallocated_use == ("GPU-7",)


@pytest.mark.parametrize("environ", [
    env(hostname="squatter-0"),  # another pod's hostname
    env(hostname="squatter-0", devices="all"),
    env(devices="GPU-5"),  # given a device the idle pod was not allocated
])
def test_an_unallocated_pod_alone_on_an_idle_pods_gpu_does_not_take_its_name(environ: dict[str, str]) -> None:
    # uid-x runs only on GPU 0, allocated to the idle pod "owner": by devices alone it would be named owner
    gpus = [gpu(0, 10), gpu(5)]
    out, pods = attribute(gpus, {10: Ident("uid-x")}, [Alloc("ns", "owner", "c", "GPU-0")], environs={10: environ})
    assert workloads(out)[10].name == "uid-x" and workloads(out)[10].names_from == "cgroup"
    owner = next(p for p in pods if p.name == "owner")
    assert owner.process_count == 0 and owner.used_gpus == ()


def test_an_interloper_on_an_idle_pods_gpu_and_a_free_gpu_stays_unnamed_with_its_hostname() -> None:
    gpus = [gpu(0, 10), gpu(1, 11)]
    identities = {10: Ident("uid-x"), 11: Ident("uid-x")}
    out, _ = attribute(gpus, identities, [Alloc("ns", "owner", "c", "GPU-0")],
                       environs={10: env(hostname="squatter-0"), 11: env(hostname="squatter-0")})
    assert workloads(out)[10].name == "uid-x"


@pytest.mark.parametrize("hostname", ["gpu-node-1", "trainer"])
def test_hostnames_that_do_not_contradict(hostname: str) -> None:
    """A hostNetwork pod reads the node's name; an indexed Job's pod ``trainer-0-x7k2p`` reads ``trainer-0``
    (here ``trainer``, a prefix of the pod's name): neither is evidence against the devices."""
    gpus = [gpu(0, 10)]
    out, _ = attribute(gpus, {10: Ident("uid-a")}, [Alloc("ml", "trainer-0-x7k2p", "main", "GPU-0")],
                       environs={10: env(hostname=hostname)}, node_names=frozenset({"gpu-node-1"}))
    assert workloads(out)[10].name == "trainer-0-x7k2p"


def test_a_long_pod_name_is_matched_by_the_hostname_the_kubelet_cuts_it_to() -> None:
    name = "inference-server-" + "a" * 50 + "-b.c"  # 70 characters: its hostname is the first 63, less "-."
    hostname = name[:63].rstrip("-.")
    gpus = [gpu(0, 10), gpu(1, 11)]
    out, _ = attribute(gpus, {10: Ident("uid-a"), 11: Ident("uid-a")}, [Alloc("ns", name, "c", "GPU-0")],
                       environs={10: env(hostname=hostname), 11: env(hostname=hostname)})
    assert workloads(out)[11].name == name


def test_time_sliced_pods_are_told_apart_by_their_hostnames() -> None:
    gpus = [gpu(0, 10, 20)]
    identities = {10: Ident("uid-a"), 20: Ident("uid-b")}
    allocations = [Alloc("ns", "a", "c", "GPU-0::0"), Alloc("ns", "b", "c", "GPU-0::1")]
    environs = {10: env(hostname="a", devices="GPU-0"), 20: env(hostname="b", devices="GPU-0")}
    out, pods = attribute(gpus, identities, allocations, environs=environs)
    w = workloads(out)
    assert (w[10].name, w[20].name) == ("a", "b") and w[10].names_from == "pod_resources"
    assert {p.name for p in pods} == {"a", "b"}
    # the devices alone say both could be either: no name
    out, _ = attribute(gpus, identities, allocations, environs={10: env(devices="GPU-0"), 20: env(devices="GPU-0")})
    assert {workloads(out)[10].name, workloads(out)[20].name} == {"uid-a", "uid-b"}


def test_a_time_sliced_replica_pod_straying_onto_a_free_gpu() -> None:
    # a holds replica 0 of GPU 0 and also runs on GPU 2 (nobody's); b holds replica 1 and runs where it should
    gpus = [gpu(0, 10, 20), gpu(2, 11)]
    identities = {10: Ident("uid-a"), 11: Ident("uid-a"), 20: Ident("uid-b")}
    allocations = [Alloc("ns", "a", "c", "GPU-0::0"), Alloc("ns", "b", "c", "GPU-0::1")]
    environs = {10: env(hostname="a"), 11: env(hostname="a"), 20: env(hostname="b")}
    out, pods = attribute(gpus, identities, allocations, environs=environs)
    w = workloads(out)
    assert (w[10].name, w[11].name, w[20].name) == ("a", "a", "b")
    assert next(p for p in pods if p.name == "a").unallocated_use == ("GPU-2",)
    assert next(p for p in pods if p.name == "b").unallocated_use == ()


def mig_gpu(index: int, placements: dict[int, tuple[int, ...]], loose: tuple[int, ...] = ()) -> GpuSample:
    """A MIG-enabled GPU: instance ID -> PIDs running in it."""
    procs = {gi: tuple(ProcessSample(pid=pid, comm=f"p{pid}", kind="compute", used_memory_bytes=1 << 30,
                                     sm_util_percent=None, memory_util_percent=None, gpu_instance_id=gi)
                       for pid in pids) for gi, pids in placements.items()}
    migs = tuple(MigSample(gpu_instance_id=gi, compute_instance_id=0, uuid=f"MIG-{index}-{gi}", profile="3g.40gb",
                           slice_fraction=3 / 7, memory_total_bytes=40 << 30, memory_used_bytes=0,
                           memory_free_bytes=40 << 30, processes=procs[gi]) for gi in placements)
    g = gpu(index, migs=migs)
    return GpuSample(**{**{f: getattr(g, f) for f in g.__slots__},
                        "processes": tuple(p for gi in placements for p in procs[gi])})


def test_a_pod_straying_from_its_mig_device_onto_another_instance() -> None:
    # a holds MIG-0-1 and also runs in MIG-0-2, which nobody holds; b holds GPU 1 whole and runs there
    gpus = [mig_gpu(0, {1: (10,), 2: (11,)}), gpu(1, 20)]
    identities = {10: Ident("uid-a"), 11: Ident("uid-a"), 20: Ident("uid-b")}
    allocations = [Alloc("ns", "a", "c", "MIG-0-1"), Alloc("ns", "b", "c", "GPU-1")]
    out, pods = attribute(gpus, identities, allocations,
                          environs={10: env(devices="MIG-0-1"), 11: env(devices="MIG-0-1"), 20: {}})
    w = workloads(out)
    assert (w[10].name, w[11].name, w[20].name) == ("a", "a", "b")
    assert out[0].migs[1].processes[0].workload.name == "a"
    a = next(p for p in pods if p.name == "a")
    assert a.allocated_gpus == ("GPU-0",) and a.unallocated_use == ()  # MIG-0-2 is on the GPU it holds a slice of
    # without evidence the devices tell the same: the instance a strays into is held by nobody
    out, _ = attribute(gpus, identities, allocations)
    assert workloads(out)[10].name == "a" and workloads(out)[20].name == "b"
    # ... but an instance held by another pod leaves it unnamed
    out, _ = attribute(gpus, identities, [*allocations, Alloc("ns", "idle", "c", "MIG-0-2")])
    assert workloads(out)[10].name == "uid-a" and workloads(out)[20].name == "b"


def test_an_interloper_in_an_idle_pods_mig_device_is_not_given_its_name() -> None:
    gpus = [mig_gpu(0, {1: (10,), 2: ()})]
    out, _ = attribute(gpus, {10: Ident("uid-x")}, [Alloc("ns", "owner", "c", "MIG-0-1")],
                       environs={10: env(hostname="squatter", devices="MIG-0-2")})
    assert workloads(out)[10].name == "uid-x"


def test_the_mps_server_is_no_pods_tenant_and_does_not_crowd_the_join() -> None:
    # the MPS server runs in the device plugin's pod (uid-d); client pod a holds GPU 0 whole
    server = ProcessSample(pid=5, comm="nvidia-cuda-mps", kind="mps_server", used_memory_bytes=40 << 20,
                           sm_util_percent=0.0, memory_util_percent=0.0)
    g = gpu(0, 10)
    g = GpuSample(**{**{f: getattr(g, f) for f in g.__slots__}, "processes": (server, *g.processes)})
    out, pods = attribute([g], {5: Ident("uid-d"), 10: Ident("uid-a")}, [Alloc("ns", "a", "c", "GPU-0")])
    w = workloads(out)
    assert w[10].name == "a" and w[5].name == "uid-d"  # the server keeps its own labels
    assert {p.name for p in pods} == {"a"}  # and joins no pod's use
