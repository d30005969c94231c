"""The kubelet's DRA devices as the allocations attribution already takes, and the ones that cannot be.

Each :class:`~gpuagent.pods.podresources.DynamicAllocation` (a container, a claim, a driver's device) is
resolved to a GPU or MIG UUID, in this order:

1. the device's ResourceSlice entry (``uuid``, and ``parentUUID`` for MIG), when the API server is used;
2. its CDI devices in the node's spec files: the ``/dev/nvidia<minor>`` node names the GPU by its minor
   number; the ``/dev/nvidia-caps/nvidia-cap<N>`` nodes of a MIG device name its GPU and compute instances
   (through the driver's ``mig-minors`` table); else ``NVIDIA_VISIBLE_DEVICES`` may list one UUID.

A device neither names is not mapped: it gets no allocation, and its
:class:`~gpuagent.snapshot.pods.DraDevice` says why (the reasons of every source tried). A resolved device
becomes a :class:`~gpuagent.pods.podresources.DeviceAllocation` whose device id is the UUID (``GPU-…`` a whole
GPU, ``MIG-…`` its instance), so attribution, labels, accounting and hints treat it exactly as the device
plugin's. A device held by several containers (one claim shared by pods or containers, or shares of a device
with consumable capacity) is given as replicas ``<uuid>::<k>``, k by holder, so each holds 1/N of it, as
time-slicing replicas do.

Everything here is pure (no I/O): the CDI index and the MIG minors table are read by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuagent.pods.dra.cdi import CdiIndex
from gpuagent.pods.dra.nvcaps import CAP_NODE, GPU_NODE, MigCapability
from gpuagent.pods.dra.slices import DeviceKey, SliceDevice
from gpuagent.pods.podresources import DeviceAllocation, DynamicAllocation, parse_device_id
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.pods import DraDevice

MAPPED_BY_SLICE = "resource_slice"
MAPPED_BY_CDI = "cdi"


@dataclass(frozen=True, slots=True)
class Resolved:
    """Which GPU (and MIG instance) one DRA device is, and how that was known; or why it is not known."""

    gpu_uuid: str | None = None
    mig_uuid: str | None = None
    mapped_by: str | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class DraMapping:
    allocations: tuple[DeviceAllocation, ...] = ()  # the mapped devices, as device-plugin allocations
    devices: tuple[DraDevice, ...] = ()  # every DRA device, mapped or not

    @property
    def unmapped(self) -> tuple[DraDevice, ...]:
        return tuple(d for d in self.devices if d.mapped_by is None)


@dataclass(frozen=True, slots=True)
class _Place:
    uuid: str
    migs: Mapping[int, tuple[int | None, str]]  # GPU instance id -> (compute instance id, MIG UUID)


class Places:
    """Where the GPUs are: by minor number, and each MIG UUID's parent, from one poll's samples."""

    def __init__(self, gpus: Sequence[GpuSample]) -> None:
        self.by_minor: dict[int, _Place] = {}
        self.parent_of: dict[str, str] = {}
        for gpu in gpus:
            migs = {m.gpu_instance_id: (m.compute_instance_id, m.uuid) for m in gpu.migs}
            if gpu.info.minor_number is not None:
                self.by_minor[gpu.info.minor_number] = _Place(gpu.info.uuid, migs)
            for mig in gpu.migs:
                self.parent_of[mig.uuid] = gpu.info.uuid

    def signature(self) -> tuple[object, ...]:
        return tuple(sorted((m, p.uuid, tuple(sorted(p.migs.items()))) for m, p in self.by_minor.items()))


def cap_minors(devices: Iterable[DynamicAllocation], cdi: CdiIndex) -> set[int]:
    """The MIG capability minors the CDI devices of ``devices`` name (the table must list them)."""
    out: set[int] = set()
    for d in devices:
        for name in d.cdi_devices:
            found = cdi.devices.get(name)
            for path in found.device_nodes if found is not None else ():
                match = CAP_NODE.match(_dev_part(path))
                if match:
                    out.add(int(match.group(1)))
    return out


def map_devices(
    dynamic: Sequence[DynamicAllocation],
    places: Places,
    *,
    slices: Mapping[DeviceKey, SliceDevice] | None = None,
    cdi: CdiIndex | None = None,
    caps: Mapping[int, MigCapability] | None = None,
    caps_error: str = "",
) -> DraMapping:
    """Every DRA device resolved (``slices`` None: the API server is not used or not listed yet; ``cdi``
    None: no spec directory configured), with the allocations of those that map."""
    resolved: dict[tuple[DeviceKey, tuple[str, ...]], Resolved] = {}
    holders: dict[str, list[tuple[str, str, str]]] = {}  # UUID -> the distinct containers holding it
    results: list[tuple[DynamicAllocation, Resolved]] = []
    for d in dynamic:
        key = ((d.driver, d.pool, d.device), d.cdi_devices)
        r = resolved.get(key)
        if r is None:
            r = resolved[key] = resolve(d, places, slices=slices, cdi=cdi, caps=caps, caps_error=caps_error)
        results.append((d, r))
        uuid = r.mig_uuid or r.gpu_uuid
        if uuid is not None:
            holder = (d.namespace, d.pod, d.container)
            taken = holders.setdefault(uuid, [])
            if holder not in taken:
                taken.append(holder)
    rank = {uuid: {h: k for k, h in enumerate(sorted(hs))} for uuid, hs in holders.items() if len(hs) > 1}
    allocations: list[DeviceAllocation] = []
    devices: list[DraDevice] = []
    placed: set[tuple[str, str, str, str]] = set()
    for d, r in results:
        uuid = r.mig_uuid or r.gpu_uuid
        device_id = None
        if uuid is not None:
            holder = (d.namespace, d.pod, d.container)
            k = rank.get(uuid, {}).get(holder)
            device_id = uuid if k is None else f"{uuid}::{k}"
            if (*holder, device_id) not in placed:  # the same device through two claims: held once
                placed.add((*holder, device_id))
                parsed = parse_device_id(device_id)
                allocations.append(DeviceAllocation(
                    namespace=d.namespace, pod=d.pod, container=d.container, resource_name=d.driver,
                    device_id=device_id, gpu_uuid=parsed.gpu_uuid, mig_uuid=parsed.mig_uuid,
                    replica=parsed.replica,
                ))
        devices.append(DraDevice(
            namespace=d.namespace, pod=d.pod, container=d.container, claim=d.claim_name,
            claim_namespace=d.claim_namespace, driver=d.driver, pool=d.pool, device=d.device,
            cdi_devices=d.cdi_devices, share_id=d.share_id, gpu_uuid=r.gpu_uuid, mig_uuid=r.mig_uuid,
            device_id=device_id, mapped_by=r.mapped_by, problem=r.problem,
        ))
    return DraMapping(tuple(allocations), tuple(devices))


def resolve(
    d: DynamicAllocation,
    places: Places,
    *,
    slices: Mapping[DeviceKey, SliceDevice] | None,
    cdi: CdiIndex | None,
    caps: Mapping[int, MigCapability] | None,
    caps_error: str = "",
) -> Resolved:
    """One device: its ResourceSlice first, then its CDI devices; the reasons of both when neither maps."""
    reasons: list[str] = []
    if slices is None:
        reasons.append("no ResourceSlices (the API server is not used, or not listed yet)")
    else:
        entry = slices.get((d.driver, d.pool, d.device))
        if entry is None:
            reasons.append("not in this node's ResourceSlices")
        elif entry.uuid is None:
            reasons.append(f"ResourceSlice {entry.slice} gives it no uuid attribute")
        else:
            found = _from_uuid(entry.uuid, places, entry.parent_uuid, MAPPED_BY_SLICE)
            if found is not None:
                return found
            reasons.append(f"ResourceSlice {entry.slice} gives uuid {entry.uuid!r}, not a GPU- or MIG- UUID")
    if not d.cdi_devices:
        reasons.append("the kubelet names no CDI device for it")
    elif cdi is None:
        reasons.append("no CDI spec directory is configured")
    else:
        found, why = _from_cdi(d.cdi_devices, places, cdi, caps or {}, caps_error)
        if found is not None:
            return found
        reasons.append(why)
    return Resolved(problem="; ".join(reasons))


def _from_uuid(uuid: str, places: Places, parent: str | None, how: str) -> Resolved | None:
    if uuid.startswith("GPU-"):
        return Resolved(gpu_uuid=uuid, mapped_by=how)
    if uuid.startswith("MIG-") and "/" not in uuid:
        return Resolved(gpu_uuid=parent or places.parent_of.get(uuid), mig_uuid=uuid, mapped_by=how)
    return None


def _dev_part(path: str) -> str:
    """``/dev/...`` of a device node path, also when a hostPath puts the driver root first
    (``/run/nvidia/driver/dev/nvidia0``)."""
    at = path.find("/dev/")
    return path[at:] if at >= 0 else path


def _from_cdi(
    names: tuple[str, ...], places: Places, cdi: CdiIndex, caps: Mapping[int, MigCapability], caps_error: str
) -> tuple[Resolved | None, str]:
    found = [cdi.devices[n] for n in names if n in cdi.devices]
    if not found:
        where = ", ".join(cdi.dirs) if cdi.dirs_found else f"{', '.join(cdi.dirs)} (none of them exists)"
        return None, f"CDI device {', '.join(names)} is in no spec under {where}"
    label = ", ".join(f.name for f in found)
    gpu_minors: set[int] = set()
    cap_list: set[int] = set()
    for device in found:
        for path in device.device_nodes:
            node = _dev_part(path)
            if (match := GPU_NODE.match(node)) is not None:
                gpu_minors.add(int(match.group(1)))
            elif (match := CAP_NODE.match(node)) is not None:
                cap_list.add(int(match.group(1)))
    if cap_list:
        return _mig_from_caps(label, gpu_minors, cap_list, places, caps, caps_error)
    if len(gpu_minors) == 1:
        (minor,) = gpu_minors
        place = places.by_minor.get(minor)
        if place is None:
            return None, f"CDI device {label} gives /dev/nvidia{minor}, but no GPU here has that minor number"
        return Resolved(gpu_uuid=place.uuid, mapped_by=MAPPED_BY_CDI), ""
    if len(gpu_minors) > 1:
        nodes = ", ".join(f"/dev/nvidia{m}" for m in sorted(gpu_minors))
        return None, f"CDI device {label} gives {len(gpu_minors)} GPUs ({nodes}): one DRA device is one GPU"
    uuids = sorted({v for device in found for v in device.visible_devices if v.startswith(("GPU-", "MIG-"))})
    if len(uuids) == 1:
        found_uuid = _from_uuid(uuids[0], places, None, MAPPED_BY_CDI)
        if found_uuid is not None:
            return found_uuid, ""
    if len(uuids) > 1:
        return None, f"CDI device {label} makes {len(uuids)} GPUs visible ({', '.join(uuids)})"
    return None, f"CDI device {label} names no GPU device node and no GPU UUID"


def _mig_from_caps(
    label: str, gpu_minors: set[int], minors: set[int], places: Places, caps: Mapping[int, MigCapability],
    caps_error: str,
) -> tuple[Resolved | None, str]:
    known = [caps[m] for m in sorted(minors) if m in caps]
    if len(known) != len(minors):
        missing = ", ".join(f"nvidia-cap{m}" for m in sorted(minors) if m not in caps)
        why = caps_error or "the driver's mig-minors table does not list it"
        return None, f"CDI device {label} gives MIG capability {missing}: {why}"
    instances = {(c.gpu_minor, c.gpu_instance) for c in known}
    if len(instances) != 1:
        return None, f"CDI device {label} gives the capabilities of {len(instances)} MIG instances"
    ((gpu_minor, gpu_instance),) = instances
    if gpu_minors and gpu_minors != {gpu_minor}:
        return None, f"CDI device {label}: its GPU node and its MIG capabilities name different GPUs"
    compute = {c.compute_instance for c in known if c.compute_instance is not None}
    place = places.by_minor.get(gpu_minor)
    if place is None:
        return None, f"CDI device {label} is a MIG device of GPU minor {gpu_minor}, not a GPU here"
    instance = place.migs.get(gpu_instance)
    if instance is None or (compute and instance[0] is not None and instance[0] not in compute):
        ci = f" compute instance {min(compute)}" if compute else ""
        return None, (f"CDI device {label} is GPU instance {gpu_instance}{ci} of GPU minor {gpu_minor}, "
                      "which NVML does not list")
    return Resolved(gpu_uuid=place.uuid, mig_uuid=instance[1], mapped_by=MAPPED_BY_CDI), ""
