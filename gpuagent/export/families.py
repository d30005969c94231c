"""Building metric families for custom collectors.

Our families can mix label sets (a GPU series and its MIG-instance series share one family), so samples are
added by label set rather than with ``GaugeMetricFamily.add_metric``'s fixed label names. The sample name
is derived from the family type the way client_python's own families do it (``_total`` for counters,
``_info`` for info), so every encoder (ours in ``exposition``, client_python's) renders them correctly.

A :class:`Family` keeps its samples as parallel lists of formatted label sets (``{gpu="0",UUID="…"}``) and
numbers rather than client_python ``Sample`` tuples: building ~2,000 tuples and label dicts a scrape cost
more than encoding them. The label helpers (``labels.GpuLabels``) format a GPU's label set once per snapshot
and renderers extend it (``extend``, ``join``), so the encoder only joins strings; ``samples`` builds the
tuples (parsing the label text back) on demand for client_python's encoders and tests. Renderers of many
rows fill a family from whole columns (``put``: a list of label texts, often shared by several families,
and a list of values), their label texts kept across snapshots in a :class:`TextCache` keyed by what they
are made of, so a row costs a list element, not a call (see ``docs/exposition.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.samples import Sample

GAUGE, COUNTER, INFO = "gauge", "counter", "info"  # the family types renderers use most
_SAMPLE_SUFFIX = {"counter": "_total", "info": "_info"}
_CHECKED: dict[tuple[str, str], str] = {}  # (name, type) pairs already validated -> the sample name
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # our names are legacy ones (exposition's docstring)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE_SEQUENCE = re.compile(r'\\([\\n"])')
_UNESCAPED = {"\\": "\\", "n": "\n", '"': '"'}

Labels = Mapping[str, str] | str  # a label dict, or a label set already formatted by ``label_text``


class Family(Metric):
    """A metric family whose samples are (label text, value) rows; the encoder joins them without tuples.

    ``texts`` and ``values`` are parallel lists; ``names`` is None while every row uses the family's
    ``sample_name``, else the sample name of each row (summaries and histograms: ``_sum``, ``_bucket``, ...).
    ``error`` is the first label set that could not be formatted: the encoder then leaves the family out.
    A family is filled by its renderer, then only read: the encoder may remember its text.
    """

    # Slots: a scrape makes a hundred families or more, and an instance without a __dict__ is made faster.
    __slots__ = ("compared", "documentation", "encoded", "error", "name", "names", "sample_name", "stable",
                 "texts", "type", "unit", "values")

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        # Metric.__init__ is not called: it assigns ``samples``, which is a computed property here.
        sample_name = _CHECKED.get((name, typ))
        if sample_name is None:
            if not _LEGACY_NAME.match(name):
                raise ValueError(f"invalid metric name {name!r}")
            if typ not in METRIC_TYPES:
                raise ValueError(f"invalid metric type {typ!r} of {name}")
            sample_name = name + _SAMPLE_SUFFIX.get(typ, "")
            if len(_CHECKED) < 10_000:  # the code's own names: a few hundred
                _CHECKED[(name, typ)] = sample_name
        self.name = name
        self.documentation = documentation
        self.unit = ""
        self.type = typ
        self.sample_name = sample_name
        self.texts: list[str] = []
        self.values: list[float] = []
        self.names: list[str] | None = None
        self.error: Exception | None = None
        self.encoded: dict[str, str] = {}  # format -> text, filled by the encoder
        self.stable = False  # set by the guard: served again, unchanged, until the next snapshot
        self.compared = False  # set by Kept: made because its rows differ from the last of its name

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        """client_python's view of the rows (built on each access)."""
        if self.error is not None:
            raise self.error
        names = self.names or [self.sample_name] * len(self.values)
        rows = zip(names, self.texts, self.values, strict=True)
        return [Sample(name, parse_label_text(text), value) for name, text, value in rows]


def same_rows(a: Family, b: Family) -> bool:
    """Whether two families encode to the same text (neither with an error). Values compare as numbers,
    and equal numbers have one text (-0.0 is written 0.0, an int as its float)."""
    return (
        a.values == b.values
        and a.texts == b.texts
        and a.names == b.names
        and a.name == b.name
        and a.type == b.type
        and a.documentation == b.documentation
        and a.unit == b.unit
        and a.error is None
        and b.error is None
    )


def family(name: str, documentation: str, typ: str) -> Family:
    """A family named as it appears on the wire (``x_total`` for a counter, ``x_info`` for info)."""
    suffix = _SAMPLE_SUFFIX.get(typ, "")
    if suffix:
        if not name.endswith(suffix):
            raise ValueError(f"a {typ} family name must end in {suffix}: {name}")
        name = name[: -len(suffix)]
    return Family(name, documentation, typ)


def gauge(name: str, documentation: str) -> Family:
    return family(name, documentation, "gauge")


def counter(name: str, documentation: str) -> Family:
    return family(name, documentation, "counter")


def add(metric: Family, labels: Labels, value: float, *, suffix: str = "") -> None:
    """One sample; ``suffix`` is for the parts of summaries and histograms (``_sum``, ``_count``, ...).

    ``labels`` is a label set formatted by ``label_text`` (the fast path: renderers share a GPU's text), or
    a dict, formatted here. A dict that cannot be formatted (a value that is no string) leaves the family
    out of the scrape, alone (``Family.error``). A negative zero is stored as 0.0: the encoder's cache of
    formatted values cannot tell them apart.
    """
    value = float(value) + 0.0  # first: a value that is no number fails here, adding nothing; -0.0 reads 0.0
    if type(labels) is not str:
        try:
            labels = label_text(labels)
        except TypeError as error:
            if metric.error is None:
                metric.error = error
            return
    if not suffix and metric.names is None:  # the common case
        metric.values.append(value)
        metric.texts.append(labels)
        return
    if suffix:
        if metric.names is None:
            metric.names = [metric.sample_name] * len(metric.values)
        metric.names.append(metric.name + suffix)
    elif metric.names is not None:
        metric.names.append(metric.sample_name)
    metric.values.append(value)
    metric.texts.append(labels)


def add_known(metric: Family, labels: Labels, value: float | None) -> None:
    """One sample, or none when the value is unknown: ``None`` never renders as 0."""
    if value is not None:
        add(metric, labels, value)


def put(metric: Family, texts: list[str], values: list[float], names: list[str] | None = None) -> None:
    """Rows from parallel columns: the label text and the value of each row (ints and floats; the encoder
    formats both as floats) and, for summaries and histograms, the sample name of each. The lists become
    the family's, so the caller leaves them as they are (one list of label texts may serve several
    families). A value that is no number leaves the family out of the scrape when it is encoded, alone, as
    a label set that cannot be formatted does."""
    if metric.values or metric.names is not None:
        raise ValueError(f"put: {metric.name} already has rows")
    if len(texts) != len(values) or (names is not None and len(names) != len(values)):
        raise ValueError(f"put: {metric.name} has columns of different lengths")
    metric.texts = texts
    metric.values = values
    metric.names = names


def put_known(metric: Family, texts: list[str], values: list[float | None]) -> None:
    """``put``, leaving out the rows whose value is unknown (``None`` never renders as 0)."""
    put(metric, *_known(texts, values))


def _known(texts: list[str], values: list[float | None]) -> tuple[list[str], list[float]]:
    if None in values:
        rows = [(text, value) for text, value in zip(texts, values, strict=True) if value is not None]
        return [text for text, _ in rows], [value for _, value in rows]  # type: ignore[misc]
    return texts, values  # type: ignore[return-value]


class Kept:
    """The families one renderer made of the last snapshot, by name: a family whose rows come out the same
    again is that same object, whose text the encoder made already, and only a family whose rows changed is
    made anew. One per renderer; it holds one family per name the renderer uses.

    ``family`` is ``family()`` then ``put()``; ``known`` is ``family()`` then ``put_known()``.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, Family] = {}

    def family(
        self,
        name: str,
        documentation: str,
        typ: str,
        texts: list[str],
        values: list[float],
        names: list[str] | None = None,
    ) -> Family:
        last = self._last.get(name)
        if (
            last is not None
            and last.values == values
            and last.texts == texts
            and last.names == names
            and last.documentation == documentation
            and last.type == typ
            and last.error is None
        ):
            return last
        metric = family(name, documentation, typ)
        put(metric, texts, values, names)
        metric.compared = True
        self._last[name] = metric
        return metric

    def last(self, name: str) -> Family | None:
        """The family made last under ``name`` (for a renderer that knows its rows are the same)."""
        return self._last.get(name)

    def known(
        self, name: str, documentation: str, typ: str, texts: list[str], values: list[float | None]
    ) -> Family:
        return self.family(name, documentation, typ, *_known(texts, values))


def add_rows(metric: Family, rows: Iterable[tuple[str, float | None]]) -> None:
    """``add_known`` for each (label text, value) row: a whole family in one call."""
    texts, values = metric.texts, metric.values
    if metric.names is not None:
        raise ValueError(f"add_rows: {metric.name} has suffixed samples")
    for text, value in rows:
        if value is not None:
            value = float(value) + 0.0
            if type(text) is not str:
                raise TypeError(f"label set of {metric.name} must be text: {text!r}")
            values.append(value)
            texts.append(text)


def non_empty(metrics: Iterable[Metric]) -> list[Metric]:
    """Families that have samples: a family with nothing to report is left out, not rendered bare."""
    return [m for m in metrics if (m.values or m.error if isinstance(m, Family) else m.samples)]


def flag(value: bool) -> float:
    return 1.0 if value else 0.0


# --- label text --------------------------------------------------------------------------------------------


def label_text(labels: Mapping[str, str]) -> str:
    """``{name="value",...}`` in the dict's order, values escaped as both formats say; "" for no labels."""
    return label_pairs(tuple(labels.items())) if labels else ""


def label_pairs(pairs: tuple[tuple[str, str], ...]) -> str:
    """``label_text`` of (name, value) pairs: what renderers use for label sets of their own."""
    if not pairs:
        return ""
    try:
        return _texts[("l", pairs)]
    except TypeError:  # a value that cannot even be hashed: say which labels were wrong
        return _format(pairs)


def join(*texts: str) -> str:
    """Label sets concatenated in order (what ``{**a, **b}`` gives for label dicts whose names differ)."""
    return _texts[("j", *texts)]


def extend(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """``text``'s labels followed by the (name, value) ``pairs``."""
    return _texts[("e", text, pairs)] if pairs else text


def with_label(text: str, name: str, value: str) -> str:
    """``text``'s labels followed by one more (``name`` must be a valid label name)."""
    return _texts[("w", text, name, value)]


class TextCache(dict[Hashable, Any]):
    """Label texts (or tuples of them) keyed by what they are built from (``build(key)`` makes a missing
    one), kept across snapshots: label sets barely change between polls, so most are found here at the cost
    of one dict lookup instead of being formatted again.

    Bounded by the live series: ``rotate`` (once per snapshot rendered) empties it once it holds twice what
    one snapshot used, i.e. once as many texts are dead (churn: pods come and go) as alive; ``minimum``
    keeps a small node's churn from emptying it more often than every ``minimum`` new texts.
    """

    __slots__ = ("_build", "live", "minimum")

    def __init__(self, build: Callable[[Any], Any], *, minimum: int = 256) -> None:
        super().__init__()
        self._build = build
        self.live = 0  # texts one snapshot used, measured after the last emptying (0: not measured yet)
        self.minimum = minimum

    def __missing__(self, key: Any) -> Any:
        text = self[key] = self._build(key)
        return text

    def rotate(self) -> None:
        """A new snapshot is about to be rendered."""
        size = len(self)
        if not self.live:
            if size:  # measured once a snapshot has been rendered
                self.live = max(size, self.minimum)
        elif size > 2 * self.live:
            self.clear()
            self.live = 0


def _format(items: tuple[tuple[str, str], ...]) -> str:
    for name, value in items:
        # Plain str only: a str subclass (a str-mixin Enum) may format as "Health.OK".
        if type(name) is not str or type(value) is not str:
            raise TypeError(f"label names and values must be strings: {dict(items)!r}")
    return "{" + ",".join([f'{name}="{escape(value)}"' for name, value in items]) + "}"


def _join(texts: tuple[str, ...]) -> str:
    inner = [text[1:-1] for text in texts if text]
    return "{" + ",".join(inner) + "}" if inner else ""


_BUILD = {
    "l": lambda key: _format(key[1]),
    "j": lambda key: _join(key[1:]),
    "e": lambda key: _join((key[1], _format(key[2]))),
    "w": lambda key: _join((key[1], _format(((key[2], key[3]),)))),
}
_texts = TextCache(lambda key: _BUILD[key[0]](key))  # the helpers' texts, tagged by helper


def rotate_label_texts() -> None:
    """A new snapshot is about to be rendered: see ``TextCache``."""
    _texts.rotate()


def label_text_cache_size() -> int:
    """Label texts held, for tests and the footprint bench."""
    return len(_texts)


def escape(value: str) -> str:
    """A label value (both formats) or an OpenMetrics HELP text."""
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # the common case
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def parse_label_text(text: str) -> dict[str, str]:
    """The dict of a label set formatted by ``label_text`` (for ``Family.samples``)."""
    return {
        name: _ESCAPE_SEQUENCE.sub(lambda m: _UNESCAPED[m.group(1)], value)
        for name, value in _LABEL_PAIR.findall(text)
    }
