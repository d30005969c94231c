"""DCGM-style profiling counters from NVML's GPU Performance Monitoring (GPM) API, without DCGM.

GPM metrics are computed between two samples taken more than 100 ms apart: a sample is taken at a poll once
``interval`` seconds (``profiling_interval``) have passed since the last, and the metrics are those between
the two; polls in between carry the last metrics. On an H100 (driver 580) a sample and its metrics cost
about 1.7 ms of NVML time, the largest per-GPU cost after per-process utilization, hence the interval.
Supported on Hopper and later; elsewhere there is no sampler and the fields are absent, never faked.

A new sampler has no sample to compare with, so the reader primes it (:meth:`GpmSampler.prime`) as soon as it
exists (at the first poll, or when a MIG instance appears): the first sample of a pair is taken then, and
the first :meth:`GpmSampler.sample` waits out what is left of ``PAIR_GAP_SECONDS`` before the second. So the
first snapshot the agent publishes has the profiling figures, at the price of one extra sample and at most
0.1 s more on each GPU's worker thread, once; samplers primed together wait together.

A GPU's samplers (:class:`GpmSamplers`) follow its layout, refreshed on the slow poll: one for the whole GPU
without MIG, one per GPU instance with MIG (the metrics are the instance's), none where GPM is unsupported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Set
from typing import Any

from gpuagent.devices.cadence import Cadence
from gpuagent.devices.guard import NvmlGuard
from gpuagent.snapshot.gpu import GpuInfo, ProfilingSample

MIB = 1024 * 1024
PAIR_GAP_SECONDS = 0.1  # the first pair is at least this far apart (the 100 ms above; later ones: interval)

# GPM metric constant -> (ProfilingSample field, factor from GPM's unit: percent -> ratio, MiB/s -> B/s)
_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "graphics_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_ratio", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_ratio", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP64_UTIL", "fp64_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP32_UTIL", "fp32_active_ratio", 0.01),
    ("NVML_GPM_METRIC_FP16_UTIL", "fp16_active_ratio", 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_second", MIB),
)


class GpmSampler:
    """Two GPM sample buffers for one GPU or one MIG GPU instance, swapped every poll."""

    def __init__(
        self,
        guard: NvmlGuard,
        handle: Any,
        scope: Hashable,
        gpu_instance_id: int | None = None,
        *,
        interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ):
        self._guard = guard
        self._handle = handle
        self._scope = scope
        self._gi = gpu_instance_id
        self._cadence = Cadence(interval)
        self._clock = clock
        self._sleep = sleep
        self._primed_at: float | None = None  # when the first sample of the first pair was taken
        self._previous: Any = None
        self._spare: Any = None
        self._last: ProfilingSample | None = None

    def prime(self) -> None:
        """Take the first sample of the first pair now (a no-op once there is one); the next :meth:`sample`
        completes the pair."""
        if self._previous is None:
            self._take()
            self._primed_at = self._clock() if self._previous is not None else None

    def sample(self) -> ProfilingSample | None:
        """The metrics between the last two samples: a new sample once ``interval`` has passed since the
        last metrics (5 % slack for poll jitter), else those metrics again. None after a failure (the next
        poll then samples again), and at the first call of a sampler that was not primed."""
        now = self._clock()
        if self._last is not None and not self._cadence.due(now):
            return self._last
        if self._primed_at is not None:  # the second sample of the first pair, PAIR_GAP_SECONDS on
            wait = min(max(self._primed_at + PAIR_GAP_SECONDS - now, 0.0), PAIR_GAP_SECONDS)
            self._primed_at = None
            if wait > 0:
                self._sleep(wait)
                now = self._clock()
        self._last = self._take()
        self._cadence.mark(now)
        return self._last

    def _take(self) -> ProfilingSample | None:
        g, nvml = self._guard, self._guard.nvml
        if self._spare is None:
            self._spare = g.call("nvmlGpmSampleAlloc", scope=self._scope)
            if self._spare is None:
                return None
        if self._gi is None:
            current = g.call("nvmlGpmSampleGet", self._handle, self._spare, scope=self._scope)
        else:
            current = g.call("nvmlGpmMigSampleGet", self._handle, self._gi, self._spare, scope=self._scope)
        if current is None:
            return None
        previous, self._previous, self._spare = self._previous, self._spare, self._previous
        if previous is None:
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_METRICS)
        request.sample1 = previous
        request.sample2 = self._previous
        for i, (const, _, _) in enumerate(_METRICS):
            request.metrics[i].metricId = getattr(nvml, const)
        answer = g.call("nvmlGpmMetricsGet", request, scope=self._scope)
        if answer is None:
            return None
        values: dict[str, float] = {}
        for i, (_, name, factor) in enumerate(_METRICS):
            metric = answer.metrics[i]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                values[name] = float(metric.value) * factor
        return ProfilingSample(**values) if values else None

    def close(self) -> None:
        for buffer in (self._previous, self._spare):
            if buffer is not None:
                self._guard.call("nvmlGpmSampleFree", buffer, scope=self._scope)
        self._previous = self._spare = None


class GpmSamplers:
    """One GPU's samplers: ``gpu`` without MIG, one per GPU instance with MIG; new ones are primed."""

    def __init__(
        self,
        guard: NvmlGuard,
        handle: Any,
        index: int,
        *,
        interval: float,
        clock: Callable[[], float],
        sleep: Callable[[float], object],
    ) -> None:
        self._guard = guard
        self._handle = handle
        self._index = index
        self._interval = interval
        self._clock = clock
        self._sleep = sleep  # the first pair waits on this (the GPU's own worker thread)
        self.gpu: GpmSampler | None = None
        self._migs: dict[int, GpmSampler] = {}

    def refresh(self, info: GpuInfo, gpu_instance_ids: Set[int]) -> None:
        """Samplers for the layout of ``info`` (with MIG: the GPU instances ``gpu_instance_ids``)."""
        if not info.gpm_supported:
            self.close()
            return
        if info.mig_enabled:
            if self.gpu is not None:
                self.gpu.close()
                self.gpu = None
            for gi in set(self._migs) - gpu_instance_ids:
                self._migs.pop(gi).close()
            for gi in gpu_instance_ids - set(self._migs):
                self._migs[gi] = GpmSampler(self._guard, self._handle, (self._index, "gpm", gi), gi,
                                            interval=self._interval, clock=self._clock, sleep=self._sleep)
        else:
            for old in self._migs.values():
                old.close()
            self._migs.clear()
            if self.gpu is None:
                self.gpu = GpmSampler(self._guard, self._handle, self._index,
                                      interval=self._interval, clock=self._clock, sleep=self._sleep)
        for sampler in (self.gpu, *self._migs.values()):  # new ones take their first sample now
            if sampler is not None:
                sampler.prime()

    def gpu_sample(self) -> ProfilingSample | None:
        """The whole GPU's metrics (:meth:`GpmSampler.sample`); None with MIG or without GPM."""
        return self.gpu.sample() if self.gpu is not None else None

    def mig_sample(self, gpu_instance_id: int) -> ProfilingSample | None:
        """A GPU instance's metrics; None for an instance without a sampler."""
        sampler = self._migs.get(gpu_instance_id)
        return sampler.sample() if sampler is not None else None

    def close(self) -> None:
        """Free every sampler's buffers."""
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
        for sampler in self._migs.values():
            sampler.close()
        self._migs.clear()
