"""The benches run, at tiny sizes, so they cannot rot: what they print and write, never how fast it was."""

from __future__ import annotations

import json
import pstats
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.integration


def run_bench(*argv: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_bench_scale_prints_a_table_a_plot_and_one_json_line(tmp_path: Path) -> None:
    plot = tmp_path / "scale.png"
    done = run_bench("bench/bench_scale.py", "--sizes", "2", "9", "--polls", "3", "--scrapes", "2",
                     "--out", str(tmp_path), "--plot", str(plot), "--profile", str(tmp_path / "profiles"))
    lines = done.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert lines[0].split()[:3] == ["pods", "series", "poll"]
    assert [row.split()[0] for row in lines[1:3]] == ["2", "9"]
    assert [size["pods"] for size in figures["sizes"]] == [2, 9]
    for size in figures["sizes"]:
        # every pod's process is named through the API server, and the baseline rendered the same series
        assert size["processes"] == size["processes_named_by_api_server"] == size["pods"]
        assert size["series"] == size["series_prometheus_client"] > 0
        assert size["poll_own"]["runs"] == 3 and size["scrape_new_snapshot"]["runs"] == 2
        assert set(size["phases_median_ms"]) == {
            "devices", "attribution", "enforcement", "accounting", "hints", "other"}
    assert set(figures["bars"]) == {"scrape_speedup_min"}  # the poll bars need sizes 8, 110 and 250
    assert plot.read_bytes().startswith(PNG_MAGIC)
    assert len(list(tmp_path.glob("scale_*.json"))) == 1
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == [
        "scale-2-poll.pstats", "scale-2-scrape.pstats", "scale-9-poll.pstats", "scale-9-scrape.pstats"]
    # each dataclass's constructor has a line of its own (cProfile merged them all into one, then kept one)
    profiled = pstats.Stats(str(tmp_path / "profiles" / "scale-9-poll.pstats")).stats
    assert ("<dataclass>", 0, "ProcessSample.__init__") in profiled


def test_bench_parts_replays_each_part_of_a_poll() -> None:
    done = run_bench("bench/bench_parts.py", "--sizes", "2", "5", "--polls", "12", "--repeat", "2")
    lines = done.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert lines[0].split() == ["pods", "attribution", "enforcement", "accounting", "hints", "sum"]
    assert [size["pods"] for size in figures["sizes"]] == [2, 5]
    for size in figures["sizes"]:
        assert set(size["us_per_poll"]) == {"attribution", "enforcement", "accounting", "hints"}
        assert all(v > 0 for v in size["us_per_poll"].values())


def test_bench_poll_scrape_measures_against_prometheus_client(tmp_path: Path) -> None:
    done = run_bench("bench/bench_poll_scrape.py", "--polls", "2", "--scrapes", "2", "--soak", "0",
                     "--out", str(tmp_path))
    figures = json.loads(done.stdout)["in_process"]
    assert figures["processes"] == figures["processes_attributed_to_named_pods"] > 0
    assert figures["prometheus_client_render"]["runs"] == 1
    assert figures["scrape_new_snapshot_speedup_vs_prometheus_client"] > 0
    assert len(list(tmp_path.glob("poll_scrape_*.json"))) == 1


def test_bench_cluster_view_judges_every_node_cold_and_after_a_restart(tmp_path: Path) -> None:
    out = tmp_path / "not" / "there" / "yet"  # a fresh clone has no results folder: the bench makes it
    done = run_bench("bench/bench_cluster_view.py", "--nodes", "30", "--busy", "0.5", "--calls", "2",
                     "--write-nodes", "2", "--write-seconds", "700", "--out", str(out))
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()[:-1]]
    decode, extender, writes = lines
    assert set(decode) == {"8xH100, 64 processes", "A100 MIG", "laptop 1 GPU"}
    assert extender["cold_first_filter"]["nodes_judged"] == 30 and extender["cold_first_filter"]["lists"] == 1
    assert extender["cold_first_filter"]["nodes_unjudged"] == 0
    assert extender["restart_mid_run"]["same_verdicts"] is True
    assert extender["filter_in_process"]["never_seen_pod"]["runs"] == 2
    assert writes["steady"]["writes_per_node_per_hour"] > 0 and "churn" in writes
    assert len(list(out.glob("cluster_view_*.json"))) == 1


def test_bench_cluster_view_decode_mode_measures_beside_a_baseline(tmp_path: Path) -> None:
    done = run_bench("bench/bench_cluster_view.py", "--decode", "--baseline", "HEAD", "--rounds", "2",
                     "--fleet", "12", "--out", str(tmp_path))
    decode, side_by_side, states = (json.loads(line) for line in done.stdout.strip().splitlines()[:-1])
    kinds = {"8xH100, 64 processes", "A100 MIG", "laptop 1 GPU"}
    assert set(decode) == kinds and all(decode[k]["verdict_key_us"] > 0 for k in kinds)
    assert side_by_side["baseline"] == "HEAD" and set(side_by_side["kinds"]) == kinds
    assert all(row["baseline_us"] > 0 and row["now_us"] > 0 for row in side_by_side["kinds"].values())
    for variation in ("names and UUIDs only", "and memory use", "and pods of their own"):
        assert states[variation]["all"]["now"] <= states[variation]["all"]["baseline"] <= 12
    assert len(list(tmp_path.glob("cluster_view_decode_*.json"))) == 1
