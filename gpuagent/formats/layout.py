"""Text columns for the terminal, shared by the commands' tables: padded to the widest cell, text left,
figures right. Cells hold label values any scrape target can set: their controls are shown as escapes
(``gpuagent.untrusted.shown``) before the widths are measured."""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.untrusted import shown


def render_columns(header: Sequence[str], rows: Sequence[Sequence[str]], footer: Sequence[str] | None = None,
                   left: int = 2) -> list[str]:
    """Columns padded to their widest cell: the first ``left`` left, figures right; "(none)" under
    the header when there are no rows."""
    body = [[shown(cell) for cell in row] for row in (header, *rows, *([footer] if footer else []))]
    if not rows:
        body.insert(1, ["(none)"] + [""] * (len(header) - 1))
    widths = [max(len(row[i]) for row in body) for i in range(len(header))]
    out = []
    for row in body:
        out.append("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    return out
