"""Benchmark what DRA adds to the agent: the per-poll mapping, the CDI re-read, a whole poll with DRA pods.

Usage: .venv/bin/python bench/bench_dra.py [--gpus 8] [--rounds 2000] [--specs 64]

- resolver, steady: ``DraResolver.allocations`` when nothing changed (what every poll pays: the inputs are
  compared, the same allocations object is returned), for one DRA device per GPU;
- mapped again: ``map_devices`` from the CDI index (what a change of the kubelet's devices, the specs or the
  GPUs costs once);
- CDI refresh: ``CdiSpecs.refresh`` over ``--specs`` claim spec files, none changed (a stat per file; what the
  pod-resources cadence pays while DRA devices exist), and the first read (every file parsed);
- poll: ``Agent.poll_once`` of a simulated 8xH100 node whose GPUs all belong to pods, the same pods given
  through the device plugin and through DRA (CDI), medians side by side in one run.
Medians and p95 over repeated runs: this machine is noisy, single timings mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' kubelet server

from podresources_server import (  # noqa: E402
    Claim,
    ClaimDevice,
    Container,
    Pod,
    PodResourcesServer,
    gpus,
    short_socket_dir,
)

from gpuagent.agent import Agent  # noqa: E402
from gpuagent.config import load_config  # noqa: E402
from gpuagent.devices.sim import SimulatedNvml, load_scenario  # noqa: E402
from gpuagent.pods.dra.cdi import CdiSpecs  # noqa: E402
from gpuagent.pods.dra.mapper import Places, map_devices  # noqa: E402
from gpuagent.pods.dra.resolver import DraResolver  # noqa: E402
from gpuagent.pods.podresources import DynamicAllocation  # noqa: E402
from gpuagent.snapshot.gpu import GpuInfo, GpuSample  # noqa: E402


def stats(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[int(0.95 * (len(samples) - 1))]
    return f"median {statistics.median(samples) * 1e6:8.1f} us   p95 {p95 * 1e6:8.1f} us"


def write_specs(directory: Path, count: int) -> list[str]:
    names = []
    for i in range(count):
        uid = f"00000000-0000-4000-8000-{i:012d}"
        name = f"{uid}-gpu-{i % 8}"
        node = {"deviceNodes": [{"path": f"/dev/nvidia{i % 8}"}]}
        spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim",
                "devices": [{"name": name, "containerEdits": node}],
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                                   "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]}}
        (directory / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").write_text(yaml.safe_dump(spec))
        names.append(f"k8s.gpu.nvidia.com/claim={name}")
    return names


def bench_resolver(gpu_count: int, rounds: int, spec_count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        names = write_specs(directory, max(spec_count, gpu_count))
        samples_cold: list[float] = []
        for _ in range(20):
            specs = CdiSpecs([tmp])
            started = time.perf_counter()
            specs.refresh()
            samples_cold.append(time.perf_counter() - started)
        specs = CdiSpecs([tmp])
        specs.refresh()
        warm = []
        for _ in range(200):
            started = time.perf_counter()
            specs.refresh()
            warm.append(time.perf_counter() - started)
        print(f"CDI refresh, {len(names)} spec files, first read   {stats(samples_cold)}")
        print(f"CDI refresh, {len(names)} spec files, unchanged    {stats(warm)}")

        gpus_ = tuple(
            GpuSample(info=GpuInfo(index=i, uuid=f"GPU-{i:08d}-0000-4000-8000-000000000000",
                                   name="NVIDIA H100 80GB HBM3", serial=None, pci_bus_id="", minor_number=i,
                                   memory_total_bytes=None, power_limit_watts=None, mig_enabled=False),
                      sampled_at_unix=0.0)
            for i in range(gpu_count)
        )
        dynamic = tuple(DynamicAllocation("ml", f"job-{i}", "main", "ml", f"claim-{i}", "gpu.nvidia.com",
                                          "node", f"gpu-{i}", (names[i],)) for i in range(gpu_count))
        resolver = DraResolver(cdi=specs)
        asyncio.run(resolver.refresh(dynamic, time.monotonic))
        plugin: tuple = ()
        resolver.allocations(plugin, dynamic, gpus_)
        steady = []
        for _ in range(rounds):
            started = time.perf_counter()
            resolver.allocations(plugin, dynamic, gpus_)
            steady.append(time.perf_counter() - started)
        remap = []
        for _ in range(max(50, rounds // 10)):
            started = time.perf_counter()
            map_devices(dynamic, Places(gpus_), cdi=specs.index)
            remap.append(time.perf_counter() - started)
        print(f"resolver, {gpu_count} DRA devices, nothing changed  {stats(steady)}")
        print(f"map_devices, {gpu_count} DRA devices, mapped again  {stats(remap)}")


async def bench_polls(rounds: int) -> None:
    processes = [{"name": f"job-{i}", "gpu": i, "memory": "10Gi", "sm_util": 50} for i in range(8)]
    scenario = {"version": 1, "name": "bench-dra", "gpus": [{"model": "H100-SXM5-80GB", "count": 8}],
                "processes": processes}
    with tempfile.TemporaryDirectory() as tmp, short_socket_dir() as sockets:
        root = Path(tmp)
        path = root / "node.yaml"
        path.write_text(yaml.safe_dump(scenario))
        cdi = root / "cdi"
        cdi.mkdir()
        names = write_specs(cdi, 8)
        proc = root / "proc"
        for i in range(8):
            uid = f"0a000000-0000-4000-8000-{i:012d}"
            (proc / str(4_200_000 + i)).mkdir(parents=True)
            pod_slice = f"kubepods-pod{uid.replace('-', '_')}.slice"
            (proc / str(4_200_000 + i) / "cgroup").write_text(
                f"0::/kubepods.slice/{pod_slice}/cri-containerd-{i:064d}.scope\n")
        nvml = SimulatedNvml(load_scenario(path))
        nvml.nvmlInit()
        uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
        kinds = {
            "device plugin": [Pod(f"job-{i}", "ml", [Container("main", [gpus(uuids[i])])]) for i in range(8)],
            "DRA (CDI)": [Pod(f"job-{i}", "ml", [Container("main", claims=[Claim(f"c-{i}", [ClaimDevice(
                "gpu.nvidia.com", "node", f"gpu-{i}", [names[i]])])])]) for i in range(8)],
        }
        results = {}
        for kind, pods in kinds.items():
            socket = sockets / f"{len(results)}.sock"
            config = load_config(None, env={}, overrides={
                "backend": "sim", "scenario": str(path), "proc_root": str(proc),
                "pod_resources_socket": str(socket), "kubernetes_api": "off", "idle_events": "off",
                "network": False, "cdi_spec_dirs": str(cdi)})
            agent = Agent(config, nvml=SimulatedNvml(load_scenario(path)), backend="sim")
            try:
                async with PodResourcesServer(socket, pods=pods):
                    for _ in range(5):
                        await agent.poll_once()
                    samples = []
                    for _ in range(rounds):
                        started = time.perf_counter()
                        snapshot = await agent.poll_once()
                        samples.append(time.perf_counter() - started)
                    named = sum(1 for p in snapshot.pods
                                if p.names_from == "pod_resources" and p.allocated_gpus)
                    results[kind] = samples
                    print(f"poll, 8 GPUs, {kind:13} ({named} pods named)  {stats(samples)}")
            finally:
                await agent.aclose()
        ratio = statistics.median(results["DRA (CDI)"]) / statistics.median(results["device plugin"])
        print(f"poll median, DRA / device plugin: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--specs", type=int, default=64)
    args = parser.parse_args()
    bench_resolver(args.gpus, args.rounds, args.specs)
    asyncio.run(bench_polls(max(100, args.rounds // 10)))


if __name__ == "__main__":
    main()
