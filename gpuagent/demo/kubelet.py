"""The simulated node's kubelet pod-resources API: ``v1.PodResourcesLister`` over gRPC on a unix socket.

Built from the agent's own generated code (``gpuagent.pods.kubelet``, the kubelet's ``api.proto``), so the
agent's client reads the bytes a kubelet sends: ``List`` (every pod's containers and their devices),
``GetAllocatableResources`` (what the device plugin advertises) and ``Get`` (one pod). The pods never change
while the demo runs. grpcio is imported here only, by ``gpuagent demo``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from gpuagent.demo.node import DemoNode, Device
from gpuagent.pods.kubelet import api_pb2, api_pb2_grpc


def _devices(devices: tuple[Device, ...]) -> list[api_pb2.ContainerDevices]:
    """One ``ContainerDevices`` per resource name, its IDs in order."""
    by_resource: dict[str, list[str]] = {}
    for device in devices:
        by_resource.setdefault(device.resource_name, []).append(device.device_id)
    return [api_pb2.ContainerDevices(resource_name=name, device_ids=ids) for name, ids in by_resource.items()]


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, node: DemoNode) -> None:
        self._pods = {(pod.namespace, pod.name): api_pb2.PodResources(
            name=pod.name, namespace=pod.namespace,
            containers=[api_pb2.ContainerResources(name=c.name, devices=_devices(c.devices))
                        for c in pod.containers])
            for pod in node.pods}
        self._allocatable = api_pb2.AllocatableResourcesResponse(devices=_devices(node.allocatable))

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=list(self._pods.values()))

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return self._allocatable

    async def Get(self, request: Any, context: Any) -> api_pb2.GetPodResourcesResponse:
        pod = self._pods.get((request.pod_namespace, request.pod_name))
        if pod is None:  # what a kubelet answers
            await context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace "
                                f"{request.pod_namespace} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=pod)


class KubeletServer:
    """``start()`` serves ``node`` on ``socket`` (a path short enough for a unix socket); ``stop()``."""

    def __init__(self, socket: Path, node: DemoNode) -> None:
        self.socket = socket
        self._node = node
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self._node), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
