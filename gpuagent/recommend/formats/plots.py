"""The recommendation page's plots, drawn with matplotlib and returned as inline SVG text (``svgplot``)."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from gpuagent.formats.svgplot import MAX_BARS, WIDTH_INCHES, styled, svg, tidy
from gpuagent.recommend.model import GIB, Action, PoolPacking, Row

NOW_COLOR = "#5b6b7c"
AFTER_COLOR = "#2e8b57"
RANGE_COLOR = "#4c78a8"
PEAK_COLOR = "#1f2d3d"
SIZE_COLOR = "#e8913a"
KIND_COLORS = {"whole": "#9aa9bc", "time-sliced": "#2e8b57", "MPS": "#4c78a8", "MIG": "#c9a227"}


def _shown(rows: Sequence[Row]) -> list[Row]:
    """The workloads with the most GPU-hours, the largest at the top."""
    return sorted(rows, key=lambda r: -r.savings.current_gpu_hours_week)[:MAX_BARS][::-1]


@styled("distributions")
def distributions(rows: Sequence[Row]) -> str:
    """Per workload: SM use p50 to p99 (bar) and to its peak (line), and memory the same, with the size
    recommended (orange tick: the share, MPS threads or MIG compute; the memory set or held)."""
    shown = [r for r in _shown(rows) if r.stats.sm is not None or r.stats.memory is not None]
    height = max(2.2, 0.42 * len(shown) + 1.3)
    figure = Figure(figsize=(WIDTH_INCHES, height), layout="constrained")
    sm_axes, memory_axes = figure.subplots(1, 2, sharey=True)
    ys = list(range(len(shown)))
    for y, row in zip(ys, shown, strict=True):
        stats, rec = row.stats, row.recommendation
        if stats.sm is not None:
            sm = stats.sm
            sm_axes.plot([sm.p50, sm.max], [y, y], color=PEAK_COLOR, linewidth=1)
            sm_axes.barh(y, sm.p99 - sm.p50, left=sm.p50, height=0.5, color=RANGE_COLOR)
            sm_axes.plot([sm.max], [y], marker="|", markersize=12, color=PEAK_COLOR)
        if rec.size is not None and rec.action is not Action.RELEASE:
            sm_axes.plot([min(1.0, rec.size)], [y], marker="|", markersize=16, markeredgewidth=2.5,
                         color=SIZE_COLOR)
        if stats.memory is not None:
            memory = stats.memory
            memory_axes.plot([memory.p50 / GIB, memory.max / GIB], [y, y], color=PEAK_COLOR, linewidth=1)
            memory_axes.barh(y, (memory.p99 - memory.p50) / GIB, left=memory.p50 / GIB, height=0.5,
                             color=RANGE_COLOR)
            memory_axes.plot([memory.max / GIB], [y], marker="|", markersize=12, color=PEAK_COLOR)
        limit = rec.memory_bytes or (stats.memory_capacity_bytes if rec.action is Action.KEEP else None)
        if limit:
            memory_axes.plot([limit / GIB], [y], marker="|", markersize=16, markeredgewidth=2.5,
                             color=SIZE_COLOR)
    sm_axes.set_yticks(ys, [str(r.stats.key) for r in shown])
    sm_axes.set_xlim(0, 1.05)
    sm_axes.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    sm_axes.set_title("SM use of its busiest device", loc="left", fontsize=11)
    sm_axes.set_xlabel("p50 to p99 (bar), to the peak (line); orange: the size recommended")
    memory_axes.set_xlim(left=0)
    memory_axes.set_title("GPU memory of its fullest device, GiB", loc="left", fontsize=11)
    memory_axes.set_xlabel("p50 to p99, to the peak; orange: what it gets")
    for axes in (sm_axes, memory_axes):
        tidy(axes, grid_axis="x")
    return svg(figure)


@styled("before-after")
def before_after(rows: Sequence[Row]) -> str:
    """GPU-hours a week per workload, now and after the recommendation."""
    shown = _shown(rows)
    figure = Figure(figsize=(WIDTH_INCHES, max(2.2, 0.42 * len(shown) + 1.2)), layout="constrained")
    axes = figure.subplots()
    ys = list(range(len(shown)))
    bar = 0.38
    axes.barh([y + bar / 2 for y in ys], [r.savings.current_gpu_hours_week for r in shown], height=bar,
              color=NOW_COLOR, label="now")
    axes.barh([y - bar / 2 for y in ys], [r.savings.recommended_gpu_hours_week for r in shown], height=bar,
              color=AFTER_COLOR, label="recommended")
    axes.set_yticks(ys, [f"{r.stats.key}  [{r.recommendation.short}]" for r in shown])
    axes.set_xlabel("GPU-hours a week")
    axes.legend(loc="lower right", frameon=False)
    tidy(axes, grid_axis="x")
    return svg(figure)


@styled("pool")
def pool_bars(packing: Sequence[PoolPacking]) -> str:
    """GPUs per model now, and after (stacked by how each GPU is used)."""
    figure = Figure(figsize=(WIDTH_INCHES, max(1.8, 0.9 * len(packing) + 1.0)), layout="constrained")
    axes = figure.subplots()
    ys = list(range(len(packing)))[::-1]
    bar = 0.36
    axes.barh([y + bar / 2 for y in ys], [p.gpus_now for p in packing], height=bar, color=NOW_COLOR,
              label="now")
    left = [0.0] * len(packing)
    for kind, counts in (("whole", [p.whole for p in packing]), ("time-sliced", [p.shared for p in packing]),
                         ("MPS", [p.mps for p in packing]), ("MIG", [p.mig for p in packing])):
        axes.barh([y - bar / 2 for y in ys], counts, left=left, height=bar, color=KIND_COLORS[kind],
                  label=f"after: {kind}", edgecolor="white", linewidth=0.6)
        left = [a + b for a, b in zip(left, counts, strict=True)]
    axes.set_yticks(ys, [p.gpu_model for p in packing])
    axes.set_xlabel("GPUs")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    tidy(axes, grid_axis="x")
    return svg(figure)
