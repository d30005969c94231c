"""``python bench/real_gpu.py mps``: MPS on a real GPU, what NVML shows and what the agent makes of it.

It starts an MPS control daemon of its own (``nvidia-cuda-mps-control -d`` with its pipe and log
directories in a temporary directory, so it touches no daemon already running and leaves the GPU's compute
mode as it is), then two PyTorch clients doing identical matrix products with different
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (70 and 30 by default; the first also with
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G``), and records:

- NVML directly: the compute, graphics and ``nvmlDeviceGetMPSComputeRunningProcesses_v3`` lists (PIDs, names,
  memory), the per-process utilization samples over a few seconds (whose PIDs they carry: clients or the
  server), the GPU's utilization and memory;
- each client's iterations per second against its thread percentage: both clients together, each alone
  under MPS (the other stopped with SIGSTOP), and one client without MPS for the baseline;
- the agent (``gpuagent run --backend nvml``) over ``--seconds``: its process series (kinds, MPS limits,
  utilization or its absence), ``gpuagent_pod/process_*mps*`` series, ``/v1/state`` processes, hints
  (sharing mode, tenants, schedulable share) and accounting (allocated per workload).

Then it stops the clients and the daemon (``quit`` on its pipe) whatever happened. As an item of ``all``
(``item``) it first stops every tenant of the other items and checks the GPU is otherwise idle, so the
rates are the clients' own (on the H200 run of 2026-11-27 five busy tenants shared the GPU with them).
The facts the code relies on and this checks: the server on the compute list, the clients only on the MPS
list, and where the driver puts the clients' per-process utilization (``devices/mps.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpucheck.items.probe import cursor_reads
from gpucheck.registry import ItemResult

MPS_LIST = "nvmlDeviceGetMPSComputeRunningProcesses_v3"


def register(commands: Any, real_gpu: Any) -> None:
    """Adds the ``mps`` command to ``real_gpu.py``'s subcommands; ``real_gpu`` is that module (its tenant,
    agent runner and metric parser)."""
    m = commands.add_parser("mps", help="MPS control daemon, two clients at different thread percentages")
    m.add_argument("--seconds", type=float, default=20, help="time the agent watches the clients")
    m.add_argument("--threads", type=int, nargs=2, default=(70, 30), metavar=("A", "B"),
                   help="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the two clients")
    m.add_argument("--size", type=int, default=8192, help="matrix size of the clients' products")
    m.set_defaults(run=functools.partial(run, real_gpu))


def run(real_gpu: Any, args: argparse.Namespace) -> dict:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("nvidia-cuda-mps-control is not on PATH (it ships with the driver's utilities)")
    directory = Path(tempfile.mkdtemp(prefix="gpuagent-mps-"))
    pipe, logs = directory / "pipe", directory / "log"
    pipe.mkdir()
    logs.mkdir()
    mps_env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    result: dict[str, Any] = {"threads": list(args.threads), "artifacts": str(directory)}
    result["baseline_iterations_per_second"] = _baseline(real_gpu, directory, args.size)
    subprocess.run([control, "-d"], env=mps_env, check=True, timeout=30)
    clients: list[tuple[subprocess.Popen, Path]] = []
    try:
        for name, threads, extra in (("a", args.threads[0], {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G"}),
                                     ("b", args.threads[1], {})):
            env = {**mps_env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(threads), **extra}
            clients.append(_client(real_gpu, directory, name, args.size, env))
        real_gpu.wait_counting([c for _, c in clients])
        time.sleep(2)
        pids = {p.pid: name for (p, _), name in zip(clients, "ab", strict=True)}
        result["nvml"] = _nvml_view(pids)
        result["iterations_per_second"] = _rates(real_gpu, [c for _, c in clients], seconds=5)
        result["alone_under_mps_iterations_per_second"] = _alone_rates(real_gpu, clients, seconds=3)
        result["clients"] = per_client(list(args.threads), result["iterations_per_second"],
                                       result["alone_under_mps_iterations_per_second"],
                                       result["baseline_iterations_per_second"])
        result["agent"] = _agent_view(real_gpu, directory, pids, args.seconds)
        result["server_log_tail"] = _tail(logs / "server.log")
        result["control_log_tail"] = _tail(logs / "control.log")
    finally:
        for process, _ in clients:
            process.kill()
            process.wait()
        with contextlib.suppress(Exception):
            subprocess.run([control], input="quit\n", text=True, env=mps_env, timeout=30)
    return result


def _client(real_gpu: Any, directory: Path, name: str, size: int, env: dict[str, str]
            ) -> tuple[subprocess.Popen, Path]:
    counter = directory / f"{name}.count"
    argv = [sys.executable, "-c", real_gpu.TENANT, str(counter), str(size), "1.0"]
    process = subprocess.Popen(argv, env=env)
    return process, counter


def _rates(real_gpu: Any, counters: list[Path], seconds: float) -> list[float]:
    before = [real_gpu.read_count(c) for c in counters]
    time.sleep(seconds)
    after = [real_gpu.read_count(c) for c in counters]
    return [round((b - a) / seconds, 1) for a, b in zip(before, after, strict=True)]


def _alone_rates(real_gpu: Any, clients: list[tuple[subprocess.Popen, Path]], seconds: float) -> list[float]:
    """Each client's rate with the others stopped (SIGSTOP: the process submits nothing; SIGCONT after)."""
    out = []
    for index, _ in enumerate(clients):
        others = [p for i, (p, _) in enumerate(clients) if i != index]
        for process in others:
            process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.5)
            out.append(_rates(real_gpu, [clients[index][1]], seconds)[0])
        finally:
            for process in others:
                process.send_signal(signal.SIGCONT)
    return out


def per_client(threads: list[int], together: list[float], alone: list[float], baseline: float
               ) -> list[dict[str, Any]]:
    """Each client's rate against its thread percentage: of the no-MPS baseline, alone and together, and its
    part of the clients' total."""
    total = sum(together)
    return [{"client": chr(ord("a") + i), "threads_percent": pct,
             "together_per_s": rate, "alone_per_s": solo,
             "together_of_baseline": round(rate / baseline, 3) if baseline else None,
             "alone_of_baseline": round(solo / baseline, 3) if baseline else None,
             "part_of_total": round(rate / total, 3) if total else None}
            for i, (pct, rate, solo) in enumerate(zip(threads, together, alone, strict=True))]


def item(real_gpu: Any, ctx: Any) -> ItemResult:
    """The ``mps`` item of ``all``: on an otherwise idle GPU, what NVML lists and the clients' rates."""
    idle = ctx.quiet([])
    result = ItemResult()
    result.check("the GPU otherwise idle before the MPS daemon starts", idle, bool(idle.get("idle")),
                 bar="no other process on the GPU; < 5 % busy")
    try:
        figures = run(real_gpu, argparse.Namespace(seconds=10, threads=(70, 30), size=8192))
    except SystemExit as exc:
        result.status, result.reason = "error", str(exc)
        return result
    result.figures = figures
    for client in figures.get("clients", ()):
        result.check(f"client {client['client']} at {client['threads_percent']} % of the SMs: iterations/s "
                     "together, alone under MPS (no-MPS baseline "
                     f"{figures['baseline_iterations_per_second']})",
                     [client["together_per_s"], client["alone_per_s"]], None,
                     note=f"{client['part_of_total']} of the clients' total")
    listed = (figures.get("nvml") or {}).get("nvmlDeviceGetComputeRunningProcesses")
    result.check("NVML's compute list: the MPS server (and clients), nothing else", listed, None)
    return result.settle()


def _baseline(real_gpu: Any, directory: Path, size: int) -> float:
    """One client alone, without MPS: what 100 % of the GPU gives."""
    process, counter = real_gpu.start_tenant(directory, "alone", size, 1.0)
    try:
        real_gpu.wait_counting([counter])
        time.sleep(1)
        return _rates(real_gpu, [counter], seconds=5)[0]
    finally:
        process.kill()
        process.wait()


def _nvml_view(pids: dict[int, str]) -> dict[str, Any]:
    import pynvml as nvml

    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)

        def listed(function: str) -> Any:
            try:
                return [{"pid": p.pid, "who": pids.get(p.pid, _comm(p.pid)), "memory_bytes": p.usedGpuMemory,
                         "gpu_instance_id": getattr(p, "gpuInstanceId", None)}
                        for p in getattr(nvml, function)(handle)]
            except nvml.NVMLError as exc:
                return f"NVMLError: {exc}"

        view: dict[str, Any] = {name: listed(name) for name in (
            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses", MPS_LIST)}
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        view["gpu"] = {"name": nvml.nvmlDeviceGetName(handle), "util_percent": util.gpu,
                       "memory_used_bytes": memory.used,
                       "compute_mode": nvml.nvmlDeviceGetComputeMode(handle)}
        view["process_utilization_samples"] = cursor_reads(
            nvml, handle, 0.5, 6,
            lambda s: {"who": pids.get(s.pid, _comm(s.pid)), "sm": s.smUtil, "mem": s.memUtil})
        return view
    finally:
        nvml.nvmlShutdown()


def _agent_view(real_gpu: Any, directory: Path, pids: dict[int, str], seconds: float) -> dict[str, Any]:
    port = real_gpu.free_port()
    with real_gpu.agent({"poll_interval": 1.0, "network": False}, port, directory):
        time.sleep(seconds)
        text = real_gpu.fetch(f"http://127.0.0.1:{port}/metrics")
        state = json.loads(real_gpu.fetch(f"http://127.0.0.1:{port}/v1/state"))
        hints = json.loads(real_gpu.fetch(f"http://127.0.0.1:{port}/v1/hints"))
    (directory / "metrics.txt").write_text(text)
    (directory / "state.json").write_text(json.dumps(state, indent=1))
    samples = real_gpu.parse_metrics(text)
    gpu = state["gpus"][0] if state.get("gpus") else {}
    hint = hints["gpus"][0] if hints.get("gpus") else {}
    return {
        "processes": [
            {"who": pids.get(p["pid"], p.get("comm")), "kind": p.get("kind"), "mps": p.get("mps"),
             "sm_util_percent": p.get("sm_util_percent"), "used_memory_bytes": p.get("used_memory_bytes"),
             "workload": (p.get("workload") or {}).get("name")}
            for p in gpu.get("processes", ())
        ],
        "mps_series": [[n, lab.get("pid") or lab.get("workload") or lab.get("pod"), v]
                       for n, lab, v in samples if "_mps_" in n],
        "process_kinds": sorted({lab.get("kind", "") for n, lab, _ in samples
                                 if n == "gpuagent_process_gpu_memory_used_bytes"}),
        "hints": {k: hint.get(k) for k in ("sharing_mode", "schedulable_share_ratio", "tenants")},
        "accounting_allocated": [[u["name"], u["allocated_gpus"]]
                                 for u in (state.get("accounting") or {}).get("usage", ())
                                 if u.get("level") != "container"],
        "nvml_mps_call": real_gpu.nvml_time(samples).get(MPS_LIST),
    }


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return str(pid)


def _tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
