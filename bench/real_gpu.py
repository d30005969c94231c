"""Checks that need a real NVIDIA GPU, and ``all``: every one of them in one command with one report.

Usage (a GPU, PyTorch, root for cgroups; this repository as the working directory; no network needed):

    python3 bench/real_gpu.py all [--out DIR]   # every item, report.md + report.json, under 8 minutes
    python3 bench/real_gpu.py all --only plant  # the plant experiment (open loop, no agent), ~5.5 minutes
    python3 bench/real_gpu.py all --only latency  # a service beside a trainer, with the latency class, ~6 min
    make gpu-check                              # the same as all (ONLY=plant: the plant)
    python3 bench/real_gpu.py all --backend sim --quick   # no GPU: the simulator items, CI-sized
    python3 bench/real_gpu.py monitor --seconds 60   # agent cost and NVML time next to two PyTorch tenants
    python3 bench/real_gpu.py share --seconds 40     # two PyTorch tenants held at 70/30
    python3 bench/real_gpu.py probe                  # what each NVML call costs here
    python3 bench/real_gpu.py mps --seconds 20       # an MPS daemon, two clients at 70 % / 30 % of the SMs

``all`` runs the items of ``gpucheck.items`` (probe, truth, cost, ladder, crash, shares, accounting; what each
proves and its bars: ``docs/real-gpu.md``) and ``mps`` when time is left (the ``plant`` experiment and the
``latency`` item only when ``--only`` names them: ``all``'s 8 minutes are full), each under its time budget
and an overall ``--deadline``; without a GPU it runs on the simulator what it can there (CPU-burning tenants
in real cgroups) and marks the rest "needs GPU". Everything it starts is stopped and every cgroup thawed and
removed on every way out. ``--only``, ``--runs``, ``--share-configs`` and ``--share-kinds`` plan longer share
matrices across several commands.

``mps`` (``bench/real_gpu_mps.py``) starts an MPS control daemon of its own, runs two PyTorch clients with
different ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and records what NVML lists and what the agent exports.
The subcommands other than ``all`` print one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import real_gpu_mps

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

from gpucheck import items  # noqa: E402,F401  (registers the items)
from gpucheck.agents import free_port, nvml_seconds, parse_metrics  # noqa: E402,F401
from gpucheck.context import Context  # noqa: E402
from gpucheck.registry import ITEMS, Item, fixed  # noqa: E402
from gpucheck.tenants import MATMUL as TENANT  # noqa: E402
from gpucheck.tenants import read_count  # noqa: E402

# the MPS check, after the others: it runs in ``all`` when their budgets leave it time (else ``--only mps``)
ITEMS.add(Item("mps", "MPS: what NVML lists, the agent exports and each client computes",
               lambda ctx: real_gpu_mps.item(sys.modules[__name__], ctx),
               needs={"nvml": ("torch",)}, budget_s=fixed(45)))

# -- helpers of the first subcommands, kept for items written against them ---------------------------------


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def start_tenant(directory: Path, name: str, size: int, duty: float) -> tuple[subprocess.Popen, Path]:
    """A PyTorch tenant outside any cgroup of ours, counting iterations in ``<directory>/<name>.count``."""
    counter = directory / f"{name}.count"
    return subprocess.Popen([sys.executable, "-c", TENANT, str(counter), str(size), str(duty)]), counter


def wait_counting(counters: list[Path], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(read_count(c) > 0 for c in counters):
            return
        time.sleep(0.2)
    raise SystemExit("tenants did not start computing")


@contextlib.contextmanager
def agent(config: dict, port: int, directory: Path) -> Iterator[subprocess.Popen]:
    """``gpuagent run --backend nvml`` with ``config`` on ``port``, stopped (SIGTERM) on the way out."""
    from agent_runner import AgentRunner

    settings = {"listen": f"127.0.0.1:{port}", "backend": "nvml", **config}
    runner = AgentRunner(f"agent-{port}", settings, directory)
    try:
        runner.wait_ready(timeout=60)
        yield runner.proc
    finally:
        runner.stop()


def nvml_time(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, dict[str, float]]:
    return {f: {"seconds": s, "calls": n, "mean_us": 1e6 * s / n if n else 0.0}
            for f, (s, n) in nvml_seconds(samples).items()}


# -- subcommands --------------------------------------------------------------------------------------------


def with_context(run: Callable[[Context], dict[str, Any]]) -> dict[str, Any]:
    """``run`` with a context on the real GPU, cleaned up however it ends (SIGTERM included)."""
    from gpucheck.machine import detect

    directory = Path(tempfile.mkdtemp(prefix="gpuagent-real-"))
    ctx = Context(backend="nvml", quick=False, workdir=directory, facts=detect())
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    try:
        return {**run(ctx), "artifacts": str(directory)}
    finally:
        problems = ctx.close()
        if problems:
            print(f"cleanup left: {problems}", file=sys.stderr)


def monitor(args: argparse.Namespace) -> dict[str, Any]:
    """The agent at its defaults next to a busy and a light tenant: its cost, and what it attributes."""
    from gpucheck.agents import get_json
    from gpucheck.items.cost import measure

    def run(ctx: Context) -> dict[str, Any]:
        tenants = [*ctx.tenants("matmul", 1), ctx.start_tenant("matmul", "light", size=4096, duty=0.2)]
        runner = ctx.start_agent("monitor", tenants)
        try:
            figures = measure(runner, args.seconds)
            state = get_json(runner, "/v1/state")
            samples = parse_metrics(runner.metrics())
            (ctx.workdir / "state.json").write_text(json.dumps(state, indent=1))
        finally:
            ctx.stop_agent(runner)
        gpu = state["gpus"][0] if state["gpus"] else {}
        return {**figures, "driver": state.get("driver_version"), "gpu": (gpu.get("info") or {}).get("name"),
                "processes": [{k: p.get(k) for k in ("pid", "sm_util_percent", "used_memory_bytes")}
                              for p in gpu.get("processes", ())],
                "process_util_window_seconds": gpu.get("process_util_window_seconds"),
                "prof_series": sorted({n for n, _, _ in samples if n.startswith("DCGM_FI_PROF_")}),
                "energy_joules": gpu.get("energy_joules_total")}

    return with_context(run)


def share(args: argparse.Namespace) -> dict[str, Any]:
    """Two PyTorch tenants held at 70/30: one run of the shares item."""
    from gpucheck.items.shares import judge, run_share

    def run(ctx: Context) -> dict[str, Any]:
        record = run_share(ctx, "matmul", (70, 30), "share", args.settle + args.seconds, args.seconds)
        return {**judge(record), "frozen_trace": record["frozen"], "left_frozen": record["left_frozen"]}

    return with_context(run)


def probe(args: argparse.Namespace) -> dict[str, Any]:
    import pynvml
    from gpucheck.items.probe import probe as run_probe

    return with_context(lambda ctx: run_probe(
        pynvml, ctx.tenants("matmul", 2) if ctx.facts.get("torch") else None))


def positive(text: str) -> float:
    """An argument that must be a number above 0."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return number


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    a = commands.add_parser("all", help="every item, one report (report.md, report.json)")
    a.add_argument("--out", default="gpu-check", help="directory of the report (default ./gpu-check)")
    a.add_argument("--backend", choices=("auto", "nvml", "sim"), default="auto",
                   help="nvml: the real GPU; sim: the simulator; auto: nvml when a GPU answers")
    a.add_argument("--deadline", type=float, default=470.0, help="seconds for everything (default 470)")
    a.add_argument("--quick", action="store_true", help="CI-sized: shorter runs, fewer of them")
    a.add_argument("--only", type=lambda s: s.split(","),
                   help=f"items, comma-separated: {','.join(ITEMS.names())}")
    a.add_argument("--runs", type=int, help="runs of each share split and tenant kind (the issue asks for 3)")
    a.add_argument("--share-configs", type=lambda s: s.split(","), help="splits: 70/30,90/10,50/30/20")
    a.add_argument("--share-kinds", type=lambda s: s.split(","),
                   help="tenants: matmul,deep (GPU), cpu,cpu-deep (sim)")
    a.add_argument("--share-seconds", type=float,
                   help="length of a share run (default 60; the last 3/4 measured)")
    a.add_argument("--budget-scale", type=positive, default=1.0,
                   help="every item's time budget times this (default 1): a slow or shared machine, such as "
                        "the test suite's, where a budget is only a bound on a hang")
    m = commands.add_parser("monitor")
    m.add_argument("--seconds", type=float, default=60)
    s = commands.add_parser("share")
    s.add_argument("--seconds", type=float, default=40, help="measured time under enforcement")
    s.add_argument("--settle", type=float, default=8, help="time the controller gets before measuring")
    commands.add_parser("probe")
    real_gpu_mps.register(commands, sys.modules[__name__])  # mps: its own module, run by args.run
    args = parser.parse_args()
    if args.command == "all":
        from gpucheck.runner import run_all

        os.chdir(ROOT)
        return run_all(args)
    if getattr(args, "run", None) is not None:
        print(json.dumps(args.run(args), indent=1, default=str))
        return 0
    result = {"monitor": monitor, "share": share, "probe": probe}[args.command](args)
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
