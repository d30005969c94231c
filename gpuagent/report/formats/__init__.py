"""Output formats of the report: ``table`` (terminal), ``csv``, ``json``, ``html`` (self-contained, with
plots). Each is a pure function ``Report -> str``; only ``html`` imports the plotting library, lazily."""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.formats.plotting import require_plotting
from gpuagent.report.model import Report

FORMATS = ("table", "csv", "json", "html")


def renderer(name: str) -> Callable[[Report], str]:
    if name == "table":
        from gpuagent.report.formats.table import render_table

        return render_table
    if name == "csv":
        from gpuagent.report.formats.csv_rows import render_csv

        return render_csv
    if name == "json":
        from gpuagent.report.formats.json_doc import render_json

        return render_json
    if name == "html":
        require_plotting()
        from gpuagent.report.formats.html_page import render_html

        return render_html
    raise ValueError(f"unknown format {name!r} (one of {', '.join(FORMATS)})")
