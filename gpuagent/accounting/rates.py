"""What each workload holds and uses on each GPU at one poll: the rates the ledger integrates.

Rules (``docs/accounting.md`` states them for users):

- **Who.** A process's :class:`~gpuagent.snapshot.processes.Workload`: a pod's container (``kind="pod"``),
  or off Kubernetes a systemd unit, Docker container, Slurm job, session. Processes without a workload (they
  exited before their cgroup was read) are nobody's: their share of the energy is "unattributed".
- **Allocated.** Where the kubelet's allocations are known (the pod-resources source answered, or pods
  carry allocated devices), a pod holds what its containers were allocated: ``GPU-<uuid>`` the whole
  GPU; ``MIG-<uuid>`` the instance's fraction of the GPU's compute slices; a time-slicing/MPS replica
  ``<id>::<n>`` 1/N of its device, N the number of that device's replicas allocated on the node (the
  device plugin's advertised count is not in the snapshot; with every replica in use the two agree, and
  the holders of one GPU then add up to the GPU). Otherwise (off Kubernetes, or no allocations known) a
  workload with a process on a GPU holds it: the whole GPU, or its MIG instance's fraction. A workload
  whose processes there are MPS clients held to a share of the SMs (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``)
  holds that share instead (of its MIG instance's fraction, on MIG): that is what MPS gives it.
- **Busy.** The sum of its processes' SM utilization (NVML's per-process samples), clamped to the GPU; an
  MPS client held to a share of the SMs counts that share of its utilization (``sm_share_ratio``). Alone on
  a whole GPU (no other owner's process there, no MPS client), the GPU's own utilization instead: read every
  poll, it is a per-poll rate the ledger integrates at once, where per-process figures come every few
  seconds and are settled over their own windows (``busy``). Shared, each owner also gets ``busy_estimate``:
  its latest figure, scaled down when the GPU's utilization at this poll is under their sum (the GPU's use
  spread by the latest per-process split), which the ledger counts poll by poll until the reading that
  covers the time settles it (exact for steady loads, no lumps).
  NVML has no per-process utilization on MIG: there the instance's GPM graphics-engine activity (the same
  time-based measure; SM activity when that is absent) times the instance's fraction, shared equally by
  the workloads with processes in it; no GPM (A100 and older) means busy is unknown (``None``), never 0.
- **Memory.** The sum of its processes' used GPU memory.
- **Infrastructure.** The MPS server is nobody's: it is not billed, and its use is not a tenant's.

All quantities are in GPU units (1 = a whole GPU), so MIG slices, replicas and whole GPUs add up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuagent.snapshot.gpu import GpuSample, Health, MigSample
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import (
    MPS_CLIENT,
    MPS_SERVER,
    ProcessSample,
    combined_mps_limits,
    sm_share_ratio,
)

REPLICA_SEPARATOR = "::"


class Owner(NamedTuple):
    """A unit the ledger accounts: a pod's container (``container`` None when its name is unknown), or a
    workload off Kubernetes (``namespace`` and ``container`` None)."""

    kind: str
    namespace: str | None
    name: str
    container: str | None


UNATTRIBUTED = Owner("", None, "", None)  # processes nobody could be named for


@dataclass(slots=True)
class Rate:
    """One owner on one GPU (or MIG instance) at one poll."""

    allocated: float = 0.0  # GPUs held
    busy: float | None = 0.0  # GPUs kept busy; None: unknown
    memory_bytes: float = 0.0
    mps_held: float | None = None  # the share of the GPU MPS gives its clients, which it holds instead
    # shared GPU: its busy now between per-process readings, its latest figure scaled down when the GPU's
    # utilization is under their sum (GPUs); None: not shared (MIG, alone), or a tenant not measured yet
    busy_estimate: float | None = None


@dataclass(slots=True)
class GpuRates:
    """One GPU at one poll: each (owner, MIG instance)'s rate, and the GPU's energy counter."""

    uuid: str
    index: int
    usable: bool  # healthy and fresh: its figures may be integrated
    energy_joules_total: float | None
    energy_read_at_unix: float | None = None  # when the counter was read (it is read every energy_interval)
    power_watts: float | None = None  # weighs the polls between two counter reads
    # when the processes' utilization was read (the busy rates are that reading's averages over its window);
    # None: busy figures are per-poll rates (MIG, from GPM)
    busy_read_at: float | None = None
    profiles: dict[int, str] = field(default_factory=dict)  # MIG GPU-instance ID -> profile
    units: dict[tuple[Owner, int | None], Rate] = field(default_factory=dict)


def poll_rates(snapshot: NodeSnapshot) -> dict[str, GpuRates]:
    """GPU UUID -> its rates at this snapshot."""
    return RateReader().read(snapshot)


class RateReader:
    """:func:`poll_rates` for a caller that reads every poll: the allocations, which change rarely, are
    turned into each GPU's holders again only when the pods' allocated devices or the GPUs' places differ
    from the last poll's."""

    def __init__(self) -> None:
        self._signature: tuple[object, ...] | None = None
        self._by_gpu: dict[str, list[tuple[Owner, int | None, float]]] = {}

    def read(self, snapshot: NodeSnapshot) -> dict[str, GpuRates]:
        known = allocations_known(snapshot)
        signature = _allocation_signature(snapshot) if known else None
        if signature != self._signature:
            by_gpu: dict[str, list[tuple[Owner, int | None, float]]] = defaultdict(list)
            for (owner, uuid, instance), fraction in (pod_allocations(snapshot) if known else {}).items():
                by_gpu[uuid].append((owner, instance, fraction))
            self._signature, self._by_gpu = signature, dict(by_gpu)
        return _rates(snapshot, known, self._by_gpu)


def _allocation_signature(snapshot: NodeSnapshot) -> tuple[object, ...]:
    """Everything :func:`pod_allocations` reads."""
    places = tuple(
        (gpu.info.uuid, tuple((m.uuid, m.gpu_instance_id, m.compute_instance_id, m.slice_fraction)
                              for m in gpu.migs))
        for gpu in snapshot.gpus
    )
    devices = tuple(
        (pod.namespace, pod.name, container.name, container.allocated_devices)
        for pod in snapshot.pods for container in pod.containers if container.allocated_devices
    )
    return places, devices


def _rates(
    snapshot: NodeSnapshot, known: bool, by_gpu: dict[str, list[tuple[Owner, int | None, float]]]
) -> dict[str, GpuRates]:
    nvml_ok = all(s.ok for s in snapshot.sources if s.name == "nvml")  # else these are earlier samples
    out: dict[str, GpuRates] = {}
    for gpu in snapshot.gpus:
        rates = GpuRates(
            uuid=gpu.info.uuid, index=gpu.info.index,
            usable=nvml_ok and gpu.health is Health.OK and not gpu.stale,
            energy_joules_total=gpu.energy_joules_total,
            energy_read_at_unix=gpu.energy_read_at_unix,
            power_watts=gpu.power_watts,
            busy_read_at=gpu.process_util_read_at_unix,
            profiles={m.gpu_instance_id: m.profile for m in gpu.migs},
        )
        _use(gpu, rates, known)
        _alone(gpu, rates)
        for owner, instance, fraction in by_gpu.get(gpu.info.uuid, ()):
            rate = rates.units.get((owner, instance))
            if rate is None:
                rate = rates.units[(owner, instance)] = Rate(busy=_idle_busy(gpu, instance))
            rate.allocated += fraction
        for rate in rates.units.values():
            if rate.mps_held is not None:
                rate.allocated = rate.mps_held
        _estimate(gpu, rates)
        out[gpu.info.uuid] = rates
    return out


def allocations_known(snapshot: NodeSnapshot) -> bool:
    """The kubelet's allocations are known: its source answered, or pods carry allocations from it."""
    return any(s.name == "pod_resources" and s.ok for s in snapshot.sources) or any(
        c.allocated_devices for pod in snapshot.pods for c in pod.containers
    )


def pod_allocations(snapshot: NodeSnapshot) -> dict[tuple[Owner, str, int | None], float]:
    """(container owner, GPU UUID, MIG instance) -> GPUs allocated, from the pods' allocated devices."""
    places: dict[str, tuple[str, int | None, float]] = {}  # device id without "::n" -> (GPU, instance, GPUs)
    for gpu in snapshot.gpus:
        places[gpu.info.uuid] = (gpu.info.uuid, None, 1.0)
        for mig in gpu.migs:
            places[mig.uuid] = (gpu.info.uuid, mig.gpu_instance_id, mig.slice_fraction)
            # before driver R470 the device plugin named MIG devices MIG-GPU-<uuid>/<gi>/<ci>
            legacy = f"MIG-{gpu.info.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id or 0}"
            places[legacy] = (gpu.info.uuid, mig.gpu_instance_id, mig.slice_fraction)
    replicas: dict[str, set[str]] = defaultdict(set)
    for pod in snapshot.pods:
        for container in pod.containers:
            for device_id in container.allocated_devices:
                base, sep, _ = device_id.partition(REPLICA_SEPARATOR)
                if sep:
                    replicas[base].add(device_id)
    out: dict[tuple[Owner, str, int | None], float] = defaultdict(float)
    for pod in snapshot.pods:
        for container in pod.containers:
            owner = Owner("pod", pod.namespace, pod.name, container.name)
            for device_id in set(container.allocated_devices):
                base, sep, _ = device_id.partition(REPLICA_SEPARATOR)
                place = places.get(base)
                if place is None:
                    continue  # a device this node's GPUs do not list (yet): nothing to account it to
                uuid, instance, fraction = place
                out[(owner, uuid, instance)] += fraction / len(replicas[base]) if sep else fraction
    return dict(out)


def owner_of(process: ProcessSample) -> Owner:
    w = process.workload
    if w is None:
        return UNATTRIBUTED
    if w.kind == "pod":
        return Owner("pod", w.namespace, w.name, w.container)
    return Owner(w.kind, None, w.name, None)


def _use(gpu: GpuSample, rates: GpuRates, pods_by_allocation: bool) -> None:
    """Busy and memory of every owner with a process on the GPU; what they hold when processes count."""
    by_place: dict[tuple[Owner, int | None], list[ProcessSample]] = {}
    for process in gpu.processes:
        if process.kind == MPS_SERVER:
            continue  # infrastructure: nobody's
        place = (owner_of(process), process.gpu_instance_id)
        group = by_place.get(place)
        if group is None:
            by_place[place] = [process]
        else:
            group.append(process)
    migs = {m.gpu_instance_id: m for m in gpu.migs}
    sharing: dict[int | None, int] = {}  # MIG instance -> owners with processes in it
    if migs:
        for _, instance in by_place:
            sharing[instance] = sharing.get(instance, 0) + 1
    for (owner, instance), processes in by_place.items():
        holds = owner is not UNATTRIBUTED and not (pods_by_allocation and owner.kind == "pod")
        if instance is None and len(processes) == 1:  # the common case: one process on a whole GPU
            process = processes[0]  # (the general case's sums, of one value: 0 + it)
            share = sm_share_ratio(process)
            rate = Rate(1.0 if holds else 0.0, None if share is None else min(1.0, 0.0 + share),
                        float(process.used_memory_bytes or 0))
            if process.kind == MPS_CLIENT and owner is not UNATTRIBUTED:  # else no MPS limits to combine
                mps = combined_mps_limits(processes)
                if mps is not None and mps.active_thread_percent is not None:
                    rate.mps_held = 1.0 * mps.active_thread_percent / 100.0
            rates.units[(owner, instance)] = rate
            continue
        rate = Rate(memory_bytes=float(sum([p.used_memory_bytes or 0 for p in processes])))
        mig = migs.get(instance) if instance is not None else None
        if instance is None:
            known = [share for share in map(sm_share_ratio, processes) if share is not None]
            rate.busy = min(1.0, sum(known)) if known else None
        else:
            active = _instance_active(mig)
            if active is not None and mig is not None:
                rate.busy = active * mig.slice_fraction / sharing[instance]
            else:
                rate.busy = None
        place_fraction = 1.0 if instance is None else (mig.slice_fraction if mig is not None else 0.0)
        mps = combined_mps_limits(processes) if owner is not UNATTRIBUTED else None
        if mps is not None and mps.active_thread_percent is not None:
            rate.mps_held = place_fraction * mps.active_thread_percent / 100.0
        if holds:
            rate.allocated = place_fraction
        rates.units[(owner, instance)] = rate


def _alone(gpu: GpuSample, rates: GpuRates) -> None:
    """One owner alone on a whole GPU (no other's process there): its busy is the device's utilization,
    read every poll, so it is integrated poll by poll like any per-poll rate instead of waiting for the
    per-process reading (every ``process_utilization_interval``). MPS clients keep the per-process rule:
    their busy counts only their share of the SMs, which the device's figure does not know."""
    if gpu.gpu_util_percent is None or gpu.migs:
        return
    place = None
    for process in gpu.processes:
        if process.kind == MPS_SERVER:
            continue
        if process.kind == MPS_CLIENT:
            return
        here = (owner_of(process), process.gpu_instance_id)
        if place is None:
            place = here
        elif here != place:
            return  # shared: each tenant's busy is its own per-process figure
    if place is None or place[1] is not None:
        return
    rates.units[place].busy = min(1.0, max(0.0, gpu.gpu_util_percent / 100.0))
    rates.busy_read_at = None


def _estimate(gpu: GpuSample, rates: GpuRates) -> None:
    """Several owners on a whole GPU (busy waits for per-process readings, ``busy_read_at`` set): each one's
    ``busy_estimate`` for this poll, its figure of the latest reading scaled down when the GPU's own
    utilization, read every poll, is under their sum: the GPU's utilization spread by the latest split. So a
    steady tenant is counted exactly at every poll; when the GPU as a whole falls quieter (a tenant stops,
    all do) everyone's count falls at once; a rise is not guessed (it is nobody's figure yet: a neighbour's
    rise must not land on a steady tenant) but counted when the reading says whose it was. MPS clients hold
    their figures unscaled: their utilizations overlap, so their sum may pass the GPU's. None where an owner
    was never measured (the reading settles the window)."""
    if rates.busy_read_at is None or gpu.gpu_util_percent is None or gpu.migs:
        return
    split = 0.0
    for rate in rates.units.values():
        if rate.busy is None:
            return
        split += rate.busy
    device = min(1.0, max(0.0, gpu.gpu_util_percent / 100.0))
    scale = 1.0
    if device < split and not any(p.kind == MPS_CLIENT for p in gpu.processes):
        scale = device / split
    for rate in rates.units.values():
        rate.busy_estimate = rate.busy * scale  # type: ignore[operator]  # (every busy is known: checked above)


def _instance_active(mig: MigSample | None) -> float | None:
    """A MIG instance's activity (0-1) from GPM: graphics engine active, else SM active; None without GPM."""
    if mig is None or mig.profiling is None:
        return None
    p = mig.profiling
    value = p.graphics_active_ratio if p.graphics_active_ratio is not None else p.sm_active_ratio
    return None if value is None else min(1.0, max(0.0, value))


def _idle_busy(gpu: GpuSample, instance: int | None) -> float | None:
    """Busy of an owner holding a place without a process there: 0 where use would be seen, else None."""
    if instance is None:
        return None if gpu.info.mig_enabled else 0.0
    mig = next((m for m in gpu.migs if m.gpu_instance_id == instance), None)
    return None if _instance_active(mig) is None else 0.0
