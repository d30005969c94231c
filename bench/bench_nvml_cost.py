"""Model the driver-lock time of the agent's NVML calls on an 8xH100 node: calls counted on the simulator x
per-call costs measured on a real H100.

Usage: .venv/bin/python bench/bench_nvml_cost.py [--seconds 300] [--costs probe.json] [--against-main]

The agent polls the simulated 8xH100 node (``gpuagent.devices.sim``: the agent's own NVML code on a test
double of pynvml, which counts the calls) once a second of scenario time under a hand-moved clock, for
``--seconds`` of it, in each enforcement mode: ``off`` (the default), ``audit`` and ``enforce``. GPUs 0-2 are
time-shared by two or three workloads each (where the share controller acts), GPUs 3-7 run one workload
each. Each function's calls per GPU per second times its cost is the modelled time NVML holds the driver's
lock; the goal is at most 1 % of wall time on 8 GPUs at the default settings (1.25 ms per GPU per second)
and 2 % with enforcement on.

Costs (``COSTS``): medians per call measured by ``bench/real_gpu.py probe`` on an H100 80GB HBM3, driver
580.159.04, 2026-11-2x. A field-value call costs the sum of its fields' costs. Functions not measured there
cost ``UNMEASURED_US``: the monitor's total per GPU (about 3.8 ms a second) left 0.27 ms for the seven
getters the probe did not time, about 40 us each. ``--costs probe.json`` replaces any of them with a
later probe's ``call_us`` and ``field_us``. ``nvmlEventSetWait`` (the XID thread's blocking wait) is not
counted. On a real GPU the measure is ``gpuagent_nvml_call_duration_seconds``; this model says which calls
the tiers make, and lets a change be judged before a GPU is at hand.

``--against-main`` also runs this model on the code of the ``main`` branch (``git archive`` into a temporary
directory, the same scenario, keys main does not have left out) and prints both side by side. Ends with
one JSON line: ``{"off": {"ms_per_gpu_per_s": ..., "percent_8gpus": ...}, "audit": {...}, "enforce": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

COSTS_MEASURED = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "date": "2026-11-2x",
                  "by": "bench/real_gpu.py probe (medians per call)"}
CALL_US: dict[str, float] = {
    "nvmlDeviceGetProcessUtilization": 2000.0,
    "nvmlDeviceGetProcessesUtilizationInfo": 2000.0,  # not measured apart yet: assumed the same
    "nvmlGpmMetricsGet": 1500.0,
    "nvmlGpmSampleGet": 180.0,
    "nvmlGpmMigSampleGet": 180.0,
    "nvmlDeviceGetComputeRunningProcesses": 120.0,
    "nvmlDeviceGetGraphicsRunningProcesses": 120.0,
    "nvmlDeviceGetMemoryInfo": 85.0,
    "nvmlDeviceGetUtilizationRates": 57.0,
}
FIELD_US: dict[str, float] = {
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 3080.0,
    "NVML_FI_DEV_POWER_INSTANT": 7.0,
    # the other five fields of the old per-poll batch took 0.5 ms with the power: split evenly until the
    # probe times them one by one
    "NVML_FI_DEV_MEMORY_TEMP": 98.6,
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER": 98.6,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 98.6,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 98.6,
    "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL": 98.6,
}
UNMEASURED_US = 40.0
NOT_LOCK_TIME = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})
GPUS = 8
BUDGET = {"off": 1.0, "audit": 2.0, "enforce": 2.0}  # percent of wall time on 8 GPUs

# 8 GPUs: 0-2 time-shared by two or three workloads (the share controller acts there), 3-7 one each
SHARED = {0: ("a0", "b0"), 1: ("a1", "b1", "c1"), 2: ("a2", "b2")}
SCENARIO: dict[str, Any] = {
    "version": 1,
    "name": "nvml-cost",
    "gpus": [{"model": "H100-SXM5-80GB", "count": GPUS}],
    "processes": [
        *({"name": name, "gpu": gpu, "memory": "10Gi",
           "sm_util": {"sine": {"min": 20, "max": 70, "period": 40}}}
          for gpu, names in SHARED.items() for name in names),
        *({"name": f"solo{gpu}", "gpu": gpu, "memory": "30Gi", "sm_util": 85} for gpu in range(3, GPUS)),
    ],
}
SHARES = {"a0": 70, "b0": 30, "a1": 50, "b1": 30, "c1": 20, "a2": 60, "b2": 40}


class FieldRecorder:
    """The simulated NVML, passed through, remembering which fields each field-value call asked for."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.fields: Counter[int] = Counter()

    def nvmlDeviceGetFieldValues(self, handle: Any, ids: list[int]) -> Any:
        self.fields.update(ids)
        return self._nvml.nvmlDeviceGetFieldValues(handle, ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)


async def count_calls(
    mode: str, seconds: int, workdir: Path, extra: dict[str, float]
) -> tuple[dict[str, int], dict[str, int]]:
    """Calls per function and field-value reads per field over ``seconds`` of 1 s polls in ``mode``."""
    import yaml
    from simclock import FakeClock
    from test_accounting import NamedTenants

    from gpuagent.agent import Agent
    from gpuagent.config import KEYS, load_config
    from gpuagent.devices.sim import SimulatedNvml, load_scenario
    from gpuagent.snapshot.processes import Workload

    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    settings = {
        "backend": "sim", "scenario": str(scenario), "mode": mode, "poll_interval": 1.0,
        "journal_path": str(workdir / f"journal-{mode}.json"), "idle_events": "off", "kubernetes_api": "off",
        "pod_resources_socket": None, "network": False,
        "policies": [{"match_name": f"{name}.service", "gpu_share": share} for name, share in SHARES.items()],
        **extra,
    }
    known = {key.name for key in KEYS}  # the code measured may predate some keys
    config = load_config(None, env={}, overrides={k: v for k, v in settings.items() if k in known})
    clock = FakeClock()
    nvml = FieldRecorder(SimulatedNvml(load_scenario(scenario), clock=clock))
    agent = Agent(config, nvml=nvml, backend="sim", clock=lambda: 1.79e9 + clock(), monotonic=clock)
    names = [p["name"] for p in SCENARIO["processes"]]
    agent.pods = NamedTenants({n: Workload(kind="systemd_service", name=f"{n}.service")  # type: ignore[assignment]
                               for n in names})
    try:
        await agent.poll_once()  # start-up (static info, first reads) is not steady state
        start, fields_start = Counter(nvml.call_counts()), Counter(nvml.fields)
        for _ in range(seconds):
            clock.advance(1.0)
            await agent.poll_once()
        calls = Counter(nvml.call_counts()) - start
        fields = nvml.fields - fields_start
    finally:
        if agent.enforcer is not None:
            agent.enforcer.shutdown()
        await agent.devices.close()
    return dict(calls), {str(k): v for k, v in fields.items()}


def field_names() -> dict[int, str]:
    import pynvml

    return {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_FI_DEV_")}


def model(calls: dict[str, int], fields: dict[str, int], seconds: int,
          call_us: dict[str, float], field_us: dict[str, float]) -> dict[str, Any]:
    """Lock time per GPU per second, by function, from counted calls and per-call costs."""
    names = field_names()
    per_function: dict[str, float] = {}
    for function, n in calls.items():
        if function in NOT_LOCK_TIME or function == "nvmlDeviceGetFieldValues":
            continue
        per_function[function] = n * call_us.get(function, UNMEASURED_US)
    for field_id, n in fields.items():
        name = names.get(int(field_id), field_id)
        per_function[f"nvmlDeviceGetFieldValues[{name}]"] = n * field_us.get(name, UNMEASURED_US)
    scale = 1e-3 / (GPUS * seconds)  # us over the run -> ms per GPU per second
    ms = sum(per_function.values()) * scale
    return {
        "ms_per_gpu_per_s": round(ms, 3),
        "percent_8gpus": round(ms * GPUS / 10, 3),  # 8 GPUs' ms in 1000 ms, in percent
        "calls_per_gpu_per_s": {f: round(n / (GPUS * seconds), 3) for f, n in sorted(calls.items())
                                if f not in NOT_LOCK_TIME},
        "top_ms_per_gpu_per_s": dict(sorted(((f, round(us * scale, 3)) for f, us in per_function.items()),
                                            key=lambda kv: -kv[1])[:8]),
    }


def load_costs(path: str | None) -> tuple[dict[str, float], dict[str, float]]:
    """The costs above, with a probe's JSON (``call_us``, ``field_us``) over them."""
    call_us, field_us = dict(CALL_US), dict(FIELD_US)
    if path:
        probe = json.loads(Path(path).read_text())
        probe = probe.get("probe", probe)  # the probe alone, or a gpu-check report.json holding it
        call_us.update({k: float(v) for k, v in (probe.get("call_us") or {}).items()
                        if isinstance(v, (int, float))})
        field_us.update({k: float(v) for k, v in (probe.get("field_us") or {}).items()
                         if isinstance(v, (int, float)) and k.startswith("NVML_FI_")})
    return call_us, field_us


def run_modes(seconds: int, costs: str | None, extra: dict[str, float]) -> dict[str, Any]:
    call_us, field_us = load_costs(costs)
    out = {}
    with tempfile.TemporaryDirectory(prefix="nvml-cost-") as directory:
        for mode in ("off", "audit", "enforce"):
            calls, fields = asyncio.run(count_calls(mode, seconds, Path(directory), extra))
            out[mode] = model(calls, fields, seconds, call_us, field_us)
    return out


def main_branch_figures(args: argparse.Namespace) -> dict[str, Any]:
    """This model on main's code: its tree exported to a temporary directory, this script run there."""
    with tempfile.TemporaryDirectory(prefix="nvml-cost-main-") as directory:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "main"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        command = [sys.executable, str(Path(__file__).resolve()), "--code", directory,
                   "--seconds", str(args.seconds), "--json-only", *(f"--set={s}" for s in args.set)]
        if args.costs:
            command += ["--costs", str(Path(args.costs).resolve())]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=directory)
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=300, help="scenario seconds polled per mode")
    parser.add_argument("--costs", help="a probe JSON (real_gpu.py probe, or a gpu-check report.json)")
    parser.add_argument("--against-main", action="store_true", help="also model main's code, side by side")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=SECONDS",
                        help="another value of an interval key, e.g. --set energy_interval=10 (repeatable)")
    parser.add_argument("--code", help=argparse.SUPPRESS)  # the checkout whose gpuagent is measured
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    code = Path(args.code) if args.code else ROOT
    sys.path[:0] = [str(code), str(ROOT / "tests")]  # the measured code first; the tests' stand-ins
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: expected KEY=SECONDS")
        extra[key] = float(value)
    figures = run_modes(args.seconds, args.costs, extra)
    summary = {m: {k: f[k] for k in ("ms_per_gpu_per_s", "percent_8gpus")} for m, f in figures.items()}
    if args.json_only:
        print(json.dumps(summary))
        return 0
    before = main_branch_figures(args) if args.against_main else None
    print(f"modelled NVML lock time, simulated 8xH100 ({args.seconds} s of 1 s polls per mode); costs: "
          f"{COSTS_MEASURED['gpu']}, driver {COSTS_MEASURED['driver']}, {COSTS_MEASURED['date']}"
          + (f", overridden by {args.costs}" if args.costs else "")
          + (f"; {', '.join(args.set)}" if args.set else ""))
    header = f"{'mode':8} {'ms/GPU/s':>9} {'8 GPUs %':>9} {'budget %':>9}"
    print(header + (f" {'main ms/GPU/s':>14} {'main 8 GPUs %':>14}" if before else ""))
    for mode, f in figures.items():
        line = f"{mode:8} {f['ms_per_gpu_per_s']:9.3f} {f['percent_8gpus']:9.3f} {BUDGET[mode]:9.1f}"
        if before:
            line += f" {before[mode]['ms_per_gpu_per_s']:14.3f} {before[mode]['percent_8gpus']:14.3f}"
        print(line)
    for mode, f in figures.items():
        top = ", ".join(f"{name} {ms}" for name, ms in f["top_ms_per_gpu_per_s"].items())
        print(f"  {mode}: largest ms/GPU/s: {top}")
    if before:
        summary["main"] = before
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
