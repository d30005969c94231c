"""Text encoders that keep each sample's label order: dcgm-exporter's ``gpu, UUID, pci_bus_id, device, ...``.

client_python's encoders print label names sorted (``DCGM_FI_DRIVER_VERSION="…",Hostname="…",UUID="…",
device=…``). Prometheus does not care, but dashboards' users, ``grep`` and scripts written against
dcgm-exporter's output do. These are client_python's text 0.0.4 and OpenMetrics 1.0 encoders with that one
difference: same family munging (``_total``/``_info`` names, ``untyped``, ``_created`` moved out in 0.0.4),
same value formatting, label values escaped exactly as both formats say (``\\``, ``"``, newline). Not
rendered: exemplars and native histograms (the agent emits neither), UTF-8 metric names (ours are legacy).

A :class:`~gpuagent.export.families.Family`'s rows are label text already, so a line is a join. Caches: each
family's encoded bytes per format (on the family: the guard serves a family again, with its bytes, for as
long as its rows stay the same), so a body is one join of bytes; each family's HELP/TYPE lines, by name;
formatted values, bounded by the live series (``rotate_caches``, called by the guard for each new snapshot,
drops what the snapshot before last used). Sizes: ``cache_sizes``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from gpuagent.export.families import Family, escape, label_text

log = logging.getLogger(__name__)

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_TEXT_NAME_SUFFIX = {"counter": "_total", "info": "_info"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")  # moved to gauges of their own in text 0.0.4
TEXT, OPENMETRICS = "text", "openmetrics"


EOF = b"# EOF\n"  # the end of an OpenMetrics exposition


def generate_text(registry: Collector) -> bytes:
    """Prometheus text format 0.0.4."""
    fmt = Lines()
    return b"".join([encode_family(TEXT, m, fmt) for m in registry.collect()])


def generate_openmetrics(registry: Collector) -> bytes:
    """OpenMetrics text format 1.0."""
    fmt = Lines()
    out = [encode_family(OPENMETRICS, m, fmt) for m in registry.collect()]
    out.append(EOF)
    return b"".join(out)


def encode_family(kind: str, metric: Metric, fmt: Lines) -> bytes:
    """One family's text (UTF-8), or nothing when it cannot be encoded (a label value that is not a string,
    a value that is not a number): a renderer's bug costs that family, never the whole scrape.

    A :class:`Family` remembers its bytes per format: a family served again (the same snapshot's, or one
    the guard kept from an earlier snapshot because its rows are the same) costs nothing to encode.
    """
    if isinstance(metric, Family):
        encoded = metric.encoded.get(kind)
        if encoded is None:
            encoded = metric.encoded[kind] = _encode(kind, metric, fmt)
        return encoded
    return _encode(kind, metric, fmt)


def _encode(kind: str, metric: Metric, fmt: Lines) -> bytes:
    try:
        if isinstance(metric, Family) and (kind == OPENMETRICS or not _moves(metric)):
            text = _header(kind, metric) + "".join(fmt.rows(metric))  # a family's lines are the same in both
        elif kind == TEXT:
            text = _text_family(metric, fmt)
        else:
            text = _openmetrics_family(metric, fmt)
    except Exception as error:
        if metric.name not in _UNENCODABLE:
            _UNENCODABLE.add(metric.name)
            log.error("family %s cannot be encoded and is left out: %r", metric.name, error)
        return b""
    return text.encode("utf-8")


def _moves(metric: Family) -> bool:
    """Whether the 0.0.4 text format moves some of a family's samples to gauges of their own."""
    return metric.names is not None and any(name.endswith(_OPENMETRICS_ONLY) for name in set(metric.names))


_UNENCODABLE: set[str] = set()  # families already logged as unencodable: one line each, not one per scrape


def _text_family(metric: Metric, fmt: Lines) -> str:
    out = [_header(TEXT, metric)]
    moved: dict[str, list[str]] = {}
    for sample_name, line in _named_lines(metric, fmt, _text_timestamp):
        if sample_name.endswith(_OPENMETRICS_ONLY):  # rare: only then find which one
            suffix = next((s for s in _OPENMETRICS_ONLY if sample_name == metric.name + s), None)
            if suffix is not None:
                moved.setdefault(suffix, []).append(line)
                continue
        out.append(line)
    for suffix, lines in sorted(moved.items()):
        out.append(f"# HELP {metric.name}{suffix} {_escape_help_text(metric.documentation)}\n")
        out.append(f"# TYPE {metric.name}{suffix} gauge\n")
        out.extend(lines)
    return "".join(out)


def _openmetrics_family(metric: Metric, fmt: Lines) -> str:
    out = [_openmetrics_header(metric)]
    out.extend(line for _, line in _named_lines(metric, fmt, _openmetrics_timestamp))
    return "".join(out)


def _header(kind: str, metric: Metric) -> str:
    """The HELP and TYPE (and UNIT) lines of a family, made once per name, help, type and unit."""
    key = (kind, metric.name, metric.documentation, metric.type, metric.unit)
    text = _HEADERS.get(key)
    if text is None:
        if kind == TEXT:
            name = metric.name + _TEXT_NAME_SUFFIX.get(metric.type, "")
            text = (f"# HELP {name} {_escape_help_text(metric.documentation)}\n"
                    f"# TYPE {name} {_TEXT_TYPES.get(metric.type, metric.type)}\n")
        else:
            text = _openmetrics_header(metric)
        if len(_HEADERS) < 10_000:  # the code's own families: a few hundred
            _HEADERS[key] = text
    return text


_HEADERS: dict[tuple[str, str, str, str, str], str] = {}


def _openmetrics_header(metric: Metric) -> str:
    out = f"# HELP {metric.name} {escape(metric.documentation)}\n# TYPE {metric.name} {metric.type}\n"
    return out + f"# UNIT {metric.name} {metric.unit}\n" if metric.unit else out


def _named_lines(
    metric: Metric, fmt: Lines, timestamp: Callable[[float], str]
) -> Iterator[tuple[str, str]]:
    """(sample name, line) of each sample: a :class:`Family`'s rows, or client_python samples."""
    if isinstance(metric, Family):
        pieces = fmt.rows(metric)
        lines = ["".join(pieces[start:start + 5]) for start in range(0, len(pieces), 5)]
        yield from zip(metric.names or (), lines, strict=True)
        return
    for sample in metric.samples:
        yield sample.name, fmt.line(sample, timestamp)


def choose_encoder(accept_header: str | None) -> tuple[Callable[[Collector], bytes], str]:
    """OpenMetrics when the scraper accepts it (as Prometheus does by default), else text 0.0.4."""
    if wants_openmetrics(accept_header):
        return generate_openmetrics, CONTENT_TYPE_OPENMETRICS
    return generate_text, CONTENT_TYPE_TEXT


def wants_openmetrics(accept_header: str | None) -> bool:
    return any(
        accepted.split(";")[0].strip() == "application/openmetrics-text"
        for accepted in (accept_header or "").split(",")
    )


class _Values(dict[float, str]):
    """Formatted values of one snapshot's families: most values repeat (0, 1, limits, totals), each is
    formatted once (``sample_value``). ``rotate`` (a new snapshot) starts a new generation that takes over
    what the previous one formatted, so the cache holds at most the distinct values of the last two
    snapshots. -0.0 is the same key as 0.0 here, and is written 0.0."""

    previous: dict[float, str] = {}

    def __missing__(self, value: float) -> str:
        text = self.previous.get(value)
        if text is None:
            if type(value) is float and -_INF < value < 1e6:  # the common case, inline
                text = repr(value + 0.0)  # -0.0 reads 0.0
            else:
                text = sample_value(value)
        self[value] = text
        return text


def sample_value(value: float) -> str:
    """A sample's value as client_python writes it (``floatToGoString``): ``repr`` of the float below 1e6,
    Go's exponent form from there (``1.234567e+06``), ``+Inf``, ``-Inf``, ``NaN``; an int or a bool as its
    float (``3`` as ``3.0``); -0.0 as 0.0. A whole number of 7 to 16 digits (bytes, counts, mJ) is written
    from its digits, without ``repr``. Anything else raises ``TypeError``: the encoder then leaves that
    family out."""
    if type(value) is int and -_EXACT < value < _EXACT:  # an int a float holds exactly
        return f"{value}.0" if value < 1_000_000 else _go_exponent(str(value))
    if type(value) is not float:
        if not isinstance(value, (int, float)):
            raise TypeError(f"a sample value must be a number, not {value!r}")
        value = float(value)
    value += 0.0
    if -_INF < value < 1e6:
        return repr(value)
    if 1e6 <= value < 1e16:  # Go's exponent form of repr's digits (repr has no exponent below 1e16)
        if value.is_integer():  # repr writes its digits, then ".0"
            return _go_exponent(str(int(value)))
        text = repr(value)
        dot = text.index(".")
        return _go_exponent(text[:dot], text[dot + 1:])
    return floatToGoString(value)  # +Inf, -Inf, NaN, repr's own exponents


def _go_exponent(whole: str, fraction: str = "") -> str:
    """floatToGoString's form of a number of 7 to 16 ``whole`` digits and ``fraction`` digits."""
    return f"{whole[0]}.{whole[1:]}{fraction}".rstrip("0.") + _EXPONENTS[len(whole)]


_EXACT = 2**53  # ints below this (in magnitude) are floats exactly
_EXPONENTS = {n: f"e+{n - 1:02d}" for n in range(7, 17)}  # by the number of digits
_INF = float("inf")
_VALUES = _Values()


def rotate_caches() -> None:
    """A new snapshot is being rendered: values only the one before last used are dropped."""
    global _VALUES
    fresh = _Values()
    fresh.previous = _VALUES
    _VALUES.previous = {}  # two generations, never a chain
    _VALUES = fresh


def cache_sizes() -> dict[str, int]:
    """What the encoder's caches hold (both generations of values), for tests and the footprint bench."""
    return {"values": len(_VALUES) + len(_VALUES.previous), "headers": len(_HEADERS)}


class Lines:
    """Sample lines of one scrape: a :class:`Family`'s rows are already label text; values are formatted
    through the snapshot's value cache."""

    __slots__ = ("_keep", "_labels")

    def __init__(self) -> None:
        # client_python samples' label dicts, by identity: ``_keep`` holds them, so no id is reused.
        self._labels: dict[int, str] = {}
        self._keep: list[dict[str, str]] = []

    @staticmethod
    def rows(metric: Family) -> list[str]:
        """The pieces of a family's lines (name, label text, " ", value, newline for each row), to be
        joined: laid out by slice assignments, so a row costs no string of its own and no bytecode."""
        if metric.error is not None:
            raise metric.error
        texts, values = metric.texts, metric.values
        if len(texts) != len(values) or (metric.names is not None and len(metric.names) != len(values)):
            raise ValueError(f"{metric.name}: columns of different lengths")
        pieces = [metric.sample_name, "", " ", "", "\n"] * len(values)
        if metric.names is not None:
            pieces[0::5] = metric.names
        pieces[1::5] = texts
        pieces[3::5] = map(_VALUES.__getitem__, values)
        return pieces

    def line(self, sample: Sample, timestamp: Callable[[float], str]) -> str:
        labels = sample.labels
        text = self._labels.get(id(labels))
        if text is None:
            text = self._labels[id(labels)] = label_text(labels)
            self._keep.append(labels)
        # -0.0 == 0.0: a cached "0.0" must not answer for client_python's -0.0, which it writes "-0.0"
        value = _VALUES[sample.value] if sample.value else floatToGoString(sample.value)
        if sample.timestamp is None:
            return f"{sample.name}{text} {value}\n"
        return f"{sample.name}{text} {value} {timestamp(float(sample.timestamp))}\n"


def _escape_help_text(value: str) -> str:
    """A HELP text in the 0.0.4 format, where a double quote stays as it is."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _text_timestamp(seconds: float) -> str:
    return str(int(seconds * 1000))  # milliseconds in text 0.0.4


def _openmetrics_timestamp(seconds: float) -> str:
    return floatToGoString(seconds)
