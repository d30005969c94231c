"""The modal screens of ``gpuagent top``: the help (keys and what each column means) and the namespace
picker. Textual, like ``gpuagent.top.app``; imported only by it."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gpuagent.untrusted import shown

ALL_NAMESPACES = "(all namespaces)"

NODE_KEYS = (
    ("up/down, j/k, pgup/pgdn", "move the cursor (a GPU, a tenant, a process)"),
    ("enter, space", "on a tenant: show or hide its processes; on a GPU: fold or unfold its tenants"),
    ("e", "show or hide every tenant's processes"),
    ("s / S", "sort by the next / previous column (the one sorted is underlined, with its direction)"),
    ("r", "reverse the sort"),
    ("/", "filter by text: a tenant, container or process name, a PID (enter keeps it, escape clears it)"),
    ("n", "show one namespace only"),
    ("p", "pause: stop asking the agent and freeze the view (again to go on)"),
    ("escape", "back to the cluster view (a node opened from it)"),
    ("?", "this help"),
    ("q", "quit"),
)
NODE_COLUMNS = (
    ("PROC", "processes of the tenant on this GPU"),
    ("SM", "its SM use now, of the whole GPU"),
    ("EFF", "busy / held over the agent's efficiency window (the header says how long)"),
    ("MEM USED/LIMIT", "GPU memory used against its gpuagent.io/gpu-memory limit; OVER when above"),
    ("SHARE LIM/GOT", "its share limit of SM time and what it achieved over the enforcer's window"),
    ("FROZEN", "the part of each period its cgroups are frozen (audit mode: what enforce would do)"),
    ("THROTTLED", "time spent frozen since the agent started"),
    ("MEM LADDER", "where it stands on the memory ladder: ok, warned, terminating, killed, evicted"),
    ("IDLE", "length of its idle episode; IDLE when flagged (idle for the agent's idle window)"),
    ("GPU-h", "GPU-hours held today (UTC; the header says since when)"),
)
CLUSTER_KEYS = (
    ("up/down, j/k", "move the cursor"),
    ("enter", "open the node's view (escape comes back)"),
    ("s / S, r", "sort by the next / previous column, reverse it"),
    ("/", "filter nodes by name"),
    ("p", "pause"),
    ("?", "this help"),
    ("q", "quit"),
)
CLUSTER_COLUMNS = (
    ("FREE", "healthy GPUs without MIG and without any tenant"),
    ("BUSY", "GPUs with a tenant"),
    ("IDLE-HELD", "GPU-equivalents held by workloads flagged idle (a replica counts its 1/N)"),
    ("HEALTH", "the worst GPU state and how many GPUs are in it (ok, stale, error, unresponsive, lost)"),
    ("AGE", "how old the node's figures are"),
    ("STATE", "ok, STALE (figures not moving), NO ANSWER (the agent or its scrape fails), STARTING"),
)


def help_text(keys: Sequence[tuple[str, str]], columns: Sequence[tuple[str, str]]) -> Text:
    out = Text()
    out.append("keys\n", style="bold underline")
    for key, meaning in keys:
        out.append(f"  {key:<26}", style="bold")
        out.append(f"{meaning}\n")
    out.append("\ncolumns\n", style="bold underline")
    for column, meaning in columns:
        out.append(f"  {column:<26}", style="bold")
        out.append(f"{meaning}\n")
    out.append("\nA figure the agent did not give is '-', never 0. Any key closes this help.", style="dim")
    return out


def node_help() -> Text:
    return help_text(NODE_KEYS, NODE_COLUMNS)


def cluster_help() -> Text:
    return help_text(CLUSTER_KEYS, CLUSTER_COLUMNS)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 118; max-width: 100%; height: auto; max-height: 100%;
                            border: round $accent; padding: 0 1; background: $surface; }
    HelpScreen Static { width: 100%; height: auto; }
    """

    def __init__(self, text: Text) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.text)

    def on_key(self) -> None:
        self.dismiss()

    def on_click(self) -> None:
        self.dismiss()


class NamespaceScreen(ModalScreen[str | None]):
    """Pick one namespace (or all); the choice is the screen's result."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    NamespaceScreen { align: center middle; }
    NamespaceScreen > OptionList { width: 40; height: auto; max-height: 80%; border: round $accent; }
    """

    def __init__(self, namespaces: Sequence[str], current: str | None) -> None:
        super().__init__()
        self.namespaces = list(namespaces)
        self.current = current

    def compose(self) -> ComposeResult:
        # a name as text (never markup), its controls shown; the id keeps the name itself
        options = [Option(ALL_NAMESPACES, id="")] + [Option(Text(shown(ns)), id=ns) for ns in self.namespaces]
        chooser = OptionList(*options)
        chooser.border_title = "namespace"
        if self.current in self.namespaces:
            chooser.highlighted = self.namespaces.index(self.current) + 1
        yield chooser

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id or None)

    def action_cancel(self) -> None:
        self.dismiss(self.current)
