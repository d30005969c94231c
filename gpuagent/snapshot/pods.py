"""Pods on the node as the pods source joins them: what the kubelet allocated each container, what its
processes use, and the devices of DRA ResourceClaims (and the DRA drivers' device taints) mapped to GPUs.
``pods/`` produces these; the enforcer reads a pod's annotations, hints its tenants, health
the DRA taints, the API its allocation view. None of them refers to another part of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class ContainerUse:
    """One container of a pod: what the kubelet allocated it and what its processes use."""

    name: str
    allocated_devices: tuple[str, ...] = ()  # device ids as allocated (GPU-…, GPU-…::n replicas, MIG-…)
    pids: tuple[int, ...] = ()
    gpu_memory_used_bytes: int = 0
    sm_util_percent: float | None = None  # sum over its processes; None when NVML reports none (MIG)


@dataclass(frozen=True, slots=True)
class PodUse:
    """A pod holding or using GPUs on this node: allocation (kubelet) next to use (NVML)."""

    name: str  # the pod name, or its UID when only the cgroup is known
    namespace: str | None = None
    uid: str | None = None
    qos: str | None = None
    names_from: str = "cgroup"
    containers: tuple[ContainerUse, ...] = ()
    allocated_gpus: tuple[str, ...] = ()  # UUIDs of the GPUs allocated (a MIG device counts its parent)
    used_gpus: tuple[str, ...] = ()  # UUIDs of the GPUs its processes run on
    gpu_memory_used_bytes: int = 0
    sm_util_percent: float | None = None
    process_count: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)  # gpuagent.io/* only (the API server's)
    # The top of its controller chain from the API server (Deployment, CronJob, ...; "Pod" for a bare pod);
    # None without the API server or while it is being asked
    owner_kind: str | None = None
    owner_name: str | None = None

    @property
    def unallocated_use(self) -> tuple[str, ...]:
        """GPUs used without being allocated: a pod that bypassed the device plugin."""
        return tuple(g for g in self.used_gpus if g not in self.allocated_gpus)


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a ResourceClaim (DRA) the kubelet prepared for a pod's container, and which GPU it is.

    ``mapped_by`` says where the UUIDs came from: "resource_slice" (the driver's ResourceSlice, through the
    API server) or "cdi" (the node's CDI spec for the claim); None when the device could not be mapped, and
    ``problem`` then says why. A mapped device is also in its container's ``allocated_devices``."""

    namespace: str
    pod: str
    container: str
    claim: str
    claim_namespace: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None
    gpu_uuid: str | None = None  # the GPU (a MIG device's parent)
    mig_uuid: str | None = None
    device_id: str | None = None  # as in allocated_devices: GPU-…, MIG-…, or …::n when several hold it
    mapped_by: str | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class DraTaint:
    """A taint a DRA driver put on one of its devices in its ResourceSlice (KEP-5055), and the GPU it is on:
    ``effect`` "NoSchedule" keeps new claims off the device, "NoExecute" also evicts its pods, "None" (or an
    effect unknown to the agent) only informs."""

    driver: str
    pool: str
    device: str
    key: str
    value: str
    effect: str
    gpu_uuid: str  # the GPU (a MIG device's parent)
    mig_uuid: str | None = None
    time_added: str | None = None  # RFC 3339, as the slice says
    slice: str = ""  # the ResourceSlice it was read from


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
