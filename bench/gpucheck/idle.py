"""Is the device otherwise idle? The check a share, plant or MPS run makes before it starts, for its report.

On a GPU: the run's own tenants are frozen for a moment (their queues drain), then NVML's process lists
must name none but them (anything else holding a context, an earlier item's tenant or another program, is
named with its command), and the device's own utilization samples over one second (their median) say how
busy the GPU was without them. On the simulator the device is the one CPU the tenants share: no tenant of
ours but the run's may be alive, and that CPU's use over the second is recorded (other programs on a
shared machine may use it: a figure, not a bar).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

from gpucheck.nvmltrace import device_samples, processes
from gpucheck.tenants import Tenant

LOOK_S = 1.0  # the second the device is watched with the run's tenants frozen
DRAIN_S = 0.4  # what a frozen tenant's queue may still run first


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80] \
            or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def gpu_view(nvml: Any, keep_pids: set[int]) -> dict[str, Any]:
    """Other processes on GPU 0 and the device's busiest utilization sample over ``LOOK_S``."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        time.sleep(DRAIN_S)
        cursor = max((s[0] for s in _quiet_samples(nvml, handle, 0)), default=0)
        time.sleep(LOOK_S)
        samples = _quiet_samples(nvml, handle, cursor)
        listed = processes(nvml, handle)
    finally:
        nvml.nvmlShutdown()
    others = {pid: f"{where}: {comm(pid)}" for pid, where in listed.items() if pid not in keep_pids}
    busy = statistics.median(v for _, v in samples) if samples else None  # one sample may straddle the drain
    return {"device": "GPU 0", "other_processes": {str(p): w for p, w in sorted(others.items())},
            "own_processes_listed": sorted(p for p in listed if p in keep_pids),
            "busy_percent_while_frozen": busy, "samples": len(samples),
            "idle": not others and (busy is None or busy <= 5.0)}


def _quiet_samples(nvml: Any, handle: Any, cursor: int) -> list[tuple[int, float]]:
    with contextlib.suppress(nvml.NVMLError):
        return device_samples(nvml, handle, cursor)
    return []


def cpu_view(cpu: int | None, alive_others: list[str]) -> dict[str, Any]:
    """Our other tenants alive, and the tenants' CPU's use over ``LOOK_S``."""
    import psutil

    time.sleep(DRAIN_S / 4)
    busy = psutil.cpu_percent(interval=LOOK_S, percpu=True)
    return {"device": f"CPU {cpu}", "other_processes": alive_others,
            "busy_percent_while_frozen": busy[cpu] if cpu is not None and cpu < len(busy) else None,
            "idle": not alive_others}


def check_idle(ctx: Any, keep: list[Tenant]) -> dict[str, Any]:
    """The run's tenants ``keep`` frozen for the look, thawed after, whatever happened."""
    for tenant in keep:
        with contextlib.suppress(OSError):
            tenant.freeze(True)
    try:
        if ctx.sim:
            others = [t.name for t in ctx.live_tenants() if t not in keep]
            return cpu_view(ctx.burn_cpu, others)
        import pynvml

        return gpu_view(pynvml, {t.pid for t in keep})
    finally:
        for tenant in keep:
            with contextlib.suppress(OSError):
                tenant.freeze(False)
