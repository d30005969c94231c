"""Async client for the kubelet pod-resources v1 API: which pod and container hold which GPU.

The kubelet serves ``v1.PodResourcesLister`` on a plain unix socket (no TLS, no auth). ``fetch()`` calls
``List`` and ``GetAllocatableResources`` and keeps only GPU resources: a resource name given in
``resource_names`` (exact match; ``nvidia.com/gpu`` by default, shared names such as
``nvidia.com/gpu.shared`` come from the config) or any ``nvidia.com/mig-*`` name.

GPUs allocated through Dynamic Resource Allocation (ResourceClaims, Kubernetes 1.34 GA) are reported per
container in ``dynamic_resources``: the claim, and per device the driver, pool, device name and CDI device
names, but no device id. ``fetch()`` keeps those of the GPU drivers in ``dra_drivers`` (``gpu.nvidia.com``
by default; a NIC's claim is not a GPU) as :class:`DynamicAllocation` records, which ``pods.dra`` maps to
GPU and MIG UUIDs.

Device ids are whatever the device plugin advertised. The NVIDIA plugin reports ``GPU-<uuid>`` and
``MIG-<uuid>``, ``MIG-GPU-<uuid>/<gi>/<ci>`` before driver R470, and ``<id>::<n>`` for the n-th
time-slicing or MPS replica of a device; :func:`parse_device_id` splits those forms.

gRPC costs about 20 MiB of RSS, so it is imported on the first ``fetch()`` that finds the socket, never at
module import: a node without a kubelet never loads it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SOCKET_PATH = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)  # NVIDIA's DRA driver (k8s-dra-driver-gpu)

_REPLICA_SEPARATOR = "::"
_LEGACY_MIG_PREFIX = "MIG-GPU-"


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One device id the kubelet has given to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str  # e.g. "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"
    device_id: str  # as the kubelet reports it, e.g. "GPU-<uuid>::3" (a time-slicing/MPS replica)
    gpu_uuid: str | None  # "GPU-<uuid>" without the "::<n>" suffix; None for MIG ids and unknown forms
    mig_uuid: str | None  # "MIG-<uuid>" without the suffix for MIG devices, None otherwise
    replica: int | None  # the n of "::n", None when the id is not a replica
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DynamicAllocation:
    """One device of a ResourceClaim (DRA) the kubelet prepared for one container.

    The (driver, pool, device) triplet names the device uniquely; ``cdi_devices`` are the fully qualified
    CDI device names the runtime injected for it (``k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0``);
    ``share_id`` is set when the device is one share of a device with consumable capacity."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PodResourcesSnapshot:
    """The GPU part of one ``List`` + ``GetAllocatableResources`` round."""

    allocations: tuple[DeviceAllocation, ...]  # GPU resources only
    allocatable: tuple[str, ...]  # GPU device ids the kubelet can allocate, raw; () on kubelets < 1.21
    pods_seen: int  # pods in the List answer, GPU or not
    dynamic: tuple[DynamicAllocation, ...] = ()  # DRA devices of the GPU drivers (kubelets >= 1.27)


class PodResourcesUnavailable(Exception):
    """The kubelet's pod-resources API could not be read; the message says why."""


@dataclass(frozen=True, slots=True)
class ParsedDeviceId:
    gpu_uuid: str | None
    mig_uuid: str | None
    replica: int | None


def parse_device_id(device_id: str) -> ParsedDeviceId:
    """Split a device plugin id into GPU UUID, MIG UUID and replica number.

    ``GPU-<uuid>[::n]`` → gpu_uuid; ``MIG-<uuid>[::n]`` → mig_uuid; the pre-R470
    ``MIG-GPU-<uuid>/<gi>/<ci>[::n]`` → gpu_uuid of the parent GPU (no MIG UUID exists in that form; the
    instance ids stay in the raw device id). Any other form (e.g. the plugin's index strategy, ``"0"``)
    gives neither UUID.
    """
    base, replica = device_id, None
    head, sep, tail = device_id.rpartition(_REPLICA_SEPARATOR)
    if sep and head and tail.isdigit():
        base, replica = head, int(tail)
    if base.startswith(_LEGACY_MIG_PREFIX):
        parent = base[len("MIG-") :].split("/", 1)[0]
        return ParsedDeviceId(gpu_uuid=parent, mig_uuid=None, replica=replica)
    if base.startswith("MIG-"):
        return ParsedDeviceId(gpu_uuid=None, mig_uuid=base, replica=replica)
    if base.startswith("GPU-"):
        return ParsedDeviceId(gpu_uuid=base, mig_uuid=None, replica=replica)
    return ParsedDeviceId(gpu_uuid=None, mig_uuid=None, replica=replica)


class _Channel:
    """One gRPC channel, the loop it belongs to and the socket file it was opened on."""

    __slots__ = ("channel", "inode", "loop", "stub")

    def __init__(self, channel: Any, stub: Any, loop: asyncio.AbstractEventLoop, inode: tuple[int, int]):
        self.channel = channel
        self.stub = stub
        self.loop = loop
        self.inode = inode


class PodResourcesClient:
    """Reads GPU allocations from the kubelet; one instance per agent, reused across polls."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET_PATH,
        *,
        resource_names: Sequence[str] = ("nvidia.com/gpu",),
        dra_drivers: Sequence[str] = DEFAULT_DRA_DRIVERS,
        timeout: float = 2.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if isinstance(resource_names, str) or isinstance(dra_drivers, str):
            raise TypeError("resource_names and dra_drivers must be sequences of names, not strings")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes!r}")
        self._socket_path = os.path.abspath(socket_path)
        self._target = "unix://" + self._socket_path  # grpc wants unix:///abs/path (or unix:rel)
        self._resource_names = frozenset(resource_names)
        self._dra_drivers = frozenset(dra_drivers)
        self._timeout = timeout
        self._max_message_bytes = max_message_bytes
        self._conn: _Channel | None = None
        self._allocatable_supported = True

    @property
    def target(self) -> str:
        return self._target

    @property
    def allocatable_supported(self) -> bool:
        """False once the kubelet has answered UNIMPLEMENTED to GetAllocatableResources (k8s < 1.21)."""
        return self._allocatable_supported

    def is_gpu_resource(self, resource_name: str) -> bool:
        return resource_name in self._resource_names or resource_name.startswith(MIG_RESOURCE_PREFIX)

    async def fetch(self) -> PodResourcesSnapshot:
        """List + GetAllocatableResources. Raises :class:`PodResourcesUnavailable` and nothing else."""
        try:
            return await self._fetch()
        except PodResourcesUnavailable:
            raise
        except Exception as exc:  # the contract: callers handle one exception type
            await self.close()
            raise PodResourcesUnavailable(
                f"kubelet pod-resources at {self._target}: {type(exc).__name__}: {exc}"
            ) from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close_channel(conn)

    # -- internals ---------------------------------------------------------------------------------------

    async def _fetch(self) -> PodResourcesSnapshot:
        inode = await self._check_socket()
        grpc, api_pb2, api_pb2_grpc = _import_grpc()
        conn, fresh = await self._connection(grpc, api_pb2_grpc, inode)
        try:
            listed = await self._call(grpc, conn, "List", api_pb2.ListPodResourcesRequest(),
                                      stale_ok=not fresh)
        except _Stale:  # a kubelet restarted on a socket file of the same identity: dial it afresh, once
            conn, _ = await self._connection(grpc, api_pb2_grpc, inode)
            listed = await self._call(grpc, conn, "List", api_pb2.ListPodResourcesRequest())
        allocatable: tuple[str, ...] = ()
        if self._allocatable_supported:
            try:
                answer = await self._call(
                    grpc,
                    conn,
                    "GetAllocatableResources",
                    api_pb2.AllocatableResourcesRequest(),
                    unimplemented_ok=True,
                )
            except _Unimplemented:
                self._allocatable_supported = False
            else:
                allocatable = tuple(
                    device_id
                    for devices in answer.devices
                    if self.is_gpu_resource(devices.resource_name)
                    for device_id in devices.device_ids
                )
        return PodResourcesSnapshot(
            allocations=self._allocations(listed),
            allocatable=allocatable,
            pods_seen=len(listed.pod_resources),
            dynamic=self._dynamic(listed),
        )

    async def _check_socket(self) -> tuple[int, int]:
        """Fail without any gRPC work when the kubelet's socket is not there."""
        try:
            st = os.stat(self._socket_path)
        except FileNotFoundError:
            await self.close()  # the kubelet is gone: its next socket gets a fresh channel
            raise PodResourcesUnavailable(
                f"kubelet pod-resources socket {self._socket_path} does not exist "
                "(kubelet not running, or its pod-resources directory not mounted)"
            ) from None
        except OSError as exc:
            raise PodResourcesUnavailable(
                f"kubelet pod-resources socket {self._socket_path}: {exc.strerror or exc}"
            ) from None
        if not stat.S_ISSOCK(st.st_mode):
            raise PodResourcesUnavailable(f"kubelet pod-resources path {self._socket_path} is not a socket")
        return (st.st_dev, st.st_ino)

    async def _connection(self, grpc: Any, api_pb2_grpc: Any, inode: tuple[int, int]
                          ) -> tuple[_Channel, bool]:
        """The channel to the kubelet, and whether it was dialled just now."""
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and (conn.loop is not loop or conn.inode != inode):
            # A restarted kubelet makes a new socket file; a channel is bound to the loop it was made on.
            self._conn = None
            await _close_channel(conn)
            conn = None
        if conn is None:
            channel = grpc.aio.insecure_channel(
                self._target,
                options=[
                    ("grpc.max_receive_message_length", self._max_message_bytes),
                    ("grpc.enable_http_proxy", 0),
                    # its own subchannels: gRPC shares them between channels to one target by default, so
                    # the channel made afresh after a refused connection could inherit the old one in its
                    # reconnect back-off and fail at once with the old error (seen when a kubelet restarts)
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            conn = _Channel(channel, api_pb2_grpc.PodResourcesListerStub(channel), loop, inode)
            self._conn = conn
            return conn, True
        return conn, False

    async def _call(
        self, grpc: Any, conn: _Channel, method: str, request: Any, *, unimplemented_ok: bool = False,
        stale_ok: bool = False,
    ) -> Any:
        """One call; ``stale_ok``: on a channel kept from an earlier fetch, UNAVAILABLE raises ``_Stale``
        (the channel dropped) so that the caller dials once more: a kubelet that restarted within the
        filesystem's clock tick can make its new socket under the old one's inode, and the old connection
        then fails its first call ("Stream removed", a broken pipe) although the kubelet is serving."""
        try:
            return await getattr(conn.stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            if code == grpc.StatusCode.UNIMPLEMENTED and unimplemented_ok:
                raise _Unimplemented from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # Never keep a channel sitting in reconnect back-off: the next fetch() dials afresh.
                await self._drop(conn)
            if code == grpc.StatusCode.UNAVAILABLE and stale_ok:
                raise _Stale from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PodResourcesUnavailable(
                    f"kubelet pod-resources {method} at {self._target}: deadline of {self._timeout:g} s "
                    f"exceeded (DEADLINE_EXCEEDED: {details})"
                ) from None
            name = code.name if code is not None else "UNKNOWN"
            raise PodResourcesUnavailable(
                f"kubelet pod-resources {method} at {self._target} failed: {name}: {details}"
            ) from None

    async def _drop(self, conn: _Channel) -> None:
        if self._conn is conn:
            self._conn = None
        await _close_channel(conn)

    def _allocations(self, listed: Any) -> tuple[DeviceAllocation, ...]:
        out: list[DeviceAllocation] = []
        for pod in listed.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not self.is_gpu_resource(devices.resource_name):
                        continue
                    numa = tuple(node.ID for node in devices.topology.nodes)
                    for device_id in devices.device_ids:
                        parsed = parse_device_id(device_id)
                        out.append(
                            DeviceAllocation(
                                namespace=pod.namespace,
                                pod=pod.name,
                                container=container.name,
                                resource_name=devices.resource_name,
                                device_id=device_id,
                                gpu_uuid=parsed.gpu_uuid,
                                mig_uuid=parsed.mig_uuid,
                                replica=parsed.replica,
                                numa_nodes=numa,
                            )
                        )
        return tuple(out)

    def _dynamic(self, listed: Any) -> tuple[DynamicAllocation, ...]:
        """The DRA devices of the GPU drivers; a claim resource without a device name (not a device) and
        other drivers' devices are left out."""
        if not self._dra_drivers:
            return ()
        out: list[DynamicAllocation] = []
        for pod in listed.pod_resources:
            for container in pod.containers:
                for claim in container.dynamic_resources:
                    for resource in claim.claim_resources:
                        if resource.driver_name not in self._dra_drivers or not resource.device_name:
                            continue
                        out.append(
                            DynamicAllocation(
                                namespace=pod.namespace,
                                pod=pod.name,
                                container=container.name,
                                claim_namespace=claim.claim_namespace or pod.namespace,
                                claim_name=claim.claim_name,
                                driver=resource.driver_name,
                                pool=resource.pool_name,
                                device=resource.device_name,
                                cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices),
                                share_id=resource.share_id if resource.HasField("share_id") else None,
                            )
                        )
        return tuple(out)


class _Unimplemented(Exception):
    pass


class _Stale(Exception):
    """UNAVAILABLE on a channel kept from an earlier fetch (dropped already): worth one fresh dial."""


def _import_grpc() -> tuple[Any, Any, Any]:
    """grpc and the generated modules, imported on first use only (about 20 MiB of RSS)."""
    try:
        import grpc
        import grpc.aio

        from gpuagent.pods.kubelet import api_pb2, api_pb2_grpc
    except ImportError as exc:
        raise PodResourcesUnavailable(f"gRPC support is not installed (grpcio, protobuf): {exc}") from None
    return grpc, api_pb2, api_pb2_grpc


async def _close_channel(conn: _Channel) -> None:
    """Close a channel made on this loop; one made on a loop that is gone is left to the collector."""
    try:
        if conn.loop is asyncio.get_running_loop():
            await conn.channel.close()
    except Exception as exc:  # a failed close must not hide the error that made us close
        log.debug("closing the pod-resources channel failed: %s", exc)
