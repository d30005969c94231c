"""``bench/real_gpu.py all``: the one-command real-GPU check, run here in its simulator mode (CI-sized), and
the parts that only a GPU runs exercised on the simulated NVML and on recorded nvidia-smi figures, so the
next session with a lent GPU does not meet their bugs first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:0] = [str(BENCH)]

from gpucheck import items  # noqa: E402,F401  (registers the items)
from gpucheck.items.truth import FIELDS, compare, parse_number  # noqa: E402
from gpucheck.registry import ITEMS, ItemResult, fixed, legacy  # noqa: E402
from gpucheck.report import markdown  # noqa: E402

SIM_ITEMS = ("cost", "ladder", "crash", "shares", "accounting")
GPU_ONLY = ("probe", "truth")


@pytest.mark.serial  # measures a real process's CPU progress
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_all_in_simulator_mode_writes_the_report_and_the_simulator_items_pass(tmp_path: Path) -> None:
    from cgroups import cgroups_unavailable

    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: the tenants on one, the agent on another")
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, str(BENCH / "real_gpu.py"), "all", "--backend", "sim", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=360, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")},
    )
    document = json.loads((out / "report.json").read_text())
    statuses = {item["name"]: item for item in document["items"]}
    assert list(statuses)[: len(ITEMS.names())] == ITEMS.names()  # then real_gpu.py's own (mps)
    assert document["backend"] == "sim" and document["quick"] is True
    assert {"python", "cpus", "torch", "cgroups", "gpu"} <= set(document["machine"])
    for name in (*GPU_ONLY, *(n for n in statuses if n not in ITEMS.names())):
        assert statuses[name]["status"] == "skipped" and statuses[name]["reason"] == "needs GPU"
    failed = {n: (statuses[n]["status"], statuses[n]["reason"]) for n in SIM_ITEMS
              if statuses[n]["status"] != "pass"}
    assert not failed, f"{failed}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for name in SIM_ITEMS:
        item = statuses[name]
        assert item["checks"] and all({"name", "value", "bar", "passed"} <= set(c) for c in item["checks"])
        assert item["seconds"] <= item["budget_s"] + 10
    assert document["cleanup"] == ""  # every tenant, agent and cgroup gone, nothing frozen
    assert done.returncode == 0
    text = (out / "report.md").read_text()
    assert "| item | result | seconds (budget) | why |" in text
    for name in ITEMS.names():
        assert f"## {name}: " in text
    assert "needs GPU" in text


def test_truth_compares_the_median_difference_with_each_fields_tolerance() -> None:
    gpu = {"memory_used_bytes": 1000 * 2**20, "gpu_util_percent": 97.0, "temperature_celsius": 60.0,
           "power_watts": 400.0, "sm_clock_hz": 1.98e9, "memory_clock_hz": 2.619e9, "graphics_clock_hz": 1.98e9,
           "memory_temperature_celsius": None, "info": {"memory_total_bytes": 81559 * 2**20}}
    smi = {"memory.used": 1010.0, "memory.total": 81559.0, "utilization.gpu": 100.0, "temperature.gpu": 61.0,
           "temperature.memory": 70.0, "power.draw": 520.0, "clocks.sm": 1980.0, "clocks.mem": 2619.0,
           "clocks.gr": None}
    rows = {row["field"]: row for row in compare([(gpu, smi)] * 3)}
    assert set(rows) == {f.smi for f in FIELDS}
    assert rows["memory.used"]["passed"] and rows["memory.used"]["median_difference"] == 10.0
    assert rows["memory.total"]["passed"] and rows["utilization.gpu"]["passed"]
    assert rows["power.draw"]["passed"] is False  # 120 W off a 520 W reading: over 15 %
    assert rows["temperature.memory"]["passed"] is None and "the agent" in rows["temperature.memory"]["note"]
    assert rows["clocks.gr"]["passed"] is None and "nvidia-smi" in rows["clocks.gr"]["note"]
    assert parse_number(" [N/A]") is None and parse_number(" 71 ") == 71.0


def test_the_probe_runs_on_the_simulated_nvml_and_gives_what_the_cost_model_takes() -> None:
    from bench_nvml_cost import load_costs
    from gpucheck.items.probe import probe

    from gpuagent.devices.sim import SimulatedNvml, load_scenario

    nvml = SimulatedNvml(load_scenario(ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"))
    figures = probe(nvml, None)
    assert figures["call_us"]["nvmlDeviceGetMemoryInfo"] > 0
    assert figures["call_us"]["nvmlDeviceGetProcessUtilization[one call]"] is None  # real pynvml only
    assert figures["field_us"]["NVML_FI_DEV_POWER_INSTANT"] > 0
    assert set(figures["energy_mj"]) == {"direct", "field", "direct_after"}
    assert "utilization_us_alone_vs_during_gpm_metrics" in figures["idle"]
    assert "needs torch" in figures["loaded"]
    from gpucheck.items.probe import cursor_reads

    nvml.nvmlInit()
    try:
        reads = cursor_reads(nvml, nvml.nvmlDeviceGetHandleByIndex(0), 0.2, 2, lambda s: (s.pid, s.smUtil))
    finally:
        nvml.nvmlShutdown()
    assert len(reads) == 2 and all(isinstance(r, (list, str)) for r in reads)
    assert any(isinstance(r, list) and r and isinstance(r[0][1], int) for r in reads)  # a 1/6 s tick passed
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"probe-{os.getpid()}.json"
    path.write_text(json.dumps({"probe": figures}))
    try:
        call_us, field_us = load_costs(str(path))
    finally:
        path.unlink()
    assert call_us["nvmlDeviceGetMemoryInfo"] == figures["call_us"]["nvmlDeviceGetMemoryInfo"]
    assert field_us["NVML_FI_DEV_POWER_INSTANT"] == figures["field_us"]["NVML_FI_DEV_POWER_INSTANT"]
    assert "batch:detail" not in field_us


def test_an_item_of_the_older_shape_plugs_in_with_one_line_and_is_recorded() -> None:
    from gpucheck.registry import Item, Registry

    registry = Registry()
    registry.add(Item("mps", "MPS", legacy(lambda args: {"seconds": args.seconds}, seconds=30),
                      needs={"nvml": ("torch",)}, budget_s=fixed(60, quick=20)))
    item = registry.get("mps")

    class Ctx:
        quick, sim = True, False

    assert item.budget_s(Ctx()) == 20
    result = item.run(Ctx())
    assert result.status == "recorded" and result.figures == {"seconds": 30}
    with pytest.raises(ValueError, match="twice"):
        registry.add(item)


def test_an_item_passes_only_when_every_judged_check_does() -> None:
    result = ItemResult()
    result.check("a", 1, True)
    result.check("b", 2, None)
    assert result.settle().status == "pass"
    result.check("c", 3, False, bar="< 1")
    assert result.settle().status == "fail" and result.reason == "c"
    document = {"started_at": "now", "command": "real_gpu.py all", "backend": "sim", "quick": True,
                "deadline_s": 470, "elapsed_s": 3.0, "summary": {"fail": 1},
                "machine": {"gpu_reason": "no driver", "python": "3.12", "cpus": 2, "kernel": "6", "torch": None},
                "items": [{"name": "x", "title": "X", "budget_s": 5, **result.as_json()}], "cleanup": ""}
    text = markdown(document)
    assert "| x | FAIL | 0 (5) | c |" in text and "| c | 3 | < 1 |  | **FAIL** |" in text


def test_the_tenant_programs_compile() -> None:
    from gpucheck import tenants

    for name in ("MATMUL", "DEEP", "HOG", "CPU"):
        compile(getattr(tenants, name), name, "exec")


FAKE_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) fields="${1#--query-gpu=}"
    case "$fields" in
      *,*) echo "1024, 81559, 97, 61, [N/A], 401.5, 1980, 2619, 1980" ;;
      power.draw) echo "400.0" ;;
      *) echo "[N/A]" ;;
    esac ;;
  --query-compute-apps=*) ;;
esac
"""


@pytest.mark.integration
def test_the_truth_item_runs_against_an_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The item's whole course on the simulator, a stand-in nvidia-smi answering: what a GPU session runs."""
    from gpucheck.context import Context
    from gpucheck.items import truth

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ctx = Context(backend="sim", quick=True, workdir=tmp_path, facts={"torch": None})
    ctx.item_deadline = float("inf")
    try:
        result = truth.run(ctx)
    finally:
        assert ctx.close() == []
    checks = {c.name: c for c in result.checks}
    assert set(checks) >= {f.smi for f in truth.FIELDS} | {"energy delta over 10 s, J", "processes listed by both"}
    assert checks["memory.total"].passed is True  # the simulated H100's 81559 MiB
    assert checks["temperature.memory"].passed is None  # N/A from nvidia-smi: recorded, not judged
    assert checks["energy delta over 10 s, J"].expected is not None
    assert result.figures["load"].startswith("needs torch")


def test_the_gpu_plan_fits_the_default_deadline_under_eight_minutes(tmp_path: Path) -> None:
    from gpucheck.context import Context

    ctx = Context(backend="nvml", quick=False, workdir=tmp_path, facts={},
                  options={"planned": ITEMS.names()})
    budgets = {item.name: item.budget_s(ctx) for item in ITEMS}
    assert sum(budgets.values()) <= 470 < 480, budgets  # the runner's default --deadline
    assert budgets["shares"] >= 4 * 60  # 70/30, 90/10, 50/30/20 of matmul tenants and 70/30 of deep ones
