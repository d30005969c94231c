"""The report as terminal text: a header, then namespaces, pods and other workloads, each with a total."""

from __future__ import annotations

from gpuagent.formats.layout import render_columns
from gpuagent.formats.numbers import figure
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.report.formats.columns import describe_prices, figure_names, title
from gpuagent.report.model import Report, Usage, total_of
from gpuagent.untrusted import shown


def render_table(report: Report) -> str:
    names = figure_names(report)
    titles = [_upper(title(n, report)) for n in names]
    lines = header_lines(report)

    def cells(usage: Usage) -> list[str]:
        figures = usage.figures()
        return [figure(n, figures[n]) for n in names]

    namespaces_total = total_of(r.usage for r in report.namespaces)
    lines += ["", *render_columns(["NAMESPACE", "PODS", *titles],
                                  [[row.namespace, str(row.pods), *cells(row.usage)]
                                   for row in report.namespaces],
                                  ["TOTAL", str(len(report.pods)), *cells(namespaces_total)])]
    lines += ["", *render_columns(["NAMESPACE", "POD", *titles],
                                  [[row.namespace, row.pod, *cells(row.usage)] for row in report.pods])]
    if report.workloads:
        lines += ["", *render_columns(["KIND", "WORKLOAD", *titles],
                                      [[row.workload_kind, row.workload, *cells(row.usage)]
                                       for row in report.workloads])]
    lines += ["", *render_columns(["", "", *titles], [["ALL", "", *cells(report.total)]])]
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
