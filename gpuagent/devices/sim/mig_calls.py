"""The simulated NVML's MIG calls: mode, MIG device handles and attributes, profiles, remaining capacity."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from gpuagent.devices.sim.core import SimCore, nvml_error
from gpuagent.devices.sim.mig import profile_by_index, remaining_capacity
from gpuagent.devices.sim.models import MIB


class MigCalls(SimCore):
    """MIG mode and layout as the scenario gives it."""

    def nvmlDeviceGetMigMode(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> Any:
        g, _, _ = self._device(device)
        return g.model.max_mig_devices if g.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: Any) -> Any:
        g, _, _ = self._device(device)
        limit = g.model.max_mig_devices if g.mig_enabled else 0
        if not isinstance(index, int) or not 0 <= index < limit:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(g.mig_instances):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._handle(self._mig_addr[(g.index, g.mig_instances[index].id)])

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        g, inst, _ = self._device(migDevice)
        if inst is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(self._gpu_addr[g.index])

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        if inst is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return inst.id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        if inst is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        _, inst, _ = self._device(device)
        return ctypes.c_uint(1 if inst is not None else 0)  # pynvml returns the c_uint, not its value

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        return self._attributes(device, "nvmlDeviceGetAttributes")

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        return self._attributes(device, "nvmlDeviceGetAttributes_v2")

    def _attributes(self, device: Any, name: str) -> Any:
        g, inst, _ = self._device(device, name)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if inst is None:
            slices = g.model.mig_slices if g.model.mig else 1
            attrs.multiprocessorCount = g.model.sm_count
            attrs.memorySizeMB = g.memory_bytes // MIB
        else:
            slices = inst.profile.slices
            attrs.multiprocessorCount = inst.profile.sm_count
            attrs.memorySizeMB = inst.profile.memory_bytes // MIB
        attrs.gpuInstanceSliceCount = slices
        attrs.computeInstanceSliceCount = slices
        attrs.sharedCopyEngineCount = max(1, slices)
        attrs.sharedDecoderCount = slices // 2 if inst is not None else 5
        attrs.sharedEncoderCount = 0
        attrs.sharedJpegCount = 1 if inst is None or slices >= 7 else 0
        attrs.sharedOfaCount = 1 if inst is None or slices >= 7 else 0
        return attrs

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: Any, version: Any = 2) -> Any:
        g, _, _ = self._device(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        if not isinstance(profile, int) or not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = profile_by_index(g.model, profile)
        if spec is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        else:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id = profile
        info.isP2pSupported = 0
        info.sliceCount = spec.slices
        info.instanceCount = len(spec.placements)
        info.multiprocessorCount = spec.sm_count
        info.copyEngineCount = max(1, spec.slices)
        info.decoderCount = spec.slices // 2
        info.memorySizeMB = spec.memory_bytes // MIB
        if version == 2:
            info.name = f"MIG {spec.name}".encode()
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: Any) -> Any:
        g, _, _ = self._device(device)
        if not g.mig_enabled:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = profile_by_index(g.model, profileId) if isinstance(profileId, int) else None
        if spec is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return remaining_capacity(g.model, ((i.profile, i.id) for i in g.mig_instances), spec)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        if g.numa_node is not None:
            return g.numa_node
        return g.index * 2 // max(1, len(self.scenario.gpus))  # two sockets, half the GPUs on each

    def nvmlDeviceGetComputeMode(self, handle: Any) -> Any:
        g, _, _ = self._device(handle)
        return {"default": pynvml.NVML_COMPUTEMODE_DEFAULT, "prohibited": pynvml.NVML_COMPUTEMODE_PROHIBITED,
                "exclusive_process": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS}[g.compute_mode]

