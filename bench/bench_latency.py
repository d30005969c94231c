"""Benchmark a latency-sensitive service sharing a GPU with trainers, per share design, on the GPU plant.

Usage: .venv/bin/python bench/bench_latency.py [--seeds 8] [--designs none,duty,rotation,exempt,latency]
       [--neighbours matmul,deep,trainer] [--counts 1,2] [--loads 0.1,0.3,0.6] [--arrivals poisson|bursts]
       [--seconds 120] [--freeze-latency-ms 4] [--hold-latency-ms 1] [--markdown]

Issue 29's measurement (``tests/latencyplant.py``): a request-driven service (``serve``: Poisson arrivals,
each request 2-12 H200 matmul kernels, 3.2-19.2 ms of GPU work) with a 30 % share at a load of 10, 30 and
60 % of the GPU, beside one or two trainers of one kind (``matmul`` synchronous, ``deep`` 90 ms queued,
``trainer`` PyTorch-style 100 ms iterations) sharing the other 70 % equally; each design of
``latencyplant.DESIGNS`` enforces those shares (``none``: nothing is frozen). Runs of ``--seconds``
virtual seconds, judged after the first 15; one seed a run (it draws the arrivals, the same for every
design, NVML's phase and the plan's dither). ``--freeze-latency-ms``: the most a freeze or thaw on the
agent's loop lands after it was due (the plant's 4 by default, fitted to the rotation on the H200);
``--hold-latency-ms``: the same for a change decided at a CPU reading, the preemption (the plant's 1 by
default: its hand-off to the loop, ``bench_preemption.py``, and a v2 thaw, both well under it at the
median).

Per design, neighbours and load, over the seeds:

- the service's latency from arrival to reply, p50 / p99 / p99.9 in ms over the requests of every seed
  together (a request unanswered at the end counts with what it has waited), and the worst seed's p99;
  ``solo``: the service alone on the GPU;
- ``svc``: the service's part of the work done (median over the seeds); ``err``: with two neighbours, the
  largest miss of a neighbour's part of the neighbours' work against its share of theirs (worst seed,
  points); ``kept``: the work done per second against one neighbour alone (lowest seed).

Prints JSON, or with ``--markdown`` the two tables of docs/shares.md (latency; shares and throughput), or
with ``--goals DESIGN`` issue 29's goals for it, seed by seed against ``none`` and ``solo`` (``--designs``
must hold ``none`` and it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    from latencyplant import DESIGNS, SERVICE, run_beside

    from gpuagent.devices.sim import contention
    from gpuagent.devices.sim.workloads import Serve, summary

    seconds = args.seconds
    after = 15.0
    settings = contention.PlantSettings(freeze_latency_s=args.freeze_latency_ms / 1000.0,
                                        hold_latency_s=args.hold_latency_ms / 1000.0)
    rows: list[dict[str, object]] = []
    loads = [float(x) for x in args.loads.split(",")]
    for load in loads:
        pooled: list[float] = []
        p99s = []
        for seed in range(args.seeds):
            result = contention.run([(SERVICE, Serve(load, args.arrivals))], _Nothing(), seconds=seconds,
                                    seed=seed, settings=settings)
            lat = [x for a, x in result.requests[SERVICE] if a > after]
            pooled += lat
            p99s.append(summary(lat)["p99"])
        rows.append({"design": "solo", "neighbours": "", "count": 0, "load": load,
                     "latency_ms": _ms(summary(pooled)), "p99_worst_ms": round(1000 * max(p99s), 1),
                     "p99_by_seed_ms": [round(1000 * p, 1) for p in p99s]})
    for neighbour in args.neighbours.split(","):
        for count in (int(c) for c in args.counts.split(",")):
            for load in loads:
                for design in args.designs.split(","):
                    pooled, p99s, svc, errors, kept = [], [], [], [], []
                    for seed in range(args.seeds):
                        run = run_beside(design, neighbour, count, load, seed=seed, arrivals=args.arrivals,
                                         seconds=seconds, measured=seconds - after, settings=settings)
                        pooled += [x for a, x in run.result.requests[SERVICE] if a > after]
                        p99s.append(run.latency["p99"])
                        svc.append(run.got[SERVICE])
                        errors.append(run.neighbour_error)
                        kept.append(run.kept)
                    rows.append({"design": design, "label": DESIGNS[design][0], "neighbours": neighbour,
                                 "count": count, "load": load, "latency_ms": _ms(summary(pooled)),
                                 "p99_worst_ms": round(1000 * max(p99s), 1),
                                 "p99_by_seed_ms": [round(1000 * p, 1) for p in p99s],
                                 "svc_median": round(statistics.median(svc), 3),
                                 "neighbour_error_max": round(max(errors), 4) if count > 1 else None,
                                 "kept_min": round(min(kept), 3)})
    return rows


class _Nothing:
    def frozen_at(self, t: float) -> set[str]:
        return set()

    def next_change(self, t: float) -> float:
        return float("inf")

    def poll(self, t: float, readings: object) -> None:
        return None


def _ms(s: dict[str, float]) -> dict[str, float]:
    return {k: (round(1000 * v, 1) if k != "n" else int(v)) for k, v in s.items()}


def _cell(latency: object) -> str:
    lat = dict(latency)  # type: ignore[call-overload]
    return " / ".join(_fmt(lat[k]) for k in ("p50", "p99", "p999"))


def _fmt(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.0f}"


def markdown(rows: list[dict[str, object]], designs: list[str]) -> str:
    solo = {r["load"]: r for r in rows if r["design"] == "solo"}
    groups: dict[tuple[object, object, object], dict[object, dict[str, object]]] = {}
    for r in rows:
        if r["design"] != "solo":
            groups.setdefault((r["neighbours"], r["count"], r["load"]), {})[r["design"]] = r
    head = "| neighbours | load | solo | " + " | ".join(designs) + " |"
    lines = ["The service's latency, p50 / p99 / p99.9 (ms):", "", head, "|" + " --- |" * (3 + len(designs))]
    for (neighbour, count, load), by in groups.items():
        cells = [_cell(by[d]["latency_ms"]) if d in by else "" for d in designs]
        alone = _cell(solo[load]["latency_ms"])
        lines.append(f"| {count} x {neighbour} | {float(str(load)):.0%} | {alone} | "
                     + " | ".join(cells) + " |")
    caption = ("The service's part of the work (median) · with two neighbours, their largest miss of their "
               "split\n(points, worst seed) · the throughput kept against one neighbour alone (lowest seed):")
    lines += ["", caption, "", "| neighbours | load | " + " | ".join(designs) + " |",
              "|" + " --- |" * (2 + len(designs))]
    for (neighbour, count, load), by in groups.items():
        cells = []
        for d in designs:
            r = by.get(d)
            if r is None:
                cells.append("")
                continue
            err = r["neighbour_error_max"]
            err_text = "" if err is None else f" · {100 * float(str(err)):.1f}"
            cells.append(f"{float(str(r['svc_median'])):.2f}{err_text} · {float(str(r['kept_min'])):.2f}")
        lines.append(f"| {count} x {neighbour} | {float(str(load)):.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(rows: list[dict[str, object]], design: str) -> str:
    """Issue 29's goals for ``design``, seed by seed against ``none`` and ``solo`` on the same seed."""
    solo = {r["load"]: r for r in rows if r["design"] == "solo"}
    by = {(r["design"], r["neighbours"], r["count"], r["load"]): r for r in rows}
    lines = ["| neighbours | load | p99 (worst seed) | / p99 with no enforcement (worst) "
             "| - solo p99 (worst) | service's part | neighbours' miss (points) | kept (min) "
             "| kept with no enforcement (min) |",
             "|" + " --- |" * 9]
    for (name, neighbour, count, load), r in by.items():
        if name != design or ("none", neighbour, count, load) not in by:
            continue
        mine = [float(x) for x in r["p99_by_seed_ms"]]  # type: ignore[attr-defined]
        none = [float(x) for x in by[("none", neighbour, count, load)]["p99_by_seed_ms"]]  # type: ignore[attr-defined]
        alone = [float(x) for x in solo[load]["p99_by_seed_ms"]]  # type: ignore[attr-defined]
        ratio = max(m / n for m, n in zip(mine, none, strict=True))
        excess = max(m - a for m, a in zip(mine, alone, strict=True))
        err = r["neighbour_error_max"]
        miss = "" if err is None else f"{100 * float(str(err)):.1f}"
        kept_none = float(str(by[("none", neighbour, count, load)]["kept_min"]))
        lines.append(f"| {count} x {neighbour} | {float(str(load)):.0%} | {_fmt(max(mine))} | {ratio:.2f} "
                     f"| {_fmt(excess)} | {float(str(r['svc_median'])):.2f} | {miss} "
                     f"| {float(str(r['kept_min'])):.2f} | {kept_none:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--designs", default="none,duty,rotation,exempt,latency")
    parser.add_argument("--neighbours", default="matmul,deep,trainer")
    parser.add_argument("--counts", default="1,2")
    parser.add_argument("--loads", default="0.1,0.3,0.6")
    parser.add_argument("--arrivals", default="poisson", choices=("poisson", "bursts"))
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--freeze-latency-ms", type=float, default=4.0)
    parser.add_argument("--hold-latency-ms", type=float, default=1.0)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--goals", default=None, help="issue 29's goals table of this design (with none)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    started = time.perf_counter()
    rows = measure(args)
    if args.goals:
        print(goals(rows, args.goals))
    elif args.markdown:
        print(markdown(rows, args.designs.split(",")))
    else:
        wall = round(time.perf_counter() - started, 3)
        print(json.dumps({"bench": "latency", "rows": rows, "wall_s": wall}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
