"""``gpuagent top``: its arguments, the first contact with the agent(s), then the TUI or one frame.

Wired into ``gpuagent.cli`` by :func:`add_top_parser`; nothing here imports Rich or Textual at import time
(every ``gpuagent`` command builds this parser). A wrong URL, an agent that does not answer at start, an
agents file that does not read: one line on stderr and exit 2. Once running, an agent that stops answering
is shown as such.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import sys
import time
from typing import Any

from gpuagent.top.errors import TopError
from gpuagent.untrusted import shown

EXIT_TOP_ERROR = 2
DEFAULT_AGENT = "http://127.0.0.1:9402"
DEFAULT_WIDTH = 120

EPILOG = """\
examples:
  gpuagent top                                        # the agent on this node
  gpuagent top --agent http://gpu-node-7:9402          # another node (from a laptop: only HTTP to the agent)
  gpuagent top --agents agents.yaml                    # a cluster, from the extender's agents file
  gpuagent top --prometheus http://prometheus:9090     # a cluster, from the Prometheus scraping the agents
  gpuagent top --once > node.txt                       # one frame as plain text, for a script or a bug report

keys: arrows move, enter expands, s/r sort, / filters, n picks a namespace, p pauses, ? helps, q quits.
"""


def add_top_parser(commands: Any) -> None:
    """Add the ``top`` command to ``commands`` (an argparse subparsers action)."""
    top = commands.add_parser(
        "top", help="a live, pod-aware view of the GPUs of a node (or one line per node of a cluster)",
        description="A live view of a node's GPUs and their tenants (pods, shares, throttling, memory "
                    "limits, idle allocations), from the agent's HTTP API; or one line per node of a "
                    "cluster.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = top.add_mutually_exclusive_group()
    where.add_argument("--agent", metavar="URL", help=f"the agent to watch (default {DEFAULT_AGENT})")
    where.add_argument("--agents", metavar="FILE",
                       help="cluster view: a YAML map node name -> agent URL (the extender's agents file)")
    where.add_argument("--prometheus", metavar="URL",
                       help="cluster view: the Prometheus (or Thanos, Mimir) that scrapes the agents")
    top.add_argument("--selector", metavar="MATCHERS",
                     help='with --prometheus: label matchers for the agents\' series, e.g. cluster="prod"')
    top.add_argument("--header", metavar="'NAME: VALUE'", action="append", default=[],
                     help="with --prometheus: an extra HTTP header, e.g. 'X-Scope-OrgID: gpu'")
    top.add_argument("--agent-url", metavar="TEMPLATE",
                     help="with --prometheus: where a node's agent listens, like http://{node}:9402 "
                          "(default: the scrape target)")
    top.add_argument("--interval", metavar="SECONDS",
                     help="seconds between refreshes (default: the agent's poll interval; a cluster 2, "
                          "Prometheus 10)")
    top.add_argument("--timeout", metavar="SECONDS", default="3", help="per request (default 3)")
    top.add_argument("--once", action="store_true", help="print one frame as plain text and exit")
    top.add_argument("--width", metavar="COLUMNS",
                     help=f"with --once: the frame's width (default: the terminal's, or {DEFAULT_WIDTH})")
    top.set_defaults(command=run_top)


def run_top(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except TopError as err:
        print(f"gpuagent top: {err}", file=sys.stderr)
        return EXIT_TOP_ERROR
    except KeyboardInterrupt:
        return 130


def _seconds(value: str | None, what: str, low: float = 0.1, high: float = 3600.0) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:
        raise TopError(f"{what}: expected seconds from {low:g} to {high:g}, got {value!r}")
    return seconds


def _width(value: str | None) -> int:
    if value is None:
        return shutil.get_terminal_size((DEFAULT_WIDTH, 40)).columns
    if not value.isdigit() or not 40 <= int(value) <= 1000:
        raise TopError(f"--width: expected a number of columns from 40 to 1000, got {value!r}")
    return int(value)


async def _main(args: argparse.Namespace) -> int:
    from gpuagent.top.client import check_agent_url, new_session

    interval = _seconds(args.interval, "--interval")
    timeout = _seconds(args.timeout, "--timeout", high=300.0) or 3.0
    width = _width(args.width) if args.once else DEFAULT_WIDTH
    cluster = args.agents is not None or args.prometheus is not None
    if not args.prometheus and (args.selector or args.header or args.agent_url):
        raise TopError("--selector, --header and --agent-url go with --prometheus")
    _need_rich(args.once)
    async with new_session() as session:
        if not cluster:
            from gpuagent.top.client import AgentWatch

            watch = AgentWatch(check_agent_url(args.agent or DEFAULT_AGENT), session, timeout_seconds=timeout)
            await watch.refresh()
            if watch.state is None and watch.error is not None:
                raise TopError(f"cannot use the agent at {watch.url}: {watch.error}")
            if args.once:
                return _print(_node_frame(watch, width))
            from gpuagent.top.app import NodeScreen, TopApp

            return await _run_app(TopApp(lambda: NodeScreen(watch, interval=interval)))
        source = _cluster_source(args, session, timeout)
        await source.refresh()
        if source.error is not None:
            raise TopError(source.error)
        if args.once:
            return _print(_cluster_frame(source, width))
        from gpuagent.top.app import ClusterScreen, NodeScreen, TopApp
        from gpuagent.top.client import AgentWatch

        def node_screen(url: str) -> NodeScreen:
            return NodeScreen(AgentWatch(url, session, timeout_seconds=timeout))

        default = 10.0 if args.prometheus else 2.0
        return await _run_app(TopApp(lambda: ClusterScreen(source, interval=interval or default,
                                                            node_screen=node_screen)))


async def _run_app(app: Any) -> int:
    """Run the TUI; its exit status is the app's (1 when it stopped on an error), not always 0."""
    await app.run_async()
    return app.return_code or 0


def _cluster_source(args: argparse.Namespace, session: Any, timeout: float) -> Any:
    from gpuagent.top import cluster

    if args.agents is not None:
        return cluster.AgentsSource(cluster.read_agents_file(args.agents), session, timeout_seconds=timeout)
    from gpuagent.hints.extender_config import AgentDirectoryError, check_template
    from gpuagent.prom.client import parse_headers
    from gpuagent.prom.errors import ReportError

    try:
        template = check_template(args.agent_url, "--agent-url") if args.agent_url else None
        headers = parse_headers(args.header)
    except (AgentDirectoryError, ReportError) as err:
        raise TopError(str(err)) from None
    return cluster.prometheus_source(args.prometheus, selector=args.selector, agent_url=template,
                                     headers=headers, timeout_seconds=max(timeout, 10.0))


def _need_rich(once: bool) -> None:
    """The TUI needs Textual, ``--once`` Rich: both come with the ``top`` extra (found, not imported here)."""
    for name in ("rich",) if once else ("rich", "textual"):
        if importlib.util.find_spec(name) is None:
            raise TopError(f"needs {name}, which comes with the 'top' extra: pip install 'gpuagent[top]'")


def _node_frame(watch: Any, width: int) -> str:
    from gpuagent.top import render
    from gpuagent.top.arrange import ViewOptions, arrange
    from gpuagent.top.history import History
    from gpuagent.top.model import guarded, node_view

    status = watch.status()
    options = ViewOptions()

    def frame() -> str:
        node = node_view(watch.state) if watch.state is not None else None
        lines = render.header(node, status, watch.url, options, width, now_unix=time.time())
        lines.append(render.Line(render.column_titles(options, width)))
        if node is None:
            lines += render.no_data(status)
        else:
            history = History()
            history.add(node.taken_at_unix, {g.uuid: None if g.stale else g.util_ratio for g in node.gpus})
            lines += render.body(arrange(node, options), options, history, width)
        return render.plain(lines)

    try:
        return guarded(frame)
    except TopError as err:  # what the agent sent and the view cannot show: one line, exit 2
        raise TopError(f"cannot show the agent at {shown(watch.url)}: {err}") from None


def _cluster_frame(source: Any, width: int) -> str:
    from gpuagent.top import cluster_view, render

    options = cluster_view.ClusterOptions()
    rows = cluster_view.arrange_nodes(source.rows(), options)
    clock = time.strftime("%H:%M:%S")
    lines = cluster_view.cluster_header(source.description, rows, source.error, options, width, clock)
    lines.append(render.Line(cluster_view.cluster_titles(options, width)))
    lines += cluster_view.cluster_body(rows, width)
    return render.plain(lines)


def _print(text: str) -> int:
    from gpuagent.prom.cliargs import write_output

    write_output(text, None)
    return 0
