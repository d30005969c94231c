"""What a simulated node's pods look like to the sources the agent reads: device IDs, container IDs, cgroups.

From a scenario's ``pods:`` and the simulated NVML's UUIDs: each container's allocated devices as the NVIDIA
device plugin names them (``nvidia.com/gpu`` with ``GPU-<uuid>`` or a replica ``GPU-<uuid>::<n>``,
``nvidia.com/mig-<profile>`` with ``MIG-<uuid>``), its container ID (64 hex digits, as containerd makes
them), and the cgroup v2 path the kubelet's systemd driver gives it (``kubepods.slice``, the pod's QoS slice,
``cri-containerd-<id>.scope``). The same records feed the pod-resources server, the API server and the
``/proc`` tree, so the three agree as on a real node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuagent.devices.sim import SimulatedNvml
from gpuagent.devices.sim.scenario import Scenario
from gpuagent.devices.sim.scenario.spec import PodDeviceSpec, PodSpec

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_QOS_SLICE = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


@dataclass(frozen=True)
class Device:
    """One allocated device: the device plugin's resource name and ID, and the UUID a container sees."""

    resource_name: str
    device_id: str
    visible_uuid: str


@dataclass(frozen=True)
class Container:
    name: str
    container_id: str  # bare 64 hex digits
    pids: tuple[int, ...]
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class Pod:
    spec: PodSpec
    containers: tuple[Container, ...]

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def uid(self) -> str:
        return self.spec.uid

    def cgroup_path(self, container: Container) -> str:
        """The container's cgroup v2 path (kubelet with the systemd cgroup driver, containerd)."""
        uid = self.uid.replace("-", "_")
        qos = _QOS_SLICE[self.spec.qos]
        parent = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice" if qos else \
            f"/kubepods.slice/kubepods-pod{uid}.slice"
        return f"{parent}/cri-containerd-{container.container_id}.scope"


@dataclass(frozen=True)
class DemoNode:
    """The scenario's node as its Kubernetes sources see it."""

    hostname: str
    pods: tuple[Pod, ...]
    allocatable: tuple[Device, ...]  # every device the device plugin advertises


def demo_node(scenario: Scenario) -> DemoNode:
    """The pods of ``scenario`` with their devices named by the simulated NVML's UUIDs."""
    uuids = _uuids(scenario)
    pods = []
    replicas: dict[int, int] = {}  # GPU index -> replicas advertised (one more than the highest given)
    for spec in scenario.pods:
        containers = []
        for c in spec.containers:
            devices = tuple(_device(d, scenario, uuids) for d in c.devices)
            for d in c.devices:
                if d.replica is not None:
                    replicas[d.gpu] = max(replicas.get(d.gpu, 0), d.replica + 2)
            container_id = hashlib.sha256(f"{spec.uid}/{c.name}".encode()).hexdigest()
            containers.append(Container(c.name, container_id, c.pids, devices))
        pods.append(Pod(spec, tuple(containers)))
    allocatable: list[Device] = []
    for gpu in scenario.gpus:
        if gpu.mig_enabled:
            allocatable += [_device(PodDeviceSpec(gpu.index, mig_instance=i.id), scenario, uuids)
                            for i in gpu.mig_instances]
        elif gpu.index in replicas:
            allocatable += [_device(PodDeviceSpec(gpu.index, replica=n), scenario, uuids)
                            for n in range(replicas[gpu.index])]
        else:
            allocatable.append(_device(PodDeviceSpec(gpu.index), scenario, uuids))
    return DemoNode(scenario.hostname, tuple(pods), tuple(allocatable))


def _device(spec: PodDeviceSpec, scenario: Scenario, uuids: Mapping[Any, str]) -> Device:
    gpu_uuid = uuids[spec.gpu]
    if spec.mig_instance is not None:
        gpu = scenario.gpus[spec.gpu]
        instance = gpu.instance(spec.mig_instance)
        assert instance is not None  # the scenario's checks made sure
        mig_uuid = uuids[(spec.gpu, spec.mig_instance)]
        return Device(MIG_RESOURCE_PREFIX + instance.profile.name, mig_uuid, mig_uuid)
    if spec.replica is not None:
        return Device(GPU_RESOURCE, f"{gpu_uuid}::{spec.replica}", gpu_uuid)
    return Device(GPU_RESOURCE, gpu_uuid, gpu_uuid)


def _uuids(scenario: Scenario) -> dict[Any, str]:
    """GPU index -> UUID, (GPU index, GPU-instance ID) -> MIG device UUID, asked of the simulated NVML."""
    nvml = SimulatedNvml(scenario)
    nvml.nvmlInit()
    try:
        out: dict[Any, str] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            out[index] = nvml.nvmlDeviceGetUUID(handle)
            if not scenario.gpus[index].mig_enabled:
                continue
            for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nvml.NVMLError:
                    continue  # an empty slot
                out[(index, nvml.nvmlDeviceGetGpuInstanceId(mig))] = nvml.nvmlDeviceGetUUID(mig)
        return out
    finally:
        nvml.nvmlShutdown()
