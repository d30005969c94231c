"""Benchmark the share schemes: on the GPU-contention plant (``--plant``), or the PI alone on simple plants.

Usage: .venv/bin/python bench/bench_timeslice.py --plant [--seeds 6] [--designs duty,rotation,...]
       [--markdown]
       .venv/bin/python bench/bench_timeslice.py [--noise-model gaussian|binomial|both] [--seeds 10]
       [--seconds S] [--poll P] [--tail T] [--noise 0.01] [--samples 5]

``--plant``: every design of ``tests/shareplant.py`` (the duty cycle as it was, dithered, with a period
sized to the tenants' drain, and the exclusive rotation fixed and dithered) holds ``matmul`` and ``deep``
tenants at 70/30, 90/10 and 50/30/20 on ``gpuagent/devices/sim/contention.py`` (the plant calibrated on
the H200, docs/shares.md), 60 s runs judged over the last 45 s by the tenants' completed work, one seed a
run (the seed also draws NVML's sample phase). Per design, kind and split: the largest error of any tenant
over the seeds (and the median run's), and the lowest throughput kept against one tenant alone. The table
of docs/shares.md is ``--plant --markdown``; ``--plant --periods 0.5,1,2 --seeds 4`` gives the rotation at
each period, tenants of one kind (every split) and of two kinds (a deep one beside a synchronous one).

Without ``--plant``, the PI controller (``share_scheme: duty``) on the plants of ``tests/test_timeslice.py``:

Burners (demand 1.0 each) sharing one GPU whose use follows CPU-like dynamics (a frozen tenant's use
decays over a 0.2 s queue); the controller decides at every poll and each 100 ms period applies its
frozen fractions. Two measurement noise models:

- ``gaussian``: the true use plus ``--noise`` (1 point) of seeded Gaussian noise; 20 s runs at 0.5 s
  polls, scored over the last 15 s (the defaults);
- ``binomial``: what NVML gives per process on a time-sliced GPU, each ~200 ms sample belonging to one
  context: ``Binomial(samples, true use) / samples`` (20-point steps, ~20 points of spread); 60 s runs at
  1 s polls (the agent's default), scored over the last 45 s.

``both`` (the default) runs each with its defaults. Per case, over the seeds:

- ``share_error``: per run, the worst tenant's |mean true use over the tail - share| (the true use, not
  the noisy measurement); the median and the worst over the runs;
- ``noise_floor``: per run, |mean over the tail of (measured - true use)| of the tenant with the largest
  one: how far the readings' own mean misses the truth, which a controller steering the readings to the
  share cannot remove (median and worst);
- ``gpu_use_min``: the lowest, over the runs, of the tenants' summed mean true use over the tail (below 1:
  time lost with several tenants frozen at once);
- ``poll_deviation_worst``: the largest |measured use in one poll - share| over the tail of any run
  (what a dashboard plotting every poll would show, noise included);
- ``time_to_throttle_s``: the first poll at which every tenant's measured use is within 5 points of its
  share; the median and the worst over the runs (gaussian only: single binomial readings are 20 points
  apart, so null there).

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "70/30": {"a": 0.7, "b": 0.3},
    "50/30/20": {"a": 0.5, "b": 0.3, "c": 0.2},
    "90/10": {"a": 0.9, "b": 0.1},
    "10/90": {"a": 0.1, "b": 0.9},
}

DEFAULTS = {  # per noise model: seconds, poll, tail
    "gaussian": (20.0, 0.5, 15.0),
    "binomial": (60.0, 1.0, 45.0),
}


def run_model(model: str, args: argparse.Namespace) -> dict[str, object]:
    from test_timeslice import simulate, tail_error, time_to_throttle

    from gpuagent.enforce.timeslice import ShareController

    seconds, poll, tail = DEFAULTS[model]
    seconds = args.seconds if args.seconds is not None else seconds
    poll = args.poll if args.poll is not None else poll
    tail = min(args.tail if args.tail is not None else tail, seconds)
    tail_from = seconds - tail
    cases = {}
    for name, shares in CASES.items():
        errors, floors, totals, deviations, times = [], [], [], [], []
        for seed in range(args.seeds):
            polls, _ = simulate(shares, seconds=seconds, poll=poll, seed=seed, noise=args.noise,
                                noise_model=model, samples=args.samples, controller=ShareController())
            scored = [p for p in polls if p.t > tail_from]
            errors.append(tail_error(polls, shares, after=tail_from))
            floors.append(max(abs(statistics.fmean(p.measured[k] - p.true[k] for p in scored))
                              for k in shares))
            totals.append(statistics.fmean(sum(p.true.values()) for p in scored))
            deviations.append(max(abs(p.measured[k] - s) for p in scored for k, s in shares.items()))
            if model == "gaussian":
                ttt = time_to_throttle(polls, shares)
                times.append(ttt if ttt is not None else float("inf"))
        cases[name] = {
            "share_error_median": round(statistics.median(errors), 4),
            "share_error_worst": round(max(errors), 4),
            "noise_floor_median": round(statistics.median(floors), 4),
            "noise_floor_worst": round(max(floors), 4),
            "gpu_use_min": round(min(totals), 4),
            "poll_deviation_worst": round(max(deviations), 4),
            "time_to_throttle_s_median": statistics.median(times) if times else None,
            "time_to_throttle_s_worst": max(times) if times else None,
            "runs": args.seeds,
        }
    plant = {"noise_model": model, "demand": 1.0, "queue_s": 0.2, "period_s": 0.1, "poll_s": poll,
             "seconds": seconds, "tail_s": tail}
    plant.update({"noise": args.noise} if model == "gaussian" else {"samples": args.samples})
    return {"plant": plant, "cases": cases}


def run_plant(args: argparse.Namespace) -> dict[str, object]:
    from shareplant import DESIGNS, SPLITS, run_split

    from gpuagent.devices.sim.contention import KINDS, PlantSettings

    designs = args.designs.split(",") if args.designs else list(DESIGNS)
    rows = []
    for design in designs:
        for kind in KINDS:
            for split_name, split in SPLITS.items():
                errors, kept = [], []
                for seed in range(args.seeds):
                    outcome = run_split(design, kind, split, seed=seed)
                    errors.append(outcome.max_error)
                    kept.append(outcome.kept)
                rows.append({"design": design, "label": DESIGNS[design].name, "kind": kind,
                             "split": split_name, "max_error": round(max(errors), 4),
                             "median_error": round(statistics.median(errors), 4),
                             "kept_min": round(min(kept), 4), "runs": args.seeds})
    return {"plant": vars(PlantSettings()), "rows": rows}


def run_periods(args: argparse.Namespace) -> list[dict[str, object]]:
    """The rotation at each period of ``--periods``: tenants of one kind (every split), and of two kinds."""
    from shareplant import SPLITS, Design, Enforced, run_split

    from gpuagent.devices.sim import contention
    from gpuagent.enforce.timeslice import RotationController, RotationPlan

    rows: list[dict[str, object]] = []
    for period in (float(p) for p in args.periods.split(",")):
        def build(shares: object, kind: str, seed: int, period: float = period) -> Enforced:
            plan = RotationPlan(period, dither=0.3, seed=seed)
            return Enforced(RotationController(), plan, shares)  # type: ignore[arg-type]

        design = Design(f"rotation, {period:g} s +-30 %", build)
        for kind in contention.KINDS:
            runs = [run_split(design, kind, split, seed=seed) for split in SPLITS.values()
                    for seed in range(args.seeds)]
            rows.append({"period_s": period, "tenants": kind,
                         "max_error": round(max(r.max_error for r in runs), 4),
                         "kept_min": round(min(r.kept for r in runs), 4)})
        for kinds in (("deep", "matmul"), ("matmul", "deep")):
            errors = []
            for split in ((70, 30), (90, 10)):
                for seed in range(args.seeds):
                    shares = {"a": split[0] / 100, "b": split[1] / 100}
                    result = contention.run([("a", kinds[0]), ("b", kinds[1])], build(shares, "", seed),
                                            seconds=60.0, seed=seed)
                    truth = result.truth(15.0)
                    errors.append(max(abs(truth[k] - shares[k]) for k in shares))
            rows.append({"period_s": period,
                         "tenants": f"{kinds[0]} (a) beside {kinds[1]} (b), 70/30 and 90/10",
                         "max_error": round(max(errors), 4), "kept_min": None})
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| design | kind | split | largest error (points) | median run's (points) "
             "| throughput kept (min) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        worst, median, kept = (float(str(r[k])) for k in ("max_error", "median_error", "kept_min"))
        lines.append(f"| {r['label']} | {r['kind']} | {r['split']} | {100 * worst:.1f} "
                     f"| {100 * median:.1f} | {kept:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plant", action="store_true", help="the designs on the GPU-contention plant")
    parser.add_argument("--designs", default=None, help="--plant: comma-separated designs (default: all)")
    parser.add_argument("--markdown", action="store_true", help="--plant: a Markdown table, not JSON")
    parser.add_argument("--periods", default=None,
                        help="--plant: the rotation at these periods (comma-separated seconds) instead")
    parser.add_argument("--noise-model", choices=("gaussian", "binomial", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs per case (default: 6 with --plant, else 10)")
    parser.add_argument("--seconds", type=float, default=None, help="run length (default: per model)")
    parser.add_argument("--poll", type=float, default=None, help="poll interval (default: per model)")
    parser.add_argument("--tail", type=float, default=None,
                        help="seconds scored at the end (default: per model)")
    parser.add_argument("--noise", type=float, default=0.01, help="gaussian: standard deviation")
    parser.add_argument("--samples", type=int, default=5, help="binomial: NVML samples per poll")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from gpuagent.enforce.timeslice import ShareController

    if args.plant:
        args.seeds = args.seeds or 6
        started = time.perf_counter()
        if args.periods:
            rows = run_periods(args)
            if args.markdown:
                print("| period | tenants | largest error (points) | kept (min) |\n| --- | --- | --- | --- |")
                for r in rows:
                    kept = "" if r["kept_min"] is None else f"{float(str(r['kept_min'])):.3f}"
                    error = 100 * float(str(r["max_error"]))
                    print(f"| {r['period_s']:g} s | {r['tenants']} | {error:.1f} | {kept} |")
            else:
                print(json.dumps({"bench": "timeslice-periods", "rows": rows}, indent=2))
            return 0
        plant = run_plant(args)
        if args.markdown:
            print(markdown(plant["rows"]))  # type: ignore[arg-type]
        else:
            print(json.dumps({"bench": "timeslice-plant", **plant,
                              "wall_s": round(time.perf_counter() - started, 3)}, indent=2))
        return 0
    args.seeds = args.seeds or 10
    started = time.perf_counter()
    models = ("gaussian", "binomial") if args.noise_model == "both" else (args.noise_model,)
    defaults = ShareController()
    report = {
        "bench": "timeslice",
        "controller": {k: getattr(defaults, k) for k in ("kp", "ki", "window", "max_frozen", "tolerance")},
        "models": {model: run_model(model, args) for model in models},
        "wall_s": 0.0,
    }
    report["wall_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
