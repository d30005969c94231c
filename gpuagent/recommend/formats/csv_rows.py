"""The recommendations as CSV: one line per workload, figures in full precision (names as in the JSON
document, nested ones joined with ``_``). Text cells hold label values any scrape target can set: one that
starts a formula is neutralised (``gpuagent.untrusted.csv_cell``); figures stay numbers."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from gpuagent.prom.timerange import format_time
from gpuagent.recommend.formats.json_doc import recommendation_dict, savings_dict, stats_dict
from gpuagent.recommend.model import Recommendations
from gpuagent.untrusted import csv_cell

_LISTS = ("pods", "containers")
_MAPS = ("annotations", "env", "resources")


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict) and name not in _MAPS:
            out.update(_flat(f"{prefix}{name}_", value))
        else:
            out[prefix + name] = value
    return out


def render_csv(result: Recommendations) -> str:
    start, end = format_time(result.time_range.start_unix), format_time(result.time_range.end_unix)
    rows = []
    for row in result.rows:
        stats = {k: v for k, v in stats_dict(row.stats).items()}
        rows.append({"start": start, "end": end, **_flat("", stats),
                     **_flat("recommendation_", recommendation_dict(row.recommendation)),
                     **_flat("", savings_dict(row.savings))})
    columns: list[str] = []
    for line in rows:
        columns += [c for c in line if c not in columns]
    out = io.StringIO()
    # RFC 4180 CRLF: the writer then quotes a cell holding a lone CR (with "\n" a name could split a row)
    writer = csv.DictWriter(out, fieldnames=columns or ["start", "end", "workload"], lineterminator="\r\n")
    writer.writeheader()
    for line in rows:
        writer.writerow({c: _cell(c, v) for c, v in line.items()})
    return out.getvalue()


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in _LISTS:
        return csv_cell(" ".join(value))
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True) if value else ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return csv_cell(value)
    return str(value)  # an int or a bool
