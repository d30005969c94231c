"""A real kubelet pod-resources v1 server for tests: grpc.aio on a unix socket, fed from Python data.

It is built from the same generated code as the client (``gpuagent.pods.kubelet``), so the bytes on the
socket are those of the real API. Describe the node with :class:`Pod`, :class:`Container` and
:class:`Devices` (or with ready ``api_pb2.PodResources`` messages, e.g. from :func:`load_list_response`);
devices a DRA driver prepared for a container's ResourceClaims with :class:`Claim` and :class:`ClaimDevice`
(``ContainerResources.dynamic_resources``, as kubelets >= 1.27 report them)::

    async with PodResourcesServer(sock, pods=[Pod("job-0", "ml", [Container("main", [gpus("GPU-a")])])],
                                  allocatable=[gpus("GPU-a", "GPU-b")]) as server:
        server.set_pods([Pod("dra-0", "ml", [Container("main", claims=[
            Claim("gpu-claim", [ClaimDevice("gpu.nvidia.com", "node-1", "gpu-0",
                                            ["k8s.gpu.nvidia.com/claim=<uid>-gpu-0"])])])])])
        ...                         # the client sees the pod
        server.set_pods([])         # the pod is gone on the next List
        await server.stop()         # the kubelet goes away (grpc removes the socket file; with
                                    # stop(stale_socket=True) a dead socket file stays, as after a crash)
        await server.start()        # and comes back on the same path
        server.unimplemented.add("GetAllocatableResources")   # an old kubelet (< 1.21)
        server.delays["List"] = 1.0                           # a slow kubelet
        server.errors["List"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        assert server.calls["List"] == 1                      # calls seen since start()/reset_calls()

Unix socket paths are limited to about 107 bytes: see :func:`short_socket_dir`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import grpc
import grpc.aio
from google.protobuf import json_format

from gpuagent.pods.kubelet import api_pb2, api_pb2_grpc

SERVICE = "v1.PodResourcesLister"
METHODS = ("List", "GetAllocatableResources", "Get")
MAX_UNIX_PATH = 107


@dataclass(frozen=True)
class Devices:
    """One ``ContainerDevices`` entry: device ids of one resource, with optional NUMA nodes."""

    resource_name: str
    device_ids: Sequence[str]
    numa_nodes: Sequence[int] = ()

    def to_proto(self) -> api_pb2.ContainerDevices:
        message = api_pb2.ContainerDevices(resource_name=self.resource_name, device_ids=list(self.device_ids))
        if self.numa_nodes:
            message.topology.nodes.extend(api_pb2.NUMANode(ID=node) for node in self.numa_nodes)
        return message


@dataclass(frozen=True)
class ClaimDevice:
    """One ``ClaimResource``: a device of a DRA driver (driver, pool, device) and its CDI device names."""

    driver: str
    pool: str
    device: str
    cdi_devices: Sequence[str] = ()
    share_id: str | None = None

    def to_proto(self) -> api_pb2.ClaimResource:
        message = api_pb2.ClaimResource(
            driver_name=self.driver, pool_name=self.pool, device_name=self.device,
            cdi_devices=[api_pb2.CDIDevice(name=name) for name in self.cdi_devices],
        )
        if self.share_id is not None:
            message.share_id = self.share_id
        return message


@dataclass(frozen=True)
class Claim:
    """One ``DynamicResource``: a ResourceClaim the container uses and its devices. ``namespace`` None:
    the pod's (a claim is always in its pod's namespace; the kubelet says so explicitly)."""

    name: str
    devices: Sequence[ClaimDevice] = ()
    namespace: str | None = None

    def to_proto(self, pod_namespace: str) -> api_pb2.DynamicResource:
        return api_pb2.DynamicResource(
            claim_name=self.name, claim_namespace=self.namespace or pod_namespace,
            claim_resources=[d.to_proto() for d in self.devices],
        )


@dataclass(frozen=True)
class Container:
    name: str
    devices: Sequence[Devices] = ()
    cpu_ids: Sequence[int] = ()
    claims: Sequence[Claim] = ()

    def to_proto(self, pod_namespace: str = "default") -> api_pb2.ContainerResources:
        return api_pb2.ContainerResources(
            name=self.name, devices=[d.to_proto() for d in self.devices], cpu_ids=list(self.cpu_ids),
            dynamic_resources=[c.to_proto(pod_namespace) for c in self.claims],
        )


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str = "default"
    containers: Sequence[Container] = field(default_factory=tuple)

    def to_proto(self) -> api_pb2.PodResources:
        return api_pb2.PodResources(
            name=self.name, namespace=self.namespace,
            containers=[c.to_proto(self.namespace) for c in self.containers],
        )


PodLike = Union[Pod, api_pb2.PodResources]  # noqa: UP007 (the generated classes do not support |)


def gpus(*device_ids: str, resource: str = "nvidia.com/gpu", numa: Sequence[int] = ()) -> Devices:
    """Shorthand: ``gpus("GPU-a", "GPU-b")``, ``gpus("MIG-x", resource="nvidia.com/mig-1g.10gb")``."""
    return Devices(resource, device_ids, numa)


def load_list_response(path: str | os.PathLike[str]) -> list[api_pb2.PodResources]:
    """The pods of a ``ListPodResourcesResponse`` written in proto3 JSON (as in tests/fixtures/kubernetes)."""
    return parse_list_response(Path(path).read_text())


def parse_list_response(text: str) -> list[api_pb2.PodResources]:
    """The pods of a ``ListPodResourcesResponse`` in proto3 JSON text."""
    return list(json_format.Parse(text, api_pb2.ListPodResourcesResponse()).pod_resources)


@contextlib.contextmanager
def short_socket_dir(prefix: str = "gpa-") -> Iterator[Path]:
    """A fresh short directory for unix sockets (pytest's tmp_path can exceed the 107-byte limit)."""
    base = "/tmp" if os.path.isdir("/tmp") else None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pod_proto(pod: PodLike) -> api_pb2.PodResources:
    if isinstance(pod, api_pb2.PodResources):
        copy = api_pb2.PodResources()
        copy.CopyFrom(pod)
        return copy
    return pod.to_proto()


class PodResourcesServer:
    """A kubelet pod-resources endpoint; start/stop/restart it at will inside a test."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        pods: Iterable[PodLike] = (),
        allocatable: Iterable[Devices] = (),
        allocatable_cpu_ids: Iterable[int] = (),
    ) -> None:
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        if len(self.socket_path.encode()) > MAX_UNIX_PATH:
            raise ValueError(f"unix socket path longer than {MAX_UNIX_PATH} bytes: {self.socket_path}")
        self.target = "unix://" + self.socket_path
        self.calls: collections.Counter[str] = collections.Counter()
        self.delays: dict[str, float] = {}  # method → seconds to sleep before answering
        self.errors: dict[str, tuple[grpc.StatusCode, str]] = {}  # method → status to abort with
        self.unimplemented: set[str] = set()  # methods this "kubelet version" lacks
        self.get_enabled = True  # False: Get fails as with the KubeletPodResourcesGet gate off
        self._pods: list[api_pb2.PodResources] = []
        self._allocatable = api_pb2.AllocatableResourcesResponse()
        self._server: grpc.aio.Server | None = None
        self.set_pods(pods)
        self.set_allocatable(allocatable, allocatable_cpu_ids)

    # -- data ---------------------------------------------------------------------------------------

    def set_pods(self, pods: Iterable[PodLike]) -> None:
        self._pods = [_pod_proto(pod) for pod in pods]

    def set_allocatable(self, devices: Iterable[Devices], cpu_ids: Iterable[int] = ()) -> None:
        self._allocatable = api_pb2.AllocatableResourcesResponse(
            devices=[d.to_proto() for d in devices], cpu_ids=list(cpu_ids)
        )

    def set_delay(self, seconds: float, *methods: str) -> None:
        """Sleep ``seconds`` before answering ``methods`` (all methods when none is named)."""
        for method in methods or METHODS:
            self.delays[method] = seconds

    def reset_calls(self) -> None:
        self.calls.clear()

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("PodResourcesServer already started")
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(self.target)
        await server.start()
        self._server = server

    async def stop(self, grace: float | None = None, *, stale_socket: bool = False) -> None:
        """Stop serving. grpc removes the socket file, as a clean kubelet exit does; ``stale_socket``
        leaves a dead socket file there instead (connect → ECONNREFUSED), as a crashed kubelet does."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        if stale_socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
                dead.bind(self.socket_path)  # bound, never listening, closed: the file stays

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def __aenter__(self) -> PodResourcesServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop(0)

    # -- serving ------------------------------------------------------------------------------------

    async def _enter(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.calls[method] += 1
        if method in self.unimplemented:
            details = f"unknown method {method} for service {SERVICE}"  # what a Go gRPC server says
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, details)
        delay = self.delays.get(method, 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        if method in self.errors:
            code, details = self.errors[method]
            await context.abort(code, details)

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=self._pods)

    def _get(self, name: str, namespace: str) -> api_pb2.PodResources | None:
        for pod in self._pods:
            if pod.name == name and pod.namespace == namespace:
                return pod
        return None


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, owner: PodResourcesServer) -> None:
        self._owner = owner

    async def List(self, request, context):
        await self._owner._enter("List", context)
        return self._owner._list()

    async def GetAllocatableResources(self, request, context):
        await self._owner._enter("GetAllocatableResources", context)
        return self._owner._allocatable

    async def Get(self, request, context):
        await self._owner._enter("Get", context)
        if not self._owner.get_enabled:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = self._owner._get(request.pod_name, request.pod_namespace)
        if pod is None:
            details = f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            await context.abort(grpc.StatusCode.UNKNOWN, details)
        return api_pb2.GetPodResourcesResponse(pod_resources=pod)
