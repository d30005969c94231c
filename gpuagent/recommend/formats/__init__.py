"""Output formats of ``gpuagent recommend``: ``table`` (terminal), ``json``, ``csv``, ``html``
(self-contained, with plots). Each is a pure function ``Recommendations -> str``; only ``html`` imports the
plotting library, lazily."""

from __future__ import annotations

from collections.abc import Callable

from gpuagent.formats.plotting import require_plotting
from gpuagent.recommend.model import Recommendations

FORMATS = ("table", "json", "csv", "html")


def renderer(name: str) -> Callable[[Recommendations], str]:
    if name == "table":
        from gpuagent.recommend.formats.table import render_table

        return render_table
    if name == "json":
        from gpuagent.recommend.formats.json_doc import render_json

        return render_json
    if name == "csv":
        from gpuagent.recommend.formats.csv_rows import render_csv

        return render_csv
    if name == "html":
        require_plotting()
        from gpuagent.recommend.formats.html_page import render_html

        return render_html
    raise ValueError(f"unknown format {name!r} (one of {', '.join(FORMATS)})")
