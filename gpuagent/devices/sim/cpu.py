"""Real processes behind simulated GPU processes: liveness and CPU progress of real PIDs.

A scenario process with ``sm_util: {follow_cpu: ...}`` uses the GPU as fast as its CPU threads submit
work: its SM utilization is the CPU time the PID (all threads) consumed over the last ``queue_seconds``
divided by that window. A frozen cgroup stops the CPU, so the "GPU" use decays to 0 over the queue depth,
as kernels already queued on a real GPU run to completion. A sampler thread reads the PIDs' CPU times
every few milliseconds, so the window is measured where it lies, not between two NVML calls.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

import psutil

_LIVENESS_TTL = 0.05  # seconds a liveness answer is reused


class _Tracked:
    def __init__(self, pid: int, window: float) -> None:
        self.pid = pid
        self.window = window
        self.history: deque[tuple[float, float]] = deque()  # (monotonic seconds, CPU seconds)
        self.proc: psutil.Process | None = None


class CpuMeter:
    """Liveness of real PIDs and, for ``follow_cpu`` ones, their CPU use over a sliding window."""

    def __init__(self, windows: dict[int, float], *, period: float | None = None) -> None:
        self._tracked = {pid: _Tracked(pid, w) for pid, w in windows.items()}
        shortest = min(windows.values(), default=0.2)
        self._period = period if period is not None else min(0.02, max(0.002, shortest / 10.0))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, psutil.Process | None] = {}
        self._dead: set[int] = set()
        self._alive_cache: dict[int, tuple[float, bool]] = {}

    # -- liveness ----------------------------------------------------------------------------------

    def alive(self, pid: int) -> bool:
        """True while ``pid`` runs; once it has exited (or turned zombie) it stays gone, even if reused."""
        now = time.monotonic()
        with self._lock:
            cached = self._alive_cache.get(pid)
            if cached is not None and now - cached[0] < _LIVENESS_TTL:
                return cached[1]
            if pid in self._dead:
                return False
            proc = self._procs.get(pid)
        alive = False
        try:
            if proc is None:
                proc = psutil.Process(pid)
            alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            alive = False
        with self._lock:
            if alive:
                self._procs[pid] = proc
            elif pid in self._procs:  # seen alive before: it has exited for good
                self._dead.add(pid)
            self._alive_cache[pid] = (now, alive)
        return alive

    # -- CPU progress ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or not self._tracked:
            return
        self._stop.clear()
        self._sample_all()
        self._thread = threading.Thread(target=self._run, name="sim-nvml-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._sample_all()

    def _sample_all(self) -> None:
        now = time.monotonic()
        for tracked in self._tracked.values():
            cpu = self._cpu_seconds(tracked)
            with self._lock:
                hist = tracked.history
                if cpu is None:
                    hist.clear()
                    continue
                hist.append((now, cpu))
                horizon = now - tracked.window - 4 * self._period
                while len(hist) > 2 and hist[1][0] <= horizon:
                    hist.popleft()

    @staticmethod
    def _cpu_seconds(tracked: _Tracked) -> float | None:
        try:
            if tracked.proc is None or not tracked.proc.is_running():
                tracked.proc = psutil.Process(tracked.pid)
            times = tracked.proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            tracked.proc = None
            return None
        return float(times.user + times.system)

    def utilization(self, pid: int) -> float:
        """Percent of one CPU the PID used over its window (0 when unknown or not started)."""
        tracked = self._tracked.get(pid)
        if tracked is None:
            return 0.0
        with self._lock:
            hist = list(tracked.history)
        if len(hist) < 2:
            return 0.0
        t_now, cpu_now = hist[-1]
        t_from = t_now - tracked.window
        cpu_from = _interpolate(hist, t_from)
        span = min(tracked.window, t_now - hist[0][0])
        if span <= 0:
            return 0.0
        return max(0.0, 100.0 * (cpu_now - cpu_from) / span)


def _interpolate(hist: list[tuple[float, float]], t: float) -> float:
    """CPU seconds at monotonic time ``t``, linear between samples (the first sample before history)."""
    if t <= hist[0][0]:
        return hist[0][1]
    for (t0, c0), (t1, c1) in itertools.pairwise(hist):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return hist[-1][1]
