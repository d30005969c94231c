"""The recommendations as one self-contained HTML page: summary cards, the recommendations with their
reasons, SM and memory distributions, GPU-hours before and after, the node pool's packing, every figure.

Plots are inline SVG (matplotlib); no external script, style sheet, font or image. Every figure cell
carries its full-precision value in ``data-value`` and its JSON name in ``data-figure``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.formats import page
from gpuagent.formats.numbers import NONE, money, quantity
from gpuagent.formats.page import escape as _e
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.recommend.formats.table import header_lines
from gpuagent.recommend.model import SECONDS_PER_HOUR, Recommendations, Row, gib_text, percent_text

_STYLE = """
td.reason { max-width: 620px; font-size: 12px; color: #34495e; }
span.action { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px;
              font-weight: 600; white-space: nowrap; }
.keep { background: #e6ebf0; } .release { background: #fde2c8; } .share, .mps, .mig { background: #d7efe0; }
.needs_more { background: #f8d3d3; } .insufficient_history { background: #f1f1f1; color: #5b6b7c; }
div.wide { overflow-x: auto; }
"""


def render_html(result: Recommendations) -> str:
    from gpuagent.recommend.formats import plots  # matplotlib: only this format needs it

    span = result.time_range
    _, *meta = header_lines(result)
    title = f"GPU right-sizing, {format_time(span.start_unix)} to {format_time(span.end_unix)}"
    parts = page.head(title, _STYLE)
    parts.append(f'<p class="meta">{_e(format_duration(span.seconds))} of history from '
                 f"{_e(result.prometheus_url)}</p>")
    parts += [f'<p class="meta">{_e(line)}</p>' for line in meta]
    parts += [f'<div class="warning">{_e(w)}</div>' for w in result.warnings]
    parts.append(_cards(result))

    parts.append('<h2 id="recommendations">Recommendations</h2>')
    parts.append(_recommendations(result))
    if result.rows:
        parts.append('<h2 id="distributions">SM use and memory</h2>')
        parts.append(page.plot("distributions", plots.distributions(result.rows)))
        parts.append('<h2 id="before-after">GPU-hours a week, now and recommended</h2>')
        parts.append(page.plot("before-after", plots.before_after(result.rows)))
    parts.append('<h2 id="pool">Node pool</h2>')
    if result.packing:
        parts.append(page.plot("pool", plots.pool_bars(result.packing)))
    parts.append(_pool(result))
    parts.append('<h2 id="figures">Every figure</h2>')
    parts.append(f'<div class="wide">{_figures(result.rows)}</div>')
    footer = (f"gpuagent recommend; {result.queries} queries. SM use: NVML's share of time kernels ran, of "
              "the workload's busiest device, while it ran processes; memory: of its fullest device; idle: "
              "allocated time under the agents' idle threshold; savings: allocated GPU-hours scaled to a "
              "week, at the recommended size; the pool: first-fit decreasing per GPU model.")
    return page.finish(parts, footer)


def _cards(result: Recommendations) -> str:
    totals = result.totals
    now = sum(p.gpus_now for p in result.packing)
    after = sum(p.gpus_after for p in result.packing)
    cards = [("workloads", str(totals.workloads)),
             ("GPU-hours a week now", quantity(totals.current_gpu_hours_week)),
             ("GPU-hours a week freed", quantity(totals.saved_gpu_hours_week)),
             ("GPUs now / after packing", f"{now} / {after}")]
    if result.has_cost:
        cards.append((f"cost freed a week {result.prices.currency}".strip(), money(totals.cost_saved_week)))
    return page.cards(cards)


def _cell(name: str, value: float | None, text: str) -> str:
    data = "" if value is None else f' data-value="{value!r}"'
    return f'<td class="num" data-figure="{name}"{data}>{_e(text)}</td>'


def _recommendations(result: Recommendations) -> str:
    cost = result.has_cost
    head = ["workload", "GPU model", "recommendation", "GPU-h/week now", "freed/week",
            *([f"cost freed {result.prices.currency}".strip()] if cost else []), "why"]
    if not result.rows:
        return '<table id="recommendations-table"><tr><td class="empty">none</td></tr></table>'
    lines = ['<table id="recommendations-table">',
             "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>", "<tbody>"]
    for row in result.rows:
        rec, saved = row.recommendation, row.savings
        cells = [f"<td>{_e(str(row.stats.key))}</td>", f"<td>{_e(row.stats.gpu_model or NONE)}</td>",
                 f'<td><span class="action {rec.action.value}" data-action="{rec.action.value}">'
                 f"{_e(rec.short)}</span></td>",
                 *_saved(saved.current_gpu_hours_week, saved.saved_gpu_hours_week, saved.cost_saved_week,
                         cost),
                 f'<td class="reason">{_e(rec.reason)}</td>']
        lines.append("<tr>" + "".join(cells) + "</tr>")
    totals = result.totals
    saved_total = _saved(totals.current_gpu_hours_week, totals.saved_gpu_hours_week, totals.cost_saved_week,
                         cost)
    lines += ["</tbody>", '<tfoot><tr class="total"><td>total</td><td></td><td></td>' + "".join(saved_total)
              + "<td></td></tr></tfoot>", "</table>"]
    return "\n".join(lines)


def _saved(current: float, saved: float, cost: float | None, priced: bool) -> list[str]:
    cells = [_cell("current_gpu_hours_week", current, quantity(current)),
             _cell("saved_gpu_hours_week", saved, quantity(saved))]
    return cells + ([_cell("cost_saved_week", cost, money(cost))] if priced else [])


def _pool(result: Recommendations) -> str:
    head = ["GPU model", "GPUs now", "after", "whole", "time-sliced", "MPS", "MIG", "released devices"]
    rows = "".join(
        f"<tr><td>{_e(p.gpu_model)}</td>"
        + "".join(_cell(n, float(v), str(v)) for n, v in (
            ("gpus_now", p.gpus_now), ("gpus_after", p.gpus_after), ("whole", p.whole), ("shared", p.shared),
            ("mps", p.mps), ("mig", p.mig), ("released_devices", p.released)))
        + "</tr>" for p in result.packing)
    if not rows:
        rows = f'<tr><td class="empty" colspan="{len(head)}">none</td></tr>'
    return (f'<table id="pool-table"><thead><tr>{"".join(f"<th>{_e(h)}</th>" for h in head)}</tr></thead>'
            f"<tbody>{rows}</tbody></table>")


def _figures(rows: Sequence[Row]) -> str:
    head = ["workload", "pods", "GPUs held", "devices", "days", "hours seen", "SM p50", "SM p95", "SM p99",
            "SM max", "SM samples", "mem p50", "mem p99", "mem peak", "mem all GPUs", "mem limit", "idle",
            "throttled", "ladder stops", "GPU-h allocated", "stray GPUs"]
    lines = ['<table id="figures-table">',
             "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>", "<tbody>"]
    for row in rows:
        stats = row.stats
        sm, memory = stats.sm, stats.memory
        cells = [f"<td>{_e(str(stats.key))}</td>",
                 _cell("pods", float(len(stats.pods)), str(len(stats.pods))),
                 _cell("gpus_held", stats.gpus_held, f"{stats.gpus_held:g}"),
                 _cell("devices", float(stats.devices), str(stats.devices)),
                 _cell("days_seen", float(stats.days_seen), str(stats.days_seen)),
                 _cell("seen_hours", stats.seen_seconds / SECONDS_PER_HOUR,
                       quantity(stats.seen_seconds / SECONDS_PER_HOUR))]
        for name in ("p50", "p95", "p99", "max"):
            value = getattr(sm, name) if sm else None
            cells.append(_cell(f"sm_{name}", value, percent_text(value)))
        cells.append(_cell("sm_samples", float(sm.samples) if sm else None, str(sm.samples) if sm else NONE))
        for name in ("p50", "p99", "max"):
            value = getattr(memory, name) if memory else None
            cells.append(_cell(f"memory_{name}", value, gib_text(value)))
        all_gpus = stats.memory_all_gpus_bytes
        cells += [_cell("memory_all_gpus_bytes", all_gpus, gib_text(all_gpus)),
                  _cell("memory_limit_bytes", stats.memory_limit_bytes, gib_text(stats.memory_limit_bytes)),
                  _cell("idle_ratio", stats.idle_ratio, percent_text(stats.idle_ratio)),
                  _cell("throttled_ratio", stats.throttled_ratio, percent_text(stats.throttled_ratio)),
                  _cell("memory_ladder_restarts", float(stats.ladder_restarts), str(stats.ladder_restarts)),
                  _cell("allocated_gpu_hours", stats.allocated_gpu_seconds / SECONDS_PER_HOUR,
                        quantity(stats.allocated_gpu_seconds / SECONDS_PER_HOUR)),
                  _cell("strays_gpus", float(stats.strays.gpus if stats.strays else 0),
                        str(stats.strays.gpus) if stats.strays else NONE)]
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)
