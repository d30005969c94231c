"""The interactive ``gpuagent top``: Textual screens over the node and cluster renderers.

Textual rather than Rich's ``Live``: the view needs keys (sort, filter, expand, pause, help), a modal help
and namespace picker, a second screen (a node opened from the cluster), scrolling with a cursor, and tests
that drive all of it headless through the library's own pilot and compare SVG frames; ``Live`` only
redraws. Only this module (and ``gpuagent.top.screens``) imports Textual, and only ``gpuagent top`` imports
them, so the agent's footprint does not change.

Each screen refreshes from its source in a worker: the node screen at the agent's poll rate (or
``--interval``), asking ``/v1/state`` conditionally; paused, it asks nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from gpuagent.top import cluster_view, render
from gpuagent.top.arrange import ViewOptions, arrange
from gpuagent.top.client import AgentWatch
from gpuagent.top.errors import TopError
from gpuagent.top.history import History
from gpuagent.top.model import NodeView, error_line, guarded, node_view
from gpuagent.top.render import Line
from gpuagent.top.screens import HelpScreen, NamespaceScreen, cluster_help, node_help
from gpuagent.untrusted import shown_lines

MIN_INTERVAL_SECONDS = 0.25


class LineView(ScrollView, can_focus=True):
    """Lines of Rich text with a cursor over the lines that belong to a row (Textual's line API)."""

    DEFAULT_CSS = "LineView { height: 1fr; scrollbar-size-vertical: 1; }"
    BINDINGS = [
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "move(-10)", show=False),
        Binding("pagedown", "move(10)", show=False),
        Binding("home", "move(-1000000)", show=False),
        Binding("end", "move(1000000)", show=False),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lines: list[Line] = []
        self.cursor: str | None = None

    def show(self, lines: Sequence[Line]) -> None:
        self.lines = list(lines)
        keys = self.keys()
        if self.cursor not in keys:
            self.cursor = keys[0] if keys else None
        self.virtual_size = Size(self.size.width, len(self.lines))
        self.refresh()

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for line in self.lines:
            if line.key is not None:
                seen.setdefault(line.key)
        return list(seen)

    def render_line(self, y: int) -> Strip:
        index = y + round(self.scroll_offset.y)
        width = self.size.width
        if index >= len(self.lines):
            return Strip.blank(width)
        line = self.lines[index]
        text = render.guarded(line.text)
        if line.key is not None and line.key == self.cursor and self.has_focus:
            text = text.copy()
            text.stylize("reverse")
        # on the widget's style: a segment without one trips Textual's filters (NO_COLOR's among them)
        segments = Segment.apply_style(text.render(self.app.console, end=""), self.rich_style)
        return Strip(list(segments)).crop_extend(0, width, self.rich_style)

    def action_move(self, step: int) -> None:
        keys = self.keys()
        if not keys:
            return
        index = keys.index(self.cursor) if self.cursor in keys else 0
        self.cursor = keys[max(0, min(len(keys) - 1, index + step))]
        self.scroll_to_cursor()
        self.refresh()

    def scroll_to_cursor(self) -> None:
        rows = [i for i, line in enumerate(self.lines) if line.key == self.cursor]
        if rows:
            region = Region(0, rows[0], self.size.width, rows[-1] - rows[0] + 1)
            self.scroll_to_region(region, animate=False, force=True)

    def on_click(self, event: events.Click) -> None:
        index = event.y + round(self.scroll_offset.y)
        if 0 <= index < len(self.lines) and self.lines[index].key is not None:
            self.cursor = self.lines[index].key
            self.refresh()

    def on_resize(self, event: events.Resize) -> None:
        self.screen.post_message(Redraw())


class Redraw(events.Event):
    """The width changed: lines are laid out for a width, so the screen lays them out again."""


class ViewScreen(Screen[None]):
    """What both views share: a header, column titles, the lines, a filter box, pausing, refreshing."""

    BINDINGS = [
        Binding("s", "sort(1)", "sort"),
        Binding("S", "sort(-1)", "sort back", show=False),
        Binding("r", "reverse", "reverse"),
        Binding("slash", "filter", "filter"),
        Binding("p", "pause", "pause"),
        Binding("escape", "back", "back", show=False),
    ]
    DEFAULT_CSS = """
    #header { height: 2; }
    #titles { height: 1; }
    #filter { dock: bottom; display: none; }
    #filter.shown { display: block; }
    """

    def __init__(self, *, interval: float | None, clock: Callable[[], float]) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self.paused = False
        self.header_text = ""  # what the header says now, as plain text
        self.options: Any = None  # the view's options (ViewOptions or ClusterOptions): sort, filters

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="titles")
        yield LineView(id="lines")
        yield Input(placeholder="filter: part of a name, a container, a process, a PID", id="filter")
        yield Footer()

    @property
    def lines(self) -> LineView:
        return self.query_one(LineView)

    def drawable(self) -> bool:
        """Mounted with every widget a redraw writes to: a fetch that ends while the app quits finds some of
        them removed already, in any order (a redraw has no await: nothing is removed while it runs)."""
        return self.is_mounted and len(self.query("#header, #titles, LineView")) == 3

    def on_mount(self) -> None:
        self.lines.focus()
        self.redraw()
        self.run_worker(self._refresh_loop(), exclusive=True, group="refresh")

    async def _refresh_loop(self) -> None:
        while True:
            if not self.paused and not self._covered():
                await self.fetch()
                if not self.paused:  # paused while the answer was on its way: the view stays as paused
                    self.redraw()
            await asyncio.sleep(max(MIN_INTERVAL_SECONDS, self.next_interval()))

    def _covered(self) -> bool:
        """Another view is over this one (a node opened from the cluster): this one asks nothing meanwhile."""
        stack = self.app.screen_stack
        above = stack[stack.index(self) + 1:] if self in stack else []
        return any(isinstance(screen, ViewScreen) for screen in above)

    async def fetch(self) -> None:
        raise NotImplementedError

    def next_interval(self) -> float:
        raise NotImplementedError

    def redraw(self) -> None:
        raise NotImplementedError

    def on_redraw(self, event: Redraw) -> None:
        self.redraw()

    @property
    def width(self) -> int:
        """The lines' width: the screen's less the scrollbar (the titles align with the lines)."""
        lines = self.lines.scrollable_content_region.width if self.lines.is_mounted else 0
        return max(40, lines or (self.size.width or self.app.size.width) - 1)

    def clock_text(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.clock()))

    def set_header(self, header: Sequence[Line], titles: Text) -> None:
        self.header_text = render.plain(header)
        shown_header = Text("\n").join(render.guarded(line.text) for line in header)
        self.query_one("#header", Static).update(shown_header)
        self.query_one("#titles", Static).update(titles)

    # -- keys both views share ---------------------------------------------------------------------------
    def action_pause(self) -> None:
        self.paused = not self.paused
        self.redraw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.set_text_filter(event.value)
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_filter()

    def action_back(self) -> None:
        """Escape: clear and close the filter box if it is open, else back to the cluster (if from there)."""
        box = self.query_one("#filter", Input)
        if box.has_class("shown"):
            box.value = ""
            self._close_filter()
        elif len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def _close_filter(self) -> None:
        self.query_one("#filter", Input).remove_class("shown")
        self.lines.focus()

    def set_text_filter(self, text: str) -> None:
        self.options = replace(self.options, text=text)

    def action_sort(self, step: int) -> None:
        self.options = self.options.next_sort(step)
        self.redraw()

    def action_reverse(self) -> None:
        self.options = self.options.sorted_by(self.options.sort)
        self.redraw()


class NodeScreen(ViewScreen):
    """One agent's GPUs and tenants."""

    BINDINGS = [
        Binding("enter,space", "toggle", "expand"),
        Binding("n", "namespace", "namespace"),
        Binding("e", "expand_all", "expand all"),
    ]

    def __init__(self, watch: AgentWatch, *, interval: float | None = None,
                 clock: Callable[[], float] = time.time, history: History | None = None) -> None:
        super().__init__(interval=interval, clock=clock)
        self.watch = watch
        self.history = history if history is not None else History()
        self.options = ViewOptions()
        self.node: NodeView | None = None
        self._take(watch.state)

    async def fetch(self) -> None:
        await self.watch.refresh()
        if self.watch.state_changed:
            self._take(self.watch.state)

    def _take(self, state: dict | None) -> None:
        if state is None:
            return
        try:
            self.node = node_view(state)
        except TopError as err:  # a body the view cannot read: say so, keep the last one
            self._refuse(err)
            return
        self.history.add(self.node.taken_at_unix, {g.uuid: None if g.stale else g.util_ratio
                                                   for g in self.node.gpus})

    def next_interval(self) -> float:
        if self.interval is not None:
            return self.interval
        poll = self.node.poll_interval_seconds if self.node is not None else None
        return min(10.0, poll) if poll else 1.0

    def _refuse(self, err: TopError) -> None:
        """The node's answer cannot be shown: its error, and no ETag, so that the next refresh asks for the
        whole body again (a 304 would clear the error while nothing new is shown)."""
        self.watch.error, self.watch.etag = str(err), None

    def redraw(self) -> None:
        if not self.drawable():
            return
        try:
            guarded(self._draw)
        except TopError as err:  # the node's figures broke the renderer: the node's error, drawn without it
            self.node = None
            self._refuse(err)
            self._draw()

    def _draw(self) -> None:
        width = self.width
        status = self.watch.status()
        header = render.header(self.node, status, self.watch.url, self.options, width, paused=self.paused,
                               now_unix=self.clock())
        self.set_header(header, render.column_titles(self.options, width))
        if self.node is None:
            self.lines.show(render.no_data(status))
            return
        rows = arrange(self.node, self.options)
        lines = render.body(rows, self.options, self.history, width)
        if not rows:
            lines = [Line(Text("  no tenant matches the filter", style=render.DIM))]
        self.lines.show(lines)

    def action_toggle(self) -> None:
        if self.lines.cursor is not None and self.lines.cursor.startswith(("gpu:", "tenant:")):
            self.options = self.options.toggled(self.lines.cursor)
            self.redraw()

    def action_expand_all(self) -> None:
        if self.node is None:
            return
        rows = arrange(self.node, replace(self.options, expanded=frozenset()))
        tenants = frozenset(r.key for r in rows if r.kind == "tenant" and r.tenant and r.tenant.processes)
        expanded = frozenset() if tenants <= self.options.expanded else tenants
        self.options = replace(self.options, expanded=expanded)
        self.redraw()

    def action_namespace(self) -> None:
        namespaces = self.node.namespaces() if self.node is not None else ()

        def chosen(namespace: str | None) -> None:
            self.options = replace(self.options, namespace=namespace)
            self.redraw()

        self.app.push_screen(NamespaceScreen(namespaces, self.options.namespace), chosen)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(node_help()))


class ClusterScreen(ViewScreen):
    """One line per node; Enter opens that node's screen."""

    BINDINGS = [Binding("enter", "open", "open node")]

    def __init__(self, source: object, *, interval: float = 2.0, clock: Callable[[], float] = time.time,
                 node_screen: Callable[[str], NodeScreen] | None = None) -> None:
        super().__init__(interval=interval, clock=clock)
        self.source = source
        self.options = cluster_view.ClusterOptions()
        self.node_screen = node_screen

    async def fetch(self) -> None:
        await self.source.refresh()  # type: ignore[attr-defined]

    def next_interval(self) -> float:
        return self.interval or 2.0

    def redraw(self) -> None:
        if not self.drawable():
            return
        width = self.width
        rows = cluster_view.arrange_nodes(self.source.rows(), self.options)  # type: ignore[attr-defined]
        header = cluster_view.cluster_header(
            self.source.description, rows, self.source.error,  # type: ignore[attr-defined]
            self.options, width, self.clock_text(), paused=self.paused)
        self.set_header(header, cluster_view.cluster_titles(self.options, width))
        self.lines.show(cluster_view.cluster_body(rows, width))

    def action_open(self) -> None:
        cursor = self.lines.cursor
        rows = {f"node:{r.node}": r for r in self.source.rows()}  # type: ignore[attr-defined]
        row = rows.get(cursor or "")
        if row is None or row.url is None or self.node_screen is None:
            self.notify("no agent URL known for this node", severity="warning")
            return
        self.app.push_screen(self.node_screen(row.url))

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(cluster_help()))


class TopApp(App[None]):
    """``gpuagent top``: starts on the node screen or the cluster screen it is given."""

    TITLE = "gpuagent top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, first: Callable[[], Screen[None]]) -> None:
        super().__init__()
        self._first = first

    def on_mount(self) -> None:
        self.push_screen(self._first())

    def _fatal_error(self) -> None:
        """An error nothing caught ends the app (exit 1) with one line and the traceback, never Textual's
        own panel, which lists every frame's local variables: a node's pods, namespaces and processes
        (Textual calls this from its handler of unhandled exceptions, a failed worker's included)."""
        error = sys.exc_info()[1]
        self.bell()
        where = "".join(traceback.format_tb(error.__traceback__)) if error is not None else ""
        what = error_line(error) if error is not None else "an unknown error"
        self._exit_renderables.append(Text(shown_lines(f"{where}gpuagent top stopped: {what}")))
        self._close_messages_no_wait()

    def action_help(self) -> None:
        screen = self.screen
        if isinstance(screen, (NodeScreen, ClusterScreen)):
            screen.action_help()
