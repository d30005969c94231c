"""The HTML page's plots, drawn with matplotlib (object API, no pyplot: no global backend or figure state)
and returned as inline SVG text (text kept as text, ids unique per plot)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ParamSpec

import matplotlib
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from gpuagent.report.model import NamespaceRow, PodRow, Timeline

ALLOCATED_COLOR = "#9aa9bc"
BUSY_COLOR = "#2e8b57"
IDLE_COLOR = "#e8913a"
ENERGY_COLOR = "#c9a227"
CLUSTER_COLOR = "#1f2d3d"
WIDTH_INCHES = 12.0
MAX_BARS = 15
MAX_LINES = 8

_PROLOG_RE = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA_RE = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_P = ParamSpec("_P")


def _styled(name: str) -> Callable[[Callable[_P, str]], Callable[_P, str]]:
    """Draw the plot inside :func:`_style` (defined below)."""
    def wrap(draw: Callable[_P, str]) -> Callable[_P, str]:
        @functools.wraps(draw)
        def styled(*args: _P.args, **kwargs: _P.kwargs) -> str:
            with _style(name):
                return draw(*args, **kwargs)
        return styled
    return wrap


@_styled("namespaces")
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
        _tidy(axes, grid_axis="x")
    return _svg(figure)


@_styled("idle-pods")
def idle_pod_bars(rows: Sequence[PodRow]) -> str:
    """Idle GPU-hours of the pods with the most (horizontal bars)."""
    shown = list(rows[:MAX_BARS])[::-1]
    figure = Figure(figsize=(WIDTH_INCHES, max(1.5, 0.32 * len(shown) + 0.9)), layout="constrained")
    axes = figure.subplots()
    axes.barh(range(len(shown)), [r.usage.idle_gpu_hours or 0.0 for r in shown], height=0.6, color=IDLE_COLOR)
    axes.set_yticks(list(range(len(shown))), [f"{r.namespace}/{r.pod}" for r in shown])
    axes.set_xlabel("idle GPU-hours (allocated, under the idle threshold)")
    _tidy(axes, grid_axis="x")
    return _svg(figure)


@_styled("efficiency")
def efficiency_lines(timeline: Timeline, namespaces: Sequence[str]) -> str:
    """Busy / allocated GPU-time per step: the cluster (thick) and the namespaces with the most allocated."""
    figure = Figure(figsize=(WIDTH_INCHES, 4.2), layout="constrained")
    axes = figure.subplots()
    shown = [ns for ns in namespaces if ns in timeline.namespaces][:MAX_LINES]
    for ns in shown:
        points = timeline.namespaces[ns]
        axes.plot(_times(p.time_unix for p in points), [_ratio(p.efficiency_ratio) for p in points],
                  linewidth=1.2, alpha=0.85, label=ns)
    points = timeline.cluster
    axes.plot(_times(p.time_unix for p in points), [_ratio(p.efficiency_ratio) for p in points],
              linewidth=2.6, color=CLUSTER_COLOR, label="all")
    axes.set_ylim(0, 1.05)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=datetime.timezone.utc))
    axes.set_ylabel("busy / allocated GPU-time")
    axes.set_xlabel("UTC")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    _tidy(axes, grid_axis="y")
    return _svg(figure)


def _times(unix: Iterable[float]) -> list[datetime.datetime]:
    return [datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc) for t in unix]


def _ratio(value: float | None) -> float:
    return math.nan if value is None else value


def _tidy(axes: Axes, grid_axis: str) -> None:
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis=grid_axis, color="#e3e7ec", linewidth=0.8)
    axes.set_axisbelow(True)


@contextlib.contextmanager
def _style(name: str) -> Iterator[None]:
    """The look of every plot (fonts are fixed when text is made, so the whole drawing runs inside), and
    for SVG: text as text, ids salted by ``name`` so several plots on one page share no clip-path id."""
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"gpuagent-report-{name}",
                                "font.family": "DejaVu Sans", "font.size": 10, "axes.edgecolor": "#8a96a3",
                                "axes.titleweight": "bold"}):
        yield


def _svg(figure: Figure) -> str:
    """The figure as an ``<svg>`` element, without the XML prolog and the RDF metadata (call inside
    :func:`_style`)."""
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    return _METADATA_RE.sub("", _PROLOG_RE.sub("", out.getvalue(), count=1), count=1).strip()
