"""``gpuagent snapshot --format table``: a node snapshot as a compact text table (pure, no I/O).

Unknown or unsupported values (``None`` in the model) print as ``-``, never as 0. Names (processes, GPUs,
health details) are shown with their controls as escapes (``gpuagent.untrusted.shown``), cells before their
widths are measured.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from gpuagent.snapshot.gpu import GpuSample, Health
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import ProcessSample
from gpuagent.untrusted import shown

_GIB = 1024**3
_MIB = 1024**2
_NONE = "-"

_GPU_HEADER = ("GPU", "NAME", "UTIL %", "MEM GiB", "TEMP C", "POWER W", "HEALTH", "PROCS")
_GPU_RIGHT = {2, 3, 4, 5, 7}
_PROC_HEADER = ("GPU", "PID", "COMM", "MEM MiB", "SM %")
_PROC_RIGHT = {1, 3, 4}


def format_table(snapshot: NodeSnapshot) -> str:
    """The snapshot as text: a header line, one row per GPU (MIG instances indented under it), then the
    processes, one row each."""
    lines = [shown(_summary(snapshot)), ""]
    if not snapshot.gpus:
        lines.append("no GPUs")
        return "\n".join(lines) + "\n"

    gpu_rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    proc_rows: list[tuple[str, ...]] = []
    for gpu in snapshot.gpus:
        processes = _processes(gpu)
        gpu_rows.append(_gpu_row(gpu, len(processes)))
        for mig in gpu.migs:
            ci = "" if mig.compute_instance_id is None else f" CI {mig.compute_instance_id}"
            active = mig.profiling.graphics_active_ratio if mig.profiling is not None else None
            gpu_rows.append(
                (
                    "",
                    f"  MIG {mig.profile} GI {mig.gpu_instance_id}{ci}",
                    _number(None if active is None else active * 100),
                    _memory(mig.memory_used_bytes, mig.memory_total_bytes),
                    "",
                    "",
                    "",
                    str(len({(p.pid, p.kind) for p in mig.processes})),
                )
            )
        if gpu.health is not Health.OK or gpu.stale:
            detail = f": {gpu.health_detail}" if gpu.health_detail else ""
            notes.append(f"GPU {gpu.info.index} {_health(gpu)}{detail}")
        for gi, proc in processes:
            where = str(gpu.info.index) if gi is None else f"{gpu.info.index}/gi{gi}"
            proc_rows.append(
                (
                    where,
                    str(proc.pid),
                    proc.comm or _NONE,
                    _number(None if proc.used_memory_bytes is None else proc.used_memory_bytes / _MIB),
                    _number(proc.sm_util_percent),
                )
            )

    lines += _render(_GPU_HEADER, gpu_rows, _GPU_RIGHT)
    lines += map(shown, notes)
    lines.append("")
    if proc_rows:
        lines += _render(_PROC_HEADER, proc_rows, _PROC_RIGHT)
    else:
        lines.append("no processes")
    return "\n".join(lines) + "\n"


def _summary(snapshot: NodeSnapshot) -> str:
    taken = datetime.datetime.fromtimestamp(snapshot.taken_at_unix, tz=datetime.timezone.utc)
    return (
        f"host {snapshot.hostname}  backend {snapshot.backend}  driver {snapshot.driver_version or _NONE}"
        f"  taken {taken:%Y-%m-%dT%H:%M:%SZ}  poll {snapshot.poll_duration_seconds * 1000:.0f} ms"
        + ("  STALE" if snapshot.stale else "")
    )


def _gpu_row(gpu: GpuSample, process_count: int) -> tuple[str, ...]:
    return (
        str(gpu.info.index),
        gpu.info.name,
        _number(gpu.gpu_util_percent),
        _memory(gpu.memory_used_bytes, gpu.info.memory_total_bytes),
        _number(gpu.temperature_celsius),
        _number(gpu.power_watts),
        _health(gpu),
        str(process_count),
    )


def _processes(gpu: GpuSample) -> list[tuple[int | None, ProcessSample]]:
    """A GPU's processes, its MIG instances' included, once each, as (MIG GPU instance or None, process)."""
    found: dict[tuple[int, str, int | None], ProcessSample] = {}
    for proc in gpu.processes:
        found.setdefault((proc.pid, proc.kind, proc.gpu_instance_id), proc)
    for mig in gpu.migs:
        for proc in mig.processes:
            gi = mig.gpu_instance_id if proc.gpu_instance_id is None else proc.gpu_instance_id
            found.setdefault((proc.pid, proc.kind, gi), proc)
    ordered = sorted(found.items(), key=lambda item: (item[0][2] is not None, item[0][2] or 0, item[0][0]))
    return [(gi, proc) for (_, _, gi), proc in ordered]


def _health(gpu: GpuSample) -> str:
    return gpu.health.value + (" (stale)" if gpu.stale else "")


def _number(value: float | None) -> str:
    return _NONE if value is None else f"{value:.0f}"


def _memory(used_bytes: int | None, total_bytes: int | None) -> str:
    used = _NONE if used_bytes is None else f"{used_bytes / _GIB:.1f}"
    total = _NONE if total_bytes is None else f"{total_bytes / _GIB:.1f}"
    return f"{used}/{total}"


def _render(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    rows = [tuple(map(shown, row)) for row in rows]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in (header, *rows)
    ]
