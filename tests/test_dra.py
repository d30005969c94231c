"""DRA devices to GPUs: CDI spec files, the MIG capability table, ResourceSlices from the (fake) API server,
and the mapping that joins them."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from fake_apiserver import (
    NODE,
    FakeApiServer,
    eventually,
    gpu_device,
    make_slice,
    metadata_runner,
    mig_device,
)

from gpuagent.pods.dra.cdi import CdiIndex, CdiSpecError, CdiSpecs, parse_spec
from gpuagent.pods.dra.mapper import MAPPED_BY_CDI, MAPPED_BY_SLICE, Places, cap_minors, map_devices
from gpuagent.pods.dra.nvcaps import MigCapability, MigMinors, parse_mig_minors
from gpuagent.pods.dra.slices import ResourceSlices, SliceDevice
from gpuagent.pods.podresources import DynamicAllocation
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, MigSample

FIXTURES = Path(__file__).parent / "fixtures" / "cdi"
GPU_CLAIM = "6f0e9a52-6f4b-4a8e-9d3e-2b1c0a9f8e7d"
MIG_CLAIM = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
GPU_CDI = f"k8s.gpu.nvidia.com/claim={GPU_CLAIM}-gpu-3"
MIG_CDI = f"k8s.gpu.nvidia.com/claim={MIG_CLAIM}-gpu-0-mig-9-4-2"
UUIDS = [f"GPU-{i}0000000-1111-4222-8333-44445555666{i}" for i in range(4)]
MIG_UUID = "MIG-9a8b7c6d-5e4f-5a3b-8c2d-1e0f9a8b7c6d"
VENDOR_B_UUID = "GPU-4b6e2a17-90cd-4f3e-a8b1-2c3d4e5f6a7b"


def gpu(index: int, uuid: str | None = None, *, migs: tuple[MigSample, ...] = ()) -> GpuSample:
    info = GpuInfo(index=index, uuid=uuid or UUIDS[index], name="NVIDIA H100 80GB HBM3", serial=None,
                   pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", minor_number=index, memory_total_bytes=None,
                   power_limit_watts=None, mig_enabled=bool(migs))
    return GpuSample(info=info, sampled_at_unix=0.0, migs=migs)


def mig(gi: int, uuid: str = MIG_UUID, ci: int | None = 0) -> MigSample:
    return MigSample(gpu_instance_id=gi, compute_instance_id=ci, uuid=uuid, profile="3g.40gb",
                     slice_fraction=3 / 7, memory_total_bytes=None, memory_used_bytes=None, memory_free_bytes=None)


NODE_GPUS = (gpu(0, migs=(mig(1, "MIG-11111111-2222-5333-8444-555566667777"), mig(2))), gpu(1), gpu(2), gpu(3))


def dra(device: str, *cdi: str, pod: str = "train", container: str = "main", claim: str = "gpu",
        namespace: str = "ml", pool: str = NODE, driver: str = "gpu.nvidia.com",
        share_id: str | None = None) -> DynamicAllocation:
    return DynamicAllocation(namespace, pod, container, namespace, claim, driver, pool, device, cdi, share_id)


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    """The fixture specs in a /var/run/cdi-like directory of their own (the tests change it)."""
    directory = tmp_path / "run-cdi"
    directory.mkdir()
    for path in FIXTURES.iterdir():
        if path.suffix in (".yaml", ".json"):
            shutil.copy(path, directory / path.name)
    return directory


def caps_table() -> dict[int, MigCapability]:
    return parse_mig_minors((FIXTURES / "mig-minors").read_text())


# -- CDI specs ------------------------------------------------------------------------------------------------
def test_the_nvidia_claim_spec_gives_its_devices_nodes_only() -> None:
    path = FIXTURES / f"k8s.gpu.nvidia.com-claim_{GPU_CLAIM}.yaml"
    (device,) = parse_spec(path.read_text(), str(path))
    assert device.name == GPU_CDI and device.device_nodes == ("/dev/nvidia3",)
    assert device.visible_devices == ()  # NVIDIA_VISIBLE_DEVICES=void is a spec-wide edit: not the device's


def test_a_json_spec_and_visible_devices() -> None:
    path = FIXTURES / "vendor-b-gpu.json"
    (device,) = parse_spec(path.read_text(), str(path))
    assert device.name == "vendor-b.example.com/gpu=gpu1" and device.visible_devices == (VENDOR_B_UUID,)


def test_a_host_path_counts_as_a_node_too() -> None:
    text = ("cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: x-gpu-1\n  containerEdits:\n"
            "    deviceNodes:\n    - {path: /dev/nvidia1, hostPath: /run/nvidia/driver/dev/nvidia1}\n")
    (device,) = parse_spec(text, "/x.yaml")
    assert device.device_nodes == ("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1")


@pytest.mark.parametrize(("text", "suffix", "message"), [
    ("{not json", ".json", "not JSON"),
    ("kind: [unclosed", ".yaml", "not YAML"),
    ("- a list", ".yaml", "expected a mapping (cdiVersion, kind, devices), got a list"),
    ("kind: nvidia\ndevices: []", ".yaml", "kind: expected <vendor>/<class>"),
    ("kind: a.com/b\ndevices: {x: 1}", ".yaml", "devices: expected a list, got a mapping"),
    ("kind: a.com/b\ndevices: [{name: '../etc'}]", ".yaml", "devices[0].name: expected a device name"),
    ("kind: a.com/b\ndevices: [{name: g, containerEdits: {deviceNodes: [{path: dev/x}]}}]", ".yaml",
     "devices[0].containerEdits.deviceNodes[0]: expected a mapping with an absolute path"),
    ("kind: a.com/b\ndevices: [{name: g, containerEdits: {deviceNodes: /dev/nvidia0}}]", ".yaml",
     "devices[0].containerEdits.deviceNodes: expected a list"),
    ("kind: a.com/b\ndevices: [{name: g, containerEdits: {env: [3]}}]", ".yaml",
     "devices[0].containerEdits.env[0]: expected a NAME=VALUE string, got 3"),
    ("kind: a.com/b\ndevices: []\ncontainerEdits: [1]", ".yaml", "containerEdits: expected a mapping"),
])
def test_a_malformed_spec_says_what_and_where(text: str, suffix: str, message: str) -> None:
    with pytest.raises(CdiSpecError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_spec(text, "/etc/cdi/bad" + suffix)


def test_refresh_indexes_every_spec_and_names_the_broken_ones(spec_dir: Path, tmp_path: Path) -> None:
    (spec_dir / "broken.yaml").write_text("kind: k8s.gpu.nvidia.com/claim\ndevices: [{name: x, containerEdits: 7}]")
    (spec_dir / "notes.txt").write_text("not a spec: ignored")
    specs = CdiSpecs([str(tmp_path / "etc-cdi-missing"), str(spec_dir)])
    index = specs.refresh()
    assert set(index.devices) == {GPU_CDI, MIG_CDI, "vendor-b.example.com/gpu=gpu1"}
    assert index.errors == (f"{spec_dir}/broken.yaml: devices[0].containerEdits: expected a mapping, got 7",)
    assert index.dirs_found == 1  # a missing directory is no error (no driver has written one there)


def test_refresh_reads_only_what_changed(spec_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = CdiSpecs([str(spec_dir)])
    first = specs.refresh()
    reads: list[str] = []
    real_read = CdiSpecs._read
    monkeypatch.setattr(CdiSpecs, "_read", lambda self, path, size: reads.append(path) or real_read(self, path, size))
    assert specs.refresh() is first and reads == []  # nothing changed: the same index, no file opened
    new = spec_dir / "k8s.gpu.nvidia.com-claim_new.yaml"
    new.write_text("kind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: new-gpu-2\n  containerEdits:\n"
                   "    deviceNodes: [{path: /dev/nvidia2}]\n")
    second = specs.refresh()
    assert reads == [str(new)] and "k8s.gpu.nvidia.com/claim=new-gpu-2" in second.devices
    new.unlink()  # the claim is unprepared: its spec goes
    assert "k8s.gpu.nvidia.com/claim=new-gpu-2" not in specs.refresh().devices


def test_a_later_directory_overrides_and_one_directory_conflicts(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    spec = "kind: a.com/gpu\ndevices:\n- name: g0\n  containerEdits: {{deviceNodes: [{{path: /dev/nvidia{}}}]}}\n"
    (etc / "a.yaml").write_text(spec.format(0))
    (run / "a.yaml").write_text(spec.format(1))
    index = CdiSpecs([str(etc), str(run)]).refresh()
    assert index.devices["a.com/gpu=g0"].device_nodes == ("/dev/nvidia1",) and index.errors == ()
    (run / "b.yaml").write_text(spec.format(2))
    index = CdiSpecs([str(etc), str(run)]).refresh()
    assert "a.com/gpu=g0" not in index.devices
    assert index.errors == (f"{run}/a.yaml and {run}/b.yaml: both define CDI device a.com/gpu=g0; neither is used",)


def test_an_oversized_or_unreadable_spec_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_text("{" + " " * 2000 + "}")
    (tmp_path / "latin1.yaml").write_bytes(b"kind: a.com/b\ndevices: []\n# \xe9t\xe9\n")
    index = CdiSpecs([str(tmp_path)], max_bytes=1000).refresh()
    assert sorted(index.errors) == [
        f"{tmp_path}/big.json: 2002 bytes, more than the 1000 a CDI spec may have here",
        f"{tmp_path}/latin1.yaml: cannot read: 'utf-8' codec can't decode byte 0xe9 in position 28: "
        "invalid continuation byte",
    ]


def test_spec_dirs_must_be_a_sequence() -> None:
    with pytest.raises(TypeError):
        CdiSpecs("/etc/cdi")


# -- the MIG capability table ---------------------------------------------------------------------------------
def test_mig_minors_table(tmp_path: Path) -> None:
    table = caps_table()
    assert table[21] == MigCapability(0, 2, None) and table[22] == MigCapability(0, 2, 0)
    assert table[157] == MigCapability(1, 2, 0) and 1 not in table  # config/monitor are not instances
    root = tmp_path / "proc"
    (root / "driver" / "nvidia-caps").mkdir(parents=True)
    path = root / "driver" / "nvidia-caps" / "mig-minors"
    path.write_text("gpu0/gi1/access 12\n")
    minors = MigMinors(str(root))
    assert set(minors.table()) == {12} and minors.error == ""
    path.write_text("gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    assert set(minors.table()) == {12}  # read once ...
    assert set(minors.table([13])) == {12, 13}  # ... and again for a minor it did not list
    missing = MigMinors(str(tmp_path / "nowhere"))
    assert missing.table([5]) == {} and "No such file" in missing.error


# -- mapping ---------------------------------------------------------------------------------------------------
def cdi_index(spec_dir: Path) -> CdiIndex:
    return CdiSpecs([str(spec_dir)]).refresh()


def test_a_slice_maps_gpus_and_mig_devices() -> None:
    slices = {
        ("gpu.nvidia.com", NODE, "gpu-1"): SliceDevice(UUIDS[1], type="gpu", slice="s1"),
        ("gpu.nvidia.com", NODE, "gpu-0-mig-9-4-2"): SliceDevice(MIG_UUID, UUIDS[0], "mig", "3g.40gb", "s1"),
    }
    mapping = map_devices([dra("gpu-1"), dra("gpu-0-mig-9-4-2", container="side")], Places(NODE_GPUS),
                          slices=slices)
    whole, part = mapping.devices
    assert (whole.gpu_uuid, whole.mig_uuid, whole.mapped_by, whole.device_id) == (
        UUIDS[1], None, MAPPED_BY_SLICE, UUIDS[1])
    assert (part.gpu_uuid, part.mig_uuid, part.device_id) == (UUIDS[0], MIG_UUID, MIG_UUID)
    # the same records the device plugin's ids give: GPU-… whole, MIG-… (no GPU UUID: attribution finds the parent)
    assert [(a.container, a.device_id, a.gpu_uuid, a.mig_uuid, a.resource_name) for a in mapping.allocations] == [
        ("main", UUIDS[1], UUIDS[1], None, "gpu.nvidia.com"), ("side", MIG_UUID, None, MIG_UUID, "gpu.nvidia.com")]
    assert mapping.unmapped == ()


def test_a_slice_without_uuid_falls_back_to_the_cdi_spec(spec_dir: Path) -> None:
    """The driver's dynamic MIG devices exist only once prepared: their slice entry has no uuid."""
    slices = {("gpu.nvidia.com", NODE, "gpu-0-mig-9-4-2"): SliceDevice(None, type="mig", slice="s1")}
    (device,) = map_devices([dra("gpu-0-mig-9-4-2", MIG_CDI)], Places(NODE_GPUS), slices=slices,
                            cdi=cdi_index(spec_dir), caps=caps_table()).devices
    assert (device.gpu_uuid, device.mig_uuid, device.mapped_by) == (UUIDS[0], MIG_UUID, MAPPED_BY_CDI)


def test_cdi_maps_a_gpu_by_minor_a_mig_device_by_capabilities_and_a_uuid_by_env(spec_dir: Path) -> None:
    index = cdi_index(spec_dir)
    dynamic = [dra("gpu-3", GPU_CDI), dra("gpu-0-mig-9-4-2", MIG_CDI, container="b"),
               dra("gpu1", "vendor-b.example.com/gpu=gpu1", driver="gpu.vendor-b.example.com", container="c")]
    assert cap_minors(dynamic, index) == {21, 22}
    places = Places((*NODE_GPUS, gpu(4, VENDOR_B_UUID)))
    mapping = map_devices(dynamic, places, cdi=index, caps=caps_table())
    assert [(d.gpu_uuid, d.mig_uuid, d.mapped_by) for d in mapping.devices] == [
        (UUIDS[3], None, MAPPED_BY_CDI), (UUIDS[0], MIG_UUID, MAPPED_BY_CDI), (VENDOR_B_UUID, None, MAPPED_BY_CDI)]


def test_a_device_neither_source_names_is_reported_with_every_reason(spec_dir: Path) -> None:
    slices = {("gpu.nvidia.com", NODE, "gpu-1"): SliceDevice(UUIDS[1], slice="s1")}
    index = cdi_index(spec_dir)
    cases = [
        (dra("gpu-7", "k8s.gpu.nvidia.com/claim=gone-gpu-7"),
         f"not in this node's ResourceSlices; CDI device k8s.gpu.nvidia.com/claim=gone-gpu-7 is in no spec "
         f"under {spec_dir}"),
        (dra("gpu-9"), "not in this node's ResourceSlices; the kubelet names no CDI device for it"),
    ]
    for device, problem in cases:
        (mapped,) = map_devices([device], Places(NODE_GPUS), slices=slices, cdi=index).devices
        assert mapped.mapped_by is None and mapped.device_id is None and mapped.problem == problem
    mapping = map_devices([cases[0][0]], Places(NODE_GPUS), cdi=index)
    assert mapping.allocations == () and mapping.unmapped[0].problem.startswith(
        "no ResourceSlices (the API server is not used, or not listed yet); CDI device")


@pytest.mark.parametrize(("nodes", "problem"), [
    (["/dev/nvidia0", "/dev/nvidia1"], "gives 2 GPUs (/dev/nvidia0, /dev/nvidia1): one DRA device is one GPU"),
    (["/dev/nvidia6"], "gives /dev/nvidia6, but no GPU here has that minor number"),
    (["/dev/nvidiactl"], "names no GPU device node and no GPU UUID"),
    (["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap99"], "gives MIG capability nvidia-cap99: the driver's "
     "mig-minors table does not list it"),
    (["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"],
     "its GPU node and its MIG capabilities name different GPUs"),
    (["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap22"],
     "gives the capabilities of 2 MIG instances"),
    (["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157"],
     "is GPU instance 2 compute instance 0 of GPU minor 1, which NVML does not list"),
])
def test_cdi_devices_that_do_not_name_one_gpu(tmp_path: Path, nodes: list[str], problem: str) -> None:
    listed = "".join(f"    - {{path: {n}}}\n" for n in nodes)
    (tmp_path / "s.yaml").write_text(f"kind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: u-gpu-x\n"
                                     f"  containerEdits:\n    deviceNodes:\n{listed}")
    (device,) = map_devices([dra("gpu-x", "k8s.gpu.nvidia.com/claim=u-gpu-x")], Places(NODE_GPUS),
                            cdi=CdiSpecs([str(tmp_path)]).refresh(), caps=caps_table()).devices
    assert device.mapped_by is None and device.problem.endswith(problem), device.problem


def test_an_unreadable_mig_table_is_the_reason_given(spec_dir: Path) -> None:
    (device,) = map_devices([dra("gpu-0-mig-9-4-2", MIG_CDI)], Places(NODE_GPUS), cdi=cdi_index(spec_dir),
                            caps={}, caps_error="/proc/driver/nvidia-caps/mig-minors: Permission denied").devices
    assert device.problem.endswith("nvidia-cap21, nvidia-cap22: /proc/driver/nvidia-caps/mig-minors: "
                                   "Permission denied")


def test_a_shared_device_is_held_as_replicas_one_per_container() -> None:
    """One claim in two pods (or two containers): each holds 1/N of the GPU, as time-slicing replicas."""
    slices = {("gpu.nvidia.com", NODE, "gpu-2"): SliceDevice(UUIDS[2], slice="s")}
    dynamic = [dra("gpu-2", pod="b", claim="shared"), dra("gpu-2", pod="a", claim="shared"),
               dra("gpu-2", pod="a", container="side", claim="shared"),
               dra("gpu-2", pod="a", claim="shared-again")]  # the same device through a second claim: once
    mapping = map_devices(dynamic, Places(NODE_GPUS), slices=slices)
    assert [d.device_id for d in mapping.devices] == [f"{UUIDS[2]}::2", f"{UUIDS[2]}::0", f"{UUIDS[2]}::1",
                                                      f"{UUIDS[2]}::0"]
    assert [(a.pod, a.container, a.device_id, a.gpu_uuid, a.replica) for a in mapping.allocations] == [
        ("b", "main", f"{UUIDS[2]}::2", UUIDS[2], 2), ("a", "main", f"{UUIDS[2]}::0", UUIDS[2], 0),
        ("a", "side", f"{UUIDS[2]}::1", UUIDS[2], 1)]


def test_places_signature_follows_minors_and_mig_layout() -> None:
    before = Places(NODE_GPUS).signature()
    assert Places(NODE_GPUS).signature() == before
    assert Places((NODE_GPUS[0], gpu(1, UUIDS[2]))).signature() != before


# -- ResourceSlices from the API server ------------------------------------------------------------------------
@pytest.fixture
async def watch(api: FakeApiServer) -> AsyncIterator[Callable[..., ResourceSlices]]:
    """watch(**kwargs) -> a running ResourceSlices of gpu.nvidia.com for NODE; cancelled at teardown."""
    async with metadata_runner(api, ResourceSlices, drivers=("gpu.nvidia.com",)) as start:
        yield start


async def test_slices_are_not_asked_for_until_wanted(api: FakeApiServer, watch) -> None:
    api.add_slice(make_slice(NODE, [gpu_device("gpu-0", UUIDS[0])]))
    slices = watch()
    await asyncio.sleep(0.1)
    assert api.requests == [] and not slices.synced and not slices.wanted
    slices.want()
    await eventually(lambda: slices.synced)
    assert slices.devices()[("gpu.nvidia.com", NODE, "gpu-0")].uuid == UUIDS[0]
    assert api.lists[0].path == "/apis/resource.k8s.io/v1/resourceslices"
    assert api.lists[0].query["fieldSelector"] == f"spec.nodeName={NODE}"


async def test_slices_of_this_node_and_gpu_drivers_only_newest_generation(api: FakeApiServer, watch) -> None:
    old = api.add_slice(make_slice(NODE, [gpu_device("gpu-0", UUIDS[1])], generation=1))
    api.add_slice(make_slice(NODE, [gpu_device("gpu-0", UUIDS[0]), gpu_device("gpu-1", UUIDS[1], qualified=True),
                                    mig_device("gpu-2-mig-9-4-2", MIG_UUID, UUIDS[2], "3g.40gb")], generation=2))
    api.add_slice(make_slice("other-node", [gpu_device("gpu-0", UUIDS[3])]))
    api.add_slice(make_slice(NODE, [{"name": "nic-0", "attributes": {"uuid": {"string": "x"}}}], driver="dra.net"))
    slices = watch(wanted=True)
    await eventually(lambda: slices.synced)
    view = slices.devices()
    assert set(view) == {("gpu.nvidia.com", NODE, n) for n in ("gpu-0", "gpu-1", "gpu-2-mig-9-4-2")}
    assert view[("gpu.nvidia.com", NODE, "gpu-0")].uuid == UUIDS[0]  # generation 2 wins over the stale 1
    assert view[("gpu.nvidia.com", NODE, "gpu-1")].uuid == UUIDS[1]  # gpu.nvidia.com/uuid, qualified
    part = view[("gpu.nvidia.com", NODE, "gpu-2-mig-9-4-2")]
    assert (part.uuid, part.parent_uuid, part.type, part.profile) == (MIG_UUID, UUIDS[2], "mig", "3g.40gb")

    # Watched: a new slice, a deletion
    api.delete_slice(old["metadata"]["uid"])
    api.add_slice(make_slice(NODE, [gpu_device("gpu-3", UUIDS[3])], pool="second"))
    await eventually(lambda: ("gpu.nvidia.com", "second", "gpu-3") in slices.devices())
    assert slices.status == (True, "") and len(api.lists) == 1


async def test_forbidden_slices_name_the_api_group(api: FakeApiServer, watch) -> None:
    api.fail_next(403, times=1)
    slices = watch(wanted=True)
    await eventually(lambda: not slices.status[0] and "forbidden" in slices.status[1])
    assert slices.status[1].startswith(f"forbidden: resourceslices list on node {NODE}: RBAC must allow get, "
                                       "list and watch on resourceslices (API group resource.k8s.io)")


async def test_a_server_without_resource_v1_says_so(api: FakeApiServer, watch) -> None:
    api.fail_next(404, times=1, message="the server could not find the requested resource")
    slices = watch(wanted=True)
    await eventually(lambda: "404" in slices.status[1])
    assert "HTTP 404: the API server does not serve apis/resource.k8s.io/v1/resourceslices" in slices.status[1]


def test_drivers_must_be_a_sequence() -> None:
    with pytest.raises(TypeError):
        ResourceSlices(NODE, drivers="gpu.nvidia.com")


def test_fixture_files_are_what_the_readme_lists() -> None:
    listed = (FIXTURES / "README.md").read_text()
    for name in os.listdir(FIXTURES):
        if name != "README.md":
            assert f"`{name}`" in listed, name
