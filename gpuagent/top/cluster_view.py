"""The cluster view as lines of Rich text: one line per node, sorted by any column.

Like the node view's renderer: words for every state (``NO ANSWER``, ``STALE``, ``lost 1``), "-" for a
figure a node did not give, so a node that does not answer never reads as an idle one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.text import Text

from gpuagent.top.arrange import next_sort, sort_known_last, sorted_by
from gpuagent.top.client import OK
from gpuagent.top.cluster import CLUSTER_COLUMNS, NodeRow
from gpuagent.top.render import (
    ALARM,
    BAD,
    DIM,
    GOOD,
    TITLE,
    WARN,
    Line,
    cell,
    duration,
    percent,
    right_aligned,
    view_state,
)
from gpuagent.untrusted import shown

NODE_MIN, NODE_MAX = 16, 30
_BY_KEY = {c.key: c for c in CLUSTER_COLUMNS}


@dataclass(frozen=True)
class ClusterOptions:
    sort: str = "node"
    descending: bool = False
    text: str = ""

    def sorted_by(self, key: str) -> ClusterOptions:
        sort, descending = sorted_by(CLUSTER_COLUMNS, self.sort, self.descending, key)
        return replace(self, sort=sort, descending=descending)

    def next_sort(self, step: int = 1) -> ClusterOptions:
        sort, descending = next_sort(CLUSTER_COLUMNS, self.sort, step)
        return replace(self, sort=sort, descending=descending)


def arrange_nodes(rows: Sequence[NodeRow], options: ClusterOptions) -> list[NodeRow]:
    """Filtered by text (node name), sorted by the column; unknown values last; ties by node name."""
    text = options.text.strip().lower()
    column = _BY_KEY.get(options.sort, _BY_KEY["node"])
    kept = [r for r in rows if text in r.node.lower()]
    return sort_known_last(kept, column.value, options.descending, lambda r: r.node)


def node_width(width: int) -> int:
    """The node column: what the others leave, at most NODE_MAX (the rest of the line says why a node is
    not fresh)."""
    return max(NODE_MIN, min(NODE_MAX, width - sum(c.width + 1 for c in CLUSTER_COLUMNS if c.width) - 2))


def cluster_header(source: str, rows: Sequence[NodeRow], error: str | None, options: ClusterOptions,
                   width: int, clock: str, *, paused: bool = False) -> list[Line]:
    gpus = sum(r.gpus or 0 for r in rows)
    free = sum(r.free or 0 for r in rows)
    idle = sum(r.idle_held or 0.0 for r in rows)
    bad = sum(1 for r in rows if r.state != OK)
    first = Text.assemble(("cluster", TITLE), shown(f"  {len(rows)} nodes from {source}  ·  {gpus} GPUs, "
                                                    f"{free} free, {idle:.1f} idle-held"))
    if bad:
        first.append(f"  ·  {bad} not fresh", style=WARN)
    lines = [Line(right_aligned(first, Text(clock), width))]
    title = next(c.title for c in CLUSTER_COLUMNS if c.key == options.sort)
    state = view_state(title, options.descending, options.text, paused)
    second = (Text(shown(f" NO ANSWER: {error} "), style=ALARM) if error
              else Text("enter: the node's view", style=DIM))
    lines.append(Line(right_aligned(second, state, width)))
    return lines


def cluster_titles(options: ClusterOptions, width: int) -> Text:
    out = Text("  ")
    for column in CLUSTER_COLUMNS:
        style = "bold underline" if column.key == options.sort else TITLE
        title = column.title + (("▼" if options.descending else "▲") if column.key == options.sort else "")
        if column.width == 0:
            out.append_text(cell(Text(title, style=style), node_width(width), right=False))
        else:
            out.append(" ")
            out.append_text(cell(Text(title, style=style), column.width))
    return out


def node_line(row: NodeRow, width: int) -> Text:
    def number(value: float | None, digits: int = 0) -> Text:
        return Text("-" if value is None else f"{value:.{digits}f}")

    health = shown(row.health or "-")
    health_style = GOOD if health == "ok" else DIM if health == "-" else BAD
    state = Text(row.state.upper() if row.state != OK else "ok",
                 style=GOOD if row.state == OK else ALARM)
    cells = {
        "gpus": number(row.gpus), "free": number(row.free), "busy": number(row.busy),
        "idle": number(row.idle_held, 1), "health": Text(health, style=health_style),
        "sm": Text(percent(row.sm_ratio)), "age": Text(duration(row.age_seconds)), "state": state,
    }
    line = Text("  ")
    line.append_text(cell(Text(shown(row.node), style=TITLE), node_width(width), right=False))
    for column in CLUSTER_COLUMNS[1:]:
        line.append(" ")
        line.append_text(cell(cells[column.key], column.width))
    if row.message:
        line.append(shown(f"  {row.message}"), style=DIM if row.state == OK else WARN)
    line.truncate(width, overflow="ellipsis")
    return line


def cluster_body(rows: Sequence[NodeRow], width: int) -> list[Line]:
    if not rows:
        return [Line(Text("  no nodes yet", style=DIM))]
    return [Line(node_line(r, width), f"node:{r.node}") for r in rows]
