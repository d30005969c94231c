"""The benches run, at tiny sizes, so they cannot rot: what they print and write, never how fast it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def run_bench(*argv: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_bench_poll_scrape_measures_against_prometheus_client(tmp_path: Path) -> None:
    done = run_bench("bench/bench_poll_scrape.py", "--polls", "2", "--scrapes", "2", "--soak", "0",
                     "--out", str(tmp_path))
    figures = json.loads(done.stdout)["in_process"]
    assert figures["processes"] == figures["processes_attributed_to_named_pods"] > 0
    assert figures["prometheus_client_render"]["runs"] == 1
    assert figures["scrape_new_snapshot_speedup_vs_prometheus_client"] > 0
    assert len(list(tmp_path.glob("poll_scrape_*.json"))) == 1
