"""Every figure the report shows adds up on its table, or the table says why (issue 30 item 3).

The demo's node showed notebook-alice 111.8 % efficient (a replica holder using more than its 1/3 of a GPU)
and the research namespace busy 135.6 GPU-h of 104.0 allocated at 65.8 % (a stray's busy time, and a MIG
instance without GPM, count in GPU-h busy or allocated but not in efficiency). Here a day of such a node,
served by the fake Prometheus of ``test_report.py``, in every format: each efficiency over 100 % or not its
row's busy / allocated carries the marks of its reasons, the notes under its table state them, and with the
busy time elsewhere shown apart the rest adds up.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator

import pytest
from test_report import FakePrometheus, day_report, serve

from gpuagent.report.formats import renderer
from gpuagent.report.model import BUSY_ELSEWHERE, BUSY_UNKNOWN, NOTES, OVER_SHARE, Report

HOUR = 3600.0
# (namespace, pod, UUID) -> (allocated s, busy s, idle s, memory byte-s, energy J); busy None: no series
NODE_DAY = {
    # one of three replicas of GPU-aaaa (8 of 24 h), busy 9 h there: over its share
    ("research", "notebook-alice", "GPU-aaaa"): (8 * HOUR, 9 * HOUR, 0.0, 0.0, 0.0),
    # its benchmark on GPU-bbbb, never allocated to it: a stray, 10 h busy
    ("research", "notebook-alice", "GPU-bbbb"): (0.0, 10 * HOUR, 0.0, 0.0, 0.0),
    # a MIG instance of an A100 (no GPM): allocated, busy unknown
    ("research", "notebook-bob", "GPU-cccc"): (12 * HOUR, None, 0.0, 0.0, 0.0),
    # a whole GPU, 80 % busy: its figures add up as they are
    ("training", "llama-ft-0", "GPU-dddd"): (24 * HOUR, 19.2 * HOUR, 0.0, 0.0, 0.0),
}


@pytest.fixture(scope="module")
def report() -> Iterator[Report]:
    with serve(FakePrometheus(pods=dict(NODE_DAY), workloads={})) as fake:
        yield day_report(fake)


def test_the_model_gives_each_row_its_reasons(report: Report) -> None:
    pods = {p.pod: p.usage for p in report.pods}
    alice, bob, llama = pods["notebook-alice"], pods["notebook-bob"], pods["llama-ft-0"]
    assert alice.busy_gpu_hours == pytest.approx(19) and alice.busy_elsewhere_gpu_hours == pytest.approx(10)
    assert alice.efficiency_ratio == pytest.approx(9 / 8) and alice.notes() == (BUSY_ELSEWHERE, OVER_SHARE)
    assert bob.efficiency_ratio is None and bob.notes() == ()  # no efficiency shown: nothing to explain
    assert llama.notes() == () and llama.busy_elsewhere_gpu_seconds == 0.0
    research = next(n.usage for n in report.namespaces if n.namespace == "research")
    assert research.efficiency_ratio == pytest.approx(9 / 8)  # over alice's 8 h: bob's 12 have no busy
    assert research.notes() == (BUSY_ELSEWHERE, BUSY_UNKNOWN, OVER_SHARE)
    assert list(report.notes()) == list(NOTES)


def tables(text: str) -> list[tuple[list[str], list[list[str]], dict[str, str]]]:
    """Each table of the terminal report: its columns, rows (cells) and footnotes by mark."""
    out = []
    for block in text.split("\n\n")[1:]:
        lines = [line for line in block.splitlines() if not line.startswith("warning:")]
        notes = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines if line.startswith("[")}
        body = [line for line in lines if not line.startswith("[")]
        header = re.split(r"\s{2,}", body[0].strip())
        rows = [re.split(r"\s{2,}", line.strip()) for line in body[1:]]
        out.append((header, rows, notes))
    return out


def test_every_percentage_in_the_table_is_at_most_100_or_flagged_and_the_figures_add_up(report: Report) -> None:
    text = renderer("table")(report)
    found = tables(text)
    assert len(found) == 3  # namespaces, pods, all
    over = f"[{list(NOTES).index(OVER_SHARE) + 1}]"
    for header, rows, notes in found:
        assert "GPU-h BUSY ELSEWHERE" in header[-7:]  # a stray's busy time, shown apart
        column = {title: i - len(header) for i, title in enumerate(header)}  # from the right: ALL has no label
        for cells in rows:
            cell = cells[column["EFFICIENCY"]]
            if cell == "-":
                continue
            match = re.fullmatch(r"(\d+\.\d)% ?(\[[\d,]+\])?", cell)
            assert match, cell
            percent, marks = float(match.group(1)), match.group(2) or ""
            numbers = re.findall(r"\d+", marks)
            for number in numbers:  # every mark is explained under its own table
                assert f"[{number}]" in notes, (cells, notes)
            if percent > 100.0:
                assert over.strip("[]") in numbers, cells
            if numbers:
                continue
            busy = float(cells[column["GPU-h BUSY"]])
            elsewhere = float(cells[column["GPU-h BUSY ELSEWHERE"]])
            allocated = float(cells[column["GPU-h ALLOCATED"]])
            assert percent == pytest.approx(100 * (busy - elsewhere) / allocated, abs=0.1), cells
        for mark, sentence in notes.items():
            assert sentence == NOTES[list(NOTES)[int(mark.strip("[]")) - 1]]
    pods = {cells[1]: cells for cells in found[1][1]}
    assert pods["notebook-alice"][2:6] == ["8.00", "19.00", "10.00", "112.5% [1,3]"]  # (19 - 10) / 8, over
    assert pods["llama-ft-0"][2:6] == ["24.00", "19.20", "0", "80.0%"]


def test_csv_json_and_html_carry_the_same_reasons(report: Report) -> None:
    rows = list(csv.DictReader(io.StringIO(renderer("csv")(report))))
    by_name = {(r["level"], r["namespace"] or r["workload"], r["pod"]): r for r in rows}
    assert by_name[("namespace", "research", "")]["notes"] == "busy_elsewhere busy_unknown over_share"
    assert by_name[("pod", "research", "notebook-alice")]["notes"] == "busy_elsewhere over_share"
    assert float(by_name[("pod", "research", "notebook-alice")]["busy_elsewhere_gpu_hours"]) == 10.0
    assert by_name[("pod", "training", "llama-ft-0")]["notes"] == ""
    document = json.loads(renderer("json")(report))
    assert document["notes"] == NOTES
    alice = next(p for p in document["pods"] if p["pod"] == "notebook-alice")
    assert alice["notes"] == [BUSY_ELSEWHERE, OVER_SHARE] and alice["busy_elsewhere_gpu_hours"] == 10.0
    assert document["total"]["notes"] == [BUSY_ELSEWHERE, BUSY_UNKNOWN]  # (9 + 19.2) / (8 + 24): 88 %
    page = renderer("html")(report)
    namespaces = page[page.index('<table id="namespaces-table">'):page.index('<h2 id="efficiency">')]
    assert '<sup class="note">[1,2,3]</sup>' in namespaces
    for number, sentence in enumerate(NOTES.values(), start=1):
        assert f'<p class="meta note">[{number}] {sentence}</p>' in namespaces
    assert "GPU-hours busy elsewhere" in page[:page.index('<h2 id="namespaces">')]  # a summary card
