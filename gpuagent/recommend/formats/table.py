"""The recommendations as terminal text: a header, one line per workload, the reasons in words, the totals
and the node pool's packing.

Every figure adds up on the table or says there why not (issue 30 item 3): the TOTAL line adds the rows; a
STRAY column counts the GPUs a workload used without being allocated them, and a section under the reasons
says what it did there, since that use is left out of its figures; under the packing, where NOW comes
from (the GPUS column added, rounded up) and why the GPU-hours saved and the GPUs freed differ."""

from __future__ import annotations

from gpuagent.formats.layout import render_columns
from gpuagent.formats.numbers import NONE, money, quantity
from gpuagent.prom.timerange import format_duration, format_time
from gpuagent.recommend.model import (
    SECONDS_PER_HOUR,
    SECONDS_PER_WEEK,
    Recommendations,
    Row,
    gib_text,
    percent_text,
)
from gpuagent.untrusted import shown

HOURS_PER_WEEK = SECONDS_PER_WEEK / SECONDS_PER_HOUR


def render_table(result: Recommendations) -> str:
    lines = header_lines(result)
    cost = result.has_cost
    currency = f" {result.prices.currency}" if result.prices.currency else ""
    head = ["WORKLOAD", "GPU MODEL", "GPUS", "DAYS", "SM p50", "SM p99", "SM MAX", "MEM PEAK", "IDLE",
            "STRAY", "RECOMMENDATION", "GPU-h/WEEK", "SAVED/WEEK",
            *([f"COST SAVED{currency}"] if cost else [])]
    body = [_cells(row, cost) for row in result.rows]
    totals = result.totals
    footer = ["TOTAL", f"{totals.workloads} workloads", "", "", "", "", "", "", "", "", "",
              quantity(totals.current_gpu_hours_week), quantity(totals.saved_gpu_hours_week),
              *([money(totals.cost_saved_week)] if cost else [])]
    lines += ["", *render_columns(head, body, footer if result.rows else None, left=2)]
    if result.rows:
        lines += ["  GPU-h/WEEK: the GPU-hours allocated over the range, scaled to a week (GPUS x 168 for a "
                  "workload that held them all along, less for one seen less)"]
        lines += ["", "Why:"]
        lines += [f"  {row.stats.key}: {row.recommendation.reason}" for row in result.rows]
        lines += stray_lines(result)
    if result.packing:
        lines += ["", "Node pool, GPUs now and for the recommended packing (first-fit decreasing):"]
        lines += render_columns(
            ["GPU MODEL", "", "NOW", "AFTER", "WHOLE", "TIME-SLICED", "MPS", "MIG", "RELEASED DEVICES"],
            [[p.gpu_model, "", str(p.gpus_now), str(p.gpus_after), str(p.whole), str(p.shared), str(p.mps),
              str(p.mig), str(p.released)] for p in result.packing])
        lines += packing_notes(result)
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(map(shown, lines)) + "\n"  # the reasons, the header and the warnings carry names


def stray_lines(result: Recommendations) -> list[str]:
    """What each workload did on GPUs it was not allocated: left out of the figures above, said here."""
    lines = []
    for row in result.rows:
        strays = row.stats.strays
        if strays is None:
            continue
        busy = strays.busy_gpu_seconds
        lines.append(f"  {row.stats.key}: {strays.gpus} GPU(s), SM peak {percent_text(strays.sm_peak)}, "
                     f"memory peak {gib_text(strays.memory_peak_bytes)}, "
                     f"{quantity(None if busy is None else busy / SECONDS_PER_HOUR)} GPU-hours busy")
    if not lines:
        return []
    return ["", "Strays (STRAY): GPUs a workload's pods used without being allocated them. Left out of its "
                "SM, memory and GPU-hours above and of its size; their memory still counts toward its "
                "gpu-memory limit, as the memory ladder counts it:", *lines]


def packing_notes(result: Recommendations) -> list[str]:
    """Where NOW comes from, what AFTER adds, and why the GPUs freed are not the GPU-hours saved."""
    notes = ["  NOW: the workloads' GPUS added per model, rounded up; AFTER: WHOLE + TIME-SLICED + MPS + MIG "
             "(released workloads take a GPU only while they work)"]
    for pool in result.packing:
        rows = [r for r in result.rows
                if (r.stats.gpu_model or "unknown") == pool.gpu_model and r.stats.devices]
        held = sum(r.stats.gpus_held for r in rows)
        saved = sum(r.savings.saved_gpu_hours_week for r in rows)
        notes.append(f"  {pool.gpu_model}: GPUS add up to {held:.3g} (NOW {pool.gpus_now}); SAVED/WEEK "
                     f"{quantity(saved)} GPU-hours is {saved / HOURS_PER_WEEK:.3g} GPUs over a week, the "
                     f"packing frees {pool.gpus_now - pool.gpus_after} whole GPU(s)")
    return notes


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
        percent_text(stats.idle_ratio), str(stats.strays.gpus) if stats.strays else NONE,
        row.recommendation.short,
        quantity(saved.current_gpu_hours_week), quantity(saved.saved_gpu_hours_week),
        *([money(saved.cost_saved_week)] if cost else []),
    ]
