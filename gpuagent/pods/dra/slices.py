"""This node's DRA ResourceSlices from the API server: the GPU drivers' devices and their UUIDs.

A DRA driver publishes the devices of each node in ResourceSlices (``resource.k8s.io/v1``, GA in Kubernetes
1.34). NVIDIA's ``gpu.nvidia.com`` names a whole GPU ``gpu-<minor>`` with attributes ``type: gpu`` and
``uuid: GPU-…``, and a MIG device ``gpu-<minor>-mig-<profile id>-<start>-<size>`` with ``type: mig``,
``uuid: MIG-…``, ``parentUUID: GPU-…`` and ``profile: 1g.10gb``. A MIG device the driver creates only when a
claim is prepared (its dynamic MIG mode) has no ``uuid`` yet: the CDI spec maps it then.

The slices are listed and watched like the pods (:class:`gpuagent.reflector.Reflector`, field selector
``spec.nodeName=<node>``), keeping only the configured GPU drivers' devices, of each pool's newest
generation (a driver republishing a pool bumps it; older slices are stale until deleted), with their
device taints (KEP-5055: the driver's own health verdict, :mod:`gpuagent.pods.dra.taints`). RBAC: get,
list and watch on ``resourceslices`` in ``resource.k8s.io``.

``run`` waits until :meth:`ResourceSlices.want` is called: the agent calls it when the kubelet first reports
a DRA GPU device, so a node without DRA pods never asks the API server (nor needs the RBAC) for slices.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace
from typing import Any

from gpuagent.pods.dra.taints import DeviceTaint, parse_taints
from gpuagent.reflector import Reflector, list_decoder

log = logging.getLogger(__name__)

SOURCE = "dra_resource_slices"  # the ``source`` label of gpuagent_source_success
SLICES_PATH = "apis/resource.k8s.io/v1/resourceslices"

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """What a ResourceSlice says of one GPU driver's device."""

    uuid: str | None  # GPU-… or MIG-…; None when the slice gives none (a MIG device not created yet)
    parent_uuid: str | None = None  # the GPU of a MIG device
    type: str | None = None  # "gpu", "mig", ... as the driver says
    profile: str | None = None  # a MIG device's profile, e.g. "1g.10gb"
    slice: str = ""  # the ResourceSlice it was listed in
    taints: tuple[DeviceTaint, ...] = ()  # KEP-5055 device taints (the driver's health, an admin's rule)
    taint_errors: tuple[str, ...] = ()  # each taint of a bad shape, left out


@functools.cache
def _wire() -> SimpleNamespace:
    import msgspec

    attribute = msgspec.defstruct("DeviceAttribute", [
        ("string", str | None, None), ("int", int | None, None), ("bool", bool | None, None),
        ("version", str | None, None),
    ])
    device = msgspec.defstruct("Device", [
        ("name", str, ""), ("attributes", dict[str, attribute] | None, None),  # type: ignore[valid-type]
        ("taints", Any, None),  # checked by pods.dra.taints: a bad taint costs itself, not the slice
    ])
    pool = msgspec.defstruct("ResourcePool", [("name", str, ""), ("generation", int, 0)])
    spec = msgspec.defstruct("ResourceSliceSpec", [
        ("driver", str, ""), ("nodeName", str | None, None),
        ("pool", pool, msgspec.field(default_factory=pool)),
        ("devices", list[device] | None, None),  # type: ignore[valid-type]
    ])
    meta = msgspec.defstruct("ObjectMeta", [("name", str, ""), ("resourceVersion", str, "")])
    resource_slice = msgspec.defstruct("ResourceSlice", [
        ("metadata", meta, msgspec.field(default_factory=meta)),
        ("spec", spec, msgspec.field(default_factory=spec)),
    ])
    return SimpleNamespace(slice=msgspec.json.Decoder(resource_slice),
                           slice_list=list_decoder(resource_slice))


def device_of(slice_name: str, driver: str, device: Any) -> SliceDevice:
    """A decoded device's GPU facts; attribute names are taken bare (``uuid``) or qualified by the driver
    (``gpu.nvidia.com/uuid``)."""
    prefix = driver + "/"
    strings: dict[str, str] = {}
    for name, value in (device.attributes or {}).items():
        if value.string is not None:
            strings[name.removeprefix(prefix)] = value.string
    taints, errors = parse_taints(device.taints)
    return SliceDevice(uuid=strings.get("uuid") or None, parent_uuid=strings.get("parentUUID") or None,
                       type=strings.get("type"), profile=strings.get("profile"), slice=slice_name,
                       taints=taints, taint_errors=errors)


class ResourceSlices(Reflector):
    """Watches this node's ResourceSlices and keeps the GPU drivers' devices by (driver, pool, device)."""

    path = SLICES_PATH
    resource = "resourceslices"
    api_group = "resource.k8s.io"
    what = "DRA ResourceSlices"

    def __init__(
        self, node_name: str, *, drivers: Sequence[str], wanted: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(node_name, log=log, **kwargs)
        if isinstance(drivers, str):
            raise TypeError("drivers must be a sequence of driver names, not a string")
        self._drivers = frozenset(drivers)
        self._slices: dict[str, Any] = {}  # slice name -> decoded slice (GPU drivers only)
        self._devices: Mapping[DeviceKey, SliceDevice] = MappingProxyType({})
        self._wanted = asyncio.Event()
        if wanted:
            self._wanted.set()

    def want(self) -> None:
        """Start listing and watching (``run`` waits for this)."""
        self._wanted.set()

    @property
    def wanted(self) -> bool:
        return self._wanted.is_set()

    def devices(self) -> Mapping[DeviceKey, SliceDevice]:
        """The current view; a new mapping replaces it on every change, so a caller's copy never moves."""
        return self._devices

    async def run(self) -> None:
        await self._wanted.wait()
        await super().run()

    # -- the reflector's hooks --------------------------------------------------------------------------
    def _decode_list(self, body: bytes) -> tuple[list[Any], str]:
        decoded = _wire().slice_list.decode(body)
        return list(decoded.items or ()), decoded.metadata.resourceVersion

    def _decode_object(self, raw: Any) -> Any:
        return _wire().slice.decode(raw)

    def _size(self) -> int:
        return len(self._slices)

    def _replace(self, items: list[Any]) -> None:
        self._slices = {s.metadata.name: s for s in items if s.spec.driver in self._drivers}
        self._rebuild()

    def _put(self, resource_slice: Any) -> None:
        if resource_slice.spec.driver in self._drivers and resource_slice.metadata.name:
            self._slices[resource_slice.metadata.name] = resource_slice
            self._rebuild()

    def _drop(self, resource_slice: Any) -> None:
        if self._slices.pop(resource_slice.metadata.name, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        newest: dict[tuple[str, str], int] = {}
        for s in self._slices.values():
            key = (s.spec.driver, s.spec.pool.name)
            newest[key] = max(newest.get(key, s.spec.pool.generation), s.spec.pool.generation)
        devices: dict[DeviceKey, SliceDevice] = {}
        for s in sorted(self._slices.values(), key=lambda s: s.metadata.name):
            driver, pool = s.spec.driver, s.spec.pool.name
            if s.spec.pool.generation != newest[(driver, pool)]:
                continue  # a stale slice of a pool the driver has republished
            for device in s.spec.devices or ():
                devices[(driver, pool, device.name)] = device_of(s.metadata.name, driver, device)
        if devices != self._devices:
            self._devices = MappingProxyType(devices)
