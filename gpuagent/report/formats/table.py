"""The report as terminal text: a header, then namespaces, pods and other workloads, each with a total.

A row whose efficiency is not its busy / allocated, or is over 100 %, has it marked (``65.8% [1]``), and
its table's footnotes say why (``columns.footnotes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.formats.layout import render_columns
from gpuagent.formats.numbers import figure
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.report.formats.columns import describe_prices, figure_names, footnotes, note_marks, title
from gpuagent.report.model import Report, Usage, total_of
from gpuagent.untrusted import shown


def render_table(report: Report) -> str:
    names = figure_names(report)
    titles = [_upper(title(n, report)) for n in names]
    lines = header_lines(report)

    def cells(usage: Usage) -> list[str]:
        figures = usage.figures()
        marks = note_marks(usage)
        return [f"{figure(n, figures[n])} {marks}" if marks and n == "efficiency_ratio"
                else figure(n, figures[n]) for n in names]

    def table(header: list[str], rows: Sequence[tuple[list[str], Usage]],
              footer: tuple[list[str], Usage] | None = None) -> list[str]:
        shown_rows = [*rows, *([footer] if footer else [])]
        notes = [f"{mark} {text}" for mark, text in footnotes(usage for _, usage in shown_rows)]
        return ["", *render_columns([*header, *titles], [[*labels, *cells(usage)] for labels, usage in rows],
                                    [*footer[0], *cells(footer[1])] if footer else None), *notes]

    lines += table(["NAMESPACE", "PODS"],
                   [([row.namespace, str(row.pods)], row.usage) for row in report.namespaces],
                   (["TOTAL", str(len(report.pods))], total_of(r.usage for r in report.namespaces)))
    lines += table(["NAMESPACE", "POD"], [([row.namespace, row.pod], row.usage) for row in report.pods])
    if report.workloads:
        lines += table(["KIND", "WORKLOAD"], [([row.workload_kind, row.workload], row.usage)
                                              for row in report.workloads])
    lines += table(["", ""], [(["ALL", ""], report.total)])
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(map(shown, lines)) + "\n"  # names in the header and warnings too


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
