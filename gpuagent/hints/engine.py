"""``HintsEngine``: a snapshot in, the node's ``NodeHints`` out.

Stateful only for the SM utilization averages: two exponentially weighted moving averages per GPU, by
elapsed time (``alpha = 1 - exp(-dt / tau)``), with time constants of 10 s (short: what runs now) and
5 min (long: what a new tenant will share the GPU with). The first reading of a GPU starts both at it.

Per GPU, from the snapshot alone:

- ``memory_free_bytes``: total, less the driver's reserve, less what each tenant holds or was promised
  (the larger of its use and its ``gpu-memory`` limit), less what unattributed processes use; on a MIG
  GPU, the memory of idle instances and of the part not partitioned. 0 when the GPU is unhealthy.
- ``schedulable_share_ratio``: 1 less the larger of the tenants' share limits (summed) and the GPU's
  long-average SM use; 0 for a GPU a pod holds exclusively or an unhealthy one; on a MIG GPU, the slices
  of idle instances and of the part not partitioned. On an MPS GPU, 1 less what its tenants were promised
  in SMs: each tenant's MPS active-thread share, else its share limit, else (an MPS client MPS does not
  cap can take every SM) its measured share of the SMs now. The GPU's time-based utilization says nothing
  there: MPS clients run side by side, each on its part of the SMs.
"""

from __future__ import annotations

import math

from gpuagent.hints.nodeindex import MIG_SLICES
from gpuagent.hints.tenants import gpu_tenants, node_limits, pods_by_gpu, sharing_mode
from gpuagent.snapshot.gpu import GpuSample, Health
from gpuagent.snapshot.hints import (
    GpuHints,
    LinkHint,
    MigInstanceHint,
    MigProfileHint,
    NetworkHints,
    NodeHints,
    PodNetworkHint,
    TenantHint,
)
from gpuagent.snapshot.network import NetworkState
from gpuagent.snapshot.node import NodeSnapshot

SHORT_SECONDS = 10.0
LONG_SECONDS = 300.0
_NODE_LINK_KINDS = ("physical", "infiniband", "bond")


class _Average:
    """One GPU's two moving averages."""

    __slots__ = ("at", "long", "short")

    def __init__(self, value: float, at: float) -> None:
        self.short = value
        self.long = value
        self.at = at

    def update(self, value: float, at: float, short_tau: float, long_tau: float) -> None:
        dt = max(0.0, at - self.at)
        self.short += (value - self.short) * (1.0 - math.exp(-dt / short_tau))
        self.long += (value - self.long) * (1.0 - math.exp(-dt / long_tau))
        self.at = at


def sm_util_ratio(gpu: GpuSample) -> float | None:
    """The GPU's SM use now (0-1): NVML's utilization, else (MIG) its instances' GPM SM activity weighted by
    their slices, else the GPU's GPM SM activity; None when nothing reports it."""
    if gpu.gpu_util_percent is not None:
        return min(1.0, max(0.0, gpu.gpu_util_percent / 100))
    if gpu.migs and all(m.profiling and m.profiling.sm_active_ratio is not None for m in gpu.migs):
        return min(1.0, sum(m.slice_fraction * m.profiling.sm_active_ratio for m in gpu.migs))  # type: ignore[union-attr,operator]
    if gpu.profiling is not None and gpu.profiling.sm_active_ratio is not None:
        return gpu.profiling.sm_active_ratio
    return None


class HintsEngine:
    """Turns each snapshot into ``NodeHints``; keeps the moving averages between snapshots."""

    def __init__(self, short_seconds: float = SHORT_SECONDS, long_seconds: float = LONG_SECONDS) -> None:
        if not 0 < short_seconds <= long_seconds:
            raise ValueError(f"expected 0 < short_seconds <= long_seconds: {short_seconds}, {long_seconds}")
        self.short_seconds = short_seconds
        self.long_seconds = long_seconds
        self._averages: dict[str, _Average] = {}

    def _average(self, gpu: GpuSample, now: float) -> tuple[float | None, float | None, float | None]:
        value = sm_util_ratio(gpu) if gpu.health is Health.OK and not gpu.stale else None
        average = self._averages.get(gpu.info.uuid)
        if value is None:
            return None, None, None
        if average is None:
            average = self._averages[gpu.info.uuid] = _Average(value, now)
        else:
            average.update(value, now, self.short_seconds, self.long_seconds)
        return value, average.short, average.long

    def update(self, snapshot: NodeSnapshot) -> NodeHints:
        now = snapshot.taken_at_monotonic
        limits = node_limits(snapshot)
        by_bus = {g.info.pci_bus_id.upper(): g.info.uuid for g in snapshot.gpus if g.info.pci_bus_id}
        allocated = pods_by_gpu(snapshot.pods)
        faults = gpu_faults(snapshot)
        gpus = []
        for gpu in snapshot.gpus:
            util, short, long = self._average(gpu, now)
            tenants = gpu_tenants(snapshot, gpu, limits, allocated)
            gpus.append(_gpu_hints(gpu, tenants, util, short, long, by_bus, faults.get(gpu.info.uuid)))
        present = {g.info.uuid for g in snapshot.gpus}
        for uuid in set(self._averages) - present:  # a GPU gone from the node: forget its averages
            del self._averages[uuid]
        healthy = [g for g in gpus if g.health == Health.OK.value]
        return NodeHints(
            hostname=snapshot.hostname,
            taken_at_unix=snapshot.taken_at_unix,
            gpus=tuple(gpus),
            gpu_count=len(gpus),
            healthy_gpu_count=len(healthy),
            free_gpu_count=sum(1 for g in healthy if not g.mig_enabled and not g.tenants and not g.stale),
            memory_total_bytes=sum(g.memory_total_bytes or 0 for g in gpus),
            memory_free_bytes=sum(g.memory_free_bytes for g in gpus),
            schedulable_share_gpus=round(sum(g.schedulable_share_ratio for g in gpus), 6),
            stale=snapshot.stale,
            short_window_seconds=self.short_seconds,
            long_window_seconds=self.long_seconds,
            network=network_hints(snapshot.network),
        )


def gpu_faults(snapshot: NodeSnapshot) -> dict[str, tuple[str, str]]:
    """GPU UUID -> (severity, reason) of its worst degraded or fatal fault, by the health classification
    (``snapshot.health``; empty with health off): such a GPU is not offered to new work."""
    out: dict[str, tuple[str, str]] = {}
    health = snapshot.health
    for f in health.faults if health is not None else ():
        if f.gpu_uuid is None or f.severity not in ("degraded", "fatal"):
            continue
        if f.gpu_uuid not in out or (out[f.gpu_uuid][0], f.severity) == ("degraded", "fatal"):
            out[f.gpu_uuid] = (f.severity, f.reason)
    return out


def _gpu_hints(
    gpu: GpuSample,
    tenants: tuple[TenantHint, ...],
    util: float | None,
    short: float | None,
    long: float | None,
    by_bus: dict[str, str],
    fault: tuple[str, str] | None = None,
) -> GpuHints:
    info = gpu.info
    healthy = gpu.health is Health.OK and fault is None
    mode = sharing_mode(gpu, tenants)
    instances = _mig_instances(gpu, tenants) if info.mig_enabled else ()
    profiles = _free_profiles(gpu, instances) if info.mig_enabled and healthy else ()
    if info.mig_enabled:
        share, free = _mig_capacity(gpu, instances, profiles)
    else:
        share, free = _shared_capacity(gpu, tenants, mode, long if long is not None else util)
    return GpuHints(
        uuid=info.uuid,
        index=info.index,
        model=info.name,
        health=fault[0] if fault is not None and gpu.health is Health.OK else gpu.health.value,
        pci_bus_id=info.pci_bus_id,
        numa_node=info.numa_node,
        memory_total_bytes=info.memory_total_bytes,
        memory_used_bytes=gpu.memory_used_bytes,
        memory_allocated_bytes=sum(t.memory_limit_bytes or 0 for t in tenants),
        memory_free_bytes=free if healthy else 0,
        sm_util_ratio=_rounded(util),
        sm_util_short_ratio=_rounded(short),
        sm_util_long_ratio=_rounded(long),
        schedulable_share_ratio=round(share, 6) if healthy else 0.0,
        sharing_mode=mode,
        compute_mode=info.compute_mode,
        mig_enabled=info.mig_enabled,
        tenants=tenants,
        mig_instances=instances,
        free_mig_profiles=profiles,
        nvlink_peers=tuple(by_bus.get(bus.upper(), bus) for bus in info.nvlink_peers),
        stale=gpu.stale,
        fault=fault[1] if fault is not None else None,
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _shared_capacity(
    gpu: GpuSample, tenants: tuple[TenantHint, ...], mode: str, util: float | None
) -> tuple[float, int]:
    total = gpu.info.memory_total_bytes or 0
    committed = sum(max(t.memory_limit_bytes or 0, t.memory_used_bytes) for t in tenants)
    free = total - (gpu.memory_reserved_bytes or 0) - committed
    if gpu.memory_free_bytes is not None:
        free = min(free, gpu.memory_free_bytes)  # never more than the driver has
    if mode == "exclusive":
        return 0.0, 0
    if mode == "mps":
        share = 1.0 - sum(_mps_promise(t) for t in tenants)
        return min(1.0, max(0.0, share)), max(0, free)
    promised = sum(t.share_ratio or 0.0 for t in tenants)
    share = 1.0 - max(promised, util or 0.0)
    return min(1.0, max(0.0, share)), max(0, free)


def _mps_promise(tenant: TenantHint) -> float:
    """What an MPS GPU's tenant holds of its SMs (see the module docstring)."""
    for held in (tenant.mps_active_thread_ratio, tenant.share_ratio, tenant.sm_util_ratio):
        if held is not None:
            return held
    return 0.0


def _mig_instances(gpu: GpuSample, tenants: tuple[TenantHint, ...]) -> tuple[MigInstanceHint, ...]:
    holders: dict[str, list[str]] = {}
    for tenant in tenants:
        if tenant.mig_instance is not None:
            holders.setdefault(tenant.mig_instance, []).append(tenant.name)
    return tuple(
        MigInstanceHint(
            uuid=m.uuid,
            profile=m.profile,
            gpu_instance_id=m.gpu_instance_id,
            slice_ratio=round(m.slice_fraction, 6),
            memory_total_bytes=m.memory_total_bytes,
            memory_used_bytes=m.memory_used_bytes,
            tenants=tuple(holders.get(m.uuid, ())),
            idle=not holders.get(m.uuid) and not m.processes,
        )
        for m in gpu.migs
    )


def _mig_capacity(
    gpu: GpuSample, instances: tuple[MigInstanceHint, ...], profiles: tuple[MigProfileHint, ...]
) -> tuple[float, int]:
    """Idle instances, plus the most that new instances of one profile could take (NVML's remaining
    capacity); without capacity figures from NVML, the part not partitioned."""
    idle = [i for i in instances if i.idle]
    share = sum(i.slice_ratio for i in idle)
    memory = sum(i.memory_total_bytes or 0 for i in idle)
    if gpu.info.mig_profiles:
        share += max((p.creatable_count * p.slice_count / MIG_SLICES for p in profiles), default=0.0)
        memory += max((p.creatable_count * (p.memory_bytes or 0) for p in profiles), default=0)
    else:
        share += max(0.0, 1.0 - sum(i.slice_ratio for i in instances))
        partitioned = sum(i.memory_total_bytes or 0 for i in instances)
        memory += max(0, (gpu.info.memory_total_bytes or 0) - (gpu.memory_reserved_bytes or 0) - partitioned)
    return min(1.0, share), memory


def _free_profiles(gpu: GpuSample, instances: tuple[MigInstanceHint, ...]) -> tuple[MigProfileHint, ...]:
    idle: dict[str, list[str]] = {}
    for instance in instances:
        if instance.idle:
            idle.setdefault(instance.profile, []).append(instance.uuid)
    out = []
    seen = set()
    for capacity in gpu.info.mig_profiles:
        seen.add(capacity.profile)
        if capacity.remaining_count or capacity.profile in idle:
            out.append(MigProfileHint(
                profile=capacity.profile,
                slice_count=capacity.slice_count,
                memory_bytes=capacity.memory_bytes,
                creatable_count=capacity.remaining_count,
                idle_instances=tuple(idle.get(capacity.profile, ())),
            ))
    for profile, uuids in idle.items():  # NVML did not list the profile (older driver): idle ones still count
        if profile not in seen:
            sample = next(i for i in instances if i.profile == profile)
            out.append(MigProfileHint(
                profile=profile, slice_count=_slices(profile), memory_bytes=sample.memory_total_bytes,
                creatable_count=0, idle_instances=tuple(uuids),
            ))
    return tuple(out)


def _slices(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def network_hints(network: NetworkState | None) -> NetworkHints | None:
    """The node's links and RDMA ports summarised; None when the network source is off or failed."""
    if network is None or network.error:
        return None
    up = [link for link in network.links if link.oper_state == "up" and link.kind in _NODE_LINK_KINDS]
    speeds = [link.speed_bits_per_second for link in up if link.speed_bits_per_second]
    active = [port for port in network.rdma if port.state == "active"]
    return NetworkHints(
        links_up=len(up),
        fastest_link_bits_per_second=max(speeds) if speeds else None,
        rx_bytes_per_second=round(sum(link.rx_bytes_per_second or 0.0 for link in up), 3),
        tx_bytes_per_second=round(sum(link.tx_bytes_per_second or 0.0 for link in up), 3),
        rdma_ports_active=len(active),
        rdma_rate_bits_per_second=sum(port.rate_bits_per_second or 0 for port in active),
        links=tuple(
            LinkHint(link.name, link.kind, link.oper_state, link.speed_bits_per_second,
                     _rate(link.rx_bytes_per_second), _rate(link.tx_bytes_per_second))
            for link in network.links
        ),
        pods=tuple(
            PodNetworkHint(pod.pod, pod.namespace, _rate(pod.rx_bytes_per_second),
                           _rate(pod.tx_bytes_per_second))
            for pod in network.pods
        ),
    )


def _rate(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
