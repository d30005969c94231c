"""Churn soak: does the agent's memory or series count grow with dead PIDs, pods and label sets?

A real ``gpuagent run --backend sim`` process on an 8xH100 node whose GPU processes come and go (many
short-lived PIDs, from the scenario's ``start``/``stop`` lifetimes) inside pods that come and go through the
real pod-resources gRPC server (``tests/podresources_server.py``) and the fake API server
(``tests/fake_apiserver.py``). Each pod gets its own kubelet-shaped ``/proc/PID/cgroup`` files, so every
process is attributed to its pod. ``/metrics`` and ``/v1/hints`` are scraped every second; every 10 s the
agent's RSS and series count are sampled.

Ended workloads keep their accounting series for ``accounting_retention`` seconds (300 by default), so the
series count rises for that long after the first pods end and must then stay flat. The verdict compares the
series and RSS of the run's last third with its middle third.

With ``--backend sim`` the simulated NVML lives inside the agent process, and a churn scenario lists every
process the run will ever start (about 5,500 for 10 minutes). The scenario is written as JSON (a YAML subset
the simulator reads with ``json.loads``; PyYAML's parse graph would leave ~30-48 MiB in the agent), and
the simulator's own footprint (its module imports, the loaded scenario and a ``SimulatedNvml``) is measured
in a separate interpreter and reported as ``simulator_mib``, with the RSS net of it: what a real node's
agent, which has no simulator, would hold.

    .venv/bin/python bench/bench_soak.py --minutes 10     # the soak; --minutes 2 for a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from kubenode import NODE, ROOT, Container, KubeletNode, Pod, gpus, kubelet_node, make_pod, write_cgroup

from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.devices.sim.scenario import FAKE_PID_BASE

GPUS = 8
LANES_PER_POD = 6  # concurrent processes in a pod
SAMPLE_EVERY_SECONDS = 10.0
# A pod's processes end this long before the pod leaves the kubelet and the API server: the simulator's
# clock starts a second or two after the bench's, and a process outliving its pod's API object is named by
# its UID instead (a second label set, kept for accounting_retention).
ENDS_BEFORE_POD_SECONDS = 3.0
PID_LABEL = re.compile(r'pid="(\d+)"')
POD_LABEL = re.compile(r'pod="([^"]+)"')


@dataclass(frozen=True)
class PodSlot:
    """One pod: it holds one GPU for ``[start, stop)`` seconds of scenario time."""

    name: str
    uid: str
    gpu: int
    start: float
    stop: float


def plan(minutes: float, slot_seconds: float, life_seconds: tuple[float, float], seed: int
         ) -> tuple[list[PodSlot], list[dict[str, object]], dict[int, str]]:
    """Pods per GPU per slot; inside each, lanes of short-lived processes. Returns the pods, the scenario's
    process entries (fake PIDs in entry order) and each PID's pod UID."""
    rng = random.Random(seed)
    total = minutes * 60 + slot_seconds
    pods: list[PodSlot] = []
    processes: list[dict[str, object]] = []
    pod_of_pid: dict[int, str] = {}
    slot = 0
    while slot * slot_seconds < total:
        for gpu in range(GPUS):
            start, stop = slot * slot_seconds, (slot + 1) * slot_seconds
            pod = PodSlot(f"job-g{gpu}-s{slot}", str(uuid.UUID(int=rng.getrandbits(128))), gpu, start, stop)
            pods.append(pod)
            for lane in range(LANES_PER_POD):
                t = start + rng.uniform(0.0, 1.0)
                last = stop - ENDS_BEFORE_POD_SECONDS
                while t < last - 0.5:
                    end = min(last, t + rng.uniform(*life_seconds))
                    pod_of_pid[FAKE_PID_BASE + len(processes)] = pod.uid
                    processes.append({
                        "name": f"{pod.name}-l{lane}", "gpu": gpu, "memory": f"{rng.randint(1, 8)}Gi",
                        "sm_util": rng.randint(5, 15), "start": round(t, 3), "stop": round(end, 3),
                    })
                    t = end + rng.uniform(0.0, 0.5)
        slot += 1
    return pods, processes, pod_of_pid


def write_proc_root(root: Path, pod_of_pid: dict[int, str]) -> None:
    """Kubelet-shaped cgroup files (systemd driver, containerd) for every PID the scenario will list."""
    for pid, uid in pod_of_pid.items():
        write_cgroup(root, pid, uid)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for PID {pid}")


SIMULATOR_FOOTPRINT = """
import gc, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import gpuagent.agent  # everything the agent imports anyway
before = rss()
from gpuagent.devices.sim import SimulatedNvml, load_scenario
nvml = SimulatedNvml(load_scenario(sys.argv[1]))
nvml.nvmlInit()
gc.collect()
print(rss() - before)
"""


def simulator_footprint_bytes(scenario_path: Path) -> int:
    """RSS the simulator adds to an agent that has imported everything else: its modules (jsonschema
    among them), the loaded scenario and an initialised ``SimulatedNvml``, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", SIMULATOR_FOOTPRINT, str(scenario_path)], check=True,
                         capture_output=True, text=True, timeout=120)
    return int(out.stdout.split()[-1])


def with_simulator(result: dict[str, object], simulator_bytes: int, processes: int) -> dict[str, object]:
    """``result`` plus the simulator's footprint and the agent's RSS net of it."""
    rss: dict[str, float] = result["rss_mib"]  # type: ignore[assignment]
    sim_mib = round(simulator_bytes / 2**20, 1)
    net = {k: round(v - sim_mib, 1) for k, v in rss.items()}
    return {**result, "scenario_processes": processes, "simulator_mib": sim_mib,
            "rss_net_of_simulator_mib": net}


def series_by_family(body: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


async def soak(args: argparse.Namespace) -> dict[str, object]:
    lives = (args.min_life, args.max_life)
    pods, processes, pod_of_pid = plan(args.minutes, args.pod_seconds, lives, args.seed)
    base = yaml.safe_load((ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml").read_text())
    scenario = {"version": 1, "name": "soak", "hostname": NODE, "seed": args.seed, "gpus": base["gpus"],
                "processes": processes}
    with tempfile.TemporaryDirectory(prefix="gpuagent-soak-") as tmp:
        work = Path(tmp)
        scenario_path = work / "soak.json"
        scenario_path.write_text(json.dumps(scenario))
        simulator_bytes = simulator_footprint_bytes(scenario_path)
        nvml = SimulatedNvml(load_scenario(scenario_path))
        nvml.nvmlInit()
        uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(GPUS)]
        async with kubelet_node(work, allocatable=[gpus(*uuids)]) as node:
            write_proc_root(work / "proc", pod_of_pid)
            config = work / "gpuagent.yaml"
            config.write_text(yaml.safe_dump(node.agent_config(
                pod_resources_interval=1.0, accounting_retention=args.retention, idle_events="off",
            )))
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            agent = subprocess.Popen(
                [sys.executable, "-m", "gpuagent", "run", "--config", str(config), "--backend", "sim",
                 "--scenario", str(scenario_path), "--listen", f"127.0.0.1:{port}", "--poll-interval", "1",
                 "--log-level", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            started = time.monotonic()  # the simulator's t = 0 is within a second or two of this
            try:
                result = await drive(args, url, agent, started, pods, uuids, node)
                return with_simulator(result, simulator_bytes, len(processes))
            finally:
                agent.send_signal(signal.SIGTERM)
                try:
                    agent.wait(timeout=30)
                finally:
                    if agent.poll() is None:
                        agent.kill()
                        agent.wait()


async def drive(args: argparse.Namespace, url: str, agent: subprocess.Popen[str], started: float,
                pods: list[PodSlot], uuids: list[str], node: KubeletNode) -> dict[str, object]:
    samples: list[dict[str, object]] = []
    seen_pods: set[str] = set()
    seen_pids: set[str] = set()
    scrapes = failures = 0
    live: dict[str, PodSlot] = {}
    next_sample = 0.0
    duration = args.minutes * 60
    timeout = aiohttp.ClientTimeout(total=10)
    kubelet, api = node.kubelet, node.api
    async with aiohttp.ClientSession(timeout=timeout) as session:
        deadline = time.monotonic() + 30
        while True:
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else "agent exited"
            try:
                async with session.get(url + "/readyz") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "agent not ready in 30 s"
            await asyncio.sleep(0.2)
        while (now := time.monotonic() - started) < duration:
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else "agent exited"
            wanted = {p.uid: p for p in pods if p.start <= now < p.stop}
            if wanted.keys() != live.keys():
                for uid in live.keys() - wanted.keys():
                    api.delete_pod(uid)
                for uid in wanted.keys() - live.keys():
                    p = wanted[uid]
                    api.add_pod(make_pod(p.name, namespace="soak", uid=uid, containers=("main",)))
                kubelet.set_pods([Pod(p.name, "soak", [Container("main", [gpus(uuids[p.gpu])])])
                                  for p in wanted.values()])
                live = wanted
            body = ""
            for path in ("/metrics", "/v1/hints"):
                scrapes += 1
                try:
                    async with session.get(url + path) as response:
                        text = await response.text()
                        if response.status != 200:
                            failures += 1
                        elif path == "/metrics":
                            body = text
                except aiohttp.ClientError:
                    failures += 1
            seen_pods.update(POD_LABEL.findall(body))
            seen_pids.update(PID_LABEL.findall(body))
            if body and now >= next_sample:
                families = series_by_family(body)
                samples.append({"t_s": round(now, 1), "rss_bytes": rss_bytes(agent.pid),
                                "series": sum(families.values()), "families": families,
                                "pods_now": len(set(POD_LABEL.findall(body))),
                                "pids_now": len(set(PID_LABEL.findall(body)))})
                print(f"t={now:6.1f}s rss={samples[-1]['rss_bytes'] / 2**20:6.1f} MiB "
                      f"series={samples[-1]['series']} pods={samples[-1]['pods_now']} "
                      f"pids={samples[-1]['pids_now']}", flush=True)
                next_sample += SAMPLE_EVERY_SECONDS
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started - now)))
    return summarise(args, samples, seen_pods, seen_pids, scrapes, failures)


def summarise(args: argparse.Namespace, samples: list[dict[str, object]], seen_pods: set[str],
              seen_pids: set[str], scrapes: int, failures: int) -> dict[str, object]:
    rss = [int(s["rss_bytes"]) for s in samples]  # type: ignore[call-overload]
    series = [int(s["series"]) for s in samples]  # type: ignore[call-overload]
    third = max(1, len(samples) // 3)
    middle, last = samples[third:2 * third] or samples, samples[-third:]
    first_families: dict[str, int] = samples[0]["families"]  # type: ignore[assignment]
    last_families: dict[str, int] = samples[-1]["families"]  # type: ignore[assignment]
    grown = {name: (first_families.get(name, 0), n) for name, n in sorted(last_families.items())
             if n > first_families.get(name, 0) + 8}
    return {
        "minutes": args.minutes, "pod_seconds": args.pod_seconds, "retention_seconds": args.retention,
        "scrapes": scrapes, "failed_scrapes": failures,
        "rss_mib": {"first": round(rss[0] / 2**20, 1), "last": round(rss[-1] / 2**20, 1),
                    "max": round(max(rss) / 2**20, 1),
                    "middle_third_max": round(max(int(s["rss_bytes"]) for s in middle) / 2**20, 1),  # type: ignore[call-overload]
                    "last_third_max": round(max(int(s["rss_bytes"]) for s in last) / 2**20, 1)},  # type: ignore[call-overload]
        "series": {"first": series[0], "last": series[-1], "max": max(series),
                   "middle_third_max": max(int(s["series"]) for s in middle),  # type: ignore[call-overload]
                   "last_third_max": max(int(s["series"]) for s in last)},  # type: ignore[call-overload]
        "distinct_pods_seen": len(seen_pods), "distinct_pids_seen": len(seen_pids),
        "families_grown_first_to_last": grown,
        "samples": [{k: v for k, v in s.items() if k != "families"} for s in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--pod-seconds", type=float, default=30.0, help="each pod's lifetime")
    parser.add_argument("--min-life", type=float, default=2.0, help="shortest process lifetime, seconds")
    parser.add_argument("--max-life", type=float, default=8.0, help="longest process lifetime, seconds")
    parser.add_argument("--retention", type=float, default=300.0, help="the agent's accounting_retention")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"soak_{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print(f"written to {path}")
    return 1 if result["failed_scrapes"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
