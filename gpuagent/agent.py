"""Wires sources, consumers and the HTTP server on one event loop.

The device poller runs at a fixed rate; each poll publishes a new immutable :class:`NodeSnapshot` by a
single attribute assignment (atomic for every reader on the loop and in threads). The HTTP server reads
only that. The tasks are supervised (:mod:`gpuagent.serving` runs them beside the HTTP servers): the first
one to fail is logged and stops the others; SIGTERM and SIGINT stop everything within ``shutdown_timeout``,
thawing first (:mod:`gpuagent.shutdown`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from gpuagent import gctune, preflight
from gpuagent.api.admin import AdminActions
from gpuagent.api.app import build_app
from gpuagent.assembly import (
    build_accountant,
    build_enforcer,
    build_health,
    build_publisher,
    pods_source,
    recover_frozen,
)
from gpuagent.config import Config, ConfigError, load_config
from gpuagent.devices.loader import load_nvml
from gpuagent.devices.poller import DevicePoller
from gpuagent.devices.procnames import ProcessNames
from gpuagent.export import build_registry
from gpuagent.hints.engine import HintsEngine
from gpuagent.network.podnet import pod_pids
from gpuagent.network.source import network_source
from gpuagent.serving import TaskStarter, serve_until_stopped
from gpuagent.shutdown import IO_THREAD_PREFIX, Shutdown, arm_backstop, process_exit
from gpuagent.snapshot.node import NodeSnapshot, PollHistogram, SourceStatus
from gpuagent.snapshot.pods import DraDevice, DraTaint, PodUse

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# A second stop signal this soon after the first is the same request delivered twice, not an operator
# insisting: GNU timeout, and a kill of the process group beside the main process, deliver two at once.
DUPLICATE_SIGNAL_SECONDS = 0.1
GC_YOUNG_OBJECTS = 10_000  # allocations between collections of the youngest generation (CPython's: 700)
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PollDurations:
    """Accumulates poll durations; ``frozen()`` is the immutable copy a snapshot carries."""

    def __init__(self, bounds: tuple[float, ...] = POLL_BUCKETS) -> None:
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._count = 0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self._bounds, seconds)
        if i < len(self._counts):
            self._counts[i] += 1
        self._sum += seconds
        self._count += 1

    def frozen(self) -> PollHistogram:
        cumulative, running = [], 0
        for n in self._counts:
            running += n
            cumulative.append(running)
        return PollHistogram(self._bounds, tuple(cumulative), self._sum, self._count)


class Agent:
    """One node's agent: the device poller, the latest snapshot, and what serves it."""

    def __init__(
        self,
        config: Config,
        *,
        nvml: Any = None,
        backend: str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        if nvml is None:
            nvml, backend = load_nvml(config.devices.backend, config.devices.scenario)
        self.backend = backend or "nvml"
        self._clock = clock
        self._monotonic = monotonic
        fallback = getattr(nvml, "process_name", None)  # the simulator names its made-up PIDs
        self.devices = DevicePoller(
            nvml,
            timeout=config.devices.nvml_timeout,
            slow_interval=config.devices.slow_poll_interval,
            energy_interval=config.devices.energy_interval,
            profiling_interval=config.devices.profiling_interval,
            process_utilization_interval=config.devices.process_utilization_interval,
            detail_interval=config.devices.detail_interval,
            xid_window=config.devices.xid_window,
            process_names=ProcessNames(config.pods.proc_root, fallback=fallback),
            clock=clock,
            monotonic=monotonic,
        )
        self.pods = pods_source(config, environ_fallback=getattr(nvml, "process_environ", None),
                                monotonic=monotonic)
        self.network = network_source(config.network, proc_root=config.pods.proc_root,
                                      monotonic=monotonic)  # None with network: false
        self.enforcer = build_enforcer(config, monotonic=monotonic)
        self.accountant = build_accountant(config)
        self.publisher = build_publisher(config, monotonic=monotonic, wall_clock=clock)
        self.health = build_health(config)  # None with health_mode: off
        self.hints = HintsEngine()  # moving averages of SM use: 10 s and 5 min time constants
        self.latest: NodeSnapshot | None = None
        self._durations = PollDurations()
        self._polls = 0
        self._poll_failure = ""
        self._pods_failure = ""
        self._failures: dict[str, str] = {}  # a consumer's failure message -> its last error (_guarded)
        self.registry = build_registry(lambda: self.latest, clock=clock,
                                       xid_window_seconds=config.devices.xid_window, backend=self.backend)

    async def poll_once(self) -> NodeSnapshot:
        """Poll every source once and publish the snapshot."""
        started = self._monotonic()
        try:
            reading = await self.devices.poll()
            ok, error, gpus = reading.ok, reading.error, reading.gpus
            versions = (reading.driver_version, reading.nvml_version, reading.cuda_driver_version)
            xid_error = reading.xid_error
        except Exception as exc:  # a bug must not stop the agent serving: report it as the source's failure
            if repr(exc) != self._poll_failure:
                log.exception("device poll failed")
                self._poll_failure = repr(exc)
            ok, error = False, f"poll failed: {exc!r}"
            gpus = self.latest.gpus if self.latest else ()
            versions = (None, None, None)
            xid_error = ""
        pods: tuple[PodUse, ...] = ()
        statuses: tuple[SourceStatus, ...] = ()
        dra: tuple[DraDevice, ...] = ()
        dra_taints: tuple[DraTaint, ...] = ()
        if gpus:
            try:
                attributed = await self.pods.attribute(gpus)
                gpus, pods, statuses = attributed.gpus, attributed.pods, attributed.statuses
                dra, dra_taints = attributed.dra, attributed.dra_taints
            except Exception as exc:  # attribution failing must not cost the device figures
                if repr(exc) != self._pods_failure:
                    log.exception("pod attribution failed")
                    self._pods_failure = repr(exc)
                statuses = (SourceStatus("pods", False, 0.0, f"attribution failed: {exc!r}"),)
        network = None
        if self.network is not None:  # after attribution: a pod's traffic is read through its PIDs
            network = await self.network.update(pod_pids(gpus))  # reads in the background once started
            statuses = (*statuses, self.network.status)
        duration = self._monotonic() - started
        self._durations.observe(duration)
        self._polls += 1
        snapshot = NodeSnapshot(
            hostname=self.config.agent.hostname,
            backend=self.backend,
            taken_at_unix=self._clock(),
            taken_at_monotonic=self._monotonic(),
            poll_duration_seconds=duration,
            driver_version=versions[0],
            nvml_version=versions[1],
            cuda_driver_version=versions[2],
            gpus=gpus,
            sources=(
                SourceStatus(name="nvml", ok=ok, duration_seconds=duration, error=error),
                SourceStatus(name="xid_events", ok=not xid_error, duration_seconds=0.0, error=xid_error),
                *statuses,
            ),
            pods=pods,
            network=network,
            nvml_calls=self.devices.guard.call_stats(),
            nvml_errors=self.devices.guard.error_counts(),
            polls_total=self._polls,
            poll_histogram=self._durations.frozen(),
            poll_interval_seconds=self.config.devices.poll_interval,
            dra=dra,
            dra_taints=dra_taints,
        )
        if self.enforcer is not None:
            enforcement = self._guarded("enforcement failed; thawing everything until it works again",
                                        self.enforcer.update, snapshot, on_failure=self.enforcer.shutdown)
            snapshot = replace(snapshot, enforcement=enforcement)
            # the share controller closes its loop on per-process use: read it every poll where it acts
            self.devices.read_process_utilization_every_poll(self.enforcer.contended_gpus)
        # counters and idle flags (the idle Events queued, never awaited)
        accounting = self._guarded("accounting failed", self.accountant.update, snapshot)
        snapshot = replace(snapshot, accounting=accounting)
        if self.health is not None:  # before the hints: a GPU with a fault is not offered
            # GPU faults and what is done about them (the Node's writes queued, never awaited)
            health = self._guarded("classifying GPU health failed", self.health.update, snapshot)
            snapshot = replace(snapshot, health=health)
        hints = self._guarded("computing the scheduling hints failed", self.hints.update, snapshot)
        snapshot = replace(snapshot, hints=hints)  # last: it reads everything above
        if self.publisher is not None:
            self.publisher.offer(snapshot.hints)
            snapshot = replace(snapshot, publish=self.publisher.state())
        self.latest = snapshot
        return snapshot

    def admin_thaw(self, pause_seconds: float) -> dict[str, Any]:
        """``POST /v1/admin/thaw``: thaw what the enforcer froze and pause throttling."""
        if self.enforcer is None:
            return {"thawed": 0, "paused_seconds": 0.0, "mode": self.config.enforce.mode}
        thawed = self.enforcer.pause(pause_seconds)
        return {"thawed": thawed, "paused_seconds": pause_seconds, "mode": self.config.enforce.mode}

    def admin_reload_policies(self) -> dict[str, Any]:
        """``POST /v1/admin/reload-policies``: re-read the config file's ``policies:`` and apply them;
        a bad file or rule raises ``ConfigError`` naming the key path, and the old rules stay."""
        path = self.config.config_file
        if not path:
            raise ConfigError("policies", "the agent was started without a config file to reload", "agent")
        policies = load_config(path, env={"NODE_NAME": self.config.agent.hostname or ""}).enforce.policies
        rules, _ = preflight.policies(self.config, policies, source=path)
        if self.enforcer is not None:
            self.enforcer.set_rules(rules)
        applied = self.enforcer is not None
        return {"policies": len(rules), "applied": applied, "mode": self.config.enforce.mode}

    def admin_actions(self) -> AdminActions | None:
        """The admin endpoints' callables when the config enables them (a token file or a socket)."""
        if not (self.config.server.admin_token_file or self.config.server.admin_socket):
            return None
        return AdminActions(thaw=self.admin_thaw, reload_policies=self.admin_reload_policies)

    def _guarded(self, failed: str, update: Callable[[NodeSnapshot], _T], snapshot: NodeSnapshot,
                 on_failure: Callable[[], object] | None = None) -> _T | None:
        """``update(snapshot)`` for one consumer, whose failure costs its part of this poll's snapshot (None),
        not the poll: ``failed`` is logged with the traceback once per distinct error (a success forgets
        it), then ``on_failure()`` runs."""
        try:
            result = update(snapshot)
        except Exception as exc:
            if repr(exc) != self._failures.get(failed, ""):
                log.exception(failed)
                self._failures[failed] = repr(exc)
            if on_failure is not None:
                on_failure()
            return None
        self._failures[failed] = ""
        return result

    async def poll_forever(self) -> None:
        """Poll at a fixed rate; a poll that overruns skips the ticks it missed instead of bunching up."""
        interval = self.config.devices.poll_interval
        next_tick = self._monotonic()
        while True:
            await self.poll_once()
            next_tick += interval
            now = self._monotonic()
            if next_tick < now:
                next_tick = now + interval - ((now - next_tick) % interval)
            await asyncio.sleep(next_tick - now)

    async def serve(self, stop: asyncio.Event, shutdown: Shutdown | None = None) -> bool:
        """Run the poller and the HTTP server until ``stop`` is set or one of them fails, then shut down
        (``shutdown``, by default one that reports and never exits the process); True if that was clean.
        What runs is said here, how it is run and stopped in :func:`gpuagent.serving.serve_until_stopped`."""
        recovered = recover_frozen(self.config.enforce)
        if recovered:
            log.warning("thawed %d cgroups a previous run left frozen (from %s)", recovered,
                        self.config.enforce.journal_path)
        shutdown = shutdown or self.shutdown_plan()
        admin = self.admin_actions()
        app = build_app(lambda: self.latest, self.registry, clock=self._clock, admin=admin,
                        admin_token_file=self.config.server.admin_token_file)
        return await serve_until_stopped(self.config.server, app, admin=admin, backend=self.backend,
                                         poll_interval=self.config.devices.poll_interval,
                                         poller=self.poll_forever, tasks=self._tasks(), stop=stop,
                                         shutdown=shutdown, closers=self._closers())

    def _tasks(self) -> list[TaskStarter]:
        """What runs beside the poller, by task name: the watchers and writers the config turned on."""
        tasks: list[TaskStarter] = []
        if self.pods.metadata is not None:
            tasks.append(("pod-metadata", self.pods.metadata.run))
        slices = self.pods.dra.slices if self.pods.dra is not None else None
        if slices is not None:  # lists nothing until the kubelet reports a DRA GPU device
            tasks.append(("dra-resource-slices", slices.run))
        if self.enforcer is not None and self.enforcer.cycling:
            tasks.append(("duty-cycle", self.enforcer.run))
        if self.accountant.events is not None:
            tasks.append(("idle-events", self.accountant.events.run))
        if self.publisher is not None:
            tasks.append(("publish-state", self.publisher.run))
        if self.health is not None and self.health.writer is not None:
            tasks.append(("gpu-health-writer", self.health.writer.run))
        return tasks

    def _closers(self) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
        """What the agent opened besides its HTTP servers, by name, in the order it is closed."""
        closers: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("nvml", self.devices.close), ("pods", self.pods.close)]
        if self.network is not None:
            closers.append(("network", self.network.close))
        closers.append(("idle-events", self.accountant.close))
        if self.publisher is not None:
            closers.append(("publish-state", self.publisher.close))
        if self.health is not None and self.health.writer is not None:
            closers.append(("gpu-health", self.health.writer.aclose))
        return closers

    async def aclose(self) -> None:
        """Thaw whatever the enforcer froze, then close what the agent opened, as :meth:`serve` ends: for an
        agent driven by :meth:`poll_once` alone (the demo's history, a bench, a test)."""
        self._thaw_everything()
        for _, close in self._closers():
            await close()

    def shutdown_plan(self, **process: Any) -> Shutdown:
        """The bounded shutdown of this agent: thaw the enforcer's freezes first, wait for the GPU workers;
        ``process`` (``exit``, ``executor``, ``backstop``) makes it end the process when it cannot finish."""
        return Shutdown(self.config.server.shutdown_timeout, thaw=self._thaw_everything,
                        threads=self.devices.working_threads, **process)

    def _thaw_everything(self) -> int:
        return self.enforcer.shutdown() if self.enforcer is not None else 0


def run(config: Config) -> int:
    """``gpuagent run``: serve until SIGTERM, SIGINT or SIGHUP. Returns the process exit code (0; 1 when it
    cannot listen); a shutdown that cannot finish in ``shutdown_timeout`` ends the process with 3 instead.

    SIGHUP is a stop like the others (the terminal of ``gpuagent run`` or ``gpuagent demo`` was closed): its
    default action ends the process at once, with no thaw and no clean-up, so a workload frozen in its slot
    would wait for the next start's journal. Where the agent was started with SIGHUP ignored (``nohup``, the
    demo script), it stays ignored."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        io = ThreadPoolExecutor(thread_name_prefix=IO_THREAD_PREFIX)  # to_thread's: shutdown waits for it
        loop.set_default_executor(io)
        agent = Agent(config)
        tune_garbage_collector()
        shutdown = agent.shutdown_plan(exit=process_exit, executor=io, backstop=True)
        stop = asyncio.Event()
        first_signal_at: list[float] = []

        def on_signal(signum: int, _frame: object) -> None:
            # A Python-level handler, not loop.add_signal_handler: it runs even while the loop is blocked,
            # so the backstop is armed whatever the loop is doing. It only arms and schedules.
            now = time.monotonic()
            if not first_signal_at:
                first_signal_at.append(now)
                arm_backstop(config.server.shutdown_timeout)
                loop.call_soon_threadsafe(stop.set)
            elif now - first_signal_at[0] < DUPLICATE_SIGNAL_SECONDS:
                pass  # the same request delivered twice (`timeout` signals the child and its process group)
            else:  # a second request: no more waiting
                reason = f"{signal.Signals(signum).name} again during shutdown"
                loop.call_soon_threadsafe(shutdown.force, reason)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, on_signal)
        try:
            await agent.serve(stop, shutdown)
        except OSError as exc:
            log.error("cannot listen on %s: %s", config.server.listen, exc)
            return 1
        return 0

    return asyncio.run(main())


def tune_garbage_collector() -> None:
    """Once the agent is built: what start-up loaded (modules, config) is kept out of every later
    collection (``gc.freeze``), and the youngest generation is collected every ``GC_YOUNG_OBJECTS``
    allocations. A poll of a pod-dense node makes tens of thousands of objects that live about a poll;
    at CPython's defaults the collector ran many times a poll and its full passes walked the whole heap,
    14-36 % of a poll's CPU at 110-250 pods (``bench/bench_scale.py``, docs/scale.md). Cycles are still
    collected."""
    gctune.tune(GC_YOUNG_OBJECTS)


def read_only(config: Config) -> Config:
    """``config`` for a one-shot look (``snapshot``, ``hints``): the same sources and figures, nothing acted
    on. Run on a node with the production config, the look would otherwise enforce beside the live agent
    (freeze, journal, SIGTERM or evict a pod over its memory limit), write the Node's health, publish the
    GPUNodeState and post Events: that is the agent's work, never a command's run to look."""
    health = "off" if config.health.mode == "off" else "audit"
    return replace(config, enforce=replace(config.enforce, mode="off"),
                   health=replace(config.health, mode=health), publish=replace(config.publish, state="off"),
                   accounting=replace(config.accounting, idle_events="off"))


def poll_once(config: Config) -> NodeSnapshot:
    """``gpuagent snapshot``: two polls 200 ms apart, the last one (per-process figures since the first),
    read only (:func:`read_only`)."""

    async def main() -> NodeSnapshot:
        agent = Agent(read_only(config))
        try:
            await agent.poll_once()
            await asyncio.sleep(0.2)
            return await agent.poll_once()
        finally:
            await agent.aclose()

    return asyncio.run(main())
