"""One daemon thread per device: at most one NVML call in flight per GPU, never a pile-up.

A GPU that falls off the bus can block an NVML call in the kernel for minutes. ``ThreadPoolExecutor``
threads are joined at interpreter exit, so one stuck call would keep the agent from ever exiting; these
threads are daemons, and a worker that is still busy simply refuses new work.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()


class WorkerBusyError(RuntimeError):
    pass


class DaemonWorker:
    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on this worker's thread; refuses while an earlier call is still running."""
        if self._busy.is_set():
            raise WorkerBusyError(f"{self.name}: previous call still running")
        future: Future[T] = Future()
        self._busy.set()
        self._jobs.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    def stop(self) -> None:
        """Ask the thread to end after its current call; never waits for a stuck one."""
        self._jobs.put(_STOP)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, future = job
            if future.set_running_or_notify_cancel():
                try:
                    result = fn()
                except BaseException as exc:  # handed to the awaiting side, which decides
                    self._busy.clear()
                    future.set_exception(exc)
                else:
                    self._busy.clear()
                    future.set_result(result)
            else:
                self._busy.clear()
