"""The report as terminal text: a header, then namespaces, pods and other workloads, each with a total."""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.report.formats.columns import describe_prices, figure_names, title
from gpuagent.report.formats.numbers import figure
from gpuagent.report.model import Report, Usage, total_of
from gpuagent.report.timerange import format_duration, format_time


def render_table(report: Report) -> str:
    names = figure_names(report)
    titles = [_upper(title(n, report)) for n in names]
    lines = header_lines(report)

    def cells(usage: Usage) -> list[str]:
        figures = usage.figures()
        return [figure(n, figures[n]) for n in names]

    namespaces_total = total_of(r.usage for r in report.namespaces)
    lines += ["", *_render(["NAMESPACE", "PODS", *titles],
                           [[row.namespace, str(row.pods), *cells(row.usage)] for row in report.namespaces],
                           ["TOTAL", str(len(report.pods)), *cells(namespaces_total)])]
    lines += ["", *_render(["NAMESPACE", "POD", *titles],
                           [[row.namespace, row.pod, *cells(row.usage)] for row in report.pods])]
    if report.workloads:
        lines += ["", *_render(["KIND", "WORKLOAD", *titles],
                               [[row.workload_kind, row.workload, *cells(row.usage)]
                                for row in report.workloads])]
    lines += ["", *_render(["", "", *titles], [["ALL", "", *cells(report.total)]])]
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def _upper(text: str) -> str:
    """A column title in capitals, units kept as written (GPU-h, GiB-h, kWh)."""
    return " ".join(word if any(c.isupper() for c in word) else word.upper() for word in text.split())


def header_lines(report: Report) -> list[str]:
    span = report.time_range
    lines = [f"GPU accounting {format_time(span.start_unix)} .. {format_time(span.end_unix)} "
             f"({format_duration(span.seconds)}) from {report.prometheus_url}"]
    if report.selector:
        lines.append(f"series: {{{report.selector}}}")
    if report.has_cost:
        lines.append(f"prices: {describe_prices(report)}")
    return lines




def _render(header: Sequence[str], rows: Sequence[Sequence[str]],
            footer: Sequence[str] | None = None) -> list[str]:
    """Columns padded to their widest cell: text columns (the first two) left, figures right."""
    body = [list(header), *map(list, rows)] + ([list(footer)] if footer else [])
    if not rows:
        body.insert(1, ["(none)"] + [""] * (len(header) - 1))
    widths = [max(len(row[i]) for row in body) for i in range(len(header))]
    out = []
    for row in body:
        out.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    return out
