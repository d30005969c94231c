"""The way out: one bounded shutdown that thaws first, names whatever holds it up, and never hangs.

On SIGTERM or SIGINT (or when a task of the agent fails) :meth:`Shutdown.run` thaws everything the enforcer
froze before anything else, cancels the agent's own tasks, then runs the cleanup steps (the HTTP server, the
sources) one after the other, each given what is left of one deadline (``shutdown_timeout`` seconds from the
start), and waits for the threads still doing work. Whatever has not finished by the deadline is left
behind, and the log says what each unfinished step, asyncio task and thread is waiting on (their stacks). A
clean shutdown returns True. An unclean one, in the agent's process, ends the process at once with exit code
:data:`EXIT_FORCED` (3): a thread stuck in the driver or in a ``/proc`` read would otherwise hold the
interpreter's exit (``asyncio.run`` joins the default executor's threads, Python joins non-daemon threads)
until the kubelet's SIGKILL, with nothing logged.

Two backstops cover what the event loop cannot. The signal handler arms ``faulthandler``'s watchdog (a C
thread that needs neither the loop nor the GIL) for the deadline plus :data:`BACKSTOP_GRACE_SECONDS`: if the
process is still there then (the loop itself blocked, or the interpreter's exit hung), it dumps every
thread's stack to stderr and exits with 1. And a second signal forces the exit at once.

Generic on purpose (it imports nothing of the agent): the agent passes its steps, its thaw and its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

EXIT_FORCED = 3  # the exit code of a shutdown that had to leave something unfinished
BACKSTOP_GRACE_SECONDS = 2.0  # faulthandler's watchdog fires this long after the deadline
IO_THREAD_PREFIX = "gpuagent-io"  # the default executor's threads (asyncio.to_thread) in the agent's process
_STACK_LIMIT = 12  # innermost frames shown per task or thread


@dataclass(frozen=True, slots=True)
class Step:
    """One cleanup step: ``start()`` makes the awaitable (only when its turn comes)."""

    name: str
    start: Callable[[], Awaitable[object]]


class Shutdown:
    """One shutdown, bounded by ``timeout`` seconds from :meth:`begin` (or :meth:`run`).

    ``thaw`` undoes the enforcer's freezes (called first, on the event loop; returns how many). ``threads``
    lists the threads doing work that shutdown should wait for (a GPU worker inside an NVML call). With
    ``exit`` (the agent's process: :func:`process_exit`) an unclean shutdown ends the process with
    :data:`EXIT_FORCED`; without it (an agent inside a test) it is only reported. ``executor`` is the event
    loop's default executor when it is ours: shut down (without waiting) after the steps, its threads waited
    for like the others. ``backstop`` (the agent's process only) arms faulthandler's watchdog at the start.
    """

    def __init__(
        self,
        timeout: float,
        *,
        thaw: Callable[[], int] | None = None,
        threads: Callable[[], Iterable[threading.Thread]] = tuple,
        exit: Callable[[int], object] | None = None,
        executor: ThreadPoolExecutor | None = None,
        backstop: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._thaw = thaw
        self._threads = threads
        self._exit = exit
        self._executor = executor
        self._backstop = backstop
        self._clock = clock
        self.deadline: float | None = None
        self._forcing = threading.Lock()

    def begin(self) -> None:
        """Start the clock (once), and arm the backstop if asked to."""
        if self.deadline is not None:
            return
        self.deadline = self._clock() + self.timeout
        if self._backstop:
            arm_backstop(self.timeout)

    def remaining(self) -> float:
        assert self.deadline is not None
        return max(0.0, self.deadline - self._clock())

    async def run(self, tasks: Sequence[asyncio.Task[object]], steps: Sequence[Step]) -> bool:
        """Thaw, cancel ``tasks``, run ``steps``, wait for working threads; True when all of it finished
        in time. Unclean in the agent's process: does not return (the process exits with EXIT_FORCED)."""
        self.begin()
        self._thaw_first()
        for task in tasks:  # only our own tasks, never every task of the loop
            task.cancel()
        unfinished: list[str] = []
        for step in [Step("tasks", lambda: asyncio.gather(*tasks, return_exceptions=True)), *steps]:
            left = self.remaining()
            if left <= 0:
                unfinished.append(f"{step.name} (not started: no time left)")
                continue
            # asyncio.wait, not wait_for: wait_for waits for a timed-out step to finish its cancellation,
            # which is forever for one that ignores it. The step is asked to stop, never waited for.
            running = asyncio.ensure_future(step.start())
            done, _ = await asyncio.wait({running}, timeout=left)
            if not done:
                running.cancel()
                unfinished.append(f"{step.name} (did not finish)")
            elif not running.cancelled() and running.exception() is not None:
                log.error("shutdown: %s failed: %r", step.name, running.exception())
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        pending, working = await self._wait_for_leftovers(tasks)
        if not (unfinished or pending or working):
            return True
        self.report(unfinished, tasks=pending, threads=working)
        if self._exit is not None:
            self.force(f"shutdown did not finish within shutdown_timeout ({self.timeout:g} s)")
        return False

    def _thaw_first(self) -> None:
        if self._thaw is None:
            return
        try:
            thawed = self._thaw()
        except Exception:  # the journal keeps what failed: the next start thaws it
            log.exception("shutdown: thawing failed; the freeze journal names what the next start thaws")
            return
        if thawed:
            log.info("thawed %d cgroups on the way out", thawed)

    async def _wait_for_leftovers(
        self, tasks: Sequence[asyncio.Task[object]]
    ) -> tuple[list[asyncio.Task[object]], list[threading.Thread]]:
        """The tasks and working threads still running at the deadline (none, as soon as all have ended).
        In the agent's process that is every task of the loop, not only ours: ``asyncio.run`` would wait
        for each of them (a request handler that ignores its cancellation, say) after this returns."""
        while True:
            pending = [t for t in tasks if not t.done()]
            if self._exit is not None:
                current = asyncio.current_task()
                pending += [t for t in asyncio.all_tasks() if t is not current and t not in pending]
            working = self.working_threads()
            if not (pending or working) or self.remaining() <= 0:
                return pending, working
            await asyncio.sleep(min(0.02, self.remaining()))

    def working_threads(self) -> list[threading.Thread]:
        """The threads shutdown waits for: those ``threads`` names, and the executor's still alive."""
        found = {t: None for t in self._threads() if t.is_alive()}
        if self._executor is not None:
            found |= {t: None for t in threading.enumerate() if t.name.startswith(IO_THREAD_PREFIX)}
        return [t for t in found if t is not threading.current_thread()]

    def report(self, unfinished: Sequence[str], *, tasks: Sequence[asyncio.Task[object]],
               threads: Sequence[threading.Thread]) -> None:
        """Log what holds the shutdown up: the steps left, and the stack of every task and thread."""
        lines = [f"shutdown: not finished after {self.timeout:g} s; left unfinished:"]
        lines += [f"  step {name}" for name in unfinished]
        pending = list(tasks)
        try:  # every task of the loop: a stuck request handler is not one of ours, but holds the server
            current = asyncio.current_task()
            pending += [t for t in asyncio.all_tasks() if t is not current and t not in pending]
        except RuntimeError:
            pass
        lines += [describe_task(task) for task in pending if not task.done()]
        lines += [describe_thread(thread) for thread in threads]
        log.error("%s", "\n".join(lines))

    def force(self, reason: str) -> None:
        """End the process now (thawing first once more, in case something froze since): EXIT_FORCED."""
        if self._exit is None or not self._forcing.acquire(blocking=False):
            return
        log.error("%s: exiting with code %d", reason, EXIT_FORCED)
        self._thaw_first()
        flush_logs()
        self._exit(EXIT_FORCED)


def arm_backstop(timeout: float) -> None:
    """faulthandler's watchdog: dump every thread and exit (code 1) if the process is still there
    ``timeout`` + grace seconds from now. Safe in a signal handler; a later call re-arms it."""
    faulthandler.dump_traceback_later(timeout + BACKSTOP_GRACE_SECONDS, exit=True, file=sys.stderr)


def describe_task(task: asyncio.Future[object]) -> str:
    """A task and where it is suspended: the chain of coroutines it awaits, outermost first (what
    ``Task.get_stack`` does not follow), and what the innermost one awaits when that is not a plain future."""
    name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
    frames, awaited = [], task.get_coro() if isinstance(task, asyncio.Task) else None
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:  # not a coroutine or generator: what the innermost one waits for
            break
        frames.append((frame, frame.f_lineno))
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    stack = traceback.StackSummary.extract(frames[-_STACK_LIMIT:]).format()
    body = "".join(stack).rstrip().splitlines()
    if awaited is not None and type(awaited).__name__ != "FutureIter":  # a future's iterator says nothing
        body.append(f"  waiting on {awaited!r}"[:300])
    return "  task {}:\n{}".format(name, "\n".join("    " + line for line in body))


def describe_thread(thread: threading.Thread) -> str:
    """A thread and where it is (its Python stack, innermost last)."""
    frame = sys._current_frames().get(thread.ident or -1)
    kind = "daemon" if thread.daemon else "non-daemon"
    if frame is None:
        return f"  thread {thread.name} ({kind}): no Python stack (in C code, or just ended)"
    stack = traceback.format_stack(frame, limit=_STACK_LIMIT)
    body = "".join(stack).rstrip().splitlines()
    return "  thread {} ({}):\n{}".format(thread.name, kind, "\n".join("    " + line for line in body))


def flush_logs() -> None:
    """Flush the log handlers and the standard streams (a broken one must not stop the exit)."""
    for flushable in (*logging.getLogger().handlers, sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            flushable.flush()


def process_exit(code: int) -> None:
    """The exit of a forced shutdown: ``os._exit`` (no atexit, no thread joins: they are what hangs)."""
    os._exit(code)
