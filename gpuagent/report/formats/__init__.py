"""Output formats of the report: ``table`` (terminal), ``csv``, ``json``, ``html`` (self-contained, with
plots). Each is a pure function ``Report -> str``; only ``html`` imports the plotting library, lazily."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from gpuagent.report.errors import ReportError
from gpuagent.report.model import Report

FORMATS = ("table", "csv", "json", "html")
PLOTTING_EXTRA = "report"  # pyproject's extra that brings matplotlib


def require_plotting() -> None:
    """Import matplotlib, which only ``--format html`` draws with; without it (the ``report`` extra not
    installed) a :class:`ReportError` naming the install command. Any other missing module is a broken
    install, raised as it is."""
    try:
        importlib.import_module("matplotlib")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        raise ReportError(f"--format html draws its plots with matplotlib, which is not installed; it comes "
                          f"with the '{PLOTTING_EXTRA}' extra: pip install 'gpuagent[{PLOTTING_EXTRA}]' (or "
                          f"pick --format table, csv or json)") from None


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
