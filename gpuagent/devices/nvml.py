"""Where a GPU's NVML reads come together: a pynvml-shaped module in, frozen ``GpuSample``s out.

The module is the real ``pynvml`` or the simulated one (``devices/sim``); this code cannot tell them
apart. Every call goes through :class:`~gpuagent.devices.guard.NvmlGuard`. Reads are tiered so the
driver lock is held briefly (DESIGN.md, "Do no harm"):

- every poll: utilization, memory, the SM clock, temperature, the instant power (one field value),
  clock-event reasons, each process list once (``processes``);
- per-process utilization (with its timestamp cursor, ``procutil``): every poll where the share controller
  acts on the GPU, every ``process_utilization_interval`` (10 s) elsewhere (about 2 ms a read on an H100);
- every ``detail_interval`` (10 s, ``details``): the memory and graphics clocks, encoder and decoder
  utilization, and the batched counters (PCIe, NVLink, replays, memory temperature);
- every ``energy_interval`` (30 s, ``energy``): the energy counter (about 3 ms a read on an H100);
- every ``profiling_interval`` (10 s, ``gpm``): a GPM sample and the profiling metrics since the last
  (1.7 ms); a new GPU or MIG instance takes its first pair at once, so the first poll has them;
- every slow poll (``slow``): static info (name, serial, PCI, power limit, MIG mode and layout, NVLink
  peers, NUMA node, compute mode, the MIG profiles and how many more of each can be created), ECC and
  retired pages (batched field values), remapped rows.

Costs, and why each figure sits on its tier: ``docs/nvml-cost.md``.

A :class:`GpuReader` makes the every-poll reads of the GPU itself and puts the sample together; each other
job is a reader of its own module, named above, which holds its cadence and its last figures. A reader
belongs to one GPU and is only ever used from that GPU's worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuagent.devices.details import MHZ, DetailReader
from gpuagent.devices.energy import EnergyReader
from gpuagent.devices.fields import FAST_FIELDS, FieldBatch
from gpuagent.devices.gpm import GpmSamplers
from gpuagent.devices.guard import GpuLostError, NvmlGuard
from gpuagent.devices.processes import ProcessNames, ProcessReader
from gpuagent.devices.procutil import ProcessUtilization
from gpuagent.devices.slow import SlowReader, memory_info
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, MigSample, XidRecord
from gpuagent.snapshot.processes import ProcessSample


class GpuReader:
    """Reads one GPU: the every-poll figures, and the tiers' readers on their cadences. Not thread-safe by
    design: one reader, one worker thread."""

    def __init__(
        self,
        guard: NvmlGuard,
        index: int,
        handle: Any,
        *,
        process_names: ProcessNames,
        clock: Callable[[], float] = time.time,
        sys_root: str = "/sys",
        energy_interval: float = 30.0,
        profiling_interval: float = 10.0,
        process_utilization_interval: float = 10.0,
        detail_interval: float = 10.0,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.guard = guard
        self.nvml = guard.nvml
        self.index = index
        self.handle = handle
        self._clock = clock
        self._slow = SlowReader(guard, index, handle, sys_root=sys_root)
        self.process_utilization = ProcessUtilization(
            guard, handle, index, interval=process_utilization_interval, clock=clock)
        self._processes = ProcessReader(guard, index, handle, process_names=process_names,
                                        utilization=self.process_utilization)
        self._energy = EnergyReader(guard, handle, index, interval=energy_interval, clock=clock)
        self._details = DetailReader(guard, handle, index, interval=detail_interval, clock=clock)
        # GPM's first pair waits on ``sleep`` (the reader's own thread)
        self._gpm = GpmSamplers(guard, handle, index, interval=profiling_interval, clock=clock, sleep=sleep)
        self._fast_fields = FieldBatch(self.nvml, FAST_FIELDS)

    @property
    def info(self) -> GpuInfo | None:
        """The static info of the last slow poll; None before the first."""
        return self._slow.info

    def refresh_static(self) -> GpuInfo:
        """Static info, MIG layout, GPM samplers, ECC and remapped rows. Runs at start and every slow poll."""
        info = self._slow.read_info()
        self._gpm.refresh(info, {m.gpu_instance_id for m in self._slow.migs})
        self._slow.read_health()
        return info

    # -- every poll --------------------------------------------------------------------------------

    def read(self, *, slow_due: bool, xid: XidRecord) -> GpuSample:
        """One poll of this GPU. Raises GpuLostError / NvmlUnavailableError from the guard."""
        if self.handle is None:  # nvmlDeviceGetHandleByIndex failed at start
            raise GpuLostError(self.index, "nvmlDeviceGetHandleByIndex")
        if slow_due or self.info is None:
            self.refresh_static()
        info = self.info
        assert info is not None
        g, h, nvml, s = self.guard, self.handle, self.nvml, self.index
        util = g.call("nvmlDeviceGetUtilizationRates", h, scope=s)
        memory = memory_info(g, h, s)
        fields = self._fast_fields.read(g, h, s)
        if "power_watts" not in fields:
            milliwatts = g.call("nvmlDeviceGetPowerUsage", h, scope=s)
            if milliwatts is not None:
                fields["power_watts"] = milliwatts / 1000.0
        processes = self._processes.read(mig_enabled=info.mig_enabled)
        self._energy.read()
        procutil = self.process_utilization
        slow = self._slow
        return GpuSample(
            info=info,
            sampled_at_unix=self._clock(),
            energy_joules_total=self._energy.joules,
            energy_read_at_unix=self._energy.read_at,
            gpu_util_percent=_float(util.gpu) if util is not None else None,
            memory_copy_util_percent=_float(util.memory) if util is not None else None,
            memory_used_bytes=memory.used if memory is not None else None,
            memory_free_bytes=memory.free if memory is not None else None,
            memory_reserved_bytes=getattr(memory, "reserved", None) if memory is not None else None,
            sm_clock_hz=_hz(g.call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, scope=s)),
            temperature_celsius=_float(
                g.call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU, scope=s)
            ),
            clock_event_reasons=g.call("nvmlDeviceGetCurrentClocksEventReasons", h, scope=s),
            ecc=slow.ecc,
            remapped_rows=slow.remapped,
            xid=xid,
            profiling=self._gpm.gpu_sample(),
            processes=processes,
            migs=self._read_migs(processes) if info.mig_enabled else (),
            process_util_read_at_unix=None if info.mig_enabled else procutil.read_at,
            process_util_window_seconds=None if info.mig_enabled else procutil.window_seconds,
            **self._details.read(),
            **fields,
        )

    def _read_migs(self, processes: tuple[ProcessSample, ...]) -> tuple[MigSample, ...]:
        """Each MIG device's memory (every poll) and profiling metrics (its GPM cadence)."""
        out = []
        for slot in self._slow.migs:
            memory = self.guard.call("nvmlDeviceGetMemoryInfo", slot.handle, scope=(self.index, "mig"))
            profiling = self._gpm.mig_sample(slot.gpu_instance_id)
            out.append(
                MigSample(
                    gpu_instance_id=slot.gpu_instance_id,
                    compute_instance_id=slot.compute_instance_id,
                    uuid=slot.uuid,
                    profile=slot.profile,
                    slice_fraction=slot.slice_fraction,
                    memory_total_bytes=memory.total if memory is not None else None,
                    memory_used_bytes=memory.used if memory is not None else None,
                    memory_free_bytes=memory.free if memory is not None else None,
                    processes=tuple(p for p in processes if p.gpu_instance_id == slot.gpu_instance_id),
                    profiling=profiling,
                )
            )
        return tuple(out)

    def close(self) -> None:
        self._gpm.close()


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _hz(mhz: Any) -> float | None:
    return float(mhz) * MHZ if mhz is not None else None
