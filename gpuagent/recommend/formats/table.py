"""The recommendations as terminal text: a header, one line per workload, the reasons in words, the totals
and the node pool's packing."""

from __future__ import annotations

from gpuagent.formats.layout import render_columns
from gpuagent.formats.numbers import NONE, money, quantity
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.recommend.model import Recommendations, Row, gib_text, percent_text
from gpuagent.untrusted import shown


def render_table(result: Recommendations) -> str:
    lines = header_lines(result)
    cost = result.has_cost
    currency = f" {result.prices.currency}" if result.prices.currency else ""
    head = ["WORKLOAD", "GPU MODEL", "GPUS", "DAYS", "SM p50", "SM p99", "SM MAX", "MEM PEAK", "IDLE",
            "RECOMMENDATION", "GPU-h/WEEK", "SAVED/WEEK", *([f"COST SAVED{currency}"] if cost else [])]
    body = [_cells(row, cost) for row in result.rows]
    totals = result.totals
    footer = ["TOTAL", f"{totals.workloads} workloads", "", "", "", "", "", "", "", "",
              quantity(totals.current_gpu_hours_week), quantity(totals.saved_gpu_hours_week),
              *([money(totals.cost_saved_week)] if cost else [])]
    lines += ["", *render_columns(head, body, footer if result.rows else None, left=2)]
    if result.rows:
        lines += ["", "Why:"]
        lines += [f"  {row.stats.key}: {row.recommendation.reason}" for row in result.rows]
    if result.packing:
        lines += ["", "Node pool, GPUs now and for the recommended packing (first-fit decreasing):"]
        lines += render_columns(
            ["GPU MODEL", "", "NOW", "AFTER", "WHOLE", "TIME-SLICED", "MPS", "MIG", "RELEASED DEVICES"],
            [[p.gpu_model, "", str(p.gpus_now), str(p.gpus_after), str(p.whole), str(p.shared), str(p.mps),
              str(p.mig), str(p.released)] for p in result.packing])
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(map(shown, lines)) + "\n"  # the reasons, the header and the warnings carry names


def header_lines(result: Recommendations) -> list[str]:
    span, options = result.time_range, result.options
    lines = [f"GPU right-sizing {format_time(span.start_unix)} .. {format_time(span.end_unix)} "
             f"({format_duration(span.seconds)}) from {result.prometheus_url}",
             f"sampled every {format_duration(result.step_seconds)}; sized for p{options.percentile:g} SM "
             f"and the memory peak, +{percent_text(options.headroom)} headroom; sharing {options.sharing}; "
             f"GPU-hours scaled to a week"]
    if result.selector:
        lines.append(f"series: {{{result.selector}}}")
    return lines


def _cells(row: Row, cost: bool) -> list[str]:
    stats, saved = row.stats, row.savings
    sm = stats.sm
    return [
        str(stats.key), stats.gpu_model or NONE, f"{stats.gpus_held:g}", str(stats.days_seen),
        percent_text(sm.p50) if sm else NONE, percent_text(sm.p99) if sm else NONE,
        percent_text(sm.max) if sm else NONE, gib_text(stats.memory.max if stats.memory else None),
        percent_text(stats.idle_ratio), row.recommendation.short,
        quantity(saved.current_gpu_hours_week), quantity(saved.saved_gpu_hours_week),
        *([money(saved.cost_saved_week)] if cost else []),
    ]
