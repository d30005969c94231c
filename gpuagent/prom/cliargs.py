"""The command-line pieces shared by the commands that read Prometheus (``report``, ``recommend``).

Where and when (server, range, selection, chunks, timeout), prices, access (auth, TLS, headers) and output
(format, file, progress): their arguments, and what they turn into (a client, a time range, prices). Every
bad value ends in a :class:`ReportError` naming the argument, before any query is sent.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuagent.prom.client import Auth, PrometheusClient, parse_headers
from gpuagent.prom.errors import ReportError
from gpuagent.prom.prices import Prices, load_prices, parse_price
from gpuagent.prom.progress import Progress
from gpuagent.prom.queries import check_matchers, promql_string
from gpuagent.prom.timerange import TimeRange, parse_duration_seconds, resolve_range
from gpuagent.untrusted import shown

DEFAULT_CHUNK = "1d"
# The agents' scrape job as the shipped manifests name it: deploy/servicemonitor.yaml's job is its Service's
# name, and docs/runbooks.md asks a static scrape config to use the same. Any other target can expose series
# named gpuagent_* with any labels: reading only this job keeps their names out of reports and patches.
DEFAULT_JOB = "gpuagent"
_JOB_MATCHER_RE = re.compile(r'(?:^|[\s,{])job\s*(?:=~|!~|!=|=)\s*"')
EXIT_ERROR = 2


def guarded(command: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)``; a :class:`ReportError` becomes one line on stderr (``gpuagent <command>: ...``) and
    exit 2."""
    try:
        return run(args)
    except ReportError as err:
        print(shown(f"gpuagent {command}: {err}"), file=sys.stderr)  # errors quote what Prometheus said
        return EXIT_ERROR


def add_source_arguments(parser: argparse.ArgumentParser, *, default_since: str | None = None) -> Any:
    """The "where and when" group (without ``--step``, whose meaning is each command's); returned so a
    command can add to it. ``default_since``: the range when neither --since nor --start is given."""
    where = parser.add_argument_group("where and when")
    where.add_argument("--prometheus", metavar="URL", required=True,
                       help="base URL of the Prometheus HTTP API (the part before /api/v1)")
    where.add_argument("--since", metavar="DURATION",
                       help="the range ending at --end (default now): 7d, 12h, 1w"
                            + (f"; default {default_since}" if default_since else ""))
    parser.set_defaults(default_since=default_since)
    where.add_argument("--start", metavar="TIME",
                       help="start: RFC 3339 (2024-05-01T00:00:00Z), a date or Unix seconds")
    where.add_argument("--end", metavar="TIME", help="end (default now)")
    where.add_argument("--namespace", metavar="NS", action="append", default=[],
                       help="only this namespace (repeat for more); leaves out non-Kubernetes workloads")
    where.add_argument("--job", metavar="REGEX",
                       help=f"read only the series of this scrape job (a PromQL regex, matched whole): the "
                            f"agents' (default {DEFAULT_JOB}, as deploy/servicemonitor.yaml names it, unless "
                            f"--selector has a job matcher); '' reads every job's")
    where.add_argument("--selector", metavar="MATCHERS",
                       help='extra label matchers for every series read, e.g. cluster="prod"')
    where.add_argument("--chunk", metavar="DURATION", default=DEFAULT_CHUNK,
                       help=f"split the range into queries over at most this much time each, to bound the "
                            f"samples one query loads (default {DEFAULT_CHUNK})")
    where.add_argument("--timeout", metavar="SECONDS", default="60", help="per query (default 60)")
    return where


def add_output_arguments(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> Any:
    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=formats, default=formats[0],
                     help=f"output format (default {formats[0]})")
    out.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    out.add_argument("--progress", action="store_true",
                     help="print progress on stderr even when it is not a terminal (a terminal shows it)")
    out.add_argument("--quiet", action="store_true", help="no progress, even on a terminal")
    return out


def add_price_arguments(parser: argparse.ArgumentParser) -> None:
    money = parser.add_argument_group("prices")
    money.add_argument("--price-gpu-hour", metavar="PRICE",
                       help="price of one allocated GPU-hour (any model)")
    money.add_argument("--price-kwh", metavar="PRICE", help="price of one kWh of GPU energy")
    money.add_argument("--prices", metavar="FILE",
                       help="YAML/JSON price file: per GPU model, per kWh, currency")
    money.add_argument("--currency", metavar="CODE", help="currency printed with costs (e.g. EUR)")


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    auth = parser.add_argument_group("access")
    auth.add_argument("--username", help="basic auth user")
    auth.add_argument("--password-file", metavar="FILE", help="basic auth password, read from this file")
    auth.add_argument("--bearer-token-file", metavar="FILE", help="bearer token, read from this file")
    auth.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify an https:// server")
    auth.add_argument("--insecure-skip-verify", action="store_true",
                      help="do not verify the server's certificate")
    auth.add_argument("--header", metavar="'NAME: VALUE'", action="append", default=[],
                      help="extra HTTP header (repeatable), e.g. 'X-Scope-OrgID: team-a' for Mimir")


@dataclass(frozen=True)
class Source:
    """What the "where and when" and access arguments say: whom to ask, about when and what."""

    client: PrometheusClient
    time_range: TimeRange
    chunk_seconds: float
    matchers: tuple[str, ...]  # --job and --selector, applied to every series read
    namespaces: tuple[str, ...]


def source_from(args: argparse.Namespace, now_unix: float) -> Source:
    """The source the arguments name; also checks that ``--output`` can be written (before any query)."""
    since = args.since
    if since is None and args.start is None:
        since = getattr(args, "default_since", None)
    time_range = resolve_range(since, args.start, args.end, now_unix)
    chunk = parse_duration_seconds(args.chunk, "--chunk")
    timeout = parse_duration_seconds(args.timeout, "--timeout")
    namespaces = tuple(ns.strip() for ns in args.namespace)
    if any(not ns for ns in namespaces):
        raise ReportError("--namespace: expected a namespace name, got an empty one")
    matchers = job_matchers(getattr(args, "job", None), args.selector)
    auth = Auth(username=args.username, password=read_secret(args.password_file, "--password-file"),
                bearer_token=read_secret(args.bearer_token_file, "--bearer-token-file"),
                ca_file=args.ca_file, insecure_skip_verify=args.insecure_skip_verify,
                headers=parse_headers(args.header))
    if args.password_file and args.username is None:
        raise ReportError("--password-file needs --username")
    if args.output:
        check_writable(Path(args.output), "--output")
    client = PrometheusClient(args.prometheus, timeout_seconds=timeout, auth=auth)
    return Source(client, time_range, chunk, matchers, namespaces)


def job_matchers(job: str | None, selector: str | None) -> tuple[str, ...]:
    """The matchers ``--job`` and ``--selector`` make: the job's (``job=~"gpuagent"`` by default; none when
    the selector names a job itself and ``--job`` is not given, or for ``--job ''``), then the selector's."""
    extra = (check_matchers(selector),) if selector else ()
    if job is None:
        job = "" if extra and _JOB_MATCHER_RE.search(extra[0]) else DEFAULT_JOB
    return ((f'job=~"{promql_string(job)}"',) if job else ()) + extra


def prices_from(args: argparse.Namespace) -> Prices:
    gpu_hour = None if args.price_gpu_hour is None else parse_price(args.price_gpu_hour, "--price-gpu-hour")
    kwh = None if args.price_kwh is None else parse_price(args.price_kwh, "--price-kwh")
    prices = load_prices(args.prices, gpu_hour, kwh)
    if args.currency is not None:
        prices = replace(prices, currency=args.currency.strip())
    return prices


def progress_from(args: argparse.Namespace) -> Progress:
    """Progress on stderr: on a terminal (in place) unless ``--quiet``; elsewhere with ``--progress``."""
    show = not args.quiet and (args.progress or sys.stderr.isatty())
    return Progress(sys.stderr if show else None, in_place=sys.stderr.isatty())


def write_output(text: str, path: str | None) -> None:
    """``text`` to the file ``path``, or to stdout when None."""
    if path:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as err:
            raise ReportError(f"--output: cannot write {path}: {err.strerror or err}") from None
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # piped into e.g. head, which stopped reading
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def read_secret(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ReportError(f"{what}: cannot read {path}: {err.strerror or err}") from None


def check_writable(path: Path, what: str) -> None:
    """Fail before the queries, not after them, when ``path`` cannot be written."""
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ReportError(f"{what}: {path} is a directory")
    if not directory.is_dir():
        raise ReportError(f"{what}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReportError(f"{what}: cannot write {path} (permission denied)")
