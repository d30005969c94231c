"""The report as one self-contained HTML page: summary, plots (inline SVG, drawn by matplotlib) and tables.

No external script, style sheet, font or image: the page can be mailed or archived as it is. Every figure
cell carries its full-precision value in ``data-value`` (the text is rounded for reading). An efficiency
that is not its row's busy / allocated, or is over 100 %, carries the marks of its reasons, which the notes
under its table (or the summary) state, as the terminal table does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuagent.formats import page
from gpuagent.formats.numbers import figure, money, percent, quantity
from gpuagent.formats.page import escape as _e
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.report.formats.columns import describe_prices, figure_names, footnotes, note_marks, title
from gpuagent.report.model import Report, Usage, total_of


def render_html(report: Report) -> str:
    from gpuagent.report.formats import plots  # matplotlib: only this format needs it

    span = report.time_range
    heading = f"GPU accounting, {format_time(span.start_unix)} to {format_time(span.end_unix)}"
    parts = [
        *page.head(heading),
        f'<p class="meta">{_e(format_duration(span.seconds))} of accounting counters from '
        f"{_e(report.prometheus_url)}{_e(f', series {{{report.selector}}}' if report.selector else '')}; "
        f"efficiency timeline every {_e(format_duration(report.timeline.step_seconds))}</p>",
        *([f'<p class="meta">totals include {len(report.workloads)} workload(s) outside Kubernetes '
           f"(see Other workloads)</p>"] if report.workloads else []),
    ]
    if report.has_cost:
        parts.append(f'<p class="meta">prices: {_e(describe_prices(report))}</p>')
    parts += [f'<div class="warning">{_e(w)}</div>' for w in report.warnings]
    parts.append(_cards(report))

    parts.append('<h2 id="namespaces">Namespaces</h2>')
    if report.namespaces:
        parts.append(page.plot("namespaces", plots.namespace_bars(report.namespaces)))
    parts.append(_table(report, "namespaces-table", ["namespace", "pods"],
                        [([r.namespace, str(r.pods)], r.usage) for r in report.namespaces],
                        (["total", str(len(report.pods))], total_of(r.usage for r in report.namespaces))))

    parts.append('<h2 id="efficiency">Efficiency over time</h2>')
    if report.timeline.cluster:
        names = [r.namespace for r in report.namespaces]
        parts.append(page.plot("efficiency", plots.efficiency_lines(report.timeline, names)))
    else:
        parts.append('<p class="empty">No timeline points in this range.</p>')

    idle = report.top_idle_pods()
    parts.append('<h2 id="idle">Top idle pods</h2>')
    if idle:
        parts.append(page.plot("idle", plots.idle_pod_bars(idle)))
    parts.append(_table(report, "idle-table", ["namespace", "pod"],
                        [([r.namespace, r.pod], r.usage) for r in idle]))

    parts.append('<h2 id="pods">Pods</h2>')
    parts.append(_table(report, "pods-table", ["namespace", "pod", "GPU models"],
                        [([r.namespace, r.pod, ", ".join(r.gpu_models)], r.usage) for r in report.pods]))
    if report.workloads:
        parts.append('<h2 id="workloads">Other workloads</h2>')
        parts.append(_table(report, "workloads-table", ["kind", "workload", "GPU models"],
                            [([r.workload_kind, r.workload, ", ".join(r.gpu_models)], r.usage)
                             for r in report.workloads]))
    footer = (f"gpuagent report; {report.queries} queries. GPU-hours allocated: time GPUs were allocated "
              "to the pod; busy: time they ran its kernels; idle: allocated time under the agent's idle "
              "threshold; efficiency: busy on the GPUs allocated / allocated (where that is not the "
              "columns' ratio, or is over 100 %, a mark and the notes under the table say why).")
    return page.finish(parts, footer)


def _cards(report: Report) -> str:
    total = report.total
    cards = [("GPU-hours allocated", quantity(total.allocated_gpu_hours)),
             ("GPU-hours busy", quantity(total.busy_gpu_hours)),
             *([("GPU-hours busy elsewhere", quantity(total.busy_elsewhere_gpu_hours))]
               if report.has_busy_elsewhere else []),
             ("efficiency", " ".join(filter(None, (percent(total.efficiency_ratio), note_marks(total))))),
             ("idle GPU-hours", quantity(total.idle_gpu_hours)),
             ("energy kWh", quantity(total.energy_kwh))]
    if report.has_cost:
        cards.append((f"cost {report.prices.currency}".strip(), money(total.cost)))
    return page.cards(cards) + _notes([total])


def _notes(usages: Iterable[Usage]) -> str:
    """The reasons the rows give, one line each, under their table (or the summary); "" when none."""
    return "".join(f'<p class="meta note">{_e(mark)} {_e(text)}</p>' for mark, text in footnotes(usages))


def _table(report: Report, table_id: str, keys: Sequence[str], rows: Sequence[tuple[Sequence[str], Usage]],
           total: tuple[Sequence[str], Usage] | None = None) -> str:
    names = figure_names(report)
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    head += "".join(f'<th class="num">{_e(title(n, report))}</th>' for n in names)
    if not rows:
        span = len(keys) + len(names)
        return (f'<table id="{table_id}"><tr>{head}</tr>'
                f'<tr><td class="empty" colspan="{span}">none</td></tr></table>')
    lines = [f'<table id="{table_id}">', f"<thead><tr>{head}</tr></thead>", "<tbody>"]
    for labels, usage in rows:
        lines.append(f"<tr>{_row(labels, usage, names)}</tr>")
    lines.append("</tbody>")
    if total is not None:
        lines.append(f'<tfoot><tr class="total">{_row(total[0], total[1], names)}</tr></tfoot>')
    lines.append("</table>")
    lines.append(_notes([*(usage for _, usage in rows), *([total[1]] if total is not None else [])]))
    return "\n".join(lines)


def _row(labels: Sequence[str], usage: Usage, names: Sequence[str]) -> str:
    figures = usage.figures()
    cells = "".join(f"<td>{_e(label)}</td>" for label in labels)
    for name in names:
        value = figures[name]
        data = "" if value is None else f' data-value="{value!r}"'
        marks = note_marks(usage) if name == "efficiency_ratio" else ""
        mark = f' <sup class="note">{_e(marks)}</sup>' if marks else ""
        cells += f'<td class="num" data-figure="{name}"{data}>{_e(figure(name, value))}{mark}</td>'
    return cells
