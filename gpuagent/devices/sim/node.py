"""The simulated node's physics: what each GPU, MIG instance and process does at scenario time ``t``.

No NVML types here; :mod:`gpuagent.devices.sim.nvml` turns these figures into pynvml's structs, codes and
units. Instantaneous values (:class:`GpuView`) are pure functions of ``t`` and of the real PIDs' CPU use;
counters (energy, PCIe and NVLink bytes, utilization-seconds for GPM) are integrals of those values over
scenario time, advanced lazily and monotonically by :meth:`Node.advance` (the caller holds a lock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuagent.devices.sim.cpu import CpuMeter
from gpuagent.devices.sim.curves import FollowCpu
from gpuagent.devices.sim.scenario import (
    EccFault,
    GpuLost,
    GpuSpec,
    NvlinkDownFault,
    PcieReplayFault,
    ProcessSpec,
    RowRemapFailure,
    Scenario,
)

MIB = 1024 * 1024
MAX_SUBSTEPS = 100  # integration steps per advance; a step is at least 1 s of scenario time


@dataclass(frozen=True)
class ProcView:
    spec: ProcessSpec
    sm_util: float  # percent
    mem_util: float  # percent
    memory_bytes: int


@dataclass(frozen=True)
class GpuView:
    procs: tuple[ProcView, ...]
    activity: float  # percent of time a kernel ran, whole GPU (the utilization NVML reports)
    mem_util: float
    instance_util: dict[int, float]  # MIG GPU-instance ID -> percent of that instance
    instance_mem_util: dict[int, float]
    power_w: float
    power_capped: bool
    temp_c: float
    memory_temp_c: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    throttle: frozenset[str]  # "idle", "power", "sw_thermal", "hw_thermal"
    encoder_util: float
    decoder_util: float
    memory_used: int  # bytes used by processes (excludes the reserved memory)
    instance_memory_used: dict[int, int]
    pcie_tx_bps: float
    pcie_rx_bps: float
    nvlink_tx_bps: float
    nvlink_rx_bps: float


@dataclass
class Integrals:
    """Counters of one GPU at scenario time ``t``."""

    t: float
    energy_mj: float = 0.0
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0
    nvlink_tx_bytes: float = 0.0
    nvlink_rx_bytes: float = 0.0
    util_s: float = 0.0  # percent-seconds
    mem_util_s: float = 0.0
    instance_util_s: dict[int, float] = field(default_factory=dict)
    instance_mem_util_s: dict[int, float] = field(default_factory=dict)

    def copy(self) -> Integrals:
        return Integrals(
            self.t, self.energy_mj, self.pcie_tx_bytes, self.pcie_rx_bytes, self.nvlink_tx_bytes,
            self.nvlink_rx_bytes, self.util_s, self.mem_util_s, dict(self.instance_util_s),
            dict(self.instance_mem_util_s),
        )


def _clamp(v: float, lo: float, hi: float) -> float:
    return lo if v < lo else hi if v > hi else v


class Node:
    def __init__(self, scenario: Scenario, cpu: CpuMeter) -> None:
        self.scenario = scenario
        self.cpu = cpu
        n = len(scenario.gpus)
        self.procs_by_gpu: list[tuple[ProcessSpec, ...]] = [
            tuple(p for p in scenario.processes if p.gpu == i) for i in range(n)
        ]
        self.lost_at: list[float] = [math.inf] * n
        self.ecc: list[list[tuple[float, bool, int]]] = [[] for _ in range(n)]  # (at, double_bit, count)
        self.replays: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        self.remap_failed_at: list[float] = [math.inf] * n
        self.links_down: list[list[tuple[float, tuple[int, ...]]]] = [[] for _ in range(n)]
        for f in scenario.faults:
            if isinstance(f, GpuLost):
                self.lost_at[f.gpu] = min(self.lost_at[f.gpu], f.at)
            elif isinstance(f, EccFault):
                self.ecc[f.gpu].append((f.at, f.double_bit, f.count))
            elif isinstance(f, PcieReplayFault):
                self.replays[f.gpu].append((f.at, f.count))
            elif isinstance(f, RowRemapFailure):
                self.remap_failed_at[f.gpu] = min(self.remap_failed_at[f.gpu], f.at)
            elif isinstance(f, NvlinkDownFault):
                self.links_down[f.gpu].append((f.at, f.links))
        self.peers: list[tuple[int, ...]] = [self._peers(g) for g in scenario.gpus]
        # a day of idle power, so the energy counter reads like one on a running machine
        self.integrals = [
            Integrals(0.0, energy_mj=g.model.idle_power_w * 86_400 * 1000.0) for g in scenario.gpus
        ]

    def _peers(self, gpu: GpuSpec) -> tuple[int, ...]:
        if not gpu.model.nvlink_links:
            return ()
        return tuple(g.index for g in self.scenario.gpus if g.index != gpu.index and g.model is gpu.model)

    # -- processes ---------------------------------------------------------------------------------

    def active(self, p: ProcessSpec, t: float) -> bool:
        if t < p.start or (p.stop is not None and t >= p.stop):
            return False
        return not p.real or self.cpu.alive(p.pid)

    def proc_view(self, p: ProcessSpec, t: float) -> ProcView:
        if isinstance(p.sm_util, FollowCpu):
            sm = self.cpu.utilization(p.pid) * p.sm_util.scale
        else:
            sm = p.sm_util.value(t)
        sm = _clamp(sm, 0.0, 100.0)
        mem_util = _clamp(p.mem_util.value(t), 0.0, 100.0) if p.mem_util is not None else sm * 0.5
        memory = max(0, int(p.memory.value(t)))
        if p.mps is not None and p.mps.pinned_memory_limit_bytes is not None:
            memory = min(memory, p.mps.pinned_memory_limit_bytes)  # MPS fails the allocations past it
        return ProcView(p, sm, mem_util, memory)

    def procs(self, gpu: int, t: float) -> tuple[ProcView, ...]:
        return tuple(self.proc_view(p, t) for p in self.procs_by_gpu[gpu] if self.active(p, t))

    # -- a GPU at time t ---------------------------------------------------------------------------

    def view(self, gpu: int, t: float) -> GpuView:
        g = self.scenario.gpus[gpu]
        m = g.model
        procs = self.procs(gpu, t)
        inst_util: dict[int, float] = {}
        inst_mem_util: dict[int, float] = {}
        inst_mem: dict[int, int] = {}
        if g.mig_enabled:
            activity = mem_util = 0.0
            for inst in g.mig_instances:
                mine = [p for p in procs if p.spec.mig_instance == inst.id]
                u = min(100.0, sum(p.sm_util for p in mine))
                mu = min(100.0, sum(p.mem_util for p in mine))
                share = inst.profile.slices / m.mig_slices
                inst_util[inst.id], inst_mem_util[inst.id] = u, mu
                inst_mem[inst.id] = min(inst.profile.memory_bytes, sum(p.memory_bytes for p in mine))
                activity += u * share
                mem_util += mu * inst.profile.memory_slices / m.mig_memory_slices
        else:
            activity = min(100.0, sum(p.sm_util for p in procs))
            mem_util = min(100.0, sum(p.mem_util for p in procs))
        if g.utilization is not None:
            activity = _clamp(g.utilization.value(t), 0.0, 100.0)
        if g.memory_util is not None:
            mem_util = _clamp(g.memory_util.value(t), 0.0, 100.0)
        limit = g.power_limit_w
        idle = min(m.idle_power_w, limit)
        if g.power_w is not None:
            power = max(0.0, g.power_w.value(t))
        else:
            power = idle + (0.93 * limit - idle) * activity / 100.0
        power = min(power, limit)
        capped = power >= 0.97 * limit
        if g.temperature is not None:
            temp = g.temperature.value(t)
        else:
            load = (power - idle) / (limit - idle) if limit > idle else 0.0
            temp = m.idle_temp_c + (m.load_temp_c - m.idle_temp_c) * _clamp(load, 0.0, 1.0)
        throttle = set()
        if activity <= 0.0:
            throttle.add("idle")
        if capped:
            throttle.add("power")
        if temp >= m.sw_slowdown_temp_c:
            throttle.add("sw_thermal")
        if temp >= m.hw_slowdown_temp_c:
            throttle.add("hw_thermal")
        if activity <= 0.0:
            sm_clock = m.idle_sm_clock_mhz
            mem_clock = m.idle_mem_clock_mhz
        else:
            factor = 1.0
            if capped:
                factor *= 0.85
            if "sw_thermal" in throttle:
                factor *= 0.8
            if "hw_thermal" in throttle:
                factor *= 0.6
            sm_clock = max(m.idle_sm_clock_mhz, int(m.max_sm_clock_mhz * factor))
            mem_clock = m.max_mem_clock_mhz
        capacity = g.memory_bytes - g.reserved_bytes
        used = min(capacity, sum(p.memory_bytes for p in procs))
        a = activity / 100.0
        nvlink = m.nvlink_mibps * MIB * 0.3 * a if self.peers[gpu] and not g.mig_enabled else 0.0
        return GpuView(
            procs=procs, activity=activity, mem_util=mem_util, instance_util=inst_util,
            instance_mem_util=inst_mem_util, power_w=power, power_capped=capped, temp_c=temp,
            memory_temp_c=temp + 4.0, sm_clock_mhz=sm_clock, mem_clock_mhz=mem_clock,
            throttle=frozenset(throttle),
            encoder_util=_clamp(g.encoder_util.value(t), 0, 100) if g.encoder_util is not None else 0.0,
            decoder_util=_clamp(g.decoder_util.value(t), 0, 100) if g.decoder_util is not None else 0.0,
            memory_used=used, instance_memory_used=inst_mem,
            pcie_tx_bps=(2.0 + m.pcie_mibps * 0.05 * a) * MIB,
            pcie_rx_bps=(3.0 + m.pcie_mibps * 0.12 * a) * MIB,
            nvlink_tx_bps=nvlink, nvlink_rx_bps=nvlink * 0.97,
        )

    # -- counters ----------------------------------------------------------------------------------

    def advance(self, gpu: int, t: float) -> Integrals:
        """Integrate the GPU's rates up to ``t`` (midpoint rule) and return a copy of its counters."""
        acc = self.integrals[gpu]
        span = t - acc.t
        if span > 0:
            steps = max(1, min(MAX_SUBSTEPS, math.ceil(span)))
            dt = span / steps
            for k in range(steps):
                v = self.view(gpu, acc.t + (k + 0.5) * dt)
                acc.energy_mj += v.power_w * dt * 1000.0
                acc.pcie_tx_bytes += v.pcie_tx_bps * dt
                acc.pcie_rx_bytes += v.pcie_rx_bps * dt
                acc.nvlink_tx_bytes += v.nvlink_tx_bps * dt
                acc.nvlink_rx_bytes += v.nvlink_rx_bps * dt
                acc.util_s += v.activity * dt
                acc.mem_util_s += v.mem_util * dt
                for gi, u in v.instance_util.items():
                    acc.instance_util_s[gi] = acc.instance_util_s.get(gi, 0.0) + u * dt
                for gi, u in v.instance_mem_util.items():
                    acc.instance_mem_util_s[gi] = acc.instance_mem_util_s.get(gi, 0.0) + u * dt
            acc.t = t
        return acc.copy()

    def ecc_counts(self, gpu: int, t: float) -> tuple[int, int]:
        """(single-bit, double-bit) errors injected up to ``t``."""
        sbe = sum(c for at, dbe, c in self.ecc[gpu] if at <= t and not dbe)
        dbe = sum(c for at, d, c in self.ecc[gpu] if at <= t and d)
        return sbe, dbe

    def remap_failed(self, gpu: int, t: float) -> bool:
        return t >= self.remap_failed_at[gpu]

    def link_down(self, gpu: int, link: int, t: float) -> bool:
        """A link down by a ``nvlink_down`` fault at ``t`` (the GPU spec's ``nvlink_down``: from start)."""
        return any(at <= t and link in links for at, links in self.links_down[gpu])

    def pcie_replays(self, gpu: int, t: float) -> int:
        return sum(c for at, c in self.replays[gpu] if at <= t)

    def is_lost(self, gpu: int, t: float) -> bool:
        return t >= self.lost_at[gpu]

