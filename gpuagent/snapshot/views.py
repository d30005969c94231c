"""The snapshot as the API shows it: any part of the model as plain JSON types (:func:`to_jsonable`), and
the pod -> GPUs / GPU -> pods allocation view of ``/v1/state`` (:func:`allocation_view`).
Functions over the model, not part of it: they read a snapshot and build nothing the agent keeps, so they
sit above :mod:`.node` and nothing in the model imports them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import DraDevice


def to_jsonable(value: Any) -> Any:
    """A snapshot (or any part of it) as plain JSON types, enums by value, mappings with string keys; a
    mapping keyed by pairs (``actions_total``'s (action, outcome)) nested by them,
    ``{"freeze": {"audit": 3}}``, never the text of a Python tuple."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        if value and all(isinstance(k, tuple) and len(k) == 2 for k in value):
            nested: dict[str, dict[str, Any]] = {}
            for (outer, inner), v in value.items():
                nested.setdefault(str(outer), {})[str(inner)] = to_jsonable(v)
            return nested
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def allocation_view(snapshot: NodeSnapshot) -> dict[str, Any]:
    """Pod -> GPUs and GPU -> pods, allocated (kubelet) next to used (NVML), for ``/v1/state``."""
    gpus: dict[str, dict[str, Any]] = {
        g.info.uuid: {
            "index": g.info.index,
            "allocated_to": [],
            "used_by": [],
            "memory_used_bytes": g.memory_used_bytes,
            "memory_total_bytes": g.info.memory_total_bytes,
        }
        for g in snapshot.gpus
    }
    pods: dict[str, dict[str, Any]] = {}
    for pod in snapshot.pods:
        key = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
        pods[key] = {
            "uid": pod.uid,
            "names_from": pod.names_from,
            "allocated_gpus": list(pod.allocated_gpus),
            "used_gpus": list(pod.used_gpus),
            "unallocated_use": list(pod.unallocated_use),
            "gpu_memory_used_bytes": pod.gpu_memory_used_bytes,
            "sm_util_percent": pod.sm_util_percent,
            "process_count": pod.process_count,
            "containers": {c.name: list(c.allocated_devices) for c in pod.containers},
        }
        claims = _claims_of(snapshot.dra, pod.namespace, pod.name)
        if claims:
            pods[key]["claims"] = claims
        for uuid in pod.allocated_gpus:
            if uuid in gpus:
                gpus[uuid]["allocated_to"].append(key)
        for uuid in pod.used_gpus:
            if uuid in gpus:
                gpus[uuid]["used_by"].append(key)
    return {"pods": pods, "gpus": gpus}


def _claims_of(devices: tuple[DraDevice, ...], namespace: str | None, pod: str) -> dict[str, list[dict]]:
    """A pod's ResourceClaims (DRA) -> their devices, for the allocation view."""
    claims: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        if d.namespace == namespace and d.pod == pod:
            entry = {"container": d.container, "driver": d.driver, "pool": d.pool, "device": d.device,
                     "uuid": d.mig_uuid or d.gpu_uuid, "mapped_by": d.mapped_by}
            if d.problem:
                entry["problem"] = d.problem
            claims.setdefault(d.claim, []).append(entry)
    return claims
