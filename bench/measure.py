"""How the benches measure: quantiles, the simulator's CPU apart from the agent's, prometheus-client's output.

- ``quantiles``: medians and p95 over repeated runs (this machine is noisy, single timings mean nothing).
- ``SimulatorTime``: a pynvml-shaped proxy around the simulated NVML that sums the CPU time each thread
  spends inside its calls (``time.thread_time``). On the simulator "NVML" is Python running in the agent's
  process; a real driver's calls cost the agent no such CPU. The agent's own work in a poll is the
  process's CPU time over the poll minus that. Thread CPU time, unlike the wall time the agent's guard
  sums for ``gpuagent_nvml_call_duration_seconds``, does not count a reader thread waiting for the GIL
  while another thread runs, and does not count time this shared machine gives to other processes.
- ``name_dataclass_constructors``: gives the ``__init__`` of every dataclass of the agent a name of its own in
  profiles; cProfile keys its figures by (file, line, name), and every generated ``__init__`` is
  ``<string>:2(__init__)``, so all but one of them vanished from its statistics.
- ``PrometheusClientRender``: the same series rendered the way an exporter written on prometheus-client
  does it: a custom collector's fresh typed families filled with ``add_metric``, encoded by
  ``generate_latest``. The baseline the agent's ``/metrics`` of a new snapshot is compared with (both from
  data to text). ``add_sample=True`` is the variant used before: ``Metric.add_sample`` with label dicts
  built beforehand, a little cheaper (it skips ``add_metric``'s ``dict(zip(names, values))``).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families


def quantiles(values: list[float]) -> dict[str, float]:
    """Median, p95 and minimum in milliseconds, and the number of runs."""
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[math.ceil(len(ordered) * 0.95) - 1] * 1000, 3),
        "min_ms": round(ordered[0] * 1000, 3),
        "runs": len(ordered),
    }


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


class SimulatorTime:
    """Stands where the simulated NVML module would; ``seconds`` is the CPU time spent inside its calls
    so far, over every thread. Wraps the ``nvml*`` functions and the simulator's ``process_name``."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._wrapped: dict[str, Callable[..., Any]] = {}
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (callable(value) and not isinstance(value, type)
                and (name.startswith("nvml") or name == "process_name")):
            return value
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            wrapped = self._wrapped[name] = self._timed(value)
        return wrapped

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.seconds += spent

        return timed


def name_dataclass_constructors() -> int:
    """Rename the code of each ``gpuagent`` dataclass's generated ``__init__`` (and ``__eq__``; by
    ``dataclasses`` or ``gpuagent.frozen``) to
    ``<dataclass>:0(Class.__init__)`` for cProfile (see the module's docstring); returns how many. The code
    stays the same; only what a profile calls it changes, for the life of the process."""
    import dataclasses
    import sys

    renamed = 0
    for module in [m for name, m in sys.modules.items() if name.startswith("gpuagent") and m is not None]:
        for cls in vars(module).values():
            ours = isinstance(cls, type) and cls.__module__ == module.__name__
            if not (ours and dataclasses.is_dataclass(cls)):
                continue
            for method in ("__init__", "__eq__"):
                fn = cls.__dict__.get(method)
                code = getattr(fn, "__code__", None)
                if code is None or not code.co_filename.startswith("<"):  # dataclasses' or faster_init's
                    continue
                label = f"{cls.__name__}.{method}"
                names = {"co_name": label, **({"co_qualname": label} if hasattr(code, "co_qualname") else {})}
                fn.__code__ = code.replace(co_filename="<dataclass>", co_firstlineno=0, **names)
                renamed += 1
    return renamed


def series_count(body: str) -> int:
    """Sample lines of a text exposition."""
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


class PrometheusClientRender:
    """prometheus-client rendering the series of one exposition as an exporter written on it would: a
    custom collector yielding fresh typed families (``GaugeMetricFamily``, ``CounterMetricFamily``,
    ``SummaryMetricFamily``, ...) filled with ``add_metric`` from each series' label values, encoded by
    ``generate_latest``. Parsing happens in the constructor, outside what is timed, so the baseline is not
    charged for reading a snapshot (nor for formatting its label values: they are kept as parsed).

    A family whose series do not all have the same label names (``add_metric`` takes one list of names per
    family) is filled with ``Metric.add_sample`` instead (``fallback_series`` counts them). ``add_sample``
    renders every family that way: the cheaper variant this bench used before, with each sample's label
    dict built beforehand, kept to compare with."""

    def __init__(self, body: str, *, add_sample: bool = False) -> None:
        families = list(text_string_to_metric_families(body))
        self.fallback_series = 0
        self.families: list[_Family] = []
        for f in families:
            samples = [(s.name, s.labels, s.value) for s in f.samples]
            typed = None if add_sample else _typed(f.name, f.documentation, f.type, samples)
            if typed is None:
                self.fallback_series += 0 if add_sample else len(samples)
                typed = _Family(Metric, (f.name, f.documentation, f.type), None, samples)
            self.families.append(typed)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Rows(self.families))  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self._registry)


@dataclass(frozen=True)
class _Family:
    """How to build one family: its class and arguments, and what each ``add_metric`` call takes (None:
    ``add_sample`` with each of ``samples``)."""

    cls: type[Metric]
    args: tuple[str, str] | tuple[str, str, str]
    labels: list[str] | None
    calls: list[tuple[Any, ...]]


_SIMPLE = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "unknown": UnknownMetricFamily}


def _typed(
    name: str, documentation: str, kind: str, samples: list[tuple[str, dict[str, str], float]]
) -> _Family | None:
    """The typed family and its ``add_metric`` calls, or None where ``add_metric`` cannot say it."""
    if kind in _SIMPLE:
        names = _label_names(label for _, label, _ in samples)
        calls = [(list(labels.values()), value) for _, labels, value in samples]
        return None if names is None else _Family(_SIMPLE[kind], (name, documentation), names, calls)
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample_name, labels, value in samples:
        key = tuple((k, v) for k, v in labels.items() if k != "le")
        parts = series.setdefault(key, {"buckets": []})
        if sample_name == name + "_bucket":
            parts["buckets"].append((labels["le"], value))
        else:
            parts[sample_name.removeprefix(name)] = value
    names = _label_names(dict(key) for key in series)
    if names is None:
        return None
    if kind == "summary" and all(set(p) == {"buckets", "_count", "_sum"} and not p["buckets"]
                                 for p in series.values()):
        calls = [([v for _, v in key], p["_count"], p["_sum"]) for key, p in series.items()]
        return _Family(SummaryMetricFamily, (name, documentation), names, calls)
    if kind == "histogram" and all(set(p) == {"buckets", "_count", "_sum"} for p in series.values()):
        calls = [([v for _, v in key], p["buckets"], p["_sum"]) for key, p in series.items()]
        return _Family(HistogramMetricFamily, (name, documentation), names, calls)
    return None


def _label_names(label_sets: Iterable[dict[str, str]]) -> list[str] | None:
    """The label names every set has, in order, or None when they differ."""
    names: tuple[str, ...] | None = None
    for labels in label_sets:
        these = tuple(labels)
        if names is None:
            names = these
        elif these != names:
            return None
    return list(names or ())


class _Rows:
    def __init__(self, families: list[_Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for f in self._families:
            if f.labels is None:
                metric = f.cls(*f.args)
                for sample_name, labels, value in f.calls:
                    metric.add_sample(sample_name, labels, value)
            else:
                metric = f.cls(*f.args, labels=f.labels)  # type: ignore[call-arg]
                for call in f.calls:
                    metric.add_metric(*call)  # type: ignore[attr-defined]
            yield metric
