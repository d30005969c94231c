"""``gpuagent hints --format table``: a node's hints as a compact text table (pure, no I/O).

Unknown values (``None``) print as ``-``, never as 0. Names (tenants, models) are shown with their controls
as escapes (``gpuagent.untrusted.shown``), cells before their widths are measured.
"""

from __future__ import annotations

import datetime

from gpuagent.snapshot.hints import GpuHints, NodeHints
from gpuagent.untrusted import shown

_GIB = 1024**3
_NONE = "-"
_HEADER = ("GPU", "MODEL", "HEALTH", "MODE", "FREE GiB", "ALLOC GiB", "SHARE %", "SM 10s %", "SM 5m %",
           "TENANTS", "NUMA")
_RIGHT = {4, 5, 6, 7, 8, 9, 10}


def _percent(value: float | None) -> str:
    return _NONE if value is None else f"{value * 100:.0f}"


def _row(gpu: GpuHints) -> tuple[str, ...]:
    return (
        str(gpu.index), gpu.model, gpu.health + (" (stale)" if gpu.stale else ""), gpu.sharing_mode,
        f"{gpu.memory_free_bytes / _GIB:.1f}", f"{gpu.memory_allocated_bytes / _GIB:.1f}",
        _percent(gpu.schedulable_share_ratio), _percent(gpu.sm_util_short_ratio),
        _percent(gpu.sm_util_long_ratio), str(len(gpu.tenants)),
        _NONE if gpu.numa_node is None else str(gpu.numa_node),
    )


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    rows = [tuple(map(shown, row)) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = (c.rjust(w) if i in _RIGHT else c.ljust(w) for i, (c, w) in pairs)
        out.append("  ".join(cells).rstrip())
    return out


def format_hints_table(hints: NodeHints) -> str:
    """A summary line, one row per GPU, then the tenants and free MIG profiles of each GPU."""
    taken = datetime.datetime.fromtimestamp(hints.taken_at_unix, datetime.timezone.utc)
    lines = [
        f"{hints.hostname}  {taken:%Y-%m-%d %H:%M:%S} UTC  GPUs {hints.healthy_gpu_count}/{hints.gpu_count} "
        f"healthy, {hints.free_gpu_count} free, {hints.schedulable_share_gpus:.2f} schedulable, "
        f"{hints.memory_free_bytes / _GIB:.1f} of {hints.memory_total_bytes / _GIB:.1f} GiB free",
        "",
    ]
    if not hints.gpus:
        return "\n".join(map(shown, [*lines, "no GPUs"])) + "\n"
    lines.extend(_columns([_HEADER, *(_row(g) for g in hints.gpus)]))
    details = []
    for gpu in hints.gpus:
        for tenant in gpu.tenants:
            share = _NONE if tenant.share_ratio is None else f"{tenant.share_ratio * 100:g}%"
            limit = tenant.memory_limit_bytes
            limit_text = _NONE if limit is None else f"{limit / _GIB:.1f} GiB"
            details.append(f"  GPU {gpu.index} tenant {tenant.name} ({tenant.kind}): share {share}, memory "
                           f"{tenant.memory_used_bytes / _GIB:.1f} GiB used, limit {limit_text}")
        for profile in gpu.free_mig_profiles:
            details.append(f"  GPU {gpu.index} MIG {profile.profile}: {len(profile.idle_instances)} idle, "
                           f"{profile.creatable_count} can be created")
    if details:
        lines.extend(["", *details])
    return "\n".join(map(shown, lines)) + "\n"
