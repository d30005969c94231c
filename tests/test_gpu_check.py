"""``bench/real_gpu.py all``: the one-command real-GPU check, run here in its simulator mode (CI-sized), and
the parts that only a GPU runs exercised on the simulated NVML and on recorded nvidia-smi figures, so the
next session with a lent GPU does not meet their bugs first."""

from __future__ import annotations

import itertools
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


def run_check(out: Path, *args: str, timeout: float) -> tuple[dict, subprocess.CompletedProcess]:
    """``real_gpu.py all --backend sim --quick ARGS --out OUT`` (skipped without cgroups or two CPUs): its
    report.json and the finished process."""
    from cgroups import cgroups_unavailable

    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: the tenants on one, the agent and the freezer on another")
    done = subprocess.run(
        [sys.executable, str(BENCH / "real_gpu.py"), "all", "--backend", "sim", "--quick", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")},
    )
    return json.loads((out / "report.json").read_text()), done


@pytest.mark.integration
@pytest.mark.serial
@pytest.mark.timeout(400)
def test_all_in_simulator_mode_writes_the_report_and_the_simulator_items_pass(tmp_path: Path) -> None:
    out = tmp_path / "report"
    document, done = run_check(out, "--budget-scale", "2", timeout=360)  # budgets bound hangs: x2 on a CI machine
    statuses = {item["name"]: item for item in document["items"]}
    checks = [i.name for i in ITEMS if not i.on_request]  # the plant experiment runs only when named
    assert list(statuses)[: len(checks)] == checks and "plant" not in statuses  # then real_gpu.py's (mps)
    assert document["backend"] == "sim" and document["quick"] is True
    assert {"python", "cpus", "torch", "cgroups", "gpu"} <= set(document["machine"])
    for name in (*GPU_ONLY, *(n for n in statuses if n not in checks)):
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
    for name in checks:
        assert f"## {name}: " in text
    assert "needs GPU" in text
    runs = statuses["shares"]["figures"]["runs"]
    assert runs and all(r["idle"]["stopped"] is not None and "other_processes" in r["idle"] for r in runs)
    assert all(r["design"] is not None and "shares" in r["design"] for r in runs)  # /v1/state enforcement
    assert all(r["nvml_shares"] is None or len(r["nvml_shares"]) == len(r["shares"]) for r in runs)


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

    for name in ("MATMUL", "DEEP", "HOG", "CPU", "SERVE", "CPU_SERVE", "TRAINER"):
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
    budgets = {item.name: item.budget_s(ctx) for item in ITEMS if not item.on_request}
    assert sum(budgets.values()) <= 470 < 480, budgets  # the runner's default --deadline
    assert budgets["shares"] >= 4 * 60  # 70/30, 90/10, 50/30/20 of matmul tenants and 70/30 of deep ones
    from gpucheck.items import plant

    # the plant alone in one call: its cells and two tenant starts within its budget, under the deadline
    cells = 2 * (plant.cell_seconds(plant.specs(True), True) + plant.TENANT_START_S)
    assert cells <= ITEMS.get("plant").budget_s(ctx) <= 470 - 40  # 40 s: detecting the machine, packing


# -- the plant experiment, the honest harness -----------------------------------------------------------------

# NVML's per-process samples as the H200 gave them (2026-11-27, probe item, reads every 0.25 s, timestamps
# mod 1e8 µs) for two identical matmul tenants left free, whose own iterations split 0.5/0.5 (over the 4 s
# after these reads)
H200_READS = [[["a", 99, 36303605]], [["a", 99, 36703745]], [["b", 99, 36903933]], [["a", 99, 37103915]],
              [["a", 99, 37303268]], [["a", 50, 37703995], ["b", 50, 37505222]], [["b", 99, 37904012]],
              [["a", 99, 38102742]], [["a", 99, 38302815]], [["b", 99, 38702817]], [["a", 99, 38903789]],
              [["a", 99, 39103780]], [["b", 50, 39505132], ["a", 50, 39303628]], [["a", 99, 39703004]],
              [["a", 99, 39903694]], [["a", 99, 40103836]]]


def _cell(**overrides):
    from gpucheck.plantstats import Cell

    fields = {"name": "c", "kind": "deep", "scheme": "rotation", "tenants": ["a", "b"], "window": (10.0, 20.0),
              "target": [0.7, 0.3]}
    return Cell(**{**fields, **overrides})


def test_nvml_split_of_the_recorded_h200_samples_is_not_the_truth() -> None:
    from gpucheck.plantstats import max_error, nvml_split, sample_interval

    pids = {"a": 101, "b": 102}
    samples = [(pids[who], stamp, sm, 0) for read in H200_READS for who, sm, stamp in read]
    split = nvml_split(_cell(window=(36.0, 41.0)), samples, 0.0, [101, 102])
    # a: 11 x 99 + 2 x 50 = 1189; b: 3 x 99 + 2 x 50 = 397; of 1586
    assert split == {"split": [1189 / 1586, 397 / 1586], "other": 0.0, "samples": 18}
    assert round(max_error(split["split"], [0.5, 0.5]), 3) == 0.25  # 25 points off the tenants' own 0.5/0.5
    assert round(sample_interval(samples), 1) == 0.2  # the ~200 ms grid
    assert nvml_split(_cell(window=(50.0, 60.0)), samples, 0.0, [101, 102]) is None  # no sample in it
    outside = [(999, 37_000_000, 40, 0), *samples]
    assert nvml_split(_cell(window=(36.0, 41.0)), outside, 0.0, [101, 102])["other"] == 40 / 1626


def test_truth_counts_completions_in_the_window_and_the_table_reads_them() -> None:
    from gpucheck.plantstats import row, table, truth

    times = {"a": [10.0 + i * 0.01 for i in range(1, 701)], "b": [10.0 + i * 0.0333 for i in range(1, 301)]}
    cell = _cell(window=(10.0, 17.0), kind="matmul")
    got = truth(cell, times)
    assert got["counts"] == [700, 210] and got["seconds"] == 7.0
    line = row(cell, times, solo=140.0, nvml=None)
    assert line["truth"] == [700 / 910, 210 / 910] and line["nvml"] == "needs GPU"
    assert round(line["error"], 3) == round(0.3 - 210 / 910, 3)
    assert round(line["throughput_vs_solo"], 3) == round(910 / 7 / 140, 3)
    solo = row(_cell(name="solo a", scheme="solo", target=None, window=(10.0, 17.0)), times, 140.0, None)
    text = "\n".join(table([line, solo, {"kind": "deep", "cell": "every cell", "skipped": "needs GPU"}]))
    assert "| matmul | c | 0.769/0.231 | needs GPU | 0.700/0.300 | 6.9 | 0.929 | - | - |" in text
    assert "alone: 100.0 it/s" in text and "| deep | every cell | needs GPU |" in text
    cell.params["late_ms_median_max"] = [0.21, 3.5]
    assert "| 0.929 | - | 0.2 / 3.5 |" in "\n".join(table([row(cell, times, solo=140.0, nvml=None)]))


def test_drain_is_how_long_a_frozen_tenants_work_goes_on_completing() -> None:
    """A deep tenant whose replays (22 ms) complete on the GPU 90 ms past its freeze at 12.0 s, nothing more
    until its thaw at 12.5 s; a matmul tenant whose last product ended 1 ms after its freeze."""
    from gpucheck.plantstats import drains, freezes, summary

    replays = [10.0 + 0.022 * i for i in range(1, 92)]  # up to 12.002
    replays += [12.0 + 0.022 * i for i in range(1, 5)]  # the queue: 12.022 ... 12.088
    replays += [12.5 + 0.022 * i for i in range(1, 23)]  # after the thaw, up to 12.984
    cell = _cell(events=[(12.0, 0, "freeze"), (12.5, 0, "thaw"), (13.0, 1, "freeze"), (13.001, 0, "freeze")],
                 window=(10.0, 14.0))
    assert freezes(cell, 0) == [(12.0, 12.5), (13.001, 14.0)]
    got = drains(cell, 0, replays)
    assert round(got[0], 3) == 0.088 and got[1] == 0.0  # no completion after the second freeze
    matmul = [12.001, 12.6]
    assert [round(d, 4) for d in drains(cell, 0, matmul)] == [0.001, 0.0]
    assert summary([0.088, 0.0, 0.05]) == {"median": 0.05, "p90": 0.088, "max": 0.088, "n": 3}
    assert summary([]) is None


def test_device_drain_from_utilization_samples_of_a_tenant_alone() -> None:
    """Device samples every 1/6 s: busy 100 % until the freeze at 1.05 s, the queue running 90 ms more."""
    from gpucheck.plantstats import device_drains

    period = 1 / 6
    stamps = [round(i * period, 6) for i in range(13)]  # 0 .. 2.0 s
    busy_until = 1.05 + 0.09

    def util(t0: float, t1: float) -> float:
        return 100.0 * max(0.0, min(t1, busy_until) - t0) / (t1 - t0) if t0 < busy_until else 0.0

    samples = [(int(stamps[0] * 1e6), 100.0)] + [
        (int(t1 * 1e6), util(t0, t1)) for t0, t1 in itertools.pairwise(stamps)]
    shifted = [(s + 5_000_000, v) for s, v in samples]  # NVML's clock 5 s ahead of the monotonic one
    cell = _cell(scheme="drain", events=[(1.05, 0, "freeze"), (1.55, 0, "thaw")], window=(0.0, 2.0))
    assert [round(x, 3) for x in device_drains(cell, 0, shifted, 5.0)] == [0.09]


def test_queue_depth_is_completion_less_enqueue() -> None:
    from gpucheck.plantstats import queue_depths

    enqueued = [1.0 + 0.022 * i for i in range(50)]
    done = [e + 0.088 for e in enqueued]
    depths = queue_depths(done, enqueued, (1.1, 1.5))  # enqueued at 1.11 ... 1.484
    assert len(depths) == 18 and all(round(d, 3) == 0.088 for d in depths)


def test_the_nvml_clock_is_found_from_the_reads() -> None:
    from gpucheck.nvmltrace import Read, clock_offset

    wall_gap = 1.7e9
    walls = [Read(100.0 + i, 100.0 + i + wall_gap, int((100.0 + i + wall_gap - 0.15) * 1e6)) for i in range(5)]
    clock, offset = clock_offset(walls)
    assert clock == "wall" and offset == wall_gap
    monos = [Read(100.0 + i, 100.0 + i + wall_gap, int((100.0 + i - 0.3) * 1e6)) for i in range(5)]
    assert clock_offset(monos) == ("monotonic", 0.0)
    assert clock_offset([Read(1.0, 2.0, None, "NOT_FOUND")]) is None
    assert clock_offset([Read(100.0, 100.0 + wall_gap, int(5e6))]) is None  # neither clock: no guess
    both = [Read(r.monotonic, r.wall, r.newest_us, "", m.newest_us) for r, m in zip(walls, monos, strict=True)]
    assert clock_offset(both) == ("wall", wall_gap) and clock_offset(both, device=True) == ("monotonic", 0.0)


def test_the_nvml_trace_runs_on_the_simulated_nvml() -> None:
    import time

    from gpucheck.nvmltrace import NvmlTrace, processes

    from gpuagent.devices.sim import SimulatedNvml, load_scenario

    nvml = SimulatedNvml(load_scenario(ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"))
    tracer = NvmlTrace(nvml, 0, interval=0.05).start()
    time.sleep(0.6)
    trace = tracer.stop()
    assert trace.reads and all(isinstance(r.error, str) for r in trace.reads)
    nvml.nvmlInit()
    try:
        listed = processes(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        nvml.nvmlShutdown()
    assert listed and all(isinstance(pid, int) for pid in listed)
    assert {pid for pid, *_ in trace.process} <= set(listed)
    document = trace.as_json()
    assert set(document) == {"process", "device", "reads"}
    json.dumps(document)


class FakeTenant:
    """What the freezer touches of a tenant: its name, freeze() and frozen(), every call kept."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.is_frozen = name, log, False

    def freeze(self, frozen: bool) -> None:
        self.log.append((self.name, frozen))
        self.is_frozen = frozen

    def frozen(self) -> bool:
        return self.is_frozen


def test_rotation_freezes_before_it_thaws_and_measures_whole_periods() -> None:
    import random

    from gpucheck.items.plant import Freezer, drive, specs

    log: list = []
    tenants = [FakeTenant("a", log), FakeTenant("b", log)]
    freezer = Freezer(tenants)
    rotation = next(s for s in specs(False) if s.name == "rotation 70/30 / 100 ms")
    cell = drive(freezer, rotation, "cpu", scale=0.1, settle=0.05, rng=random.Random(1))
    periods = (cell.window[1] - cell.window[0]) / 0.1
    assert abs(periods - round(periods)) < 1e-6 and round(periods) >= 3
    thawed = {"a", "b"}
    for name, frozen in log:  # never both thawed once the rotation began
        (thawed.discard if frozen else thawed.add)(name)
        if len(log) > 1:
            assert len(thawed) <= 1 or (name, frozen) == log[0]
    assert [e[2] for e in cell.events[:3]] == ["freeze", "freeze", "thaw"]  # b, then a at the first swap
    assert cell.target == [0.7, 0.3] and cell.params["period_s"] == 0.1
    dithered = next(s for s in specs(False) if s.name.endswith("80% / 100 ms dithered"))
    lengths = {round(sum(d for d, _ in dithered.cycle(random.Random(seed))), 6) for seed in range(5)}
    assert len(lengths) == 5 and all(0.05 <= x <= 0.15 for x in lengths)


def test_the_share_run_reports_the_design_and_nvmls_view() -> None:
    from gpucheck.items.shares import enforcement_for_gpu, nvml_view

    state = {"enforcement": {"mode": "enforce", "scheme": "rotation", "period_seconds": 0.25,
                             "shares": [{"pod": "p1", "gpu_index": 0, "slot_seconds": 0.175},
                                        {"pod": "p2", "gpu_index": 1}], "memory": []}}
    design = enforcement_for_gpu(state, 0)
    assert design == {"mode": "enforce", "scheme": "rotation", "period_seconds": 0.25,
                      "shares": [{"pod": "p1", "gpu_index": 0, "slot_seconds": 0.175}], "memory": []}
    assert enforcement_for_gpu({"enforcement": None}, 0) is None
    record = {"targets": [0.7, 0.3], "measured": 3.0, "counts": [(0.0, [0, 0]), (5.0, [9, 1])],
              "nvml_seen": [(1.0, [99.0, 0.0]), (2.5, [60.0, 40.0]), (4.0, [None, 30.0]), (5.0, [70.0, 0.0])]}
    assert nvml_view(record) == [round(130 / 200, 3), round(70 / 200, 3)]


def test_mps_clients_rates_against_their_thread_percentages() -> None:
    from real_gpu_mps import per_client

    rows = per_client([70, 30], [57.6, 27.8], [400.0, 200.0], 500.0)
    assert rows[0] == {"client": "a", "threads_percent": 70, "together_per_s": 57.6, "alone_per_s": 400.0,
                       "together_of_baseline": 0.115, "alone_of_baseline": 0.8, "part_of_total": 0.674}
    assert rows[1]["part_of_total"] == 0.326


@pytest.mark.integration
@pytest.mark.serial  # four spinning tenants: in the parallel pass (2 s alone) they took 67-87 s beside the
# serial pass's pinned tenants, starving the other workers (a watch resumed late, an agent not ready in 60 s)
def test_the_harness_stops_tenants_outside_a_run_and_freezes_them_between_items(tmp_path: Path) -> None:
    from cgroups import cgroups_unavailable
    from gpucheck.context import Context

    reason = cgroups_unavailable()
    if reason:
        pytest.skip(reason)
    ctx = Context(backend="sim", quick=True, workdir=tmp_path, facts={})
    try:
        a, b, c = ctx.tenants("cpu", 3)
        light = ctx.start_tenant("cpu", "light")
        pair = ctx.tenants("cpu", 2)
        assert pair == [a, b] and c.frozen() and not a.frozen()  # a shared tenant not handed out: frozen
        idle = ctx.quiet(pair)
        assert sorted(idle["stopped"]) == ["cpu-c", "light"] and idle["other_processes"] == []
        assert not c.alive() and not light.alive() and a.alive() and not a.frozen()  # thawed after the look
        assert ctx.live_tenants() == [a, b]
        assert ctx.after_item() == [] and a.frozen() and b.frozen()  # nothing computes between items
        assert ctx.tenants("cpu", 1) == [a] and not a.frozen() and b.frozen()
        assert b.times() is not None and len(a.times()) > 0  # every tenant dates its iterations
    finally:
        assert ctx.close() == []


@pytest.mark.integration
@pytest.mark.serial
@pytest.mark.timeout(300)
def test_the_plant_runs_its_cells_on_cpu_tenants_and_writes_the_table(tmp_path: Path) -> None:
    """``--only plant`` without a GPU: every cell on two CPU tenants sharing one CPU, judged by their work."""
    import tarfile

    from gpucheck.items.plant import specs
    from gpucheck.plantstats import Cell, done_between

    out = tmp_path / "report"
    document, done = run_check(out, "--only", "plant", "--budget-scale", "2", timeout=240)
    assert [i["name"] for i in document["items"]] == ["plant"], done.stdout[-2000:]
    item = document["items"][0]
    assert item["status"] == "pass", f"{item['reason']}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert document["cleanup"] == "" and done.returncode == 0
    rows = {r["cell"]: r for r in item["figures"]["rows"] if r["kind"] == "cpu"}
    assert set(rows) == {s.name for s in specs(False)}
    assert all(r["nvml"] == "needs GPU" for r in rows.values())
    assert rows["drain: a frozen 500 ms of each s"]["device_drain"] == "needs GPU"
    assert any(r["kind"] == "deep" and r.get("skipped") == "needs GPU" for r in item["figures"]["rows"])
    text = (out / "report.md").read_text()
    assert "| kind | cell | truth split | NVML split | target | error (pts) |" in text
    assert all(len(r["late_ms"]) == 2 for r in rows.values())
    with tarfile.open(out / "work.tar.gz") as tar:
        plant = json.loads(tar.extractfile("work/plant/plant.json").read())
        times = {m.name for m in tar.getmembers() if m.name.endswith(".times")}
        assert {"work/plant/cpu-cpu-a.times", "work/plant/cpu-cpu-b.times"} <= times
        import array

        traces = {}
        for name in ("cpu-a", "cpu-b"):
            data = array.array("d")
            data.frombytes(tar.extractfile(f"work/plant/cpu-{name}.times").read())
            traces[name] = sorted(data)
    cells = {c["name"]: Cell.from_json(c) for c in plant["kinds"][0]["cells"]}
    # judged by the tenants' work: the one frozen through a solo window did nothing in it, the other did
    solo = cells["solo a"]
    assert done_between(traces["cpu-b"], *solo.window) == 0 < done_between(traces["cpu-a"], *solo.window)
    for name, cell in cells.items():
        assert cell.events or cell.scheme in ("solo", "free"), name
        if cell.scheme == "rotation":  # 70 % of each period to a, 30 % to b
            assert done_between(traces["cpu-a"], *cell.window) > done_between(traces["cpu-b"], *cell.window)
    assert rows["rotation 70/30 / 100 ms"]["counts"][0] > rows["rotation 70/30 / 100 ms"]["counts"][1]


# The parts of PyTorch the GPU tenants call, as a module of their own: each product takes 2 ms of wall time
# when its stream runs it; an event completes when the work enqueued before it has (a queue per process), and
# its time is when it did. Enough to run MATMUL and DEEP here and read what they write.
STAND_IN_TORCH = '''
import contextlib, time
bfloat16 = "bf16"
_queue_end = [0.0]  # when the work enqueued so far is done
KERNEL_S = 0.002

def _enqueue(seconds):
    _queue_end[0] = max(_queue_end[0], time.monotonic()) + seconds

class Tensor:
    def __matmul__(self, other):
        _enqueue(KERNEL_S)
        return Tensor()
    def sum(self):
        return Tensor()
    def item(self):
        cuda.synchronize()
        return 0.0

def randn(*shape, **kw):
    return Tensor()

def empty(*shape, **kw):
    return Tensor()

def matmul(a, b, out=None):
    if not _capturing[0]:
        _enqueue(KERNEL_S)
    else:
        _capturing[1] += 1
    return out

_capturing = [False, 0]

class _Cuda:
    class Event:
        def __init__(self, enable_timing=False):
            self.at = None
        def record(self, stream=None):
            self.at = max(_queue_end[0], time.monotonic())
        def synchronize(self):
            time.sleep(max(0.0, self.at - time.monotonic()))
        def elapsed_time(self, end):
            assert self.at is not None and end.at is not None and time.monotonic() >= end.at
            return (end.at - self.at) * 1000.0
    class Stream:
        pass
    class CUDAGraph:
        kernels = 0
        def replay(self):
            _enqueue(KERNEL_S * self.kernels)
    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        yield
    @staticmethod
    @contextlib.contextmanager
    def graph(g):
        _capturing[:] = [True, 0]
        yield
        g.kernels, _capturing[0] = _capturing[1], False
    @staticmethod
    def synchronize():
        time.sleep(max(0.0, _queue_end[0] - time.monotonic()))

cuda = _Cuda()
'''


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["matmul", "deep"])
def test_the_gpu_tenants_date_each_iteration_on_a_stand_in_torch(tmp_path: Path, kind: str) -> None:
    """MATMUL and DEEP as they run on a GPU, over the stand-in: iterations counted, each dated when the
    device finished it, and the deep one keeping its queue in front of each replay."""
    import time

    from gpucheck.plantstats import queue_depths
    from gpucheck.tenants import argv, read_count, read_times

    (tmp_path / "torch.py").write_text(STAND_IN_TORCH)
    counter = tmp_path / f"{kind}.count"
    command = argv(kind, counter, size=16, kernels=4, queue_ms=40)  # deep: 8 ms replays, ~40 ms queued
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        began = time.monotonic()
        while read_count(counter) < 60 and process.poll() is None and time.monotonic() - began < 60:
            time.sleep(0.1)
    finally:
        process.kill()
        process.wait()
    log = counter.with_name(counter.name + ".log").read_text() if counter.with_name(
        counter.name + ".log").exists() else ""
    assert read_count(counter) >= 60, log
    done = read_times(counter, ".times")
    assert len(done) >= 50 and list(done) == sorted(done)
    assert all(began - 30 < t < time.monotonic() for t in done)  # CLOCK_MONOTONIC, this process's clock
    gaps = [b - a for a, b in itertools.pairwise(done)]
    if kind == "matmul":  # one 2 ms product at a time
        assert min(gaps) >= 0.0019 and not read_times(counter, ".enqueued")
    else:
        assert "in flight before each new one" in log
        enqueued = read_times(counter, ".enqueued")
        depths = queue_depths(list(done), list(enqueued), (0.0, float("inf")))
        assert len(depths) == min(len(done), len(enqueued)) and all(d > 0 for d in depths)
        in_flight = int(log.split(" ms, ")[1].split(" in flight")[0])  # chosen from a timed replay
        median = sorted(depths)[len(depths) // 2]
        assert (in_flight - 1) * 0.008 <= median <= (in_flight + 1) * 0.008 + 0.002, (in_flight, median)


def test_the_gpu_analysis_of_a_recorded_kind_fills_nvmls_columns() -> None:
    """``analyse`` as on a GPU: NVML's per-process samples stamped on the wall clock, the device's on the
    monotonic one; two free tenants NVML credits 3:1 that split 1:1 by work, and a drain cell."""
    from gpucheck.items.plant import analyse
    from gpucheck.nvmltrace import Read, Trace
    from gpucheck.plantstats import Cell, table

    gap = 1.7e9  # wall - monotonic
    together = Cell("together", "matmul", "free", ["m-a", "m-b"], (100.0, 110.0), [0.5, 0.5])
    solo = Cell("solo a", "matmul", "solo", ["m-a", "m-b"], (90.0, 95.0))
    drain = Cell("drain", "matmul", "drain", ["m-a", "m-b"], (111.0, 113.0), None,
                 [(111.5, 0, "freeze"), (112.0, 0, "thaw")])
    times = {"m-a": [90.0 + i * 0.002 for i in range(1, 2500)] + [100.0 + i * 0.004 for i in range(1, 2500)]
             + [111.0 + i * 0.002 for i in range(1, 250)] + [111.5008]  # the product in flight at the freeze
             + [112.0 + i * 0.002 for i in range(1, 400)],
             "m-b": [100.0 + i * 0.004 for i in range(1, 2500)]}
    trace = Trace()
    for k in range(50):  # every 0.2 s: a credited 99, b every fourth sample
        stamp = int((100.1 + 0.2 * k + gap) * 1e6)
        trace.process.append((11, stamp, 99, 0) if k % 4 else (12, stamp, 99, 0))
    for k in range(12):  # device samples every 1/6 s from 111.0 (monotonic clock): busy until 111.59
        t0, t1 = 111.0 + k / 6, 111.0 + (k + 1) / 6
        trace.device.append((int(t1 * 1e6), 600.0 * max(0.0, min(t1, 111.59) - t0)))
    for k in range(30):
        at = 100.0 + 0.5 * k
        trace.reads.append(Read(at, at + gap, int((at - 0.1 + gap) * 1e6), "", int((at - 0.05) * 1e6)))
    record = {"kind": "matmul", "cells": [solo, together, drain], "times": times, "skipped": [],
              "tenants": [{"name": "m-a", "pid": 11}, {"name": "m-b", "pid": 12}], "trace": trace,
              "enqueued": {"m-a": [], "m-b": []}, "done": times}
    got = analyse(record, gpu=True)
    rows = {r["cell"]: r for r in got["rows"]}
    assert got["figures"]["nvml_clock"] == ("wall", gap) and got["figures"]["nvml_device_clock"][0] == "monotonic"
    assert rows["together"]["truth"] == [0.5, 0.5] and rows["together"]["nvml"] == [0.74, 0.26]
    assert round(rows["together"]["nvml_error"], 2) == 0.24
    assert rows["together"]["throughput_vs_solo"] == pytest.approx(1.0)  # 499.8 it/s, as alone
    assert rows["drain"]["drain"]["max"] == pytest.approx(0.0008)  # the product in flight
    assert rows["drain"]["device_drain"]["median"] == pytest.approx(0.09, abs=1e-4)  # busy 90 ms after it
    assert got["figures"]["nvml_sample_interval_s"] == pytest.approx(0.2)
    assert "| matmul | together | 0.500/0.500 | 0.740/0.260 |" in "\n".join(table(got["rows"]))


def test_the_mps_item_quiets_the_gpu_first_and_says_why_it_could_not_run(monkeypatch: pytest.MonkeyPatch
                                                                         ) -> None:
    import real_gpu_mps

    calls = []

    class Ctx:
        def quiet(self, keep: list) -> dict:
            calls.append(keep)
            return {"stopped": ["matmul-a"], "other_processes": {}, "idle": True}

    monkeypatch.setattr(real_gpu_mps.shutil, "which", lambda name: None)  # no MPS control daemon here
    result = real_gpu_mps.item(None, Ctx())
    assert calls == [[]]  # every tenant stopped before the daemon starts
    assert result.status == "error" and "nvidia-cuda-mps-control" in result.reason
    assert result.checks[0].passed is True and result.checks[0].value["stopped"] == ["matmul-a"]


def test_an_unknown_item_is_named_and_nothing_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH / "real_gpu.py"), "all", "--only", "plant,plnt", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "no item named 'plnt'" in done.stderr and "plant" in done.stderr
    assert not (tmp_path / "out").exists()


# -- the latency item: a request-driven service beside a trainer ----------------------------------------------


@pytest.mark.integration
def test_the_service_and_the_trainer_run_on_a_stand_in_torch(tmp_path: Path) -> None:
    """SERVE and TRAINER as on a GPU, over the stand-in (2 ms a product): the service answers its seeded
    Poisson requests in order, each timed from the arrival the harness draws too, never faster than its
    products; the trainer queues an iteration's products at once and dates each iteration."""
    import time

    from gpucheck.tenants import argv, read_count, read_serve, read_times, requests

    (tmp_path / "torch.py").write_text(STAND_IN_TORCH)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    service, trainer = tmp_path / "service.count", tmp_path / "trainer.count"
    processes = [subprocess.Popen(argv("serve", service, size=16, seed=7, load=0.3, low=2, high=6), env=env),
                 subprocess.Popen(argv("trainer", trainer, size=16, iteration_ms=20, host_ms=1), env=env)]
    try:
        began = time.monotonic()
        while (read_count(service) < 40 or read_count(trainer) < 20) and time.monotonic() - began < 60 \
                and all(p.poll() is None for p in processes):
            time.sleep(0.1)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    logs = [c.with_name(c.name + ".log") for c in (service, trainer)]
    said = "\n".join(log.read_text() for log in logs if log.exists())
    assert read_count(service) >= 40 and read_count(trainer) >= 20, said
    schedule = read_serve(service)
    assert schedule is not None and schedule["seed"] == 7 and (schedule["low"], schedule["high"]) == (2, 6)
    assert 0.0019 <= schedule["kernel_s"] <= 0.005  # one product timed alone
    assert schedule["rate"] == pytest.approx(0.3 / (schedule["kernel_s"] * 4))  # 30 % of the device at 4 a request
    arrived, answered = list(read_times(service, ".enqueued")), list(read_times(service, ".times"))
    drawn = list(itertools.islice(requests(7, schedule["rate"], 2, 6), len(arrived)))
    assert arrived == [schedule["t0"] + offset for offset, _ in drawn]  # the harness draws the same requests
    assert answered == sorted(answered)  # one after the other, in arrival order
    for (_, kernels), start, done in zip(drawn, arrived, answered, strict=True):
        assert done - start >= kernels * 0.002 - 1e-4  # never faster than its products
    assert "requests a second of 2-6 products (30% of the device alone)" in said
    iterations = list(read_times(trainer, ".times"))
    kernels = int(said.split("trainer: one product ")[1].split(" ms, ")[1].split(" an iteration")[0])
    assert 5 <= kernels <= 10 and len(iterations) >= 15  # 20 ms of 2 ms products (a late sleep times one longer)
    assert min(b - a for a, b in itertools.pairwise(iterations)) >= kernels * 0.002 - 1e-4  # queued at once


def test_the_latency_figures_count_every_request_that_arrived_in_the_window() -> None:
    """Latency from arrival to answer of the requests that arrived in the window (the i-th answer is the
    i-th arrival), one still unanswered counted with what it waited; the work of each against alone."""
    from gpucheck.items.latency import measure, percentile

    schedule = {"kernel_s": 0.01}
    arrivals = [(9.5, 2), (10.0, 3), (11.0, 4), (12.0, 5), (19.0, 2), (19.9, 6), (20.5, 1)]
    answered = [9.6, 10.05, 11.1, 12.2, 19.1]  # (19.9, 6) and (20.5, 1) not answered when the run ended
    trainer = [10.0 + i / 10 for i in range(1, 101)]  # 10 iterations a second from 10 to 20 s
    run = {"name": "class", "window": (10.0, 20.0), "ended": 22.9, "freezes": 4.0}
    row = measure(run, schedule, arrivals, answered, trainer, trainer_solo=20.0)
    assert row["requests"] == 5 and row["unanswered"] == 1  # 10.0, 11.0, 12.0, 19.0 answered; 19.9 waiting
    assert row["p50_ms"] == 100.0 and row["p99_ms"] == 200.0 and row["p999_ms"] == 200.0
    lat = sorted([0.05, 0.1, 0.2, 0.1, 3.0])
    assert percentile(lat, 1.0) == 3.0 and percentile([], 0.5) is None
    assert row["service_asked"] == pytest.approx(0.02) and row["service_work"] == pytest.approx(0.014)
    assert row["trainer_work"] == pytest.approx(0.5)  # 100 iterations in 10 s against 20 a second alone
    assert row["throughput_kept"] == pytest.approx(0.514)
    assert row["shares"] == [round(0.014 / 0.514, 3), round(0.5 / 0.514, 3)] and row["freezes"] == 4.0


def test_the_latency_item_is_a_second_call_on_a_gpu_that_fits_one(tmp_path: Path) -> None:
    """Not part of ``all`` (its 8 minutes are full): ``--only latency``, within one call's 10 minutes."""
    from gpucheck.context import Context

    item = ITEMS.get("latency")
    assert item.on_request and "sim" in item.needs
    gpu = Context(backend="nvml", quick=False, workdir=tmp_path, facts={})
    sim = Context(backend="sim", quick=True, workdir=tmp_path, facts={})
    assert 240 <= item.budget_s(gpu) <= 470 - 40  # 40 s: detecting the machine, packing
    assert item.budget_s(sim) <= 80


@pytest.mark.integration
@pytest.mark.serial
@pytest.mark.timeout(200)
def test_the_latency_item_on_cpu_tenants_orders_the_runs_as_the_issue_asks(tmp_path: Path) -> None:
    """``--only latency`` without a GPU: a CPU service and a burner in real cgroups on one CPU, the agent
    enforcing with the simulated NVML and the real cpu.stat: the class's p99 at most 1.5 times the one
    unenforced, the shares of the work within 5 points, the trainer frozen by the preemption alone."""
    out = tmp_path / "report"
    document, done = run_check(out, "--only", "latency", "--budget-scale", "2", timeout=150)
    assert [i["name"] for i in document["items"]] == ["latency"], done.stdout[-2000:]
    item = document["items"][0]
    assert item["status"] == "pass", f"{item['reason']}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert document["cleanup"] == "" and done.returncode == 0
    rows = {r["run"]: r for r in item["figures"]["rows"]}
    assert list(rows) == ["alone", "unenforced", "latency class"]  # quick: no rotation
    assert all(r["requests"] >= 50 for r in rows.values())
    assert rows["alone"]["trainer_work"] == 0.0 and rows["unenforced"]["trainer_work"] > 0.3
    cls = rows["latency class"]
    assert cls["in_class"] is True and cls["freezes"] >= 10 and cls["service_frozen_s"] == 0.0
    # the agent's own kernel ticks (it reads them beside the monotonic clock): found, or the still time
    assert cls["ticks"] in ("calibrated", "pending", "off") and 0.0001 <= cls["tick_s"] <= 0.02
    assert "| run | requests (unanswered) | p50 / p99 / p99.9 ms |" in (out / "report.md").read_text()
