"""``gpuagent recommend``: its arguments and what it does with them (wired into ``gpuagent.cli``).

Every bad argument, unreadable file, unwritable output and Prometheus failure ends in one line on stderr
and exit 2, before any query where it can be known before.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuagent.prom.cliargs import (
    add_access_arguments,
    add_output_arguments,
    add_price_arguments,
    add_source_arguments,
    guarded,
)
from gpuagent.prom.errors import ReportError
from gpuagent.recommend.formats import FORMATS
from gpuagent.untrusted import shown

DEFAULT_SINCE = "7d"
STEP_POINTS = 2016  # samples per workload over the range: 7 days at 5 minutes
SHARINGS = ("auto", "share", "mps", "mig")
_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*$")

EPILOG = """\
examples:
  gpuagent recommend --prometheus http://prometheus:9090
  gpuagent recommend --prometheus http://thanos-query:9090 --since 14d --prices prices.yaml \\
      --format html --output gpu-rightsizing.html --patch ./gpu-patches
  gpuagent recommend --prometheus http://prometheus:9090 --namespace serving --sharing mig --headroom 30%

Per workload (pods grouped by their owner: Deployment, StatefulSet, CronJob, Notebook, ...; other
workloads by unit or job name): SM use p50/p95/p99/max while it ran, memory p99 and peak, idle time,
throttling, memory-ladder stops, days seen. Recommendation: keep, release (idle), share (gpu-share +
gpu-memory), MIG profile, MPS, needs more, or too little history; the GPU-hours a week and cost it frees,
and the node pool's GPUs for the recommended packing (first-fit decreasing per GPU model).
"""


def add_recommend_parser(commands: Any) -> None:
    """Add the ``recommend`` command to ``commands`` (an argparse subparsers action)."""
    recommend = commands.add_parser(
        "recommend", help="right-size GPU workloads from their history in Prometheus",
        description="What each GPU workload should ask for, from what it used over a time range in "
                    "Prometheus (or anything that speaks its HTTP API), what that frees, and patches "
                    "that apply it.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = add_source_arguments(recommend, default_since=DEFAULT_SINCE)
    where.add_argument("--step", metavar="DURATION",
                       help=f"sampling step (default: about {STEP_POINTS} samples over the range, at least "
                            f"1m: 5m over 7d)")
    policy = recommend.add_argument_group("policy")
    policy.add_argument("--headroom", metavar="PERCENT", default="20%",
                        help="added to the SM percentile and the memory peak (default 20%%)")
    policy.add_argument("--percentile", metavar="P", default="99",
                        help="the percentile of SM use to size for, 50-100 (default 99)")
    policy.add_argument("--sharing", choices=SHARINGS, default="auto",
                        help="how a smaller workload shares a GPU: auto (MIG where the model has it, MPS for "
                             "steady use, else a time-slicing share), or always one (default auto)")
    policy.add_argument("--release-idle", metavar="PERCENT", default="80%",
                        help="idle this much of its allocated time: release (default 80%%)")
    policy.add_argument("--min-history", metavar="DURATION", default="1d",
                        help="less time holding GPUs than this: too little history (default 1d)")
    out = add_output_arguments(recommend, FORMATS)
    out.add_argument("--patch", metavar="DIR",
                     help="write one YAML patch per workload to change, and a kustomize Component, here")
    add_price_arguments(recommend)  # report's; a kWh price is read but unused: energy follows use
    add_access_arguments(recommend)
    recommend.set_defaults(command=run_recommend)


def run_recommend(args: argparse.Namespace) -> int:
    return guarded("recommend", _run, args)


def _run(args: argparse.Namespace) -> int:
    # Imported here: every gpuagent command builds this parser, only `recommend` needs the rest.
    from gpuagent.prom.cliargs import prices_from, progress_from, source_from, write_output
    from gpuagent.prom.timerange import default_step_seconds, parse_duration_seconds
    from gpuagent.recommend.collect import Request, collect
    from gpuagent.recommend.formats import renderer
    from gpuagent.recommend.model import Options
    from gpuagent.recommend.patches import write_patches

    render = renderer(args.format)  # before any query: html without matplotlib fails here, in one line
    options = Options(
        headroom=parse_percent(args.headroom, "--headroom", upper=1000.0, zero=True),
        percentile=_percentile(args.percentile),
        sharing=args.sharing,
        release_idle=parse_percent(args.release_idle, "--release-idle", upper=100.0),
        min_history_seconds=parse_duration_seconds(args.min_history, "--min-history"),
    )
    patch_dir = Path(args.patch) if args.patch else None
    if patch_dir is not None and patch_dir.exists() and not patch_dir.is_dir():
        raise ReportError(f"--patch: {patch_dir} is not a directory")
    source = source_from(args, time.time())
    step = (parse_duration_seconds(args.step, "--step") if args.step
            else default_step_seconds(source.time_range.seconds, STEP_POINTS))
    request = Request(source.time_range, step, source.chunk_seconds, source.matchers, source.namespaces,
                      prices_from(args), options)
    if request.prices.kwh is not None:
        print("gpuagent recommend: warning: the kWh price is not used: energy follows use, not allocation, "
              "so no energy is counted as freed", file=sys.stderr)
    if args.output or args.format != "table":  # the table's header says it
        print(shown(f"gpuagent recommend: reading series {{{', '.join(source.matchers)}}}"), file=sys.stderr)
    result = collect(source.client, request, progress_from(args))
    write_output(render(result), args.output)
    if args.output or args.format != "table":  # the table shows them itself
        for warning in result.warnings:
            print(shown(f"gpuagent recommend: warning: {warning}"), file=sys.stderr)
    if patch_dir is not None:
        written, skipped = write_patches(result.rows, patch_dir)
        for line in patch_summary(len(written), skipped, patch_dir):
            print(line, file=sys.stderr)
    return 0


def patch_summary(written: int, skipped: Sequence[tuple[Any, str]], directory: Path) -> list[str]:
    """What ``--patch`` says on stderr: the patches written and why the others got none; then the
    workloads refused for their names: one warning counting them, and each on a line of its own with why
    (the JSON lists them too, under ``patch_refused``). Names shown with their controls as escapes."""
    from gpuagent.recommend.patches import Refused

    refused = [f"  {row.stats.key}: {why}" for row, why in skipped if isinstance(why, Refused)]
    others = [f"{row.stats.key}: {why}" for row, why in skipped if not isinstance(why, Refused)]
    lines = [f"gpuagent recommend: {written} patch(es) in {directory}"
             + (f"; none for {len(others)} workload(s): " + "; ".join(others) if others else "")]
    if refused:
        lines.append(f"gpuagent recommend: warning: refused {len(refused)} workload(s) whose names "
                     f"Kubernetes would refuse, no patch written for them:")
        lines += refused
    return [shown(line) for line in lines]


def parse_percent(text: str, what: str, *, upper: float, zero: bool = False) -> float:
    """``20%`` or ``20`` as 0.2, in [0 or more, ``upper``] percent. A bare number under 1 is refused as
    ambiguous (``0.2``: a fifth of a percent, or 20 %?), as the agent's share annotations are."""
    match = _PERCENT_RE.match(text)
    if not match:
        raise ReportError(f"{what}: expected a percent like 20%, got {text!r}")
    number, sign = float(match.group(1)), match.group(2)
    if 0 < number < 1 and not sign:
        raise ReportError(f"{what}: ambiguous {text!r}: write {number * 100:g}% for {number * 100:g} "
                          f"percent, or {text}% for less than one percent")
    if not math.isfinite(number) or number > upper or (number == 0 and not zero):
        low = "0" if zero else "more than 0"
        raise ReportError(f"{what}: expected a percent from {low} to {upper:g}%, got {text!r}")
    return number / 100


def _percentile(text: str) -> float:
    try:
        value = float(text.strip().removeprefix("p"))
    except ValueError:
        raise ReportError(f"--percentile: expected a number from 50 to 100 like 99, got {text!r}") from None
    if not 50 <= value <= 100:
        raise ReportError(f"--percentile: expected a number from 50 to 100 like 99, got {text!r}")
    return value
