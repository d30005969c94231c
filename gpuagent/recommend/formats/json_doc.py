"""The recommendations as one JSON document: range, options, prices, one object per workload (its
history, recommendation and savings, figures in base units and GPU-hours), totals, the pool's packing and
warnings, and the workloads ``--patch`` refuses for a name Kubernetes would refuse (``patch_refused``, each
with why). The CSV and the HTML page's ``data-`` attributes use the same names."""

from __future__ import annotations

import json
from typing import Any

from gpuagent.prom.timerange import format_time
from gpuagent.recommend.model import (
    SECONDS_PER_HOUR,
    Options,
    PoolPacking,
    Recommendation,
    Recommendations,
    Row,
    Savings,
    Strays,
    WorkloadStats,
    memory_text,
    percent_text,
)
from gpuagent.recommend.patches import refused


def render_json(result: Recommendations) -> str:
    return json.dumps(as_document(result), indent=2) + "\n"


def as_document(result: Recommendations) -> dict[str, Any]:
    span = result.time_range
    totals = result.totals
    return {
        "prometheus": result.prometheus_url,
        "selector": result.selector or None,
        "range": {"start": format_time(span.start_unix), "end": format_time(span.end_unix),
                  "start_unix": span.start_unix, "end_unix": span.end_unix, "seconds": span.seconds},
        "step_seconds": result.step_seconds,
        "options": options_dict(result.options),
        "prices": result.prices.as_dict() if result.has_cost else None,
        "workloads": [workload_dict(row) for row in result.rows],
        "totals": {"workloads": totals.workloads, "current_gpu_hours_week": totals.current_gpu_hours_week,
                   "recommended_gpu_hours_week": totals.recommended_gpu_hours_week,
                   "saved_gpu_hours_week": totals.saved_gpu_hours_week,
                   "cost_saved_week": totals.cost_saved_week},
        "packing": [packing_dict(p) for p in result.packing],
        "queries": result.queries,
        "warnings": list(result.warnings),
        "patch_refused": [{"workload": str(row.stats.key), "namespace": row.stats.key.namespace or None,
                           "kind": row.stats.key.kind or None, "name": row.stats.key.name, "why": str(why)}
                          for row, why in refused(result.rows)],
    }


def options_dict(options: Options) -> dict[str, Any]:
    return {"headroom_ratio": options.headroom, "percentile": options.percentile, "sharing": options.sharing,
            "release_idle_ratio": options.release_idle, "near_limit_ratio": options.near_limit,
            "throttled_ratio": options.throttled, "keep_above_ratio": options.keep_above,
            "min_history_seconds": options.min_history_seconds}


def workload_dict(row: Row) -> dict[str, Any]:
    return {**stats_dict(row.stats), "recommendation": recommendation_dict(row.recommendation),
            "savings": savings_dict(row.savings)}


def stats_dict(stats: WorkloadStats) -> dict[str, Any]:
    key = stats.key
    return {
        "workload": str(key), "namespace": key.namespace or None, "kind": key.kind or None, "name": key.name,
        "grouped_by": key.source, "pods": list(stats.pods), "containers": list(stats.containers),
        "gpu_model": stats.gpu_model, "gpus_held": stats.gpus_held, "devices": stats.devices,
        "device_size_gpus": stats.device_size, "days_seen": stats.days_seen,
        "seen_hours": stats.seen_seconds / SECONDS_PER_HOUR,
        "sm_ratio": stats.sm.as_dict() if stats.sm else None,
        "memory_bytes": stats.memory.as_dict() if stats.memory else None,
        "memory_limit_bytes": stats.memory_limit_bytes, "memory_capacity_bytes": stats.memory_capacity_bytes,
        "gpu_memory_bytes": stats.gpu_memory_bytes, "share_limit_ratio": stats.share_limit_ratio,
        "mig_profile": stats.mig_profile, "idle_ratio": stats.idle_ratio,
        "throttled_ratio": stats.throttled_ratio,
        "throttled_hours": stats.throttled_seconds / SECONDS_PER_HOUR,
        "memory_ladder_restarts": stats.ladder_restarts,
        "allocated_gpu_hours": stats.allocated_gpu_seconds / SECONDS_PER_HOUR,
        "busy_gpu_hours": _hours(stats.busy_gpu_seconds),
        "idle_gpu_hours": _hours(stats.idle_gpu_seconds),
        "memory_all_gpus_bytes": stats.memory_all_gpus_bytes,
        "strays": strays_dict(stats.strays),
    }


def strays_dict(strays: Strays | None) -> dict[str, Any]:
    """Its use of GPUs it was not allocated (left out of the figures above); the same keys without any,
    so that the CSV's columns are the same on every line."""
    if strays is None:
        return {"gpus": 0, "busy_gpu_hours": None, "sm_peak_ratio": None, "memory_peak_bytes": None}
    return {"gpus": strays.gpus, "busy_gpu_hours": _hours(strays.busy_gpu_seconds),
            "sm_peak_ratio": strays.sm_peak, "memory_peak_bytes": strays.memory_peak_bytes}


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / SECONDS_PER_HOUR


def recommendation_dict(rec: Recommendation) -> dict[str, Any]:
    return {
        "action": rec.action.value, "summary": rec.short, "reason": rec.reason, "size_gpus": rec.size,
        "share_ratio": rec.share_ratio, "share": percent_text(rec.share_ratio) if rec.share_ratio else None,
        "memory_bytes": rec.memory_bytes,
        "memory": memory_text(rec.memory_bytes) if rec.memory_bytes else None,
        "mig_profile": rec.mig_profile, "mps_active_thread_percentage": rec.mps_thread_percent,
        "annotations": dict(rec.annotations), "env": dict(rec.env), "resources": dict(rec.resources),
    }


def savings_dict(saved: Savings) -> dict[str, Any]:
    return {"current_gpu_hours_week": saved.current_gpu_hours_week,
            "recommended_gpu_hours_week": saved.recommended_gpu_hours_week,
            "saved_gpu_hours_week": saved.saved_gpu_hours_week, "cost_saved_week": saved.cost_saved_week}


def packing_dict(pool: PoolPacking) -> dict[str, Any]:
    return {"gpu_model": pool.gpu_model, "gpus_now": pool.gpus_now, "gpus_after": pool.gpus_after,
            "whole": pool.whole, "shared": pool.shared, "mps": pool.mps, "mig": pool.mig,
            "released_devices": pool.released}
