"""``gpuagent report``: its arguments and what it does with them (wired into ``gpuagent.cli``).

Every bad argument, unreadable file and Prometheus failure ends in one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpuagent.prom.cliargs import (
    add_access_arguments,
    add_output_arguments,
    add_price_arguments,
    add_source_arguments,
    guarded,
)
from gpuagent.report.formats import FORMATS
from gpuagent.untrusted import shown

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
    where = add_source_arguments(report)
    where.add_argument("--step", metavar="DURATION",
                       help="efficiency timeline step (default: about 120 points, at least 1m)")
    add_output_arguments(report, FORMATS)
    add_price_arguments(report)
    add_access_arguments(report)
    report.set_defaults(command=run_report)


def run_report(args: argparse.Namespace) -> int:
    return guarded("report", _run, args)


def _run(args: argparse.Namespace) -> int:
    # Imported here: every gpuagent command builds this parser, only `report` needs the rest.
    from gpuagent.prom.cliargs import prices_from, progress_from, source_from, write_output
    from gpuagent.prom.timerange import default_step_seconds, parse_duration_seconds
    from gpuagent.report.collect import Request, collect
    from gpuagent.report.formats import renderer

    render = renderer(args.format)  # before any query: html without matplotlib fails here, in one line
    source = source_from(args, time.time())
    step = (parse_duration_seconds(args.step, "--step") if args.step
            else default_step_seconds(source.time_range.seconds))
    prices = prices_from(args)
    request = Request(source.time_range, step, source.chunk_seconds, source.matchers, source.namespaces,
                      prices)
    if args.output or args.format != "table":  # the table's header says it
        print(shown(f"gpuagent report: reading series {{{', '.join(source.matchers)}}}"), file=sys.stderr)
    report = collect(source.client, request, progress_from(args))
    write_output(render(report), args.output)
    if args.output or args.format != "table":  # the table shows them itself
        for warning in report.warnings:
            print(shown(f"gpuagent report: warning: {warning}"), file=sys.stderr)
    return 0
