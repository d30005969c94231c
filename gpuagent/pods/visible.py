"""Which devices a process was given, and how CUDA numbers them, from its environment.

``NVIDIA_VISIBLE_DEVICES`` is what the NVIDIA container toolkit reads when it starts a container: the
device plugin sets it to the devices it allocated (``GPU-<uuid>``, host indices under
``deviceIDStrategy: index``, ``MIG-<uuid>``, or ``MIG-GPU-<uuid>/<gi>/<ci>`` before driver R470, which
stands for its parent GPU here as it does in the kubelet's allocations). ``all``, ``none``, ``void``,
unset, or a path (the volume-mounts strategy) name no particular device. Devices are keyed as the
attribution keys allocations: a MIG device by its MIG UUID, a GPU by its UUID.

CUDA numbers what a process sees (the MPS memory limit's ``0=1G`` ordinals are these numbers): in PCI
order, which is NVML's index order (CUDA's default FASTEST_FIRST order is the same for GPUs of one model;
for mixed models without ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` the numbering is not known). A container sees
only the devices it was given; a process without a list sees every GPU (not knowable when some GPU is in
MIG mode). ``CUDA_VISIBLE_DEVICES`` then selects and orders among those: indices into them, or UUIDs (a
unique prefix is enough), up to the first entry that names nothing, as CUDA reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuagent.pods.environ import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES
from gpuagent.snapshot.gpu import GpuSample

_NO_LIST = frozenset({"", "all", "none", "void"})


def given_devices(environ: Mapping[str, str], gpus: Sequence[GpuSample]) -> frozenset[str] | None:
    """The devices ``NVIDIA_VISIBLE_DEVICES`` names; None when it names no particular device, or names
    one this node does not have (then nothing can be read from it)."""
    listed = _listed(environ, gpus)
    return None if listed is None else frozenset(listed)


def cuda_devices(environ: Mapping[str, str], gpus: Sequence[GpuSample]) -> tuple[str, ...] | None:
    """The devices the process sees, in CUDA's numbering (device 0 first); None when not knowable."""
    listed = _listed(environ, gpus)
    if listed is None:
        mounted = (environ.get(NVIDIA_VISIBLE_DEVICES) or "").strip().startswith("/")
        if mounted or any(g.info.mig_enabled for g in gpus):
            return None  # a volume-mounts list, or MIG devices nothing names: unknown
        listed = [g.info.uuid for g in gpus]
    order = {key: n for n, key in enumerate(_pci_order(gpus))}
    base = sorted(listed, key=lambda key: order[key])
    names = {g.info.uuid: g.info.name for g in gpus}
    models = {names.get(_parent(key, gpus), "") for key in base}
    if len(models) > 1 and environ.get(CUDA_DEVICE_ORDER, "").strip().upper() != "PCI_BUS_ID":
        return None  # FASTEST_FIRST among different models: an order we cannot know
    selection = environ.get(CUDA_VISIBLE_DEVICES)
    if selection is None:
        return tuple(base)
    out: list[str] = []
    for entry in (e.strip() for e in selection.split(",")):
        key = _selected(entry, base)
        if key is None:
            break  # CUDA's rule: devices after an invalid entry are not visible
        out.append(key)
    return tuple(out)


def _listed(environ: Mapping[str, str], gpus: Sequence[GpuSample]) -> list[str] | None:
    value = environ.get(NVIDIA_VISIBLE_DEVICES)
    if value is None or value.strip().lower() in _NO_LIST or value.strip().startswith("/"):
        return None
    keys: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        key = _device_key(entry, gpus)
        if key is None:
            return None
        if key not in keys:
            keys.append(key)
    return keys


def _device_key(entry: str, gpus: Sequence[GpuSample]) -> str | None:
    """A full device name (host index, GPU or MIG UUID, pre-R470 MIG name) as the node's device key."""
    if entry.isascii() and entry.isdigit():
        return next((g.info.uuid for g in gpus if g.info.index == int(entry)), None)
    if entry.startswith("MIG-GPU-"):
        parent = entry[len("MIG-"):].split("/", 1)[0]
        return parent if any(g.info.uuid == parent for g in gpus) else None
    for gpu in gpus:
        if entry == gpu.info.uuid:
            return entry
        if any(entry == m.uuid for m in gpu.migs):
            return entry
    return None


def _selected(entry: str, base: Sequence[str]) -> str | None:
    """One ``CUDA_VISIBLE_DEVICES`` entry among the devices the process sees."""
    if entry.isascii() and entry.isdigit():
        return base[int(entry)] if int(entry) < len(base) else None
    if entry.startswith(("GPU-", "MIG-")):
        matches = [key for key in base if key.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def _pci_order(gpus: Sequence[GpuSample]) -> list[str]:
    """Every device key, GPUs by NVML index (their PCI order) and each GPU's MIG devices by instance."""
    out: list[str] = []
    for gpu in sorted(gpus, key=lambda g: g.info.index):
        out.append(gpu.info.uuid)
        out.extend(m.uuid for m in sorted(gpu.migs, key=lambda m: m.gpu_instance_id))
    return out


def _parent(key: str, gpus: Sequence[GpuSample]) -> str:
    for gpu in gpus:
        if key == gpu.info.uuid or any(key == m.uuid for m in gpu.migs):
            return gpu.info.uuid
    return key
