"""Who holds or uses each GPU, with what limits: the tenants of the hints.

A tenant is a pod the kubelet allocated the GPU (a whole GPU, ``GPU-…::n`` time-slicing replicas or a MIG
device of it) or any workload whose processes run on it. Limits come from the enforcer's decisions when it
runs (they include config rules and node defaults), else from the pod's ``gpuagent.io/gpu-share`` and
``gpuagent.io/gpu-memory`` annotations, parsed as the enforcer parses them; a value that does not parse
counts as no limit (the enforcer reports it). On an MPS GPU a tenant's clients also carry MPS limits (the
SM share MPS lets them use, the memory it lets them allocate): its memory limit is the smaller of the two,
and its measured use is counted in SMs (``sm_share_ratio``). The MPS server is infrastructure, no tenant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuagent.quantities import PolicyValueError, parse_memory, parse_share
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.hints import TenantHint
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import (
    MPS_CLIENT,
    MPS_SERVER,
    ProcessSample,
    combined_mps_limits,
    sm_share_ratio,
)

ANNOTATION_SHARE = "gpuagent.io/gpu-share"
ANNOTATION_MEMORY = "gpuagent.io/gpu-memory"
UNATTRIBUTED = "unattributed"


def tenant_name(name: str, namespace: str | None) -> str:
    """"namespace/name" for a pod, as ``/v1/state`` and the enforcer name it; the name alone otherwise."""
    return f"{namespace}/{name}" if namespace else name


@dataclass(slots=True)
class _Tenant:
    name: str
    kind: str
    allocated: bool = False
    replicas: int = 0
    mig_instance: str | None = None
    memory_used_bytes: int = 0
    sm_percent: float | None = None
    share_ratio: float | None = None
    memory_limit_bytes: int | None = None
    processes: list[ProcessSample] = field(default_factory=list)
    mps_client: bool = False  # one of its processes is an MPS client


@dataclass(frozen=True, slots=True)
class Limits:
    """The share and memory limits of every pod, by tenant name (and GPU UUID for shares)."""

    shares: Mapping[tuple[str, str], float | None] = field(default_factory=dict)  # (tenant, gpu) -> ratio
    memory: Mapping[str, int | None] = field(default_factory=dict)  # tenant -> bytes
    annotated: Mapping[str, tuple[float | None, int | None]] = field(default_factory=dict)


def _share_or_none(value: str | None) -> float | None:
    try:
        return None if value is None else parse_share(value)
    except PolicyValueError:
        return None


def _memory_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else parse_memory(value)
    except PolicyValueError:
        return None


def node_limits(snapshot: NodeSnapshot) -> Limits:
    """What the enforcer decided, else what the pods' annotations say."""
    shares: dict[tuple[str, str], float | None] = {}
    memory: dict[str, int | None] = {}
    if snapshot.enforcement is not None:
        for share in snapshot.enforcement.shares:
            shares[(tenant_name(share.pod, share.namespace), share.gpu_uuid)] = share.limit_ratio
        for state in snapshot.enforcement.memory:
            memory[tenant_name(state.pod, state.namespace)] = state.limit_bytes
    annotated: dict[str, tuple[float | None, int | None]] = {}
    for pod in snapshot.pods:
        if pod.annotations:
            annotated[tenant_name(pod.name, pod.namespace)] = (
                _share_or_none(pod.annotations.get(ANNOTATION_SHARE)),
                _memory_or_none(pod.annotations.get(ANNOTATION_MEMORY)),
            )
    return Limits(shares, memory, annotated)


def pods_by_gpu(pods: Sequence[PodUse]) -> dict[str, list[PodUse]]:
    """GPU UUID -> the pods allocated it, in the snapshot's order: one pass for all of a node's GPUs."""
    out: dict[str, list[PodUse]] = {}
    for pod in pods:
        for uuid in dict.fromkeys(pod.allocated_gpus):
            out.setdefault(uuid, []).append(pod)
    return out


def _allocations(pods: Sequence[PodUse], gpu: GpuSample) -> dict[str, _Tenant]:
    """Pods the kubelet allocated this GPU (or a replica or MIG device of it)."""
    uuid = gpu.info.uuid
    migs = {m.uuid for m in gpu.migs}
    tenants: dict[str, _Tenant] = {}
    for pod in pods:
        if uuid not in pod.allocated_gpus:
            continue
        tenant = _Tenant(tenant_name(pod.name, pod.namespace), "pod", allocated=True)
        for container in pod.containers:
            for device in container.allocated_devices:
                base, _, replica = device.partition("::")
                if base == uuid and replica:
                    tenant.replicas += 1
                elif base in migs:
                    tenant.mig_instance = base
        tenants[tenant.name] = tenant
    return tenants


def _process_tenant(process: ProcessSample) -> tuple[str, str]:
    workload = process.workload
    if workload is None:
        return UNATTRIBUTED, "unknown"
    if workload.kind == "pod":
        return tenant_name(workload.name, workload.namespace), "pod"
    return workload.name, workload.kind


def gpu_tenants(
    snapshot: NodeSnapshot, gpu: GpuSample, limits: Limits,
    allocated: Mapping[str, Sequence[PodUse]] | None = None,
) -> tuple[TenantHint, ...]:
    """The tenants of one GPU, allocated ones first, then by name. ``allocated``: :func:`pods_by_gpu` of
    the snapshot's pods, when the caller asks for every GPU's tenants."""
    pods = snapshot.pods if allocated is None else allocated.get(gpu.info.uuid, ())
    tenants = _allocations(pods, gpu)
    instance_uuid = {m.gpu_instance_id: m.uuid for m in gpu.migs}
    for process in gpu.processes:
        if process.kind == MPS_SERVER:
            continue  # the MPS server serves the tenants; it is not one
        name, kind = _process_tenant(process)
        tenant = tenants.get(name)
        if tenant is None:
            tenant = tenants[name] = _Tenant(name, kind)
        tenant.processes.append(process)
        if process.kind == MPS_CLIENT:
            tenant.mps_client = True
        tenant.memory_used_bytes += process.used_memory_bytes or 0
        share = sm_share_ratio(process)
        if share is not None:
            tenant.sm_percent = (tenant.sm_percent or 0.0) + share * 100
        if process.gpu_instance_id is not None and tenant.mig_instance is None:
            tenant.mig_instance = instance_uuid.get(process.gpu_instance_id)
    out = []
    uuid = gpu.info.uuid
    shares, memories, annotated = limits.shares, limits.memory, limits.annotated
    for tenant in tenants.values():
        name = tenant.name
        share = shares.get((name, uuid))
        memory = memories.get(name)
        annotated_share, annotated_memory = annotated.get(name, _NO_LIMITS)
        # without an MPS client among its processes, MPS limits nothing (combined_mps_limits: None)
        mps = combined_mps_limits(tenant.processes) if tenant.mps_client else None
        mps_threads = mps.active_thread_percent if mps is not None else None
        mps_memory = mps.pinned_memory_limit_bytes if mps is not None else None
        memory = memory if memory is not None else annotated_memory
        out.append(TenantHint(  # positional, in its field order: one per tenant per GPU per poll
            name,
            tenant.kind,
            share if share is not None else annotated_share,
            _smaller(memory, mps_memory),  # what holds it first
            tenant.memory_used_bytes,
            None if tenant.sm_percent is None else min(1.0, tenant.sm_percent / 100),
            tenant.allocated,
            tenant.replicas,
            tenant.mig_instance,
            None if mps_threads is None else mps_threads / 100,
            mps_memory,
        ))
    out.sort(key=_tenant_order)
    return tuple(out)


def _tenant_order(tenant: TenantHint) -> tuple[bool, str]:
    return not tenant.allocated, tenant.name  # allocated ones first, then by name


_NO_LIMITS: tuple[None, None] = (None, None)


def _smaller(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def sharing_mode(gpu: GpuSample, tenants: tuple[TenantHint, ...]) -> str:
    """"mig", "none" (no tenant), "mps" (an MPS server runs), "exclusive" (a pod was allocated the whole
    GPU) or "time_sliced" (replicas, several tenants, or processes nobody was allocated the GPU for)."""
    if gpu.info.mig_enabled:
        return "mig"
    if any(p.kind == MPS_SERVER for p in gpu.processes):
        return "mps"
    if not tenants:
        return "none"
    if any(t.allocated and t.replicas == 0 and t.mig_instance is None for t in tenants):
        return "exclusive"  # the kubelet gave a pod the whole GPU: nobody else is scheduled onto it
    return "time_sliced"
