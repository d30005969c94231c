"""``bench/bench_extender.py --judging`` runs end to end on a small fleet, beside a baseline revision.

The figures themselves are the bench's business (timed assertions do not belong in tests): here only that
each tree's child measures every kind of call, both trees see the same fleet, and the results are written
where asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_judging_bench_measures_both_trees_on_the_same_fleet(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/bench_extender.py", "--judging", "--nodes", "60", "--busy", "0.5", "--calls",
         "2", "--rounds", "1", "--baseline", "HEAD", "--now", "HEAD", "--per-state-too", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[0])
    assert row["nodes"] == 60 and row["distinct_states"]["baseline"][0] == row["distinct_states"]["now"][0]
    calls = {f"{where}_{verb}_{pod}" for where in ("in_process", "http") for verb in ("filter", "prioritize")
             for pod in ("never_seen", "seen")}
    assert set(row["now"]) == calls | {f"{name}_cpu" for name in calls}
    assert all(figures["runs"] == 2 for figures in row["baseline"].values())  # 2 calls, 1 round
    assert set(row["ratio_p99_baseline_over_now"]) == set(row["ratio_p50_now_per_state_over_now"]) == set(row["now"])
    judged = row["distinct_states"]["now_per_state"][1]
    assert judged["columns"] == 0 and judged["per_state"] > 0  # what the columns buy: measured without them
    assert len(list(tmp_path.glob("judging_*.json"))) == 1
