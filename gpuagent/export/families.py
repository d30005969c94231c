"""Building metric families for custom collectors.

Our families can mix label sets (a GPU series and its MIG-instance series share one family), so samples are
added by label dict rather than with ``GaugeMetricFamily.add_metric``'s fixed label names. The sample name
is derived from the family type the way client_python's own families do it (``_total`` for counters,
``_info`` for info), so every encoder (ours in ``exposition``, client_python's) renders them correctly.

A :class:`Family` keeps its samples as parallel lists of label dicts and float values rather than
client_python ``Sample`` tuples: building ~2,000 tuples a scrape cost more than encoding them. Our encoder
reads the lists directly; ``samples`` builds the tuples on demand for client_python's encoders and tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.samples import Sample

_SAMPLE_SUFFIX = {"counter": "_total", "info": "_info"}
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # our names are legacy ones (exposition's docstring)


class Family(Metric):
    """A metric family whose samples are (labels, value) rows; the encoder formats them without tuples.

    ``labels`` and ``values`` are parallel lists; ``names`` is None while every row uses the family's
    ``sample_name``, else the sample name of each row (summaries and histograms: ``_sum``, ``_bucket``, ...).
    A family is filled by its renderer, then only read: the encoder may remember its text.
    """

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        # Metric.__init__ is not called: it assigns ``samples``, which is a computed property here.
        if not _LEGACY_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if typ not in METRIC_TYPES:
            raise ValueError(f"invalid metric type {typ!r} of {name}")
        self.name = name
        self.documentation = documentation
        self.unit = ""
        self.type = typ
        self.sample_name = name + _SAMPLE_SUFFIX.get(typ, "")
        self.labels: list[Mapping[str, str]] = []
        self.values: list[float] = []
        self.names: list[str] | None = None
        self.encoded: dict[str, str] = {}  # format -> text, filled by the encoder
        self.stable = False  # set by the guard: served again, unchanged, until the next snapshot

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        """client_python's view of the rows (built on each access)."""
        names = self.names or [self.sample_name] * len(self.values)
        rows = zip(names, self.labels, self.values, strict=True)
        return [Sample(name, dict(labels), value) for name, labels, value in rows]


def family(name: str, documentation: str, typ: str) -> Family:
    """A family named as it appears on the wire (``x_total`` for a counter, ``x_info`` for info)."""
    suffix = _SAMPLE_SUFFIX.get(typ, "")
    if suffix and not name.endswith(suffix):
        raise ValueError(f"a {typ} family name must end in {suffix}: {name}")
    return Family(name.removesuffix(suffix), documentation, typ)


def gauge(name: str, documentation: str) -> Family:
    return family(name, documentation, "gauge")


def counter(name: str, documentation: str) -> Family:
    return family(name, documentation, "counter")


def add(metric: Family, labels: Mapping[str, str], value: float, *, suffix: str = "") -> None:
    """One sample; ``suffix`` is for the parts of summaries and histograms (``_sum``, ``_count``, ...).

    ``labels`` is kept, not copied: samples of one GPU share one dict, which the encoder formats once.
    A negative zero is stored as 0.0: the encoder's cache of formatted values cannot tell them apart.
    """
    value = float(value) + 0.0  # first: a value that is no number fails here, adding nothing; -0.0 reads 0.0
    if suffix:
        if metric.names is None:
            metric.names = [metric.sample_name] * len(metric.values)
        metric.names.append(metric.name + suffix)
    elif metric.names is not None:
        metric.names.append(metric.sample_name)
    metric.values.append(value)
    metric.labels.append(labels)


def add_known(metric: Family, labels: Mapping[str, str], value: float | None) -> None:
    """One sample, or none when the value is unknown: ``None`` never renders as 0."""
    if value is not None:
        add(metric, labels, value)


def non_empty(metrics: Iterable[Metric]) -> list[Metric]:
    """Families that have samples: a family with nothing to report is left out, not rendered bare."""
    return [m for m in metrics if (m.values if isinstance(m, Family) else m.samples)]


def flag(value: bool) -> float:
    return 1.0 if value else 0.0
