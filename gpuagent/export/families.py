"""Building metric families for custom collectors.

Our families can mix label sets (a GPU series and its MIG-instance series share one family), so samples are
added by label dict rather than with ``GaugeMetricFamily.add_metric``'s fixed label names. The sample name
is derived from the family type the way client_python's own families do it (``_total`` for counters,
``_info`` for info), so every encoder (ours in ``exposition``, client_python's) renders them correctly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

_SAMPLE_SUFFIX = {"counter": "_total", "info": "_info"}


def family(name: str, documentation: str, typ: str) -> Metric:
    """A family named as it appears on the wire (``x_total`` for a counter, ``x_info`` for info)."""
    suffix = _SAMPLE_SUFFIX.get(typ, "")
    if suffix and not name.endswith(suffix):
        raise ValueError(f"a {typ} family name must end in {suffix}: {name}")
    return Metric(name.removesuffix(suffix), documentation, typ)


def gauge(name: str, documentation: str) -> Metric:
    return family(name, documentation, "gauge")


def counter(name: str, documentation: str) -> Metric:
    return family(name, documentation, "counter")


def add(metric: Metric, labels: Mapping[str, str], value: float, *, suffix: str = "") -> None:
    """One sample; ``suffix`` is for the parts of summaries and histograms (``_sum``, ``_count``, ...).

    ``labels`` is kept, not copied: samples of one GPU share one dict, which the encoder formats once.
    """
    name = metric.name + (suffix or _SAMPLE_SUFFIX.get(metric.type, ""))
    metric.samples.append(Sample(name, labels, float(value)))  # type: ignore[arg-type]


def add_known(metric: Metric, labels: Mapping[str, str], value: float | None) -> None:
    """One sample, or none when the value is unknown: ``None`` never renders as 0."""
    if value is not None:
        add(metric, labels, value)


def non_empty(metrics: Iterable[Metric]) -> list[Metric]:
    """Families that have samples: a family with nothing to report is left out, not rendered bare."""
    return [m for m in metrics if m.samples]


def flag(value: bool) -> float:
    return 1.0 if value else 0.0
