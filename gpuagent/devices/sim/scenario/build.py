"""Building a scenario: the semantic checks a schema cannot express, and the specs they produce.

GPU indices, MIG profiles of the GPU's model, PID uniqueness, curve ranges: every message names the path
inside the file (``processes[3].gpu: GPU index 9 does not exist (scenario has 8 GPUs)``), and every
problem found is reported, in the order of the file.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

import pynvml

from gpuagent.devices.sim.curves import Constant, FollowCpu, Points, Sine
from gpuagent.devices.sim.models import MIB, MODELS, GpuModel, MigProfile
from gpuagent.devices.sim.scenario.spec import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_DRIVER_VERSION,
    DEFAULT_PROCESS_MEMORY,
    FAKE_PID_BASE,
    MPS_LIMIT_VARIABLES,
    MPS_SERVER_NAME,
    DriverSpec,
    EccFault,
    Fault,
    GpuLost,
    GpuSpec,
    HangFault,
    InitFailure,
    MigInstanceSpec,
    MpsSpec,
    PcieReplayFault,
    ProcessSpec,
    Scenario,
    XidFault,
)
from gpuagent.devices.sim.scenario.values import gib, parse_size


def _pynvml_function_names() -> frozenset[str]:
    return frozenset(
        n for n, v in vars(pynvml).items() if n.startswith("nvml") and inspect.isfunction(v)
    )


def _field_names() -> frozenset[str]:
    return frozenset(n for n in vars(pynvml) if n.startswith("NVML_FI_"))


class _Builder:
    def __init__(self, data: Mapping[str, Any], source: str, name: str | None):
        self.data = data
        self.source = source
        self.name = name
        self.errors: list[tuple[str, str]] = []
        self.functions = _pynvml_function_names()

    def error(self, path: str, message: str) -> None:
        self.errors.append((path, message))

    def build(self) -> Scenario:
        d = self.data
        name = d.get("name") or self.name or "scenario"
        driver = self._driver(d.get("driver") or {})
        gpus = self._gpus(d.get("gpus") or [])
        processes = self._processes(d.get("processes") or [], gpus)
        faults = self._faults(d.get("faults") or [], gpus)
        return Scenario(
            name=name,
            hostname=d.get("hostname", "sim-node"),
            seed=str(d.get("seed", name)),
            driver=driver,
            gpus=tuple(gpus),
            processes=tuple(processes),
            faults=tuple(faults),
            source=self.source,
            description=d.get("description", ""),
        )

    # driver

    def _driver(self, d: Mapping[str, Any]) -> DriverSpec:
        version = d.get("version", DEFAULT_DRIVER_VERSION)
        cuda = d.get("cuda_version", DEFAULT_CUDA_VERSION)
        if isinstance(cuda, str):
            major, minor = cuda.split(".")
            cuda = int(major) * 1000 + int(minor) * 10
        latency = dict(d.get("latency_ms") or {})
        for fn in latency:
            if fn != "default" and fn not in self.functions:
                self.error(f"driver.latency_ms.{fn}", "not a pynvml function (or 'default')")
        return DriverSpec(
            version=version, nvml_version=d.get("nvml_version", f"12.{version}"), cuda_version=cuda,
            latency_ms=latency, mps_utilization=d.get("mps_utilization", "per_client"),
        )

    # curves

    def curve(self, node: Any, path: str, *, size: bool = False, lo: float | None = None,
              hi: float | None = None, follow: bool = False) -> Any:
        if isinstance(node, (int, float, str)):
            c: Any = Constant(float(parse_size(node)) if size else float(node))
        else:
            kinds = [k for k in ("sine", "points", "steps", "follow_cpu") if k in node]
            if len(kinds) != 1:
                what = "give exactly one of sine, points, steps" + (", follow_cpu" if follow else "")
                self.error(path, f"{what}; got {', '.join(kinds) if kinds else 'none'}")
                return None
            kind = kinds[0]
            if ("repeat" in node or "period" in node) and kind not in ("points", "steps"):
                self.error(path, f"repeat and period go with points or steps, not {kind}")
                return None
            if kind == "follow_cpu":
                f = node["follow_cpu"] or {}
                return FollowCpu(
                    scale=float(f.get("scale", 1.0)), queue_seconds=float(f.get("queue_seconds", 0.2))
                )
            if kind == "sine":
                s = node["sine"]
                conv = parse_size if size else float
                c = Sine(
                    float(conv(s["min"])), float(conv(s["max"])), float(s["period"]), float(s.get("phase", 0))
                )
                if c.min > c.max:
                    self.error(f"{path}.sine", f"min ({s['min']}) is above max ({s['max']})")
                    return None
            else:
                pts = tuple(
                    (float(t), float(parse_size(v)) if size else float(v)) for t, v in node[kind]
                )
                for i in range(1, len(pts)):
                    if pts[i][0] <= pts[i - 1][0]:
                        self.error(f"{path}.{kind}[{i}]",
                                   f"times must increase: {pts[i][0]:g} after {pts[i - 1][0]:g}")
                        return None
                repeat = bool(node.get("repeat", False))
                period = node.get("period")
                if repeat and period is None and pts[-1][0] <= 0:
                    self.error(path, "repeat needs a period, or a last point after time 0")
                    return None
                c = Points(pts, steps=kind == "steps", repeat=repeat,
                           period=float(period) if period is not None else None)
        low, high = c.bounds()
        if (lo is not None and low < lo) or (hi is not None and high > hi):
            unit = " bytes" if size else ""
            rng = f"{lo:g}..{hi:g}" if lo is not None and hi is not None else (
                f">= {lo:g}" if lo is not None else f"<= {hi:g}")
            self.error(path, f"values must lie in {rng}{unit}, got {low:g}..{high:g}")
            return None
        return c

    # GPUs

    def _gpus(self, entries: list[Mapping[str, Any]]) -> list[GpuSpec]:
        gpus: list[GpuSpec] = []
        fields = _field_names()
        for i, g in enumerate(entries):
            where = f"gpus[{i}]"
            model = MODELS[g["model"]]
            count = g.get("count", 1)
            for key in ("serial", "pci_bus_id"):
                if key in g and count > 1:
                    self.error(f"{where}.{key}", "cannot be given together with count > 1")
            memory = parse_size(g["memory"]) if "memory" in g else model.memory_bytes
            reserved = parse_size(g["memory_reserved"]) if "memory_reserved" in g else model.reserved_bytes
            if memory <= 0:
                self.error(f"{where}.memory", "must be more than 0 bytes")
            if reserved >= memory:
                self.error(f"{where}.memory_reserved", f"{reserved} bytes is not less than memory ({memory})")
            not_supported = []
            for j, n in enumerate(g.get("not_supported") or []):
                if n not in self.functions and n not in fields:
                    hint = difflib.get_close_matches(n, sorted(self.functions | fields), n=1)
                    more = f"; did you mean '{hint[0]}'?" if hint else ""
                    self.error(f"{where}.not_supported[{j}]",
                               f"{n!r} is neither a pynvml function nor an NVML_FI_* field{more}")
                not_supported.append(n)
            for j, link in enumerate(g.get("nvlink_down") or []):
                if link >= model.nvlink_links:
                    self.error(f"{where}.nvlink_down[{j}]",
                               f"link {link} does not exist "
                               f"({model.key} has {model.nvlink_links} NVLink links)")
            mig_enabled, instances = self._mig(g.get("mig"), model, f"{where}.mig")
            pct = {"lo": 0.0, "hi": 100.0}
            curves = {
                "utilization": self.curve(g["utilization"], f"{where}.utilization", **pct)
                if "utilization" in g else None,
                "memory_util": self.curve(g["memory_util"], f"{where}.memory_util", **pct)
                if "memory_util" in g else None,
                "encoder_util": self.curve(g["encoder_util"], f"{where}.encoder_util", **pct)
                if "encoder_util" in g else None,
                "decoder_util": self.curve(g["decoder_util"], f"{where}.decoder_util", **pct)
                if "decoder_util" in g else None,
                "power_w": self.curve(g["power_w"], f"{where}.power_w", lo=0.0, hi=5000.0)
                if "power_w" in g else None,
                "temperature": self.curve(g["temperature"], f"{where}.temperature", lo=-40.0, hi=150.0)
                if "temperature" in g else None,
            }
            for _ in range(count):
                gpus.append(GpuSpec(
                    index=len(gpus), model=model, name=g.get("name", model.name), serial=g.get("serial"),
                    memory_bytes=memory, reserved_bytes=reserved,
                    power_limit_w=float(g.get("power_limit_w", model.power_limit_w)),
                    pci_bus_id=g.get("pci_bus_id"), mig_enabled=mig_enabled, mig_instances=instances,
                    not_supported=frozenset(not_supported), nvlink_down=frozenset(g.get("nvlink_down") or ()),
                    where=where, numa_node=g.get("numa_node"),
                    compute_mode=g.get("compute_mode", "default"), **curves,
                ))
        return gpus

    def _mig(self, mig: Mapping[str, Any] | None, model: GpuModel,
             where: str) -> tuple[bool, tuple[MigInstanceSpec, ...]]:
        if mig is None:
            return False, ()
        if not model.mig:
            self.error(where, f"model {model.key} does not support MIG")
            return False, ()
        enabled = bool(mig.get("enabled", True))
        entries = mig.get("instances") or []
        if entries and not enabled:
            self.error(f"{where}.instances", "MIG instances need MIG enabled (enabled: true)")
            return False, ()
        known = ", ".join(p.name for p in model.mig_profiles)
        chosen: list[tuple[int, MigProfile, int | None]] = []
        for j, inst in enumerate(entries):
            profile = model.profile(inst["profile"])
            if profile is None:
                self.error(f"{where}.instances[{j}].profile",
                           f"unknown profile {inst['profile']!r} for {model.key}; known: {known}")
                continue
            gi = inst.get("id")
            if gi is not None and gi not in profile.placements:
                places = ", ".join(map(str, profile.placements))
                self.error(f"{where}.instances[{j}].id",
                           f"GPU instance ID {gi} is not a placement of {profile.name} (one of {places})")
                continue
            chosen.append((j, profile, gi))
        used = {gi for _, _, gi in chosen if gi is not None}
        if len(used) != len([1 for _, _, gi in chosen if gi is not None]):
            self.error(f"{where}.instances", "GPU instance IDs must be unique")
        out: list[MigInstanceSpec] = []
        for j, profile, gi in chosen:
            if gi is None:
                free = [p for p in profile.placements if p not in used]
                if not free:
                    self.error(f"{where}.instances[{j}]", f"no free placement left for {profile.name}")
                    continue
                gi = free[0]
                used.add(gi)
            out.append(MigInstanceSpec(gi, profile))
        slices = sum(i.profile.slices for i in out)
        memory_slices = sum(i.profile.memory_slices for i in out)
        if slices > model.mig_slices:
            self.error(f"{where}.instances",
                       f"the instances need {slices} compute slices; {model.key} has {model.mig_slices}")
        elif memory_slices > model.mig_memory_slices:
            self.error(f"{where}.instances", f"the instances need {memory_slices} memory slices; "
                       f"{model.key} has {model.mig_memory_slices}")
        return enabled, tuple(sorted(out, key=lambda i: i.id))

    # processes

    def _processes(self, entries: list[Mapping[str, Any]], gpus: list[GpuSpec]) -> list[ProcessSpec]:
        out: list[ProcessSpec] = []
        pids: dict[int, int] = {}
        for i, p in enumerate(entries):
            where = f"processes[{i}]"
            gi_index = p["gpu"]
            if gi_index >= len(gpus):
                self.error(f"{where}.gpu",
                           f"GPU index {gi_index} does not exist (scenario has {len(gpus)} GPUs)")
                continue
            gpu = gpus[gi_index]
            mig_instance = p.get("mig_instance")
            capacity = gpu.memory_bytes - gpu.reserved_bytes
            if gpu.mig_enabled:
                if mig_instance is None:
                    ids = ", ".join(str(x.id) for x in gpu.mig_instances) or "none"
                    self.error(where,
                               f"GPU {gi_index} is in MIG mode: give mig_instance (GPU instance IDs: {ids})")
                    continue
                inst = gpu.instance(mig_instance)
                if inst is None:
                    ids = ", ".join(str(x.id) for x in gpu.mig_instances) or "none"
                    self.error(f"{where}.mig_instance",
                               f"GPU {gi_index} has no GPU instance {mig_instance} (it has: {ids})")
                    continue
                capacity = inst.profile.memory_bytes
            elif mig_instance is not None:
                self.error(f"{where}.mig_instance", f"GPU {gi_index} is not in MIG mode")
                continue
            pid = p.get("pid")
            real = pid is not None
            if pid is None:
                pid = FAKE_PID_BASE + i
            elif pid in pids:
                self.error(f"{where}.pid", f"PID {pid} is already used by processes[{pids[pid]}]")
            pids[pid] = i
            start = float(p.get("start", 0.0))
            stop = p.get("stop")
            if stop is not None and stop <= start:
                self.error(f"{where}.stop", f"must be after start ({start:g}), got {stop:g}")
            memory = self.curve(p.get("memory", DEFAULT_PROCESS_MEMORY), f"{where}.memory", size=True, lo=0.0)
            if memory is not None and memory.bounds()[1] > capacity:
                holder = f"GPU {gi_index}"
                if gpu.mig_enabled:
                    holder = f"GPU instance {mig_instance} of {holder}"
                self.error(f"{where}.memory", f"up to {gib(memory.bounds()[1])}, more than the "
                           f"{gib(capacity)} {holder} can hold")
            sm = self.curve(p.get("sm_util", 0), f"{where}.sm_util", lo=0.0, hi=100.0, follow=True)
            if isinstance(sm, FollowCpu) and not real:
                self.error(f"{where}.sm_util.follow_cpu", "needs a real 'pid' on the process")
            mem_util = (self.curve(p["mem_util"], f"{where}.mem_util", lo=0.0, hi=100.0)
                        if "mem_util" in p else None)
            kind = p.get("type", "compute")
            default_name = MPS_SERVER_NAME if kind == "mps_server" else f"process-{i}"
            out.append(ProcessSpec(
                index=i, pid=pid, real=real, name=p.get("name", default_name), gpu=gi_index,
                mig_instance=mig_instance, type=kind, memory=memory, sm_util=sm,
                mem_util=mem_util, start=start, stop=float(stop) if stop is not None else None,
                mps=self._mps(p, kind, where, capacity), environ=self._environ(p, real, where),
            ))
        self._check_mps_servers(out)
        return out

    def _mps(self, p: Mapping[str, Any], kind: str, where: str, capacity: int) -> MpsSpec | None:
        if "mps" not in p:
            return MpsSpec() if kind == "mps_client" else None
        if kind != "mps_client":
            self.error(f"{where}.mps", f"only an mps_client has MPS limits (this process is {kind})")
            return None
        if p.get("pid") is not None:
            self.error(f"{where}.mps", "a real PID's limits are its own environment: start it with "
                       + " and ".join(MPS_LIMIT_VARIABLES) + " instead")
            return None
        limits = p["mps"]
        memory = None
        if "pinned_memory_limit" in limits:
            memory = parse_size(limits["pinned_memory_limit"])
            if memory <= 0 or memory % MIB:
                self.error(f"{where}.mps.pinned_memory_limit", f"must be a positive whole number of MiB, "
                           f"got {memory} bytes")
                return None
            if memory > capacity:
                self.error(f"{where}.mps.pinned_memory_limit",
                           f"{gib(memory)} is more than the {gib(capacity)} the device holds")
                return None
        return MpsSpec(limits.get("active_thread_percentage"), memory)

    def _environ(self, p: Mapping[str, Any], real: bool, where: str) -> Mapping[str, str]:
        environ = dict(p.get("environ") or {})
        if environ and real:
            self.error(f"{where}.environ", "a real PID's environment is its own (/proc/PID/environ): "
                       "start the process with it instead")
            return {}
        given = [v for v in MPS_LIMIT_VARIABLES if v in environ]
        if given and "mps" in p:
            self.error(f"{where}.environ.{given[0]}",
                       "the MPS limits are given by 'mps' already: give them once")
        return environ

    def _check_mps_servers(self, processes: list[ProcessSpec]) -> None:
        """An MPS client connects to a server on its GPU (and MIG instance): the scenario must have one."""
        servers = {(p.gpu, p.mig_instance) for p in processes if p.type == "mps_server"}
        for p in processes:
            if p.type == "mps_client" and (p.gpu, p.mig_instance) not in servers:
                on = f"GPU {p.gpu}" + (f" instance {p.mig_instance}" if p.mig_instance is not None else "")
                self.error(f"processes[{p.index}].type",
                           f"an mps_client needs an mps_server process on {on} (type: mps_server)")

    # faults

    def _faults(self, entries: list[Mapping[str, Any]], gpus: list[GpuSpec]) -> list[Fault]:
        out: list[Fault] = []
        for i, entry in enumerate(entries):
            ((kind, f),) = entry.items()
            where = f"faults[{i}].{kind}"
            gpu = f.get("gpu")
            if gpu is not None and gpu >= len(gpus):
                self.error(f"{where}.gpu", f"GPU index {gpu} does not exist (scenario has {len(gpus)} GPUs)")
                continue
            at = float(f.get("at", 0.0))
            gi = f.get("gpu_instance")
            if gi is not None:
                spec = gpus[gpu]
                if not spec.mig_enabled:
                    self.error(f"{where}.gpu_instance", f"GPU {gpu} is not in MIG mode")
                    continue
                if spec.instance(gi) is None:
                    ids = ", ".join(str(x.id) for x in spec.mig_instances) or "none"
                    self.error(f"{where}.gpu_instance", f"GPU {gpu} has no GPU instance {gi} (it has: {ids})")
                    continue
            if kind == "gpu_lost":
                out.append(GpuLost(gpu, at))
            elif kind == "xid":
                out.append(XidFault(gpu, at, f["code"], gi))
            elif kind == "xid_storm":
                out.append(XidFault(gpu, at, f["code"], gi, f["count"], float(f.get("interval", 0.0))))
            elif kind in ("ecc_dbe", "ecc_sbe"):
                if not gpus[gpu].model.ecc:
                    self.error(where, f"GPU {gpu} ({gpus[gpu].model.key}) has no ECC memory")
                    continue
                out.append(EccFault(gpu, at, f.get("count", 1), double_bit=kind == "ecc_dbe"))
            elif kind == "pcie_replay":
                out.append(PcieReplayFault(gpu, at, f.get("count", 1)))
            elif kind == "hang":
                fn = f.get("function", "any")
                if fn != "any" and fn not in self.functions:
                    hint = difflib.get_close_matches(fn, sorted(self.functions), n=1)
                    more = f"; did you mean '{hint[0]}'?" if hint else ""
                    self.error(f"{where}.function", f"{fn!r} is not a pynvml function (or 'any'){more}")
                    continue
                out.append(HangFault(None if fn == "any" else fn, gpu, at, float(f["seconds"])))
            elif kind == "init_failure":
                name = f.get("error", "DRIVER_NOT_LOADED")
                code = getattr(pynvml, name if name.startswith("NVML_ERROR_") else f"NVML_ERROR_{name}", None)
                if not isinstance(code, int):
                    self.error(f"{where}.error", f"unknown NVML error {name!r} (e.g. DRIVER_NOT_LOADED)")
                    continue
                if any(isinstance(x, InitFailure) for x in out):
                    self.error(where, "only one init_failure per scenario")
                    continue
                out.append(InitFailure(float(f["until"]), code))
        return out

