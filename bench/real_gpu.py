"""Checks that need a real NVIDIA GPU: the agent against the real driver, and time-slice shares on it.

Usage (on a machine with a GPU, PyTorch and this repository on PYTHONPATH):

    python bench/real_gpu.py monitor --seconds 60   # agent cost and NVML time under a two-tenant load
    python bench/real_gpu.py share --seconds 40     # two PyTorch tenants at 70/30 through cgroup freezing
    python bench/real_gpu.py mps --seconds 20       # an MPS daemon, two clients at 70 % / 30 % of the SMs

``monitor`` runs two PyTorch tenants (one busy, one light) and a real ``gpuagent run --backend nvml`` at 1 s
polling; it samples the agent's CPU and RSS each second, and at the end reads its own metrics: the time spent
inside each NVML function (the budget is 1 % of wall time), poll durations and what was attributed.

``share`` runs two PyTorch tenants doing identical matrix products, each in its own cgroup shaped like a
systemd service, first alone side by side (baseline), then under ``gpuagent run --mode enforce`` with
policies giving them 70 % and 30 % of the GPU. Achieved shares are the tenants' own iteration counts, not
what the agent reports. After SIGTERM it checks that nothing is left frozen.

``mps`` (``bench/real_gpu_mps.py``) starts an MPS control daemon of its own, runs two PyTorch clients with
different ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and records what NVML lists and what the agent exports.

Prints one JSON document per command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import real_gpu_mps

ROOT = Path(__file__).resolve().parent.parent

# A tenant: bf16 matrix products, synchronised each iteration so a frozen process stops submitting work;
# its iteration count is written to a file every 0.1 s. DUTY < 1 sleeps between products (a light tenant).
TENANT = r"""
import os, sys, time, torch
path, size, duty = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
n, last = 0, 0.0
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
while True:
    t0 = time.perf_counter()
    (a @ b).sum().item()
    n += 1
    if duty < 1.0:
        busy = time.perf_counter() - t0
        time.sleep(busy * (1.0 - duty) / duty)
    now = time.monotonic()
    if now - last > 0.1:
        os.pwrite(fd, f"{n:020d}".encode(), 0)
        last = now
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_count(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_ready(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            fetch(f"http://127.0.0.1:{port}/readyz", 2.0)
            return
        time.sleep(0.2)
    raise SystemExit(f"agent on port {port} not ready after {timeout}s")


def start_tenant(directory: Path, name: str, size: int, duty: float) -> tuple[subprocess.Popen, Path]:
    counter = directory / f"{name}.count"
    process = subprocess.Popen([sys.executable, "-c", TENANT, str(counter), str(size), str(duty)])
    return process, counter


def wait_counting(counters: list[Path], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(read_count(c) > 0 for c in counters):
            return
        time.sleep(0.2)
    raise SystemExit("tenants did not start computing")


@contextlib.contextmanager
def agent(config: dict, port: int, directory: Path) -> Iterator[subprocess.Popen]:
    path = directory / f"agent-{port}.yaml"
    path.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "backend": "nvml", **config}))
    log = open(directory / f"agent-{port}.log", "w")  # noqa: SIM115 - closed below
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "gpuagent", "run", "--config", str(path)],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(port)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


_SAMPLE = re.compile(r'^(\w+)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            samples.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return samples


def nvml_time(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, dict[str, float]]:
    sums = {lab.get("function", ""): v for n, lab, v in samples
            if n == "gpuagent_nvml_call_duration_seconds_sum"}
    counts = {lab.get("function", ""): v for n, lab, v in samples
              if n == "gpuagent_nvml_call_duration_seconds_count"}
    return {f: {"seconds": sums[f], "calls": counts.get(f, 0.0),
                "mean_us": 1e6 * sums[f] / counts[f] if counts.get(f) else 0.0} for f in sums}


def monitor(args: argparse.Namespace) -> dict:
    import psutil

    directory = Path(tempfile.mkdtemp(prefix="gpuagent-real-"))
    tenants = [start_tenant(directory, "busy", 8192, 1.0), start_tenant(directory, "light", 4096, 0.2)]
    result: dict = {}
    try:
        wait_counting([c for _, c in tenants])
        port = free_port()
        with agent({"poll_interval": 1.0}, port, directory) as process:
            proc = psutil.Process(process.pid)
            started = time.monotonic()
            cpu0 = proc.cpu_times()
            rss, polls = [], []
            while time.monotonic() - started < args.seconds:
                time.sleep(1.0)
                rss.append(proc.memory_info().rss / 2**20)
                state = json.loads(fetch(f"http://127.0.0.1:{port}/v1/state"))
                polls.append(state["poll_duration_seconds"])
            cpu1 = proc.cpu_times()
            wall = time.monotonic() - started
            text = fetch(f"http://127.0.0.1:{port}/metrics")
            scrape_times = []
            for _ in range(20):
                t0 = time.perf_counter()
                fetch(f"http://127.0.0.1:{port}/metrics")
                scrape_times.append(time.perf_counter() - t0)
            state = json.loads(fetch(f"http://127.0.0.1:{port}/v1/state"))
            hints = json.loads(fetch(f"http://127.0.0.1:{port}/v1/hints"))
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/hints/score", method="POST",
                data=json.dumps({"gpus": 1, "memory": "10Gi", "share": 30}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                score = json.loads(response.read())
            uptime = time.time() - proc.create_time()
        (directory / "metrics.txt").write_text(text)
        (directory / "state.json").write_text(json.dumps(state, indent=1))
        samples = parse_metrics(text)
        calls = nvml_time(samples)
        waiting = {"nvmlEventSetWait", "nvmlEventSetWait_v2"}
        nvml_seconds = sum(v["seconds"] for f, v in calls.items() if f not in waiting)
        processes = [
            {"pid": p["pid"], "comm": p.get("comm"), "sm_util_percent": p.get("sm_util_percent"),
             "used_memory_bytes": p.get("used_memory_bytes"),
             "workload": (p.get("workload") or {}).get("kind")}
            for g in state["gpus"] for p in g.get("processes", ())
        ]
        gpu = state["gpus"][0] if state["gpus"] else {}
        hint = hints["gpus"][0] if hints.get("gpus") else {}

        def values(name: str, scale: float = 1.0) -> list[float]:
            return [v * scale for n, _, v in samples if n == name]

        def by_workload(suffix: str) -> dict[str, float]:
            names = (f"gpuagent_workload_gpu_{suffix}", f"gpuagent_pod_gpu_{suffix}")
            return {lab.get("workload") or lab.get("pod", ""): round(v, 1)
                    for n, lab, v in samples if n in names}
        result = {
            "seconds": round(wall, 1),
            "driver": state.get("driver_version"),
            "gpu": (gpu.get("info") or {}).get("name"),
            "gpm_supported": (gpu.get("info") or {}).get("gpm_supported"),
            "agent_cpu_percent_of_one_core": round(
                100 * ((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) / wall, 3),
            "rss_mib_first_last_max": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)],
            "poll_seconds_median": round(statistics.median(polls), 5),
            "poll_seconds_max": round(max(polls), 5),
            "scrape_round_trip_ms_median": round(1000 * statistics.median(scrape_times), 2),
            "series": len(samples),
            "nvml_seconds_total": round(nvml_seconds, 4),
            "nvml_share_of_wall": round(nvml_seconds / uptime, 5),
            "nvml_top_functions": dict(sorted(
                ((f, {k: round(x, 3) for k, x in v.items()}) for f, v in calls.items() if f not in waiting),
                key=lambda kv: -kv[1]["seconds"])[:12]),
            "processes": processes,
            "prof_series": sorted({n for n, _, _ in samples if n.startswith("DCGM_FI_PROF_")}),
            "gpu_util": [v for n, _, v in samples if n == "DCGM_FI_DEV_GPU_UTIL"],
            "hints_gpu0": {k: hint.get(k) for k in (
                "sharing_mode", "sm_util_short_ratio", "sm_util_long_ratio", "memory_free_bytes",
                "schedulable_share_ratio", "numa_node", "compute_mode")},
            "score_1gpu_10Gi_share30": {k: score.get(k)
                                        for k in ("fits", "score", "recommended_mode", "reasons")},
            "energy": {
                "counter_joules": values("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", scale=1e-3),
                "accounted_joules": values("gpuagent_gpu_energy_accounted_joules_total"),
                "unattributed_joules": values("gpuagent_gpu_energy_unattributed_joules_total"),
                "by_workload_joules": by_workload("energy_joules_total"),
                "busy_seconds": by_workload("busy_seconds_total"),
            },
            "artifacts": str(directory),
        }
    finally:
        for process, _ in tenants:
            process.kill()
            process.wait()
    return result


def cgroup2_root() -> Path:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] == "cgroup2":
            return Path(left.split()[4])
    raise SystemExit("no cgroup v2 mount")


def share(args: argparse.Namespace) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="gpuagent-share-"))
    root = cgroup2_root()
    slice_dir = root / "system.slice"
    made_slice = not slice_dir.exists()
    slice_dir.mkdir(exist_ok=True)
    groups = {name: slice_dir / f"gputest-{name}.service" for name in ("a", "b")}
    tenants: dict[str, tuple[subprocess.Popen, Path]] = {}
    result: dict = {"cgroup2": str(root)}
    try:
        for name, group in groups.items():
            group.mkdir(exist_ok=True)
            process, counter = start_tenant(directory, name, 8192, 1.0)
            (group / "cgroup.procs").write_text(str(process.pid))
            tenants[name] = (process, counter)
        wait_counting([c for _, c in tenants.values()])
        time.sleep(3)  # warm-up

        def rates(seconds: float) -> dict[str, float]:
            before = {n: read_count(c) for n, (_, c) in tenants.items()}
            time.sleep(seconds)
            after = {n: read_count(c) for n, (_, c) in tenants.items()}
            return {n: (after[n] - before[n]) / seconds for n in tenants}

        # solo: b frozen by hand, a alone gives the full rate
        (groups["b"] / "cgroup.freeze").write_text("1")
        time.sleep(1)
        solo = rates(5)["a"]
        (groups["b"] / "cgroup.freeze").write_text("0")
        time.sleep(1)
        baseline = rates(args.baseline)
        result["solo_iterations_per_s"] = round(solo, 1)
        result["baseline_iterations_per_s"] = {n: round(v, 1) for n, v in baseline.items()}
        config = {
            "mode": "enforce",
            "poll_interval": args.poll,
            "share_period": args.period,
            "journal_path": str(directory / "journal"),
            "freezable_outside_kubepods": ["/system.slice/gputest-*"],
            "policies": [
                {"match_name": "gputest-a.service", "gpu_share": 70},
                {"match_name": "gputest-b.service", "gpu_share": 30},
            ],
        }
        port = free_port()
        trace: list[dict] = []

        def traced_rates(seconds: float) -> dict[str, float]:
            """Rates over ``seconds`` while recording, each second, what the agent measured and decided."""
            before = {n: read_count(c) for n, (_, c) in tenants.items()}
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                state = json.loads(fetch(f"http://127.0.0.1:{port}/v1/state"))
                uses = {(p.get("workload") or {}).get("name"): p.get("sm_util_percent")
                        for g in state["gpus"] for p in g.get("processes", ())}
                shares = (state.get("enforcement") or {}).get("shares", ())
                trace.append({"use": [uses.get(f"gputest-{n}.service") for n in "ab"],
                              "frozen": [round(next((x["frozen_ratio"] for x in shares
                                                     if x["pod"] == f"gputest-{n}.service"), 0.0), 2)
                                         for n in "ab"]})
            after = {n: read_count(c) for n, (_, c) in tenants.items()}
            return {n: (after[n] - before[n]) / seconds for n in tenants}

        with agent(config, port, directory):
            time.sleep(args.settle)
            windows = [traced_rates(5) for _ in range(int(args.seconds // 5))]
            text = fetch(f"http://127.0.0.1:{port}/metrics")
        result["trace"] = trace
        (directory / "enforce-metrics.txt").write_text(text)
        total_a = sum(w["a"] for w in windows)
        total_b = sum(w["b"] for w in windows)
        result["enforced_iterations_per_s"] = {"a": round(total_a / len(windows), 1),
                                               "b": round(total_b / len(windows), 1)}
        result["enforced_share_a_b"] = [round(total_a / (total_a + total_b), 3),
                                        round(total_b / (total_a + total_b), 3)]
        result["enforced_share_per_5s_window_a"] = [round(w["a"] / (w["a"] + w["b"]), 3) for w in windows]
        result["throughput_kept_vs_solo"] = round((total_a + total_b) / len(windows) / solo, 3)
        result["agent_view"] = [
            (n, lab.get("pod") or lab.get("workload"), round(v, 3)) for n, lab, v in parse_metrics(text)
            if n in ("gpuagent_pod_gpu_share_achieved_ratio", "gpuagent_pod_gpu_frozen_ratio",
                     "gpuagent_pod_gpu_share_limit_ratio")
        ]
        result["frozen_after_stop"] = {n: (g / "cgroup.freeze").read_text().strip()
                                       for n, g in groups.items()}
        time.sleep(2)
        after_stop = rates(3)
        result["iterations_per_s_after_stop"] = {n: round(v, 1) for n, v in after_stop.items()}
        result["artifacts"] = str(directory)
    finally:
        for process, _ in tenants.values():
            process.kill()
            process.wait()
        for group in groups.values():
            with contextlib.suppress(OSError):
                (group / "cgroup.freeze").write_text("0")
                group.rmdir()
        if made_slice:
            with contextlib.suppress(OSError):
                slice_dir.rmdir()
    return result


def probe(args: argparse.Namespace) -> dict:
    """Where NVML time goes (each fast field alone) and what per-process samples look like when two
    identical tenants time-slice the GPU."""
    import pynvml as nvml

    from gpuagent.devices.fields import FAST_FIELDS

    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

    def timed(call, *a, repeat: int = 15) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            with contextlib.suppress(nvml.NVMLError):
                call(*a)
            times.append(time.perf_counter() - t0)
        return round(1e6 * statistics.median(times), 1)

    result: dict = {"field_us": {}, "call_us": {}}
    ids = []
    for spec in FAST_FIELDS:
        fid = getattr(nvml, spec.nvml_name, None)
        if fid is None:
            continue
        ids.append(fid)
        result["field_us"][spec.nvml_name] = timed(nvml.nvmlDeviceGetFieldValues, handle, [fid])
    result["field_us"]["batch"] = timed(nvml.nvmlDeviceGetFieldValues, handle, ids)
    directory = Path(tempfile.mkdtemp(prefix="gpuagent-probe-"))
    tenants = [start_tenant(directory, "a", 8192, 1.0), start_tenant(directory, "b", 8192, 1.0)]
    try:
        wait_counting([c for _, c in tenants])
        time.sleep(2)
        result["field_us_loaded"] = {"batch": timed(nvml.nvmlDeviceGetFieldValues, handle, ids)}
        for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                     "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetTemperature"):
            call = getattr(nvml, name)
            extra = (nvml.NVML_TEMPERATURE_GPU,) if name == "nvmlDeviceGetTemperature" else ()
            result["call_us"][name] = timed(call, handle, *extra)
        result["call_us"]["nvmlDeviceGetProcessUtilization"] = timed(
            nvml.nvmlDeviceGetProcessUtilization, handle, 0)
        pids = {p.pid: name for (p, _), name in zip(tenants, "ab", strict=True)}
        for interval in (1.0, 0.25):
            cursor, polls = 0, []
            nvml.nvmlDeviceGetProcessUtilization(handle, 0)
            for _ in range(int(6 / interval)):
                time.sleep(interval)
                try:
                    samples = nvml.nvmlDeviceGetProcessUtilization(handle, cursor)
                except nvml.NVMLError as exc:
                    polls.append(str(exc))
                    continue
                row = []
                for sample in samples:
                    cursor = max(cursor, sample.timeStamp)
                    row.append((pids.get(sample.pid, sample.pid), sample.smUtil, sample.timeStamp % 10**8))
                polls.append(row)
            result[f"process_samples_every_{interval}s"] = polls
        before = [read_count(c) for _, c in tenants]
        time.sleep(5)
        after = [read_count(c) for _, c in tenants]
        result["true_split_a"] = round((after[0] - before[0]) / (sum(after) - sum(before)), 3)
        if hasattr(nvml, "nvmlDeviceGetProcessesUtilizationInfo"):
            try:
                info = nvml.c_nvmlProcessesUtilizationInfo_t()
                info.version = nvml.nvmlProcessesUtilizationInfo_v1
                info.lastSeenTimeStamp = 0
                got = nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, info)
                result["v2_api"] = [(pids.get(p.pid, p.pid), p.smUtil, p.timeStamp % 10**8)
                                    for p in got.procUtilArray[: got.processSamplesCount]]
            except Exception as exc:  # a probe reports what it sees
                result["v2_api"] = repr(exc)
    finally:
        for process, _ in tenants:
            process.kill()
            process.wait()
        nvml.nvmlShutdown()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("monitor")
    m.add_argument("--seconds", type=float, default=60)
    s = commands.add_parser("share")
    s.add_argument("--seconds", type=float, default=40, help="measured time under enforcement")
    s.add_argument("--baseline", type=float, default=10)
    s.add_argument("--settle", type=float, default=8, help="time the controller gets before measuring")
    s.add_argument("--poll", type=float, default=1.0)
    s.add_argument("--period", type=float, default=0.1, help="the duty cycle's period (share_period)")
    commands.add_parser("probe")
    real_gpu_mps.register(commands, sys.modules[__name__])  # mps: its own module, run by args.run
    args = parser.parse_args()
    if getattr(args, "run", None) is not None:
        print(json.dumps(args.run(args), indent=1))
        return 0
    result = {"monitor": monitor, "share": share, "probe": probe}[args.command](args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
