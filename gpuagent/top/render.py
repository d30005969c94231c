"""The node view as lines of Rich text: the header, the column titles, one block per GPU, its tenants.

The TUI shows these lines (with a cursor) and ``--once`` prints them as plain text, so a bug report shows
what the screen showed. Every state is spelled out in words (``STALE``, ``LOST``, ``IDLE 31m``, ``OVER``)
and bars are drawn with glyphs inside brackets, so the view reads the same in a monochrome terminal:
colour only repeats what the words say. A figure the agent did not give is "-", never 0. In audit mode the
enforcer's decisions say what it would do (``would 80%`` frozen, ``would kill``): nothing was done.

Every name shown (processes, tenants, GPUs, hosts, the agent's messages) is from outside: any process can
name itself with escape sequences. Each goes through ``gpuagent.untrusted.shown`` as it becomes text, so its
controls and bidi characters show as escapes (``\x1b``) and the columns are measured on what is shown;
:func:`guarded` is the last check before a line reaches the terminal (the live view and ``--once``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from gpuagent.top.arrange import COLUMNS, Row, ViewOptions
from gpuagent.top.client import NO_ANSWER, OK, AgentStatus
from gpuagent.top.history import History, sparkline
from gpuagent.top.model import GpuView, MigView, NodeView, ProcessView, TenantView
from gpuagent.untrusted import has_unsafe, shown

GIB = 2**30
KINDS = {"systemd_service": "unit", "user_session": "session", "slurm_job": "slurm"}  # short labels
NAME_MIN = 20
PARTIAL = " ▏▎▍▌▋▊▉"

# Styles: colour for those who have it; bold and reverse carry the alarms in monochrome too.
# Light colours: NO_COLOR's monochrome keeps their lightness, so they stay readable on a dark background.
GOOD, WARN, BAD, ALARM, DIM, TITLE = (
    "#5fd75f", "#ffd75f", "bold #ff7070", "bold reverse #ff7070", "dim", "bold")


@dataclass(frozen=True)
class Line:
    text: Text
    key: str | None = None  # the row this line belongs to (the cursor moves over these)


# -- figures -----------------------------------------------------------------------------------------------

def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def gib(value: int | float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}G"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def bar(ratio: float | None, width: int) -> Text:
    """``[████▌     ]``: the brackets show the whole without colour; unknown is ``[   -   ]``."""
    inner = width - 2
    if ratio is None:
        return Text("[" + "-".center(inner) + "]", style=DIM)
    eighths = round(max(0.0, min(1.0, ratio)) * inner * 8)
    full, part = divmod(eighths, 8)
    glyphs = "█" * full + (PARTIAL[part] if part else "")
    style = BAD if ratio >= 0.9 else WARN if ratio >= 0.7 else GOOD
    return Text.assemble("[", (glyphs.ljust(inner), style), "]")


def cell(text: str | Text, width: int, *, right: bool = True, style: str = "") -> Text:
    cell = text if isinstance(text, Text) else Text(text, style=style)
    cell.truncate(width, overflow="ellipsis")
    pad = width - cell.cell_len
    return Text.assemble(" " * pad, cell) if right else Text.assemble(cell, " " * pad)


def name_width(width: int) -> int:
    fixed = sum(c.width + 1 for c in COLUMNS if c.width)
    return max(NAME_MIN, width - fixed - 1)


# -- header ------------------------------------------------------------------------------------------------

def header(node: NodeView | None, status: AgentStatus, url: str, options: ViewOptions, width: int, *,
           paused: bool = False, now_unix: float | None = None) -> list[Line]:
    """Two lines: who and how fresh; then what is wrong, or the node's summary, and the view's state."""
    clock = time.strftime("%H:%M:%S", time.localtime(now_unix if now_unix is not None else time.time()))
    if node is None:
        first = Text.assemble((shown(url), TITLE), "  ", ("no snapshot", DIM))
    else:
        facts = [shown(node.backend or "?"), shown(f"driver {node.driver_version or '-'}"),
                 shown(f"CUDA {node.cuda_version or '-'}"), shown(f"mode {node.mode}")
                 + (" (says what it would do)" if node.mode == "audit" else "")]
        if node.poll_interval_seconds is not None:
            facts.append(f"poll {node.poll_interval_seconds:g}s")
        age = status.snapshot_age_seconds
        first = Text.assemble((shown(node.hostname), TITLE), "  ", " · ".join(facts), "  ",
                              (f"snapshot {age:.1f}s old" if age is not None else "snapshot age -",
                               "" if status.state == OK else ALARM))
    first = right_aligned(first, Text(clock), width)
    if status.state != OK:
        second = Text(shown(f" {status.state.upper()}: {status.message} "), style=ALARM)
    elif node is not None:
        second = Text(summary(node))
        if node.failing_sources:
            second.append(shown("  sources failing: " + "; ".join(node.failing_sources)), style=WARN)
        if node.failing_conditions:
            second.append(shown("  " + "; ".join(node.failing_conditions)), style=WARN)
        if node.quarantine:
            second.append(shown(f"  node {node.quarantine}"), style=WARN)
    else:
        second = Text("")
    title = next(c.title for c in COLUMNS if c.key == options.sort)
    state = view_state(title, options.descending, options.text, paused, options.namespace)
    return [Line(first), Line(right_aligned(second, state, width))]


def summary(node: NodeView) -> str:
    pods = {t.name for g in node.gpus for t in g.all_tenants() if t.kind == "pod"}
    parts = [f"{len(node.gpus)} GPUs", f"{len(pods)} pods"]
    if node.idle_gpus_held is not None:
        idle_window = node.idle_window_seconds
        window = f" (idle ≥{duration(idle_window)})" if idle_window is not None else ""
        parts.append(f"idle-held {node.idle_gpus_held:.1f} GPU{window}")
    if node.efficiency_window_seconds is not None:
        parts.append(f"EFF over {duration(node.efficiency_window_seconds)}")
    if node.day_started_at_unix is not None:
        parts.append("GPU-h since " + time.strftime("%H:%M UTC", time.gmtime(node.day_started_at_unix)))
    return " · ".join(parts)


def view_state(title: str, descending: bool, text: str, paused: bool, namespace: str | None = None) -> Text:
    """The right end of the second header line: the sort, the filters, PAUSED."""
    out = Text(f"sort {title} {'▼' if descending else '▲'}")
    if namespace is not None:
        out.append(shown(f"  ns={namespace}"), style=TITLE)
    if text.strip():
        out.append(shown(f"  /{text.strip()}"), style=TITLE)
    if paused:
        out.append("  PAUSED", style="bold reverse")
    return out


def right_aligned(left: Text, right: Text, width: int) -> Text:
    room = width - right.cell_len - 1
    left = left.copy()
    left.truncate(max(0, room), overflow="ellipsis")
    return Text.assemble(left, " " * max(1, width - left.cell_len - right.cell_len), right)


def column_titles(options: ViewOptions, width: int) -> Text:
    out = Text("  ")
    for column in COLUMNS:
        title = column.title
        style = "bold underline" if column.key == options.sort else TITLE
        if column.key == options.sort:
            title += "▼" if options.descending else "▲"
        if column.width == 0:
            out.append_text(cell(Text(title, style=style), name_width(width) - 2, right=False))
        else:
            out.append(" ")
            out.append_text(cell(Text(title, style=style), column.width))
    return out


# -- the body ----------------------------------------------------------------------------------------------

def body(rows: Sequence[Row], options: ViewOptions, history: History, width: int) -> list[Line]:
    lines: list[Line] = []
    for row in rows:
        if row.kind == "gpu":
            collapsed = row.key in options.collapsed
            lines += [Line(text, row.key) for text in gpu_block(row.gpu, history, width, collapsed)]
        elif row.kind == "mig" and row.mig is not None:
            lines.append(Line(mig_line(row.mig, width), row.key))
        elif row.kind == "tenant" and row.tenant is not None:
            lines.append(Line(tenant_line(row.tenant, width, expanded=row.key in options.expanded), row.key))
        elif row.kind == "process" and row.process is not None:
            lines.append(Line(process_line(row.process, width), row.key))
    return lines


def gpu_block(gpu: GpuView, history: History, width: int, collapsed: bool = False) -> list[Text]:
    spark_width = max(0, min(40, width // 4))
    title = Text.assemble(("▸ " if collapsed else "  "), (f"GPU {gpu.index}", TITLE), "  ", shown(gpu.model),
                          "  ")
    title.append_text(health_words(gpu))
    if gpu.sharing_mode is not None:
        tenants = len(gpu.all_tenants())
        title.append(shown(f"  {gpu.sharing_mode.replace('_', '-')}, {tenants} tenant{'s' * (tenants != 1)}"))
    title.append_text(tenant_sm_timing(gpu))
    spark = Text(sparkline(history.of(gpu.uuid), spark_width), style="cyan")
    first = right_aligned(title, spark, width)
    second = Text("    SM ")
    second.append_text(bar(gpu.util_ratio, 16))
    second.append(f" {percent(gpu.util_ratio):>4}")
    second.append(f"  avg {percent(gpu.sm_short_ratio)} / {percent(gpu.sm_long_ratio)}", style=DIM)
    second.append("  MEM ")
    memory = (gpu.memory_used_bytes / gpu.memory_total_bytes
              if gpu.memory_used_bytes is not None and gpu.memory_total_bytes else None)
    second.append_text(bar(memory, 14))
    second.append(f" {gib(gpu.memory_used_bytes).removesuffix('G')}/{gib(gpu.memory_total_bytes)}")
    power = "-" if gpu.power_watts is None else f"{gpu.power_watts:.0f}"
    limit = "" if gpu.power_limit_watts is None else f"/{gpu.power_limit_watts:.0f}"
    second.append(f"  {power}{limit}W")
    second.append("  -°C" if gpu.temperature_celsius is None else f"  {gpu.temperature_celsius:.0f}°C",
                  style=BAD if (gpu.temperature_celsius or 0) >= 85 else "")
    clocks = "/".join("-" if c is None else f"{c:.0f}" for c in (gpu.sm_clock_mhz, gpu.memory_clock_mhz))
    second.append(f"  {clocks}MHz")
    if gpu.schedulable_share_ratio is not None:
        second.append(f"  free share {percent(gpu.schedulable_share_ratio)}", style=DIM)
    second.truncate(width, overflow="ellipsis")
    if gpu.stale or gpu.health != "ok":
        second.stylize(DIM)
    return [first, second]


def tenant_sm_timing(gpu: GpuView) -> Text:
    """``(tenant SM: 10s mean, 4.0s older)``: where the tenants' SM is not this poll's figure, as the GPU's
    is, its window and age, so a tenant above its GPU reads as what it is."""
    if not any(t.sm_ratio is not None for t in gpu.all_tenants()):
        return Text("")
    parts = []
    if gpu.tenant_sm_window_seconds is not None:
        parts.append(f"{duration(gpu.tenant_sm_window_seconds)} mean")
    if gpu.tenant_sm_age_seconds is not None:
        parts.append(f"{duration(gpu.tenant_sm_age_seconds)} older")
    return Text(f"  (tenant SM: {', '.join(parts)})", style=DIM) if parts else Text("")


def health_words(gpu: GpuView) -> Text:
    words = Text()
    if gpu.health == "ok":
        words.append("ok", style=GOOD)
    else:
        detail = f" ({gpu.health_detail})" if gpu.health_detail else ""
        words.append(shown(f" {gpu.health.upper()}{detail} "), style=ALARM)
    if gpu.stale:
        words.append("  ")
        stale = " STALE: figures from an earlier poll " if gpu.health == "ok" else " STALE "
        words.append(stale, style=ALARM)
    if gpu.xid_last is not None:
        words.append("  ")
        words.append(f"XID {gpu.xid_last} (x{gpu.xid_recent})", style=BAD)
    if gpu.fault is not None:
        words.append("  ")
        words.append(f" FAULT {gpu.fault} ", style=ALARM if "fatal" in gpu.fault else BAD)
    return words


def mig_line(mig: MigView, width: int) -> Text:
    line = Text.assemble("    ", (shown(f"MIG {mig.gpu_instance_id} {mig.profile}"), TITLE), "  GPM ")
    line.append_text(bar(mig.activity_ratio, 12))
    line.append(f" {percent(mig.activity_ratio):>4}  MEM ")
    memory = (mig.memory_used_bytes / mig.memory_total_bytes
              if mig.memory_used_bytes is not None and mig.memory_total_bytes else None)
    line.append_text(bar(memory, 12))
    line.append(f" {gib(mig.memory_used_bytes).removesuffix('G')}/{gib(mig.memory_total_bytes)}")
    line.append(f"  {len(mig.tenants)} tenant{'s' * (len(mig.tenants) != 1)}", style=DIM)
    line.truncate(width, overflow="ellipsis")
    return line


def tenant_line(tenant: TenantView, width: int, *, expanded: bool) -> Text:
    marker = ("▾ " if expanded else "▸ ") if tenant.processes else "  "
    name = Text(shown(tenant.name))
    if tenant.kind not in ("pod", "unknown"):
        name.append(shown(f" ({KINDS.get(tenant.kind, tenant.kind)})"), style=DIM)
    elif tenant.kind == "pod" and not tenant.allocated:  # it runs on a GPU the kubelet did not give it
        name.append(" (not allocated)", style=WARN)
    over = (tenant.memory_limit_bytes is not None and tenant.memory_used_bytes is not None
            and tenant.memory_used_bytes > tenant.memory_limit_bytes)
    memory = f"{gib(tenant.memory_used_bytes)}/{gib(tenant.memory_limit_bytes)}"
    share = f"{percent(tenant.share_limit_ratio)}/{percent(tenant.share_achieved_ratio)}"
    frozen = tenant.frozen_ratio
    stage = ladder_words(tenant)
    return _row("    " + marker, name, width, {
        "procs": Text(str(len(tenant.processes))),
        "sm": Text(percent(tenant.sm_ratio)),
        "eff": Text(percent(tenant.efficiency_ratio)),
        "memory": Text(memory + (" OVER" if over else ""), style=BAD if over else ""),
        "share": Text(share),
        "frozen": Text(frozen_words(tenant), style=WARN if frozen else ""),
        "throttled": Text(duration(tenant.throttled_seconds)),
        "ladder": Text(stage, style="" if stage in ("ok", "-") else WARN if tenant.audit else BAD),
        "idle": idle_words(tenant),
        "today": Text("-" if tenant.gpu_hours_today is None else f"{tenant.gpu_hours_today:.2f}"),
    })


# The ladder's stages as audit mode says them: the step it would have taken (a warning it does give).
WOULD = {"terminating": "would term", "killed": "would kill", "evicted": "would evict"}


def frozen_words(tenant: TenantView) -> str:
    """The part of each period frozen; in audit mode what would be: ``would 80%`` (``would all``)."""
    ratio = tenant.frozen_ratio
    if not tenant.audit or not ratio:
        return percent(ratio)
    return "would all" if ratio >= 0.995 else f"would {percent(ratio)}"


def ladder_words(tenant: TenantView) -> str:
    """The memory ladder's stage; in audit mode the signal or eviction it would have sent."""
    stage = shown(tenant.ladder_stage or "-")
    return WOULD.get(stage, stage) if tenant.audit else stage


def _row(prefix: str, name: Text, width: int, cells: dict[str, Text]) -> Text:
    """A line of the tenant table: ``prefix`` and the name in the name column, then the cells given."""
    line = Text(prefix)
    line.append_text(cell(name, name_width(width) - len(prefix), right=False))
    for column in COLUMNS[1:]:
        line.append(" ")
        line.append_text(cell(cells.get(column.key, Text("")), column.width))
    return line


def idle_words(tenant: TenantView) -> Text:
    if tenant.idle_seconds is None:
        return Text("-")
    if tenant.idle_flagged:
        return Text(f"IDLE {duration(tenant.idle_seconds)}", style="bold reverse #ffd75f")
    return Text(duration(tenant.idle_seconds) if tenant.idle_seconds > 0 else "busy",
                style=DIM if tenant.idle_seconds == 0 else WARN)


def process_line(process: ProcessView, width: int) -> Text:
    who = f"{process.pid} {process.comm or '?'}" + (f" [{process.container}]" if process.container else "")
    line = _row("        ", Text(shown(who)), width, {
        "sm": Text(percent(process.sm_ratio)), "memory": Text(gib(process.memory_bytes)),
    })
    line.stylize(DIM)
    return line


def no_data(status: AgentStatus) -> list[Line]:
    """What the body says when no snapshot was ever had: the reason, never an empty table of zeros."""
    if status.state == NO_ANSWER:
        return [Line(Text(shown(f"  no data: {status.message}"), style=BAD))]
    return [Line(Text(shown(f"  waiting for the agent: {status.message or 'first answer'}"), style=DIM))]


def guarded(text: Text) -> Text:
    """``text`` as it may reach a terminal: unchanged when it holds no control (every name was shown as it
    became text); else, should a name have come another way, as plain text with its controls shown."""
    return text if not has_unsafe(text.plain) else Text(shown(text.plain))


def plain(lines: Sequence[Line | Text]) -> str:
    """The lines as plain text, trailing spaces trimmed (``--once``), no control in them."""
    texts = [line.text if isinstance(line, Line) else line for line in lines]
    return "\n".join(shown(t.plain.rstrip()) for t in texts) + "\n"
