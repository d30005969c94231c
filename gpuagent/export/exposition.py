"""Text encoders that keep each sample's label order: dcgm-exporter's ``gpu, UUID, pci_bus_id, device, ...``.

client_python's encoders print label names sorted (``DCGM_FI_DRIVER_VERSION="…",Hostname="…",UUID="…",
device=…``). Prometheus does not care, but dashboards' users, ``grep`` and scripts written against
dcgm-exporter's output do. These are client_python's text 0.0.4 and OpenMetrics 1.0 encoders with that one
difference: same family munging (``_total``/``_info`` names, ``untyped``, ``_created`` moved out in 0.0.4),
same value formatting, label values escaped exactly as both formats say (``\\``, ``"``, newline). Not
rendered: exemplars and native histograms (the agent emits neither), UTF-8 metric names (ours are legacy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_TEXT_NAME_SUFFIX = {"counter": "_total", "info": "_info"}
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")  # moved to gauges of their own in text 0.0.4


def generate_text(registry: Collector) -> bytes:
    """Prometheus text format 0.0.4."""
    out: list[str] = []
    for metric in registry.collect():
        name = metric.name + _TEXT_NAME_SUFFIX.get(metric.type, "")
        out.append(f"# HELP {name} {_escape_help_text(metric.documentation)}\n")
        out.append(f"# TYPE {name} {_TEXT_TYPES.get(metric.type, metric.type)}\n")
        moved: dict[str, list[str]] = {}
        for sample in metric.samples:
            suffix = next((s for s in _OPENMETRICS_ONLY if sample.name == metric.name + s), None)
            line = _sample_line(sample, _text_timestamp)
            if suffix is None:
                out.append(line)
            else:
                moved.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(moved.items()):
            out.append(f"# HELP {metric.name}{suffix} {_escape_help_text(metric.documentation)}\n")
            out.append(f"# TYPE {metric.name}{suffix} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


def generate_openmetrics(registry: Collector) -> bytes:
    """OpenMetrics text format 1.0."""
    out: list[str] = []
    for metric in registry.collect():
        out.append(f"# HELP {metric.name} {_escape(metric.documentation)}\n")
        out.append(f"# TYPE {metric.name} {metric.type}\n")
        if metric.unit:
            out.append(f"# UNIT {metric.name} {metric.unit}\n")
        out.extend(_sample_line(sample, _openmetrics_timestamp) for sample in metric.samples)
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def choose_encoder(accept_header: str | None) -> tuple[Callable[[Collector], bytes], str]:
    """OpenMetrics when the scraper accepts it (as Prometheus does by default), else text 0.0.4."""
    for accepted in (accept_header or "").split(","):
        if accepted.split(";")[0].strip() == "application/openmetrics-text":
            return generate_openmetrics, CONTENT_TYPE_OPENMETRICS
    return generate_text, CONTENT_TYPE_TEXT


def _sample_line(sample: Sample, timestamp: Callable[[float], str]) -> str:
    stamp = "" if sample.timestamp is None else " " + timestamp(float(sample.timestamp))
    return f"{sample.name}{_label_set(sample.labels)} {floatToGoString(sample.value)}{stamp}\n"


def _label_set(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items()) + "}"


def _escape(value: str) -> str:
    """A label value (both formats) or an OpenMetrics HELP text."""
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # the common case, and most of a scrape's work
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help_text(value: str) -> str:
    """A HELP text in the 0.0.4 format, where a double quote stays as it is."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _text_timestamp(seconds: float) -> str:
    return str(int(seconds * 1000))  # milliseconds in text 0.0.4


def _openmetrics_timestamp(seconds: float) -> str:
    return floatToGoString(seconds)
