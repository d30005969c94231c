"""The report page's plots, drawn with matplotlib and returned as inline SVG text (``svgplot``)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from gpuagent.formats.svgplot import (
    MAX_BARS,
    WIDTH_INCHES,
    nan_for_none,
    styled,
    svg,
    tidy,
    utc_times,
)
from gpuagent.report.model import NamespaceRow, PodRow, Timeline

ALLOCATED_COLOR = "#9aa9bc"
BUSY_COLOR = "#2e8b57"
IDLE_COLOR = "#e8913a"
ENERGY_COLOR = "#c9a227"
CLUSTER_COLOR = "#1f2d3d"
MAX_LINES = 8


@styled("namespaces")
def namespace_bars(rows: Sequence[NamespaceRow]) -> str:
    """GPU-hours allocated, busy and idle per namespace (grouped horizontal bars), and energy (kWh)."""
    shown = list(rows[:MAX_BARS])[::-1]  # most allocated at the top
    names = [r.namespace for r in shown]
    height = max(2.6, 0.5 * len(shown) + 1.4)
    figure = Figure(figsize=(WIDTH_INCHES, height), layout="constrained")
    hours, energy = figure.subplots(1, 2, width_ratios=[3, 1], sharey=True)
    ys = range(len(shown))
    bar = 0.27
    series = (("allocated", ALLOCATED_COLOR, [r.usage.allocated_gpu_hours for r in shown], bar),
              ("busy", BUSY_COLOR, [r.usage.busy_gpu_hours for r in shown], 0.0),
              ("idle", IDLE_COLOR, [r.usage.idle_gpu_hours for r in shown], -bar))
    for label, color, values, offset in series:
        hours.barh([y + offset for y in ys], [v or 0.0 for v in values], height=bar, color=color, label=label)
    hours.set_yticks(list(ys), names)
    hours.set_xlabel("GPU-hours")
    hours.set_title("GPU-hours per namespace", loc="left", fontsize=11)
    hours.legend(loc="lower right", frameon=False)
    energy.barh(list(ys), [r.usage.energy_kwh or 0.0 for r in shown], height=0.5, color=ENERGY_COLOR)
    energy.set_xlabel("kWh")
    energy.set_title("Energy", loc="left", fontsize=11)
    for axes in (hours, energy):
        tidy(axes, grid_axis="x")
    return svg(figure)


@styled("idle-pods")
def idle_pod_bars(rows: Sequence[PodRow]) -> str:
    """Idle GPU-hours of the pods with the most (horizontal bars)."""
    shown = list(rows[:MAX_BARS])[::-1]
    figure = Figure(figsize=(WIDTH_INCHES, max(1.5, 0.32 * len(shown) + 0.9)), layout="constrained")
    axes = figure.subplots()
    axes.barh(range(len(shown)), [r.usage.idle_gpu_hours or 0.0 for r in shown], height=0.6, color=IDLE_COLOR)
    axes.set_yticks(list(range(len(shown))), [f"{r.namespace}/{r.pod}" for r in shown])
    axes.set_xlabel("idle GPU-hours (allocated, under the idle threshold)")
    tidy(axes, grid_axis="x")
    return svg(figure)


@styled("efficiency")
def efficiency_lines(timeline: Timeline, namespaces: Sequence[str]) -> str:
    """Busy / allocated GPU-time per step: the cluster (thick) and the namespaces with the most allocated."""
    figure = Figure(figsize=(WIDTH_INCHES, 4.2), layout="constrained")
    axes = figure.subplots()
    shown = [ns for ns in namespaces if ns in timeline.namespaces][:MAX_LINES]
    for ns in shown:
        points = timeline.namespaces[ns]
        axes.plot(utc_times(p.time_unix for p in points), [nan_for_none(p.efficiency_ratio) for p in points],
                  linewidth=1.2, alpha=0.85, label=ns)
    points = timeline.cluster
    axes.plot(utc_times(p.time_unix for p in points), [nan_for_none(p.efficiency_ratio) for p in points],
              linewidth=2.6, color=CLUSTER_COLOR, label="all")
    # a replica holder can use more than its 1/N (the tables flag it): such a step is drawn, not clipped
    ratios = [p.efficiency_ratio for points in (timeline.cluster, *(timeline.namespaces[ns] for ns in shown))
              for p in points if p.efficiency_ratio is not None]
    axes.set_ylim(0, max([1.05, *(r * 1.05 for r in ratios)]))
    axes.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=datetime.timezone.utc))
    axes.set_ylabel("busy / allocated GPU-time")
    axes.set_xlabel("UTC")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    tidy(axes, grid_axis="y")
    return svg(figure)
