"""The trust model in docs/operations.md names a test for each input: every one it names exists.

A row of that table is a promise ("another node's object changes that node's verdict only") and the test it
names is what keeps the promise; a renamed or deleted test would leave the row unproven without anyone
noticing. So each ``tests/<module>.py`` and ``::<test>`` the table names is looked up here: the module must
exist and define the test (a plain function or a parametrised one, by name).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"


def _table() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Trust model", 1)[1].split("\n### ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]


def _named_tests(cell: str) -> list[tuple[str, str | None]]:
    """(module, test or None) for each test a cell names; ``::name`` alone continues the last module."""
    named: list[tuple[str, str | None]] = []
    module = None
    for ref in re.findall(r"`([^`]+)`", cell):
        match = re.fullmatch(r"(tests/\w+\.py)?(?:::(\w+))?", ref)
        if match is None or not any(match.groups()):
            continue
        module = match.group(1) or module
        assert module is not None, f"{ref} names a test before any module"
        named.append((module, match.group(2)))
    return named


def test_every_row_names_a_test_and_every_test_named_exists() -> None:
    rows = _table()
    assert len(rows) >= 15, "the trust model lists the inputs of every identity"
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 5, f"a row has five columns: {row[:80]}"
        named = _named_tests(cells[4])
        assert named, f"the row for {cells[0]} names no test"
        for module, test in named:
            source = (ROOT / module).read_text(encoding="utf-8")
            if test is not None:
                assert re.search(rf"^(async )?def {test}\(", source, re.MULTILINE), f"{module} has no {test}"
