"""The report as CSV: one line per namespace, pod, other workload and the total, figures in full precision
(for spreadsheets and billing systems), and ``notes``: the codes (space-separated, ``model.NOTES``) of why a
line's efficiency is not its busy / allocated or is over 1. Names are label values any scrape target can
set: one that starts a formula is neutralised (``gpuagent.untrusted.csv_cell``); figures stay numbers."""

from __future__ import annotations

import csv
import io

from gpuagent.prom.timerange import format_time
from gpuagent.report.model import FIGURES, Report, Usage
from gpuagent.untrusted import csv_cell

COLUMNS = ("level", "namespace", "pod", "workload_kind", "workload", "start", "end", *FIGURES, "notes")


def render_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180: a CR in a name is quoted too
    writer.writerow(COLUMNS)
    start, end = format_time(report.time_range.start_unix), format_time(report.time_range.end_unix)

    def row(level: str, namespace: str, pod: str, kind: str, workload: str, usage: Usage) -> None:
        figures = usage.figures()
        writer.writerow([level, *map(csv_cell, (namespace, pod, kind, workload)), start, end,
                         *("" if figures[n] is None else repr(figures[n]) for n in FIGURES),
                         " ".join(usage.notes())])

    for ns in report.namespaces:
        row("namespace", ns.namespace, "", "", "", ns.usage)
    for pod in report.pods:
        row("pod", pod.namespace, pod.pod, "", "", pod.usage)
    for workload in report.workloads:
        row("workload", "", "", workload.workload_kind, workload.workload, workload.usage)
    row("total", "", "", "", "", report.total)
    return out.getvalue()

