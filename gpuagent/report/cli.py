"""``gpuagent report``: its arguments and what it does with them (wired into ``gpuagent.cli``).

Every bad argument, unreadable file and Prometheus failure ends in one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuagent.report.errors import ReportError
from gpuagent.report.formats import FORMATS

EXIT_REPORT_ERROR = 2
DEFAULT_CHUNK = "1d"

EPILOG = """\
examples:
  gpuagent report --prometheus http://prometheus:9090 --since 7d
  gpuagent report --prometheus http://thanos-query:9090 --start 2024-05-01 --end 2024-06-01 \\
      --prices prices.yaml --format html --output may.html
  gpuagent report --prometheus https://mimir/prometheus --header 'X-Scope-OrgID: gpu' --since 30d --format csv

Figures are the increase of the agents' accounting counters over the range (gpuagent_pod_gpu_*_total):
GPU-hours allocated, busy and idle, memory GiB-hours, energy kWh; efficiency = busy / allocated; cost =
allocated GPU-hours x the GPU-hour price of the GPU's model + kWh x the kWh price.
"""


def add_report_parser(commands: Any) -> None:
    """Add the ``report`` command to ``commands`` (an argparse subparsers action)."""
    report = commands.add_parser(
        "report", help="GPU chargeback per namespace and pod, from the accounting counters in Prometheus",
        description="GPU-hours allocated and busy, efficiency, idle GPU-hours, memory GiB-hours, energy and "
                    "cost per namespace and pod over a time range, read from Prometheus (or anything that "
                    "speaks its HTTP API: Thanos, Mimir, Cortex, VictoriaMetrics).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = report.add_argument_group("where and when")
    where.add_argument("--prometheus", metavar="URL", required=True,
                       help="base URL of the Prometheus HTTP API (the part before /api/v1)")
    where.add_argument("--since", metavar="DURATION",
                       help="the range ending at --end (default now): 7d, 12h, 1w")
    where.add_argument("--start", metavar="TIME",
                       help="start: RFC 3339 (2024-05-01T00:00:00Z), a date or Unix seconds")
    where.add_argument("--end", metavar="TIME", help="end (default now)")
    where.add_argument("--namespace", metavar="NS", action="append", default=[],
                       help="only this namespace (repeat for more); leaves out non-Kubernetes workloads")
    where.add_argument("--selector", metavar="MATCHERS",
                       help='extra label matchers for every series read, e.g. cluster="prod"')
    where.add_argument("--step", metavar="DURATION",
                       help="efficiency timeline step (default: about 120 points, at least 1m)")
    where.add_argument("--chunk", metavar="DURATION", default=DEFAULT_CHUNK,
                       help=f"split totals into queries over at most this much time each, to bound the "
                            f"samples one query loads (default {DEFAULT_CHUNK})")
    where.add_argument("--timeout", metavar="SECONDS", default="60", help="per query (default 60)")

    out = report.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    out.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    out.add_argument("--progress", action="store_true",
                     help="print progress on stderr even when it is not a terminal (a terminal shows it)")
    out.add_argument("--quiet", action="store_true", help="no progress, even on a terminal")

    money = report.add_argument_group("prices")
    money.add_argument("--price-gpu-hour", metavar="PRICE",
                       help="price of one allocated GPU-hour (any model)")
    money.add_argument("--price-kwh", metavar="PRICE", help="price of one kWh of GPU energy")
    money.add_argument("--prices", metavar="FILE",
                       help="YAML/JSON price file: per GPU model, per kWh, currency")
    money.add_argument("--currency", metavar="CODE", help="currency printed with costs (e.g. EUR)")

    auth = report.add_argument_group("access")
    auth.add_argument("--username", help="basic auth user")
    auth.add_argument("--password-file", metavar="FILE", help="basic auth password, read from this file")
    auth.add_argument("--bearer-token-file", metavar="FILE", help="bearer token, read from this file")
    auth.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify an https:// server")
    auth.add_argument("--insecure-skip-verify", action="store_true",
                      help="do not verify the server's certificate")
    auth.add_argument("--header", metavar="'NAME: VALUE'", action="append", default=[],
                      help="extra HTTP header (repeatable), e.g. 'X-Scope-OrgID: team-a' for Mimir")
    report.set_defaults(command=run_report)


def run_report(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ReportError as err:
        print(f"gpuagent report: {err}", file=sys.stderr)
        return EXIT_REPORT_ERROR


def _run(args: argparse.Namespace) -> int:
    # Imported here: every gpuagent command builds this parser, only `report` needs the rest.
    from gpuagent.report.collect import Request, collect
    from gpuagent.report.formats import renderer
    from gpuagent.report.prices import load_prices, parse_price
    from gpuagent.report.progress import Progress
    from gpuagent.report.prometheus import Auth, PrometheusClient, parse_headers
    from gpuagent.report.queries import check_matchers
    from gpuagent.report.timerange import default_step_seconds, parse_duration_seconds, resolve_range

    now = time.time()
    time_range = resolve_range(args.since, args.start, args.end, now)
    step = (parse_duration_seconds(args.step, "--step") if args.step
            else default_step_seconds(time_range.seconds))
    chunk = parse_duration_seconds(args.chunk, "--chunk")
    timeout = parse_duration_seconds(args.timeout, "--timeout")
    gpu_hour = None if args.price_gpu_hour is None else parse_price(args.price_gpu_hour, "--price-gpu-hour")
    kwh = None if args.price_kwh is None else parse_price(args.price_kwh, "--price-kwh")
    prices = load_prices(args.prices, gpu_hour, kwh)
    if args.currency is not None:
        prices = replace(prices, currency=args.currency.strip())
    namespaces = tuple(ns.strip() for ns in args.namespace)
    if any(not ns for ns in namespaces):
        raise ReportError("--namespace: expected a namespace name, got an empty one")
    matchers = (check_matchers(args.selector),) if args.selector else ()
    auth = Auth(username=args.username, password=_read_secret(args.password_file, "--password-file"),
                bearer_token=_read_secret(args.bearer_token_file, "--bearer-token-file"),
                ca_file=args.ca_file, insecure_skip_verify=args.insecure_skip_verify,
                headers=parse_headers(args.header))
    if args.password_file and args.username is None:
        raise ReportError("--password-file needs --username")
    if args.output:
        _check_writable(Path(args.output))
    client = PrometheusClient(args.prometheus, timeout_seconds=timeout, auth=auth)

    show = not args.quiet and (args.progress or sys.stderr.isatty())
    progress = Progress(sys.stderr if show else None, in_place=sys.stderr.isatty())
    report = collect(client, Request(time_range, step, chunk, matchers, namespaces, prices), progress)
    text = renderer(args.format)(report)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise ReportError(f"--output: cannot write {args.output}: {err.strerror or err}") from None
    else:
        write_stdout(text)
    if args.output or args.format != "table":  # the table shows them itself
        for warning in report.warnings:
            print(f"gpuagent report: warning: {warning}", file=sys.stderr)
    return 0


def _read_secret(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ReportError(f"{what}: cannot read {path}: {err.strerror or err}") from None


def _check_writable(path: Path) -> None:
    """Fail before the queries, not after them, when the output cannot be written."""
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ReportError(f"--output: {path} is a directory")
    if not directory.is_dir():
        raise ReportError(f"--output: no directory {directory}")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReportError(f"--output: cannot write {path} (permission denied)")


def write_stdout(text: str) -> None:
    """``text`` on stdout; a reader that stopped reading (``| head``) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # piped into e.g. head, which stopped reading
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
