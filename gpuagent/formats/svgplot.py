"""How the commands' HTML pages draw with matplotlib (object API, no pyplot: no global backend or figure
state): one look for every plot, and the figure as inline SVG text (text kept as text, ids unique per
plot)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import ParamSpec

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

WIDTH_INCHES = 12.0
MAX_BARS = 15

_PROLOG_RE = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA_RE = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_P = ParamSpec("_P")


def styled(name: str) -> Callable[[Callable[_P, str]], Callable[_P, str]]:
    """Draw the plot inside :func:`style` (its ids salted by ``name``, unique on the page)."""
    def wrap(draw: Callable[_P, str]) -> Callable[_P, str]:
        @functools.wraps(draw)
        def drawn(*args: _P.args, **kwargs: _P.kwargs) -> str:
            with style(name):
                return draw(*args, **kwargs)
        return drawn
    return wrap


@contextlib.contextmanager
def style(name: str) -> Iterator[None]:
    """The look of every plot (fonts are fixed when text is made, so the whole drawing runs inside), and
    for SVG: text as text, ids salted by ``name`` so several plots on one page share no clip-path id."""
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"gpuagent-report-{name}",
                                "font.family": "DejaVu Sans", "font.size": 10, "axes.edgecolor": "#8a96a3",
                                "axes.titleweight": "bold"}), warnings.catch_warnings():
        # Text stays text in the SVG, drawn by the reader's browser with its own fonts: a glyph DejaVu Sans
        # lacks (CJK or an emoji in a pod's name) shows on the page, and matplotlib's "Glyph ... missing"
        # warning, one per character and plot, is noise on the user's terminal.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)
        yield


def svg(figure: Figure) -> str:
    """The figure as an ``<svg>`` element, without the XML prolog and the RDF metadata (call inside
    :func:`style`)."""
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    return _METADATA_RE.sub("", _PROLOG_RE.sub("", out.getvalue(), count=1), count=1).strip()


def tidy(axes: Axes, grid_axis: str) -> None:
    """No top and right spines; a light grid behind the data along ``grid_axis``."""
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis=grid_axis, color="#e3e7ec", linewidth=0.8)
    axes.set_axisbelow(True)


def utc_times(unix: Iterable[float]) -> list[datetime.datetime]:
    return [datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc) for t in unix]


def nan_for_none(value: float | None) -> float:
    """A gap in a line where a value is unknown."""
    return math.nan if value is None else value
