"""XID errors from an NVML event set, waited on in a thread of its own (never log scraping).

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a last-value gauge that never clears and hides repeats.
:class:`XidBook` keeps, per GPU, the total count per XID code since start and per-second buckets over a
recent window, so the exporter can show the last XID *inside the window* (it clears by itself) and
exact windowed and cumulative counts. Memory is bounded by the window, not by the event rate: an XID
storm of thousands of events costs a counter increment each.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from gpuagent.devices.guard import NvmlGuard, NvmlUnavailableError, error_code_name
from gpuagent.snapshot.gpu import XidRecord

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 60


class XidBook:
    """Thread-safe XID counts per GPU index."""

    def __init__(self, window_seconds: float = 300.0, *, clock: Callable[[], float] = time.time) -> None:
        self.window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._totals: dict[int, Counter[int]] = {}
        self._buckets: dict[int, deque[tuple[int, Counter[int]]]] = {}
        self._last: dict[int, tuple[int, float]] = {}

    def record(self, gpu: int, code: int, when: float | None = None) -> None:
        when = self._clock() if when is None else when
        second = int(when)
        with self._lock:
            self._totals.setdefault(gpu, Counter())[code] += 1
            buckets = self._buckets.setdefault(gpu, deque())
            if not buckets or buckets[-1][0] != second:
                buckets.append((second, Counter()))
                self._trim(buckets, when)
            buckets[-1][1][code] += 1
            if gpu not in self._last or when >= self._last[gpu][1]:
                self._last[gpu] = (code, when)

    def record_for(self, gpu: int, now: float | None = None) -> XidRecord:
        now = self._clock() if now is None else now
        with self._lock:
            totals = self._totals.get(gpu)
            if not totals:
                return XidRecord()
            buckets = self._buckets.get(gpu, deque())
            self._trim(buckets, now)
            recent: Counter[int] = Counter()
            for _, counts in buckets:
                recent.update(counts)
            last = self._last.get(gpu)
            in_window = last is not None and now - last[1] <= self.window_seconds
            return XidRecord(
                last_code=last[0] if in_window else None,
                last_seen_unix=last[1] if last else None,
                totals=dict(totals),
                recent=dict(recent),
            )

    def _trim(self, buckets: deque[tuple[int, Counter[int]]], now: float) -> None:
        horizon = now - self.window_seconds
        while buckets and buckets[0][0] + 1 <= horizon:
            buckets.popleft()


def handle_key(handle: Any) -> int:
    """A stable key for a device handle: its address for ctypes handles, the object id otherwise."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or id(handle)
    except (ctypes.ArgumentError, TypeError):
        return id(handle)


class XidWatcher:
    """Waits on one NVML event set for XID critical errors of all GPUs; a daemon thread."""

    def __init__(
        self, guard: NvmlGuard, handles: Iterable[tuple[int, Any]], book: XidBook, *, wait_ms: int = 500
    ) -> None:
        self._guard = guard
        self._book = book
        self._wait_ms = wait_ms
        self._handles = list(handles)
        self._by_key = {handle_key(h): i for i, h in self._handles}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: list[int] = []
        self._logged: dict[tuple[int, int], float] = {}
        self.failed: str = ""
        self.unsupported = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _run(self) -> None:
        g, nvml = self._guard, self._guard.nvml
        try:
            event_set = g.call("nvmlEventSetCreate", scope="xid")
            if event_set is None:
                self.failed = "NVML events are not supported here (nvmlEventSetCreate)"
                self.unsupported = True
                return
            for index, handle in self._handles:
                failed = object()
                done = g.call(
                    "nvmlDeviceRegisterEvents", handle, nvml.nvmlEventTypeXidCriticalError, event_set,
                    scope=index, default=failed,
                )
                if done is not failed:  # pynvml returns None on success
                    self.registered.append(index)
            try:
                self._wait_loop(event_set)
            finally:
                g.call("nvmlEventSetFree", event_set, scope="xid")
        except NvmlUnavailableError as exc:
            self.failed = str(exc)
            log.warning("XID watcher stopped: %s", exc)
        except Exception as exc:  # the thread must not die silently
            self.failed = repr(exc)
            log.exception("XID watcher failed")

    def _wait_loop(self, event_set: Any) -> None:
        nvml = self._guard.nvml
        failing = ""
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(event_set, self._wait_ms)
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_TIMEOUT:
                    continue
                name = error_code_name(exc.value)
                self._guard.count_error("nvmlEventSetWait", name)
                if exc.value in (nvml.NVML_ERROR_UNINITIALIZED, nvml.NVML_ERROR_DRIVER_NOT_LOADED):
                    raise NvmlUnavailableError(f"nvmlEventSetWait: NVML_ERROR_{name}") from exc
                if failing != name:
                    failing = name
                    log.warning("waiting for XID events failed: NVML_ERROR_%s; retrying", name)
                self._stop.wait(1.0)
                continue
            failing = ""
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                gpu = self._by_key.get(handle_key(data.device))
                if gpu is None:
                    gpu = self._index_by_uuid(data.device)
                if gpu is not None:
                    self._record(gpu, int(data.eventData))

    def _record(self, gpu: int, code: int) -> None:
        """Count every event; log the first of a code per GPU and minute, so a storm is one line."""
        self._book.record(gpu, code)
        now = time.monotonic()
        key = (gpu, code)
        if now - self._logged.get(key, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._logged[key] = now
            log.warning("XID %d on GPU %d (repeats within %ds are counted, not logged)", code, gpu,
                        LOG_EVERY_SECONDS)

    def _index_by_uuid(self, handle: Any) -> int | None:
        uuid = self._guard.call("nvmlDeviceGetUUID", handle, scope="xid")
        for index, known in self._handles:
            if self._guard.call("nvmlDeviceGetUUID", known, scope=index) == uuid:
                self._by_key[handle_key(handle)] = index
                return index
        return None
