"""The device taints a DRA driver publishes in its ResourceSlices, read defensively, and the GPUs they are on.

KEP-5055 (DRA device taints) lets a driver mark a device in its ResourceSlice (``spec.devices[].taints``,
``resource.k8s.io`` v1beta2 and v1 alike: ``key``, ``value``, ``effect`` and ``timeAdded``): ``NoSchedule``
keeps new claims off it, ``NoExecute`` also evicts the pods using it, ``None`` only informs; an effect a
consumer does not know counts as ``None``. NVIDIA's DRA driver publishes its health checks this way
(``gpu.nvidia.com/xid=<code>`` NoSchedule for a critical XID, ``None`` for an application XID;
``gpu.nvidia.com/gpu-lost`` NoSchedule; ``gpu.nvidia.com/unmonitored`` None). docs/health.md has the
sources and what the agent makes of each effect.

The slice is input from outside: one taint of a bad shape is left out with an error naming the slice, the
device and what was wrong, never the rest of the slice. A tainted device is put on its GPU by its UUID
attributes, as the resolver maps devices (a MIG device by its ``parentUUID``); a device naming no GPU of this
node is reported, not guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuagent.snapshot.pods import DraTaint

MAX_TAINTS = 16  # KEP-5055: at most 16 taints on one device; more is a malformed slice
MAX_FIELD_CHARS = 317  # a qualified label name: a 253-character prefix, "/", a 63-character name
EFFECTS = ("None", "NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One taint of one device as the slice says it (``effect`` as written: an unknown one counts as None)."""

    key: str
    value: str = ""
    effect: str = "None"
    time_added: str | None = None  # RFC 3339, as the API server wrote it


def parse_taints(raw: Any) -> tuple[tuple[DeviceTaint, ...], tuple[str, ...]]:
    """``spec.devices[].taints`` as decoded JSON -> (its well-formed taints, an error for each one left out).
    None (no taints) is no error."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        return (), (f"taints is a {type(raw).__name__}, not a list",)
    taints: list[DeviceTaint] = []
    errors: list[str] = []
    if len(raw) > MAX_TAINTS:
        errors.append(f"{len(raw)} taints, more than {MAX_TAINTS}: the first {MAX_TAINTS} are read")
    for position, item in enumerate(raw[:MAX_TAINTS]):
        taint, problem = _taint(item)
        if taint is not None:
            taints.append(taint)
        else:
            errors.append(f"taint {position}: {problem}")
    return tuple(taints), tuple(errors)


def _taint(item: Any) -> tuple[DeviceTaint | None, str]:
    if not isinstance(item, dict):
        return None, f"a {type(item).__name__}, not an object"
    fields: dict[str, str | None] = {}
    for name in ("key", "value", "effect", "timeAdded"):
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            return None, f"{name} is a {type(value).__name__}, not a string"
        if value is not None and (len(value) > MAX_FIELD_CHARS or not value.isprintable()):
            return None, f"{name} is not a label-like string ({len(value)} characters)"
        fields[name] = value
    if not fields["key"]:
        return None, "no key"
    if not fields["effect"]:
        return None, "no effect"
    return DeviceTaint(fields["key"] or "", fields["value"] or "", fields["effect"] or "",
                       fields["timeAdded"] or None), ""


def tainted_gpus(
    devices: Iterable[tuple[tuple[str, str, str], Any]], gpu_uuids: Iterable[str],
) -> tuple[tuple[DraTaint, ...], tuple[str, ...]]:
    """Every taint of the slices' devices on the GPU it falls on, and a problem for each tainted device that
    names no GPU of this node. ``devices``: ((driver, pool, device), SliceDevice) pairs."""
    known = frozenset(gpu_uuids)
    out: list[DraTaint] = []
    problems: list[str] = []
    for (driver, pool, name), device in devices:
        if not device.taints:
            continue
        gpu, mig = _gpu_of(device)
        where = f"{driver}/{pool}/{name}"
        if gpu is None:
            problems.append(f"{where}: tainted, but its slice gives no GPU UUID")
            continue
        if gpu not in known:
            problems.append(f"{where}: tainted, but its GPU {gpu} is not on this node")
            continue
        for t in device.taints:
            out.append(DraTaint(driver=driver, pool=pool, device=name, key=t.key, value=t.value,
                                effect=t.effect, time_added=t.time_added, gpu_uuid=gpu, mig_uuid=mig,
                                slice=device.slice))
    return tuple(out), tuple(problems)


def _gpu_of(device: Any) -> tuple[str | None, str | None]:
    """(the GPU, the MIG device) a slice device names by its UUID attributes."""
    uuid, parent = device.uuid, device.parent_uuid
    if parent:
        return parent, uuid if uuid and uuid.startswith("MIG-") else None
    if uuid and uuid.startswith("MIG-"):
        return None, uuid  # a MIG device without its parent: which GPU is not said
    return uuid, None

