"""Per-GPU daemon workers: one call in flight, never joined at exit."""

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from gpuagent.devices.worker import DaemonWorker, WorkerBusyError


async def test_runs_on_its_own_thread_and_returns():
    worker = DaemonWorker("w")
    name = await worker.run(lambda: threading.current_thread().name)
    assert name == "w"
    worker.stop()


async def test_exception_reaches_the_caller():
    worker = DaemonWorker("w")
    with pytest.raises(ZeroDivisionError):
        await worker.run(lambda: 1 / 0)
    assert not worker.busy
    worker.stop()


async def test_refuses_while_busy():
    worker = DaemonWorker("w")
    release = threading.Event()
    first = worker.submit(release.wait)
    assert worker.busy
    with pytest.raises(WorkerBusyError):
        worker.submit(lambda: None)
    release.set()
    await asyncio.wrap_future(first)
    assert await worker.run(lambda: 7) == 7
    worker.stop()


def test_a_stuck_call_does_not_keep_the_process_alive():
    code = (
        "import time; from gpuagent.devices.worker import DaemonWorker;"
        "w = DaemonWorker('stuck'); w.submit(lambda: time.sleep(3600)); print('exiting')"
    )
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "exiting" in out.stdout
    assert time.monotonic() - started < 20
