"""The parts of the commands' self-contained HTML pages: the style, the head, summary cards, plot boxes.

No external script, style sheet, font or image: a page can be mailed or archived as it is.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

STYLE = """
body { font-family: "DejaVu Sans", "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2d3d;
       margin: 24px 32px; background: #fff; max-width: 1280px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #dde3ea; padding-bottom: 4px; }
.meta { color: #5b6b7c; font-size: 13px; margin: 2px 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0 4px; }
.card { border: 1px solid #dde3ea; border-radius: 6px; padding: 10px 14px; min-width: 140px;
        background: #f8fafc; }
.card .value { font-size: 22px; font-weight: bold; }
.card .label { font-size: 12px; color: #5b6b7c; }
.plot svg { width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e6ebf0; }
th { background: #f1f4f8; text-align: left; font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; border-top: 2px solid #c3ccd6; }
.warning { background: #fff4e5; border-left: 4px solid #e8913a; padding: 6px 10px; margin: 6px 0;
           font-size: 13px; }
.empty { color: #5b6b7c; font-style: italic; }
footer { color: #8a96a3; font-size: 12px; margin-top: 28px; }
"""


def escape(text: str) -> str:
    return html.escape(text, quote=True)


def head(title: str, extra_style: str = "") -> list[str]:
    """The page up to and including its ``<h1>``."""
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(title)}</title>", f"<style>{STYLE}{extra_style}</style></head><body>",
            f"<h1>{escape(title)}</h1>"]


def cards(items: Sequence[tuple[str, str]], div_id: str = "summary") -> str:
    """Summary cards: (label, value) each."""
    body = "".join(f'<div class="card"><div class="value">{escape(v)}</div>'
                   f'<div class="label">{escape(k)}</div></div>' for k, v in items)
    return f'<div class="cards" id="{div_id}">{body}</div>'


def finish(parts: list[str], footer: str) -> str:
    """The whole page: ``parts`` (from :func:`head` on), the footer (text), the end."""
    return "\n".join([*parts, f"<footer>{escape(footer)}</footer>", "</body></html>"]) + "\n"


def plot(name: str, svg: str) -> str:
    return f'<div class="plot" id="plot-{name}">{svg}</div>'
