"""The report as one JSON document: range, prices, rows (figures in GPU-hours, GiB-hours, kWh, 0-1
ratios, and ``notes``: the codes of why its efficiency is not busy / allocated or is over 1), totals, the
notes' sentences by code, the efficiency timeline and warnings."""

from __future__ import annotations

import json
from typing import Any

from gpuagent.prom.timerange import format_time
from gpuagent.report.model import SECONDS_PER_HOUR, Report, TimelinePoint, Usage


def render_json(report: Report) -> str:
    return json.dumps(as_document(report), indent=2) + "\n"


def as_document(report: Report) -> dict[str, Any]:
    span = report.time_range
    return {
        "prometheus": report.prometheus_url,
        "selector": report.selector or None,
        "range": {"start": format_time(span.start_unix), "end": format_time(span.end_unix),
                  "start_unix": span.start_unix, "end_unix": span.end_unix, "seconds": span.seconds,
                  "chunk_seconds": report.chunk_seconds},
        "prices": report.prices.as_dict() if report.has_cost else None,
        "namespaces": [{"namespace": r.namespace, "pods": r.pods, **_figures(r.usage)}
                       for r in report.namespaces],
        "pods": [{"namespace": r.namespace, "pod": r.pod, "gpu_models": list(r.gpu_models),
                  **_figures(r.usage)} for r in report.pods],
        "workloads": [{"workload_kind": r.workload_kind, "workload": r.workload,
                       "gpu_models": list(r.gpu_models), **_figures(r.usage)} for r in report.workloads],
        "total": _figures(report.total),
        "notes": report.notes(),
        "timeline": {
            "step_seconds": report.timeline.step_seconds,
            "cluster": _points(report.timeline.cluster),
            "namespaces": {ns: _points(points) for ns, points in sorted(report.timeline.namespaces.items())},
        },
        "queries": report.queries,
        "warnings": list(report.warnings),
    }


def _figures(usage: Usage) -> dict[str, Any]:
    return {**usage.figures(), "notes": list(usage.notes())}


def _points(points: tuple[TimelinePoint, ...]) -> list[dict[str, Any]]:
    return [{"time": format_time(p.time_unix), "time_unix": p.time_unix,
             "busy_gpu_hours": p.busy_gpu_seconds / SECONDS_PER_HOUR,
             "allocated_gpu_hours": p.allocated_gpu_seconds / SECONDS_PER_HOUR,
             "efficiency_ratio": p.efficiency_ratio} for p in points]
