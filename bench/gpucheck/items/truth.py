"""Truth of the figures: what the agent exports against ``nvidia-smi`` read at the same moment.

With a busy tenant on the GPU and the agent reading every figure each second (the detail, energy and
per-process intervals at 1 s), three rounds 1.5 s apart compare ``/v1/state`` with
``nvidia-smi --query-gpu``; a field passes when the median of its differences is within its tolerance
(``FIELDS``). Energy: the agent's counter delta between two readings about 10 s apart against nvidia-smi's
``power.draw`` sampled every 0.25 s over the same span. Per-process memory: each of the agent's processes
against ``nvidia-smi --query-compute-apps``. A field nvidia-smi does not know or reports as N/A is recorded,
not judged.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpucheck.agents import get_json
from gpucheck.context import Context
from gpucheck.registry import ItemResult

MIB = 1 << 20


@dataclass(frozen=True)
class Field:
    smi: str  # nvidia-smi --query-gpu name
    agent: Callable[[dict[str, Any]], float | None]  # from a /v1/state GPU, in nvidia-smi's unit
    tolerance: Callable[[float], float]  # of nvidia-smi's value, in its unit
    bar: str


def _scaled(key: str, factor: float, info: bool = False) -> Callable[[dict[str, Any]], float | None]:
    def read(gpu: dict[str, Any]) -> float | None:
        raw = (gpu.get("info") or {}).get(key) if info else gpu.get(key)
        return None if raw is None else raw / factor
    return read


FIELDS = (
    Field("memory.used", _scaled("memory_used_bytes", MIB), lambda v: 16, "within 16 MiB"),
    Field("memory.total", _scaled("memory_total_bytes", MIB, info=True), lambda v: 1, "within 1 MiB"),
    Field("utilization.gpu", _scaled("gpu_util_percent", 1), lambda v: 10, "within 10 points"),
    Field("temperature.gpu", _scaled("temperature_celsius", 1), lambda v: 2, "within 2 C"),
    Field("temperature.memory", _scaled("memory_temperature_celsius", 1), lambda v: 2, "within 2 C"),
    # nvidia-smi's power.draw is a 1 s average on recent drivers; the agent reads the instant power
    Field("power.draw", _scaled("power_watts", 1), lambda v: max(0.15 * v, 30), "within 15 % or 30 W"),
    Field("clocks.sm", _scaled("sm_clock_hz", 1e6), lambda v: 0.05 * v, "within 5 %"),
    Field("clocks.mem", _scaled("memory_clock_hz", 1e6), lambda v: 0.01 * v, "within 1 %"),
    Field("clocks.gr", _scaled("graphics_clock_hz", 1e6), lambda v: 0.05 * v, "within 5 %"),
)


def parse_number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def smi(*args: str) -> str:
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip() or f"nvidia-smi exited {done.returncode}")
    return done.stdout


def query_gpu(names: list[str], index: int = 0) -> dict[str, float | None]:
    """nvidia-smi's figures of GPU ``index``; a field it refuses is asked alone, then left None."""
    try:
        line = smi(f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits", "-i", str(index))
        values = [parse_number(v) for v in line.strip().split(",")]
        if len(values) == len(names):
            return dict(zip(names, values, strict=True))
    except RuntimeError:
        if len(names) == 1:
            return {names[0]: None}
    return {k: v for name in names for k, v in query_gpu([name], index).items()}


def query_apps() -> dict[int, float | None]:
    """pid -> MiB used, of every compute process nvidia-smi lists."""
    out: dict[int, float | None] = {}
    for line in smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit():
            out[int(pid)] = parse_number(used)
    return out


def compare(rounds: list[tuple[dict[str, Any], dict[str, float | None]]]) -> list[dict[str, Any]]:
    """Per field: the agent's and nvidia-smi's figures of each round, the median difference, the verdict."""
    out = []
    for field in FIELDS:
        pairs = [(field.agent(gpu), values.get(field.smi)) for gpu, values in rounds]
        known = [(a, s) for a, s in pairs if a is not None and s is not None]
        row: dict[str, Any] = {"field": field.smi, "agent": [a for a, _ in pairs],
                               "nvidia_smi": [s for _, s in pairs], "bar": field.bar}
        if not known:
            row["passed"] = None
            silent = "nvidia-smi" if all(s is None for _, s in pairs) else "the agent"
            row["note"] = f"not reported by {silent}"
        else:
            difference = statistics.median(abs(a - s) for a, s in known)
            reference = statistics.median(s for _, s in known)
            row["median_difference"] = round(difference, 3)
            row["passed"] = difference <= field.tolerance(reference)
        out.append(row)
    return out


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    tenants = ctx.tenants("matmul", 1) if ctx.facts.get("torch") else []
    if not tenants:
        result.figures["load"] = "needs torch for a busy tenant: compared on an idle GPU"
    fresh = {"detail_interval": 1.0, "energy_interval": 1.0, "process_utilization_interval": 1.0}
    runner = ctx.start_agent("truth", tenants, **fresh)
    try:
        time.sleep(2.0)
        rounds = []
        for _ in range(3):
            gpu = get_json(runner, "/v1/state")["gpus"][0]
            rounds.append((gpu, query_gpu([f.smi for f in FIELDS])))
            time.sleep(1.5)
        for row in compare(rounds):
            result.check(row["field"], {"agent": row["agent"], "nvidia-smi": row["nvidia_smi"]},
                         row["passed"], bar=row["bar"], note=row.get("note", ""))
        energy(result, runner)
        apps = query_apps()
        processes = {p["pid"]: p.get("used_memory_bytes") for p in get_json(runner, "/v1/state")["gpus"][0]
                     .get("processes", ())}
        for pid, used in sorted(processes.items()):
            smi_mib = apps.get(pid)
            agent_mib = None if used is None else used / MIB
            ok = None if smi_mib is None or agent_mib is None else abs(agent_mib - smi_mib) <= 8
            result.check(f"process {pid} memory MiB", {"agent": agent_mib, "nvidia-smi": smi_mib}, ok,
                         bar="within 8 MiB", note="" if ok is not None else "not listed by both")
        result.check("processes listed by both", sorted(processes), set(processes) == set(apps),
                     bar="the same PIDs", expected=sorted(apps))
    finally:
        ctx.stop_agent(runner)
    return result.settle()


def energy(result: ItemResult, runner: Any) -> None:
    first = get_json(runner, "/v1/state")["gpus"][0]
    power: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < 10.0:
        value = query_gpu(["power.draw"])["power.draw"]
        if value is not None:
            power.append(value)
        time.sleep(0.25)
    last = get_json(runner, "/v1/state")["gpus"][0]
    e0, e1 = first.get("energy_joules_total"), last.get("energy_joules_total")
    t0, t1 = first.get("energy_read_at_unix"), last.get("energy_read_at_unix")
    if None in (e0, e1, t0, t1) or not power or t1 <= t0:
        result.check("energy delta over 10 s", None, None, note="no energy counter or no power readings")
        return
    expected = statistics.fmean(power) * (t1 - t0)
    delta = e1 - e0
    result.check("energy delta over 10 s, J", round(delta, 1), abs(delta - expected) <= 0.1 * expected,
                 bar="within 10 % of nvidia-smi's power.draw integrated", expected=round(expected, 1))
