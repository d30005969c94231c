"""The ``gpuagent`` command: ``run``, ``demo``, ``snapshot`` and ``check-config``.

Flags are generated from the config key table (``gpuagent.config.KEYS``), so every flag has a config key
and a ``GPUAGENT_<KEY>`` env var; flag values go to ``load_config`` as ``overrides`` and are validated
there. ``gpuagent.agent`` is imported only by the commands that need it, so ``check-config`` stays light.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpuagent import __version__, preflight
from gpuagent.config import (
    CONFIG_ENV,
    KEYS,
    KEYS_BY_NAME,
    Config,
    ConfigError,
    describe_keys,
    load_config,
    parse_listen,
)
from gpuagent.hints import extender_config
from gpuagent.ratelog import RepeatFilter
from gpuagent.recommend.cli import add_recommend_parser
from gpuagent.report.cli import add_report_parser
from gpuagent.top.cli import add_top_parser
from gpuagent.untrusted import shown

if TYPE_CHECKING:
    from gpuagent.snapshot.node import SourceStatus

EXIT_CONFIG_ERROR = 2  # also argparse's exit status for bad usage

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The config keys each command takes as flags (their help, metavar and env name come from the key table).
RUN_KEYS = tuple(key.name for key in KEYS)
SNAPSHOT_KEYS = ("backend", "scenario", "hostname", "nvml_timeout")
DEMO_WIRED = ("backend", "proc_root", "pod_resources_socket", "kubeconfig", "kubernetes_api", "hostname",
              "cgroup_root", "journal_path")  # what gpuagent demo sets itself (gpuagent.demo.run.WIRED_KEYS)
DEMO_KEYS = tuple(name for name in RUN_KEYS if name not in DEMO_WIRED)

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # bad usage (2) or --help/--version (0): return it rather than exit
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except ConfigError as err:
        print(shown(str(err)), file=sys.stderr)
        return EXIT_CONFIG_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuagent",
        description="Node-level GPU monitoring agent.",
        epilog="config keys (file key, env var, default):\n"
        + describe_keys()
        + "\nprecedence: flag > env > file > default",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuagent {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="poll the GPUs and serve /metrics and the API until stopped")
    _add_config_flags(run, RUN_KEYS)
    run.set_defaults(command=_run, keys=RUN_KEYS)

    demo = commands.add_parser(
        "demo", help="run the agent on a SIMULATED Kubernetes GPU node: the scenario's pods served by a "
        "kubelet and an API server of the demo's own (default scenario: an 8xH100 node with twelve pods)")
    _add_config_flags(demo, DEMO_KEYS)
    demo.set_defaults(command=_demo, keys=DEMO_KEYS)

    snapshot = commands.add_parser("snapshot", help="poll the GPUs once and print what was seen")
    _add_config_flags(snapshot, SNAPSHOT_KEYS)
    snapshot.add_argument("--format", choices=("json", "table"), default="json", help="output format")
    snapshot.set_defaults(command=_snapshot, keys=SNAPSHOT_KEYS)

    hints = commands.add_parser("hints", help="poll the GPUs once and print this node's scheduling hints")
    _add_config_flags(hints, SNAPSHOT_KEYS)
    hints.add_argument("--format", choices=("json", "table"), default="json", help="output format")
    hints.set_defaults(command=_hints, keys=SNAPSHOT_KEYS)

    check = commands.add_parser(
        "check-config", help="validate a config file (with env applied) and print the effective config"
    )
    check.add_argument("file", metavar="FILE", help="YAML config file")
    check.set_defaults(command=_check_config)

    add_report_parser(commands)  # gpuagent report: chargeback from Prometheus (gpuagent/report/cli.py)
    add_recommend_parser(commands)  # gpuagent recommend: right-sizing from Prometheus (gpuagent/recommend/)
    add_top_parser(commands)  # gpuagent top: the live view of a node or a cluster (gpuagent/top/cli.py)

    extender = commands.add_parser(
        "extender", help="serve kube-scheduler's extender verbs (filter, prioritize) from the agents' hints"
    )
    extender_config.add_flags(extender)
    extender.set_defaults(command=_extender)
    return parser


def _add_config_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"YAML config file (env {CONFIG_ENV})")
    for name in names:
        key = KEYS_BY_NAME[name]
        parser.add_argument(  # no type/choices: load_config validates, naming the flag in its errors
            key.flag,
            dest=key.name,
            metavar=key.metavar,
            default=None,
            help=f"{key.help} (key {key.name}, env {key.env}, default {key.default_text})",
        )


def load_from_args(args: argparse.Namespace) -> Config:
    """The Config for a parsed command line: its ``--config`` file, the env, its flags as overrides."""
    overrides = {name: getattr(args, name) for name in args.keys}
    return load_config(args.config, overrides=overrides)


class ShownFormatter(logging.Formatter):
    """Records whose outside names cannot forge a line or drive a terminal: every control, bidi character
    and separator shown as an escape (``gpuagent.untrusted.shown``), and a record of several lines (a
    traceback, a thread dump) with its continuation lines indented, so none reads as a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n  ".join(shown(line) for line in super().format(record).split("\n"))


CHATTY_LIBRARIES = ("httpx2", "httpx", "httpcore")  # a log line per request at INFO


def setup_logging(level: str) -> None:
    """One line per record on stderr, on the root logger; calling it again replaces our handler only."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if getattr(handler, "_gpuagent", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ShownFormatter(LOG_FORMAT))
    handler.addFilter(RepeatFilter())  # a storm of one error is a few lines and a count
    handler._gpuagent = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The API server's HTTP client logs every request at INFO ("HTTP Request: GET ... 200 OK"): a watch, the
    # publisher and the health writer made that a line a second. Its requests show at debug only; its
    # warnings and errors always.
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)


def one_shot_log_level(config: Config) -> str:
    """``snapshot`` and ``hints`` print their output and exit: start-up INFO lines ("NVML initialised")
    would land in the middle of a table on a terminal, so they log warnings and errors only, unless
    ``log_level`` was set explicitly (env or file)."""
    if "log_level" in config.sources:
        return config.agent.log_level
    return "warning"


def _run(args: argparse.Namespace) -> int:
    config = load_from_args(args)
    preflight.check(config)  # what check-config checks, so a config it passes starts
    setup_logging(config.agent.log_level)
    agent = importlib.import_module("gpuagent.agent")  # lazily: check-config must not load it

    log.info("starting: %s", config.summary())
    log.debug("configuration:\n%s", config.describe())
    return agent.run(config)


def _demo(args: argparse.Namespace) -> int:
    """``gpuagent demo``: ``gpuagent.demo.run`` starts the node's servers and runs the agent on them."""
    flags = {name: getattr(args, name) for name in args.keys}
    setup_logging(load_config(args.config, overrides=flags).agent.log_level)
    demo = importlib.import_module("gpuagent.demo.run")  # lazily: grpc and the simulator only here
    return demo.run(args.config, flags)  # type: ignore[no-any-return]


def _snapshot(args: argparse.Namespace) -> int:
    config = load_from_args(args)
    preflight.scenario(config)
    setup_logging(one_shot_log_level(config))
    agent = importlib.import_module("gpuagent.agent")
    from gpuagent.snapshot.views import to_jsonable

    snap = agent.poll_once(config)
    _say_without_pod_sources("snapshot", config, snap.sources)
    if args.format == "table":
        from gpuagent.cli_table import format_table

        text = format_table(snap)
    else:
        text = json.dumps(to_jsonable(snap), indent=2) + "\n"
    return _write(text)


def _hints(args: argparse.Namespace) -> int:
    """``gpuagent hints``: one poll pair, as ``snapshot``, then the hints /v1/hints would serve."""
    config = load_from_args(args)
    preflight.scenario(config)
    setup_logging(one_shot_log_level(config))
    agent = importlib.import_module("gpuagent.agent")
    snap = agent.poll_once(config)
    _say_without_pod_sources("hints", config, snap.sources)
    if snap.hints is None:
        log.error("no hints: computing them failed (see above)")
        return 1
    if args.format == "table":
        from gpuagent.hints.table import format_hints_table

        text = format_hints_table(snap.hints)
    else:
        from gpuagent.hints.codec import hints_to_jsonable

        text = json.dumps(hints_to_jsonable(snap.hints), indent=2) + "\n"
    return _write(text)


POD_SOURCES = {"pod_resources": "the kubelet's pod-resources socket", "api_server": "the API server"}
AGENT_PATHS = {"snapshot": "/v1/state", "hints": "/v1/hints"}


def without_pod_sources(command: str, config: Config, sources: Sequence[SourceStatus]) -> str | None:
    """The one line ``snapshot`` and ``hints`` print on stderr when no pod source answered their poll: why
    (none here, or each one's error), what that does to the output, and the running agent's endpoint that
    has the pods. A one-shot look from a shell on the node, without the kubelet socket or the API server
    the agent's deployment mounts, otherwise disagrees with that agent's ``/v1/hints`` and ``/v1/state``
    in silence (issue 30 item 5); None when a pod source answered."""
    found = {s.name: s for s in sources if s.name in POD_SOURCES}
    if any(s.ok for s in found.values()):
        return None
    why = []
    for name, what in POD_SOURCES.items():
        status = found.get(name)
        if status is not None:
            why.append(f"{what} failed ({status.error or 'no answer'})")
        elif name == "pod_resources":
            why.append(f"no kubelet pod-resources socket at {config.pods.pod_resources_socket}"
                       if config.pods.pod_resources_socket else "no kubelet pod-resources socket configured")
        else:
            why.append(f"the API server not used (kubernetes_api {config.kubeapi.kubernetes_api})")
    host, port = parse_listen(config.server.listen)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    scheme = "https" if config.server.web_config else "http"
    where = f"[{host}]" if ":" in host else host
    return shown(f"gpuagent {command}: no pod sources: {', '.join(why)}; so pods are known at most by the "
                 f"UIDs in their processes' cgroups, without names or allocations. The running agent has its "
                 f"pods: curl -s {scheme}://{where}:{port}{AGENT_PATHS[command]}")


def _say_without_pod_sources(command: str, config: Config, sources: Sequence[SourceStatus]) -> None:
    line = without_pod_sources(command, config, sources)
    if line is not None:
        print(line, file=sys.stderr, flush=True)


def _write(text: str) -> int:
    """``text`` on stdout; a reader that stopped early (piped into ``head``) is not an error of ours."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
    return 0


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    preflight.check(config)  # what run checks before it starts: policies, scenario, TLS files, token file
    print(f"ok: {args.file}")
    print(config.describe())
    return 0


def _extender(args: argparse.Namespace) -> int:
    """The cluster-side extender; its options are its own (``gpuagent.hints.extender_config``)."""
    options = extender_config.options_from_args(args)
    setup_logging(options.log_level)
    ssl_context = None
    if options.web_config:  # its listener's TLS, configured like the agent's
        from gpuagent.api.tls import load_web_config, server_ssl_context

        ssl_context = server_ssl_context(load_web_config(options.web_config))
    extender = importlib.import_module("gpuagent.hints.extender_serve")
    log.info("starting the extender: %s", ", ".join(f"{k}={v}" for k, v in options.as_dict().items()))
    return extender.run(options, ssl_context=ssl_context)  # type: ignore[no-any-return]
