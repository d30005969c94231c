"""Benchmark the share controller on the simulated GPU of ``tests/test_timeslice.py``.

Usage: .venv/bin/python bench/bench_timeslice.py [--seeds 10] [--seconds 20] [--poll 0.5] [--noise 0.01]

Burners (demand 1.0 each) sharing one GPU whose use follows CPU-like dynamics (a frozen tenant's use
decays over a 0.2 s queue), with 1 point of seeded measurement noise; the controller decides at every poll
and each 100 ms period applies its frozen fractions. Per case, over the seeds:

- ``share_error``: per run, the worst tenant's |mean use over the last 15 s - share| (the true use, not the
  noisy measurement); the median and the worst over the runs;
- ``poll_deviation_worst``: the largest |measured use in one poll - share| over the last 15 s of any run
  (what a dashboard plotting every poll would show, noise included);
- ``time_to_throttle_s``: the first poll at which every tenant's measured use is within 5 points of its
  share; the median and the worst over the runs.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from test_timeslice import simulate, tail_error, time_to_throttle

    from gpuagent.enforce.timeslice import ShareController

    tail_from = args.seconds - 15.0
    started = time.perf_counter()
    cases = {}
    for name, shares in CASES.items():
        errors, deviations, times = [], [], []
        for seed in range(args.seeds):
            polls, _ = simulate(shares, seconds=args.seconds, poll=args.poll, seed=seed, noise=args.noise,
                                controller=ShareController())
            errors.append(tail_error(polls, shares, after=tail_from))
            deviations.append(max(abs(p.measured[k] - s) for p in polls if p.t > tail_from
                                  for k, s in shares.items()))
            ttt = time_to_throttle(polls, shares)
            times.append(ttt if ttt is not None else float("inf"))
        cases[name] = {
            "share_error_median": round(statistics.median(errors), 4),
            "share_error_worst": round(max(errors), 4),
            "poll_deviation_worst": round(max(deviations), 4),
            "time_to_throttle_s_median": statistics.median(times),
            "time_to_throttle_s_worst": max(times),
            "runs": args.seeds,
        }
    defaults = ShareController()
    report = {
        "bench": "timeslice",
        "plant": {"demand": 1.0, "queue_s": 0.2, "noise": args.noise, "period_s": 0.1, "poll_s": args.poll,
                  "seconds": args.seconds, "tail_s": 15.0},
        "controller": {k: getattr(defaults, k) for k in ("kp", "ki", "window", "max_frozen", "tolerance")},
        "cases": cases,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
