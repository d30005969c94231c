"""The asynchronous device source: NVML reads on per-GPU daemon threads, bounded by a timeout.

``poll()`` never raises for an NVML problem and never blocks the event loop: a GPU whose read does not
finish within ``timeout`` keeps its last sample, marked stale and unresponsive, and gets no new read until
the stuck one returns (one call in flight per GPU). NVML that fails as a whole (driver unloaded, version
mismatch) is re-initialised on later polls; until then the last samples are served, marked stale.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpuagent.devices.guard import GpuLostError, NvmlGuard, NvmlUnavailableError, error_code_name
from gpuagent.devices.nvml import GpuReader
from gpuagent.devices.procnames import ProcessNames
from gpuagent.devices.slow import optional_text
from gpuagent.devices.worker import DaemonWorker
from gpuagent.devices.xid import XidBook, XidWatcher
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, Health, XidRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """What one poll of the device source produced."""

    ok: bool
    error: str
    gpus: tuple[GpuSample, ...]
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    xid_error: str = ""  # why the XID event watcher is not running, "" while it is (or NVML is down)


@dataclass(slots=True)
class _Gpu:
    reader: GpuReader
    worker: DaemonWorker
    last: GpuSample | None = None
    state: str = "ok"  # for logging once per change


class DevicePoller:
    def __init__(
        self,
        nvml: Any,
        *,
        timeout: float = 5.0,
        slow_interval: float = 30.0,
        energy_interval: float = 30.0,
        profiling_interval: float = 10.0,
        process_utilization_interval: float = 10.0,
        detail_interval: float = 10.0,
        xid_window: float = 300.0,
        process_names: ProcessNames | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = NvmlGuard(nvml)
        self.nvml = nvml
        self.timeout = timeout
        self.slow_interval = slow_interval
        self.energy_interval = energy_interval
        self.profiling_interval = profiling_interval
        self.process_utilization_interval = process_utilization_interval
        self.detail_interval = detail_interval
        self._every_poll: frozenset[str] = frozenset()  # GPU UUIDs whose per-process use is read every poll
        self.xids = XidBook(xid_window, clock=clock)
        self.names = process_names or ProcessNames()
        self._clock = clock
        self._monotonic = monotonic
        self._node = DaemonWorker("nvml-node")
        self._gpus: dict[int, _Gpu] = {}
        self._workers: dict[int, DaemonWorker] = {}
        self._watcher: XidWatcher | None = None
        self._open = False
        self._initialised = False  # nvmlInit succeeded and nvmlShutdown is owed (node worker only)
        self._versions: tuple[str | None, str | None, str | None] = (None, None, None)
        self._last_slow = float("-inf")
        self._failure = ""

    # -- opening and closing NVML (on the node worker thread) ----------------------------------------

    def _open_nvml(self) -> list[tuple[int, Any]]:
        nvml, g = self.nvml, self.guard
        if self._initialised:  # NVML failed as a whole after a successful init: start over cleanly
            self._initialised = False
            g.call("nvmlShutdown", scope="node")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(f"nvmlInit: NVML_ERROR_{error_code_name(exc.value)} ({exc})") from exc
        self._initialised = True
        cuda = g.call("nvmlSystemGetCudaDriverVersion", scope="node")
        self._versions = (
            optional_text(g.call("nvmlSystemGetDriverVersion", scope="node")),
            optional_text(g.call("nvmlSystemGetNVMLVersion", scope="node")),
            f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        )
        count = g.call("nvmlDeviceGetCount", scope="node")
        if count is None:
            raise NvmlUnavailableError("nvmlDeviceGetCount failed")
        handles = []
        for index in range(count):
            try:
                handle = g.call("nvmlDeviceGetHandleByIndex", index, scope=index)
            except GpuLostError:
                handle = None
            handles.append((index, handle))
        return handles

    async def _ensure_open(self) -> None:
        if self._open:
            return
        if self._node.busy:
            raise NvmlUnavailableError("nvmlInit has not returned (hung in the driver?)")
        handles = await asyncio.wait_for(self._node.run(self._open_nvml), self.timeout)
        self.guard.forget_all()
        gpus: dict[int, _Gpu] = {}
        for index, handle in handles:
            worker = self._workers.get(index) or DaemonWorker(f"nvml-gpu{index}")
            self._workers[index] = worker
            previous = self._gpus.get(index)
            gpus[index] = _Gpu(
                reader=GpuReader(self.guard, index, handle, process_names=self.names, clock=self._clock,
                                 energy_interval=self.energy_interval,
                                 profiling_interval=self.profiling_interval,
                                 process_utilization_interval=self.process_utilization_interval,
                                 detail_interval=self.detail_interval),
                worker=worker,
                last=previous.last if previous else None,
            )
        self._gpus = gpus
        self._start_watcher()
        self._open = True
        self._last_slow = float("-inf")
        if self._failure:
            log.info("NVML is available again: %d GPUs, driver %s", len(gpus), self._versions[0])
        else:
            log.info("NVML initialised: %d GPUs, driver %s", len(gpus), self._versions[0])
        self._failure = ""

    def _start_watcher(self) -> None:
        handles = [(i, g.reader.handle) for i, g in self._gpus.items() if g.reader.handle is not None]
        self._watcher = XidWatcher(self.guard, handles, self.xids)
        self._watcher.start()

    def _restart_dead_watcher(self) -> None:
        """An XID watcher that died of an error (not of "unsupported") is restarted on the slow cadence."""
        watcher = self._watcher
        if watcher is not None and not watcher.alive and watcher.failed and not watcher.unsupported:
            log.warning("restarting the XID watcher (it stopped: %s)", watcher.failed)
            self._start_watcher()

    def _mark_closed(self, reason: str) -> None:
        """Forget NVML state after it failed as a whole; the next poll re-initialises."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._open = False
        # The readers' GPM buffers are not freed here: they died with NVML, and a close queued on a GPU's
        # worker would make the re-initialised poller find it busy and report the GPU stale.
        if reason != self._failure:
            log.error("NVML unavailable: %s; serving the last samples as stale, retrying every poll", reason)
            self._failure = reason

    # -- polling -----------------------------------------------------------------------------------

    def read_process_utilization_every_poll(self, uuids: frozenset[str]) -> None:
        """The GPUs (by UUID) whose per-process utilization is read every poll from the next poll on: where
        the share controller acts. The others are read every ``process_utilization_interval``."""
        self._every_poll = uuids

    async def poll(self) -> DeviceReading:
        try:
            await self._ensure_open()
        except (NvmlUnavailableError, TimeoutError, asyncio.TimeoutError) as exc:
            reason = str(exc) or "nvmlInit did not return in time"
            self._mark_closed(reason)
            return self._reading(ok=False, error=reason, gpus=self._all_stale(reason))
        now = self._clock()
        slow_due = self._monotonic() - self._last_slow >= self.slow_interval
        if slow_due:
            self._last_slow = self._monotonic()
            self._restart_dead_watcher()
        futures: dict[int, asyncio.Future[GpuSample]] = {}
        for index, gpu in self._gpus.items():
            if gpu.worker.busy:
                continue
            xid = self.xids.record_for(index, now)
            info = gpu.reader.info
            gpu.reader.process_utilization.every_poll = info is not None and info.uuid in self._every_poll
            job = gpu.worker.submit(lambda r=gpu.reader, x=xid: r.read(slow_due=slow_due, xid=x))
            futures[index] = asyncio.wrap_future(job)
        if futures:
            await asyncio.wait(futures.values(), timeout=self.timeout)
        samples: list[GpuSample] = []
        unavailable = ""
        for index, gpu in self._gpus.items():
            future = futures.get(index)
            xid = self.xids.record_for(index, now)
            if future is None or not future.done():
                if future is not None:
                    future.add_done_callback(_discard)
                    self.guard.count_error("read", "TIMEOUT")
                sample = self._stale(gpu, Health.UNRESPONSIVE, f"NVML read exceeded {self.timeout:g}s", xid)
            elif isinstance(future.exception(), GpuLostError):
                sample = self._lost(gpu, str(future.exception()), now, xid)
            elif isinstance(future.exception(), NvmlUnavailableError):
                unavailable = str(future.exception())
                sample = self._stale(gpu, Health.ERROR, unavailable, xid)
            elif future.exception() is not None:
                exc = future.exception()
                log.debug("GPU %d read failed", index, exc_info=exc)
                sample = self._stale(gpu, Health.ERROR, f"read failed: {exc!r}", xid)
            else:
                sample = future.result()
                gpu.last = sample
            self._log_state(index, gpu, sample)
            samples.append(sample)
        self.names.retain(p.pid for s in samples for p in s.processes)
        if unavailable:
            self._mark_closed(unavailable)
            return self._reading(ok=False, error=unavailable, gpus=tuple(samples))
        return self._reading(ok=True, error="", gpus=tuple(samples))

    def _reading(self, *, ok: bool, error: str, gpus: tuple[GpuSample, ...]) -> DeviceReading:
        driver, nvml_version, cuda = self._versions
        watcher = self._watcher
        dead = ok and watcher is not None and not watcher.alive and not watcher.unsupported
        xid_error = watcher.failed if dead and watcher is not None else ""
        return DeviceReading(
            ok=ok, error=error, gpus=gpus, driver_version=driver, nvml_version=nvml_version,
            cuda_driver_version=cuda, xid_error=xid_error,
        )

    def _lost(self, gpu: _Gpu, detail: str, now: float, xid: XidRecord) -> GpuSample:
        info = gpu.reader.info or _placeholder_info(gpu.reader.index)
        return GpuSample(info=info, sampled_at_unix=now, health=Health.LOST, health_detail=detail, xid=xid)

    def _stale(self, gpu: _Gpu, health: Health, detail: str, xid: XidRecord) -> GpuSample:
        if gpu.last is None:
            info = gpu.reader.info or _placeholder_info(gpu.reader.index)
            return GpuSample(info=info, sampled_at_unix=self._clock(), health=health, health_detail=detail,
                             stale=True, xid=xid)
        return replace(gpu.last, stale=True, health=health, health_detail=detail, xid=xid)

    def _all_stale(self, reason: str) -> tuple[GpuSample, ...]:
        return tuple(
            self._stale(gpu, Health.ERROR, reason, self.xids.record_for(i)) for i, gpu in self._gpus.items()
        )

    def _log_state(self, index: int, gpu: _Gpu, sample: GpuSample) -> None:
        state = "stale" if sample.stale and sample.health is Health.OK else sample.health.value
        if state == gpu.state:
            return
        if state == "ok":
            log.info("GPU %d (%s) is healthy again", index, sample.info.uuid)
        else:
            log.warning("GPU %d (%s) is %s: %s", index, sample.info.uuid, state, sample.health_detail)
        gpu.state = state

    async def close(self) -> None:
        """Stop the XID watcher, free GPM buffers and shut NVML down, without waiting on a stuck call."""
        if self._watcher is not None:
            self._watcher.stop()
            deadline = self._monotonic() + 2.0  # its wait ends within wait_ms, then it frees its set
            while self._watcher.alive and self._monotonic() < deadline:
                await asyncio.sleep(0.02)
        jobs = [asyncio.wrap_future(g.worker.submit(g.reader.close)) for g in self._gpus.values()
                if not g.worker.busy]
        if jobs:
            await asyncio.wait(jobs, timeout=self.timeout)
        if self._initialised and not self._node.busy:
            shutdown = self._node.submit(lambda: self.guard.call("nvmlShutdown", scope="node"))
            await asyncio.wait([asyncio.wrap_future(shutdown)], timeout=self.timeout)
        self._open = False
        for worker in [*self._workers.values(), self._node]:
            worker.stop()

    @property
    def xid_watcher(self) -> XidWatcher | None:
        return self._watcher

    def working_threads(self) -> list[threading.Thread]:
        """Threads inside an NVML call now (a worker's read or close, the XID watcher's wait), for
        shutdown to wait for and, if they do not return, to name."""
        threads = [w.thread for w in [*self._workers.values(), self._node] if w.busy]
        if self._watcher is not None and self._watcher.thread is not None and self._watcher.alive:
            threads.append(self._watcher.thread)
        return threads


def _placeholder_info(index: int) -> GpuInfo:
    return GpuInfo(
        index=index, uuid="", name="", serial=None, pci_bus_id="", minor_number=None,
        memory_total_bytes=None, power_limit_watts=None, mig_enabled=False,
    )


def _discard(future: asyncio.Future[Any]) -> None:
    """A read that finished after its timeout: its result is dropped, its error retrieved (no warning)."""
    if not future.cancelled():
        future.exception()
