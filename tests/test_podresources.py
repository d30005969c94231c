"""The kubelet pod-resources client against a real grpc.aio server on a unix socket."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from fixture_files import KUBERNETES
from podresources_server import (
    Claim,
    ClaimDevice,
    Container,
    Devices,
    Pod,
    PodResourcesServer,
    gpus,
    load_list_response,
    parse_list_response,
    short_socket_dir,
)

from gpuagent.pods.kubelet import api_pb2, api_pb2_grpc
from gpuagent.pods.podresources import (
    DEFAULT_SOCKET_PATH,
    DeviceAllocation,
    DynamicAllocation,
    PodResourcesClient,
    PodResourcesSnapshot,
    PodResourcesUnavailable,
    parse_device_id,
)

REPO = Path(__file__).resolve().parent.parent
KUBELET_DIR = REPO / "gpuagent" / "pods" / "kubelet"

UUID_A = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
UUID_B = "GPU-4b6e2a17-90cd-4f3e-a8b1-2c3d4e5f6a7b"
MIG_1 = "MIG-0c4a3b2e-1d5f-5a6b-9c8d-7e6f5a4b3c2d"
MIG_2 = "MIG-9a8b7c6d-5e4f-5a3b-8c2d-1e0f9a8b7c6d"


@pytest.fixture
def sock() -> str:
    with short_socket_dir() as directory:
        yield str(directory / "kubelet.sock")


@pytest.fixture
async def server(sock):
    async with PodResourcesServer(sock) as srv:
        yield srv


@pytest.fixture
async def client(sock):
    c = PodResourcesClient(sock, timeout=1.0)
    yield c
    await c.close()


def alloc(
    ns, pod, container, device_id, *, resource="nvidia.com/gpu", gpu=None, mig=None, replica=None, numa=()
) -> DeviceAllocation:
    return DeviceAllocation(ns, pod, container, resource, device_id, gpu, mig, replica, tuple(numa))


# -- device id forms --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "gpu", "mig", "replica"),
    [
        (UUID_A, UUID_A, None, None),
        (f"{UUID_A}::0", UUID_A, None, 0),
        (f"{UUID_A}::12", UUID_A, None, 12),
        (MIG_1, None, MIG_1, None),
        (f"{MIG_1}::3", None, MIG_1, 3),
        (f"MIG-{UUID_A}/1/0", UUID_A, None, None),  # pre-R470 MIG form: GPU UUID / GI / CI
        (f"MIG-{UUID_A}/7/0::2", UUID_A, None, 2),
        ("0", None, None, None),  # the plugin's index id strategy
        ("1::4", None, None, 4),
        (f"{UUID_A}::x", f"{UUID_A}::x", None, None),  # not a replica suffix: kept whole
    ],
)
def test_parse_device_id(device_id, gpu, mig, replica):
    parsed = parse_device_id(device_id)
    assert (parsed.gpu_uuid, parsed.mig_uuid, parsed.replica) == (gpu, mig, replica)


# -- allocations ---------------------------------------------------------------------------------------


async def test_whole_gpus_and_allocatable(server, client):
    server.set_pods(
        [
            Pod("train-0", "ml", [Container("main", [gpus(UUID_A, UUID_B, numa=[0, 1])])]),
        ]
    )
    server.set_allocatable([gpus(UUID_A, UUID_B), Devices("example.com/fpga", ["fpga0"])], cpu_ids=[0, 1])
    snap = await client.fetch()
    assert isinstance(snap, PodResourcesSnapshot)
    assert snap.allocations == (
        alloc("ml", "train-0", "main", UUID_A, gpu=UUID_A, numa=(0, 1)),
        alloc("ml", "train-0", "main", UUID_B, gpu=UUID_B, numa=(0, 1)),
    )
    assert snap.allocatable == (UUID_A, UUID_B)
    assert snap.pods_seen == 1


async def test_mig_devices(server, client):
    server.set_pods(
        [
            Pod("infer-a", "ml", [Container("srv", [gpus(MIG_1, resource="nvidia.com/mig-1g.10gb")])]),
            Pod(
                "infer-b",
                "ml",
                [Container("srv", [gpus(MIG_2, resource="nvidia.com/mig-3g.40gb", numa=[1])])],
            ),
        ]
    )
    server.set_allocatable(
        [gpus(MIG_1, resource="nvidia.com/mig-1g.10gb"), gpus(MIG_2, resource="nvidia.com/mig-3g.40gb")]
    )
    snap = await client.fetch()
    assert snap.allocations == (
        alloc("ml", "infer-a", "srv", MIG_1, resource="nvidia.com/mig-1g.10gb", mig=MIG_1),
        alloc("ml", "infer-b", "srv", MIG_2, resource="nvidia.com/mig-3g.40gb", mig=MIG_2, numa=(1,)),
    )
    assert snap.allocatable == (MIG_1, MIG_2)


async def test_pre_r470_mig_form(server, client):
    legacy = f"MIG-{UUID_A}/2/0"
    devices = gpus(legacy, resource="nvidia.com/mig-1g.5gb")
    server.set_pods([Pod("old", "legacy", [Container("c", [devices])])])
    (a,) = (await client.fetch()).allocations
    assert a.device_id == legacy  # GI/CI stay in the raw id
    assert (a.gpu_uuid, a.mig_uuid, a.replica) == (UUID_A, None, None)


async def test_time_sliced_replicas_in_two_pods(server, client):
    server.set_pods(
        [
            Pod("a", "team", [Container("c", [gpus(f"{UUID_A}::0")])]),
            Pod("b", "team", [Container("c", [gpus(f"{UUID_A}::1")])]),
        ]
    )
    server.set_allocatable([gpus(*(f"{UUID_A}::{n}" for n in range(4)))])
    snap = await client.fetch()
    assert snap.allocations == (
        alloc("team", "a", "c", f"{UUID_A}::0", gpu=UUID_A, replica=0),
        alloc("team", "b", "c", f"{UUID_A}::1", gpu=UUID_A, replica=1),
    )
    assert snap.allocatable == tuple(f"{UUID_A}::{n}" for n in range(4))  # raw, suffixes kept


async def test_shared_resource_name_only_when_configured(server, sock):
    server.set_pods(
        [
            Pod("a", "team", [Container("c", [gpus(f"{UUID_A}::0", resource="nvidia.com/gpu.shared")])]),
            Pod("b", "team", [Container("c", [gpus(UUID_B)])]),
        ]
    )
    server.set_allocatable([gpus(f"{UUID_A}::0", resource="nvidia.com/gpu.shared"), gpus(UUID_B)])
    default = PodResourcesClient(sock)
    shared = PodResourcesClient(sock, resource_names=["nvidia.com/gpu", "nvidia.com/gpu.shared"])
    try:
        plain = await default.fetch()
        assert [a.device_id for a in plain.allocations] == [UUID_B]
        assert plain.allocatable == (UUID_B,)
        both = await shared.fetch()
        assert both.allocations == (
            alloc("team", "a", "c", f"{UUID_A}::0", resource="nvidia.com/gpu.shared", gpu=UUID_A, replica=0),
            alloc("team", "b", "c", UUID_B, gpu=UUID_B),
        )
        assert both.allocatable == (f"{UUID_A}::0", UUID_B)
    finally:
        await default.close()
        await shared.close()


async def test_non_gpu_resources_ignored_but_pods_counted(server, client):
    server.set_pods(
        [
            Pod(
                "mixed",
                "ml",
                [
                    Container("sidecar", [Devices("rdma/hca_shared_devices_a", ["mlx5_0"])], cpu_ids=[4, 5]),
                    Container(
                        "main",
                        [
                            Devices("example.com/foo", ["foo-1"]),
                            gpus(UUID_A),
                            Devices(
                                "nvidia.com/gpu-other", [UUID_B]
                            ),  # exact match only (and the mig- prefix)
                            Devices("amd.com/gpu", ["0000:03:00.0"]),
                        ],
                    ),
                ],
            ),
            Pod("web", "default", [Container("nginx")]),
            Pod("empty", "default"),
        ]
    )
    snap = await client.fetch()
    assert snap.allocations == (alloc("ml", "mixed", "main", UUID_A, gpu=UUID_A),)
    assert snap.allocatable == ()
    assert snap.pods_seen == 3


async def test_fixture_list_response(server, client):
    server.set_pods(load_list_response(KUBERNETES / "podresources-list-response.json"))
    snap = await client.fetch()
    assert snap.pods_seen == 3
    assert snap.allocations == (
        alloc("ml-team", "llm-train-7d9c6b8f5d-x2kqp", "trainer", UUID_A, gpu=UUID_A, numa=(0,)),
        alloc("ml-team", "shared-infer-0", "server", f"{UUID_B}::1", gpu=UUID_B, replica=1),
    )


# -- DRA: dynamic resources -----------------------------------------------------------------------------

CLAIM_UID = "6f0e9a52-6f4b-4a8e-9d3e-2b1c0a9f8e7d"
# What a 1.34 kubelet answers for a pod whose container uses a GPU claim of NVIDIA's DRA driver next to a
# NIC claim of another driver (proto3 JSON of a ListPodResourcesResponse; names as the drivers make them).
DRA_LIST_RESPONSE_JSON = """
{"podResources": [
  {"name": "dra-train-0", "namespace": "ml-team",
   "containers": [{"name": "trainer",
                   "dynamicResources": [
                     {"claimName": "dra-train-0-gpu-7xk2q", "claimNamespace": "ml-team",
                      "claimResources": [{"cdiDevices": [{"name": "k8s.gpu.nvidia.com/claim=CLAIM_UID-gpu-3"}],
                                          "driverName": "gpu.nvidia.com", "poolName": "gpu-node-1",
                                          "deviceName": "gpu-3"}]},
                     {"claimName": "dra-train-0-nic-p9m4z", "claimNamespace": "ml-team",
                      "claimResources": [{"cdiDevices": [{"name": "dra.net/pci=eth2"}],
                                          "driverName": "dra.net", "poolName": "gpu-node-1",
                                          "deviceName": "pci-0000-8a-00-0"}]}]}]}
]}
""".replace("CLAIM_UID", CLAIM_UID)


async def test_dynamic_resources_of_gpu_drivers_only(server, client):
    server.set_pods(parse_list_response(DRA_LIST_RESPONSE_JSON))
    snap = await client.fetch()
    assert snap.allocations == ()  # nothing through the device plugin
    assert snap.dynamic == (
        DynamicAllocation("ml-team", "dra-train-0", "trainer", "ml-team", "dra-train-0-gpu-7xk2q",
                          "gpu.nvidia.com", "gpu-node-1", "gpu-3",
                          (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-3",)),
    )


async def test_dynamic_resources_shares_mig_and_configured_drivers(server, sock):
    mig = ClaimDevice("gpu.nvidia.com", "node-a", "gpu-0-mig-9-4-2", ["k8s.gpu.nvidia.com/claim=u1-gpu-0-mig-9-4-2"])
    share = ClaimDevice("gpu.nvidia.com", "node-a", "gpu-1", [], share_id="4d7f2c1e-0b9a-4c33-8e51-9f2a6b7c8d90")
    other = ClaimDevice("gpu.example.com", "node-a", "accel-0", ["example.com/accel=0"])
    not_a_device = ClaimDevice("gpu.nvidia.com", "node-a", "", ["k8s.gpu.nvidia.com/claim=u3"])
    server.set_pods([
        Pod("infer", "serving", [
            Container("a", [gpus(UUID_A)], claims=[Claim("mig-claim", [mig, not_a_device])]),
            Container("b", claims=[Claim("shared", [share], namespace="serving"), Claim("accel", [other])]),
        ]),
    ])
    default = PodResourcesClient(sock)
    both = PodResourcesClient(sock, dra_drivers=["gpu.nvidia.com", "gpu.example.com"])
    none = PodResourcesClient(sock, dra_drivers=[])
    try:
        snap = await default.fetch()
        assert [a.device_id for a in snap.allocations] == [UUID_A]  # device plugin and DRA side by side
        assert [(d.container, d.claim_name, d.device, d.share_id) for d in snap.dynamic] == [
            ("a", "mig-claim", "gpu-0-mig-9-4-2", None),
            ("b", "shared", "gpu-1", "4d7f2c1e-0b9a-4c33-8e51-9f2a6b7c8d90"),
        ]
        assert snap.dynamic[1].cdi_devices == () and snap.dynamic[0].claim_namespace == "serving"
        assert [d.driver for d in (await both.fetch()).dynamic] == [
            "gpu.nvidia.com", "gpu.nvidia.com", "gpu.example.com"]
        assert (await none.fetch()).dynamic == ()
    finally:
        for c in (default, both, none):
            await c.close()


def test_dra_drivers_must_be_a_sequence():
    with pytest.raises(TypeError, match="dra_drivers"):
        PodResourcesClient(dra_drivers="gpu.nvidia.com")


# -- failures ------------------------------------------------------------------------------------------


async def test_missing_socket_fails_fast_without_grpc(sock):
    client = PodResourcesClient(sock)
    start = time.monotonic()
    with pytest.raises(PodResourcesUnavailable, match="does not exist") as info:
        await client.fetch()
    assert time.monotonic() - start < 2.0  # no connection attempt, no gRPC deadline
    assert sock in str(info.value)
    await client.close()


async def test_path_that_is_not_a_socket(sock):
    Path(sock).write_text("")
    client = PodResourcesClient(sock)
    with pytest.raises(PodResourcesUnavailable, match="is not a socket"):
        await client.fetch()


@pytest.mark.parametrize("stale_socket", [False, True], ids=["clean-exit", "crash"])
async def test_server_goes_away_and_comes_back(server, client, stale_socket):
    server.set_pods([Pod("a", "ns", [Container("c", [gpus(UUID_A)])])])
    assert len((await client.fetch()).allocations) == 1

    await server.stop(0, stale_socket=stale_socket)
    expected = "UNAVAILABLE" if stale_socket else "does not exist"  # a dead socket file: connection refused
    for _ in range(2):
        with pytest.raises(PodResourcesUnavailable, match=expected):
            await client.fetch()

    server.set_pods([Pod("b", "ns", [Container("c", [gpus(UUID_B)])])])
    await server.start()
    start = time.monotonic()
    snap = await client.fetch()  # no reconnect back-off left over from the failures
    assert time.monotonic() - start < 0.5
    assert [a.pod for a in snap.allocations] == ["b"]


async def test_connection_refused_drops_the_channel(server, client):
    await client.fetch()
    await server.stop(0, stale_socket=True)
    with pytest.raises(PodResourcesUnavailable, match="UNAVAILABLE"):
        await client.fetch()
    assert client._conn is None  # the next fetch dials afresh instead of waiting out grpc's back-off


async def test_server_restart_between_fetches(server, client):
    server.set_pods([Pod("a", "ns", [Container("c", [gpus(UUID_A)])])])
    await client.fetch()
    await server.restart()
    assert (await client.fetch()).pods_seen == 1


class _BrokenOnce:
    """A kept channel's stub whose next List fails as a connection the kubelet closed does ("Stream removed")."""

    def __init__(self, stub):
        self.stub, self.failed = stub, 0

    def __getattr__(self, name):
        return getattr(self.stub, name)

    async def List(self, request, timeout=None):  # the gRPC method's name
        self.failed += 1
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   details="Stream removed (sendmsg: Broken pipe (32))")


async def test_a_kept_channel_that_fails_unavailable_is_dialled_again_within_the_fetch(server, client):
    """A kubelet restarted on a socket file of the same identity (its inode taken again within a clock tick):
    the kept channel fails its first call; the fetch drops it and dials once more instead of failing."""
    server.set_pods([Pod("a", "ns", [Container("c", [gpus(UUID_A)])])])
    await client.fetch()
    broken = _BrokenOnce(client._conn.stub)
    client._conn.stub = broken
    assert (await client.fetch()).pods_seen == 1
    assert broken.failed == 1 and client._conn.stub is not broken
    assert server.calls["List"] == 2  # the first fetch's and the retry's: the broken call never reached it


async def test_get_allocatable_unimplemented_is_remembered(server, client):
    server.set_pods([Pod("a", "ns", [Container("c", [gpus(UUID_A)])])])
    server.set_allocatable([gpus(UUID_A)])
    server.unimplemented.add("GetAllocatableResources")
    first = await client.fetch()
    assert first.allocatable == ()
    assert len(first.allocations) == 1
    assert not client.allocatable_supported
    second = await client.fetch()
    assert second.allocatable == ()
    assert server.calls == {"List": 2, "GetAllocatableResources": 1}


async def test_slow_server_hits_the_deadline(server, sock):
    client = PodResourcesClient(sock, timeout=0.2)
    server.set_delay(2.0, "List")
    start = time.monotonic()
    with pytest.raises(PodResourcesUnavailable, match=r"deadline of 0\.2 s exceeded") as info:
        await client.fetch()
    assert time.monotonic() - start < 1.8  # the 0.2 s deadline, not the server's 2 s delay
    assert "DEADLINE_EXCEEDED" in str(info.value)
    server.delays.clear()
    assert (await client.fetch()).pods_seen == 0  # the next poll works again
    await client.close()


async def test_slow_allocatable_hits_the_deadline(server, sock):
    client = PodResourcesClient(sock, timeout=0.2)
    server.set_delay(2.0, "GetAllocatableResources")
    with pytest.raises(PodResourcesUnavailable, match=r"GetAllocatableResources.*deadline"):
        await client.fetch()
    await client.close()


async def test_rpc_error_carries_code_and_details(server, client):
    server.errors["List"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
    with pytest.raises(PodResourcesUnavailable, match=r"List .*RESOURCE_EXHAUSTED: rejected by rate limit"):
        await client.fetch()
    del server.errors["List"]
    await client.fetch()


async def test_message_size_limit(server, sock):
    server.set_pods(
        [Pod(f"pod-{i:04d}", "ns", [Container("c", [gpus(f"{UUID_A}::{i}")])]) for i in range(200)]
    )
    small = PodResourcesClient(sock, max_message_bytes=1024)
    with pytest.raises(PodResourcesUnavailable, match="RESOURCE_EXHAUSTED"):
        await small.fetch()
    await small.close()
    big = PodResourcesClient(sock)
    assert len((await big.fetch()).allocations) == 200
    await big.close()


async def test_close_is_idempotent_and_fetch_reopens(server, client):
    await client.fetch()
    await client.close()
    await client.close()
    assert (await client.fetch()).pods_seen == 0


def test_constructor_defaults_and_validation():
    client = PodResourcesClient()
    assert client.target == "unix://" + DEFAULT_SOCKET_PATH
    assert client.is_gpu_resource("nvidia.com/gpu")
    assert client.is_gpu_resource("nvidia.com/mig-2g.20gb")
    assert not client.is_gpu_resource("nvidia.com/gpu.shared")
    with pytest.raises(TypeError):
        PodResourcesClient(resource_names="nvidia.com/gpu")
    with pytest.raises(ValueError):
        PodResourcesClient(timeout=0)


# -- the test server's other RPC -----------------------------------------------------------------------


async def test_server_get_rpc(server):
    server.set_pods([Pod("a", "ns", [Container("c", [gpus(UUID_A)])])])
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        answer = await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="a", pod_namespace="ns"), timeout=1)
        assert answer.pod_resources.containers[0].devices[0].device_ids == [UUID_A]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="x", pod_namespace="ns"), timeout=1)
        assert info.value.code() == grpc.StatusCode.UNKNOWN
        assert info.value.details() == "pod x in namespace ns not found"


# -- packaging -------------------------------------------------------------------------------------------


def test_grpc_is_not_imported_until_needed(tmp_path):
    code = (
        "import sys, asyncio\n"
        "import gpuagent.pods.podresources as m\n"
        "assert 'grpc' not in sys.modules, 'import'\n"
        "c = m.PodResourcesClient(sys.argv[1])\n"
        "try:\n"
        "    asyncio.run(c.fetch())\n"
        "except m.PodResourcesUnavailable:\n"
        "    pass\n"
        "assert 'grpc' not in sys.modules, 'missing socket'\n"
        "assert 'google.protobuf' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "absent.sock")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def _protoc(out: Path, *extra: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", *extra, "gpuagent/pods/kubelet/api.proto"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_generated_code_matches_the_proto(tmp_path):
    """The committed modules are what regenerate.sh makes from api.proto: they cannot drift apart."""
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed")
    from grpc_tools import grpc_version

    # Version-independent: the compiled descriptor equals the one embedded in api_pb2.
    descriptor_set = tmp_path / "api.pb"
    _protoc(tmp_path, f"--descriptor_set_out={descriptor_set}")
    from google.protobuf import descriptor_pb2

    fresh = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file[0]
    for message in fresh.message_type:  # protoc's descriptor sets carry json_name; gencode leaves it out
        for fld in message.field:
            fld.ClearField("json_name")
    committed = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    assert fresh == committed, "api.proto changed: run gpuagent/pods/kubelet/regenerate.sh"

    # Byte for byte, with the grpcio-tools version the committed code was generated with.
    if grpc_version.VERSION != api_pb2_grpc.GRPC_GENERATED_VERSION:
        pytest.skip(
            f"grpcio-tools {grpc_version.VERSION} installed; files were made with "
            f"{api_pb2_grpc.GRPC_GENERATED_VERSION}"
        )
    _protoc(tmp_path, f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}")
    for name in GENERATED:
        fresh_file = tmp_path / "gpuagent" / "pods" / "kubelet" / name
        assert fresh_file.read_bytes() == (KUBELET_DIR / name).read_bytes(), f"{name}: run regenerate.sh"


def test_socket_dir_is_short_enough():
    with short_socket_dir() as d:
        assert len(os.fsencode(d / "kubelet.sock")) < 107
