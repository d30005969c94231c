"""Time ranges of the commands that read Prometheus: ``--since 7d`` or ``--start``/``--end``, steps, and the
chunks queries are split into (pure functions; ``now_unix`` is injected)."""

from __future__ import annotations

import datetime
import itertools
import math
import re
from dataclasses import dataclass

from gpuagent.prom.errors import ReportError

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION_RE = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$")
_PART_RE = re.compile(r"(\d+)(ms|[smhdwy])")


def parse_duration_seconds(text: str, what: str) -> float:
    """A Prometheus-style duration (``30s``, ``5m``, ``1h30m``, ``7d``, ``2w``; a bare number is seconds)
    in seconds, > 0. ``what`` names the argument in the error."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        if not _DURATION_RE.match(value):
            raise ReportError(f"{what}: expected a duration like 30s, 15m, 6h, 7d or 1h30m, "
                              f"got {text!r}") from None
        seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _PART_RE.findall(value))
    if not math.isfinite(seconds) or seconds <= 0:
        raise ReportError(f"{what}: expected a duration > 0, got {text!r}")
    return seconds


def parse_time_unix(text: str, what: str) -> float:
    """A point in time: Unix seconds (``1714521600``), RFC 3339 (``2024-05-01T00:00:00Z``, with an offset,
    or without one meaning UTC), or a date (``2024-05-01``, midnight UTC)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ReportError(f"{what}: expected Unix seconds, an RFC 3339 time (2024-05-01T00:00:00Z) or "
                              f"a date (2024-05-01), got {text!r}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        seconds = parsed.timestamp()
    if not math.isfinite(seconds) or seconds < 0:
        raise ReportError(f"{what}: expected a time after 1970, got {text!r}")
    return seconds


@dataclass(frozen=True)
class TimeRange:
    """``[start_unix, end_unix]``, end after start."""

    start_unix: float
    end_unix: float

    @property
    def seconds(self) -> float:
        return self.end_unix - self.start_unix


def resolve_range(since: str | None, start: str | None, end: str | None, now_unix: float) -> TimeRange:
    """The range the arguments name: ``since`` before ``end`` (default now), or ``start`` to ``end``.
    Times are kept to the millisecond, the precision of Prometheus's API."""
    if since is not None and start is not None:
        raise ReportError("--since and --start name the range twice: give one of them")
    if since is None and start is None:
        raise ReportError("no time range: give --since (e.g. --since 7d) or --start (and --end)")
    end_unix = _ms(parse_time_unix(end, "--end") if end is not None else now_unix)
    if since is not None:
        start_unix = _ms(end_unix - parse_duration_seconds(since, "--since"))
    else:
        assert start is not None
        start_unix = _ms(parse_time_unix(start, "--start"))
    if end_unix > now_unix + 60:
        raise ReportError(f"--end: {format_time(end_unix)} is in the future (now is {format_time(now_unix)})")
    if start_unix >= end_unix:
        raise ReportError(f"--start: {format_time(start_unix)} is not before the end {format_time(end_unix)}")
    return TimeRange(start_unix, end_unix)


def chunks(time_range: TimeRange, chunk_seconds: float) -> list[TimeRange]:
    """``time_range`` cut into adjacent pieces of at most ``chunk_seconds``, the last one shorter.

    A counter's ``increase()`` over each piece, summed, is close to its increase over the whole range but
    not equal: Prometheus extrapolates each piece's first and last samples to the piece's edges, so the
    increase between the last sample of one piece and the first of the next is estimated from the rates on
    either side rather than read."""
    count = max(1, math.ceil(round(time_range.seconds / chunk_seconds, 9)))
    edges = [_ms(time_range.start_unix + i * chunk_seconds) for i in range(count)] + [time_range.end_unix]
    return [TimeRange(a, b) for a, b in itertools.pairwise(edges) if b > a]


def promql_duration(seconds: float) -> str:
    """A range for a PromQL selector: whole milliseconds (``[30500ms]``), or whole seconds when exact."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ReportError(f"a range of {seconds} s is too short for Prometheus (at least 1 ms)")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


_NICE_STEPS_SECONDS = (60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400,
                       2 * 86400, 7 * 86400)


def default_step_seconds(range_seconds: float, points: int = 120) -> float:
    """A step giving about ``points`` points over the range, rounded up to a round duration, at least a
    minute (a counter's ``increase`` over a step needs two scrapes in it)."""
    wanted = range_seconds / points
    return next((s for s in _NICE_STEPS_SECONDS if s >= wanted), _NICE_STEPS_SECONDS[-1])


def format_time(unix: float) -> str:
    """``2024-05-01T00:00:00Z`` (milliseconds only when there are some)."""
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond // 1000:03d}"
    return text + "Z"


def format_duration(seconds: float) -> str:
    """``7d``, ``1h30m``, ``45s``, ``1.5s``: the largest whole units."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    remaining = round(seconds)
    parts = []
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if remaining >= size:
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    return "".join(parts) or "0s"


def _ms(unix: float) -> float:
    return round(unix * 1000) / 1000
