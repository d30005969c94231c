"""The enforcer: turns each snapshot into share and memory decisions, and hands them to the actions gate.

Each poll, per workload (a pod, or a workload a config rule names): its limits (config rules > node defaults,
and what those let its pod's annotations change: :mod:`gpuagent.enforce.policy`), its measured SM use per
GPU and its GPU memory (grouped by :mod:`gpuagent.enforce.owners`). One controller per GPU decides frozen
fractions (:class:`RotationController` under ``share_scheme: rotation``, :class:`ShareController` under
``duty``); the :class:`Cycler` applies them between polls with the scheme's plan; the :class:`MemoryLadder`
decides warn → SIGTERM → SIGKILL (or eviction). ``Actions`` carries out, or in audit mode only counts, every
step. MIG instances are hard isolation already: no shares there.

The latency class (``policies[i].latency_sensitive``, ``gpuagent.io/latency-sensitive``): under the
rotation, a GPU where a workload with a share is latency-sensitive has its :class:`RotationController`
wrapped in a :class:`LatencyController` (unwrapped, its state kept, once none is), and with a CPU reader
(``cpu``) the :class:`Preemption` watches it: the latency workloads' ``cpu.stat`` read every few
milliseconds, the GPU's batch workloads held frozen through the cycler while one has a request in hand.
Under ``share_scheme: duty`` the class is not applied (said once in the log). A batch workload held by a
preemption is journaled like a throttled one and released when it is neither.

The cycler runs in audit mode too, so that audit counts what enforce would do, decision for decision: one
``freeze`` (outcome "audit") each time a throttled workload's cgroup would go from thawed to frozen (once per
period while its frozen fraction is under 1; once for as long as it is held at 1) and one ``thaw`` each time
it would be let go, exactly the writes enforce counts as "done". ``Actions`` touches nothing in
audit mode, and the time a workload would have spent frozen is not reported as throttled time. The memory
ladder runs in audit mode too, step for step at enforce's times (a process not signalled stays on the GPU, as
one that ignored its SIGTERM would): its signals and evictions are counted as outcome "audit", and the
warning at its first step says what it would do next and when.

On an MPS GPU the server is infrastructure and never acted on; clients are frozen per cgroup like any
process. MPS's own limits are not fought (docs/mps.md): an MPS client held to a share of the SMs is
measured in SMs (``sm_share_ratio``), and a client whose MPS share is within its share limit is shown to
the controllers without a share (never throttled, it keeps what it uses: ``_held_by_mps``), and one above
it is time-sliced down to it; a workload whose MPS memory limits add up to no more
than its GPU memory limit is left to MPS (its allocations fail past that limit), since NVML's memory figure
also counts what the pinned limit does not (the CUDA context) and would put it over a limit it keeps.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from gpuagent.enforce.actions import Actions, FreezeTarget
from gpuagent.enforce.memory import MemoryLadder
from gpuagent.enforce.owners import Owner, Owners, decisions
from gpuagent.enforce.rules import NodeDefaults, PolicyRule
from gpuagent.enforce.timeslice import (
    Cycler,
    LatencyController,
    Preemption,
    RotationController,
    ShareController,
    Tenant,
)
from gpuagent.enforce.timeslice.preempt import Counter
from gpuagent.enforce.timeslice.ticks import kernel_tick, still_for
from gpuagent.snapshot.enforcement import EnforcementState, ShareState
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import combined_mps_limits

log = logging.getLogger(__name__)

_Controller = ShareController | RotationController | LatencyController  # one GPU's


class Enforcer:
    def __init__(
        self,
        *,
        mode: str,
        actions: Actions,
        ladder: MemoryLadder,
        defaults: NodeDefaults | None = None,
        rules: Sequence[PolicyRule] = (),
        cycler: Cycler | None = None,
        controller: Callable[[], ShareController | RotationController] = ShareController,
        clock: Callable[[], float] = time.monotonic,
        work_conserving: bool = True,
        cpu: Callable[[Sequence[FreezeTarget]], Sequence[Counter]] | None = None,
    ) -> None:
        self.mode = mode
        self._work_conserving = work_conserving
        self.actions = actions
        self._ladder = ladder
        self._owners = Owners(actions, defaults, rules)
        self._cycler = cycler
        self._new_controller = controller
        self._controllers: dict[str, _Controller] = {}
        # the latency class's preemption: with a cycler to hold and a CPU reader to sense with
        self._preemption = (Preemption(cycler, cpu, clock=clock)
                            if cycler is not None and cpu is not None else None)
        self._preemptible: set[str] = set()  # batch workloads a preemption may hold: their targets kept
        self._said_no_class = False
        self._clock = clock
        self._throttling: set[str] = set()
        self._targets: dict[str, set[FreezeTarget]] = {}  # what the cycler holds per workload
        self._seen: set[str] = set()
        self._pending: set[asyncio.Task[object]] = set()
        self._paused_until = float("-inf")  # an operator's manual thaw holds throttling off until then
        self._contended: frozenset[str] = frozenset()
        self._said_throttled: set[str] = set()  # workloads whose first throttling was logged at info

    @property
    def contended_gpus(self) -> frozenset[str]:
        """UUIDs of the GPUs where the share controller acts: two or more non-exempt workloads with processes
        there at the last update (whether or not their use has been measured yet), or, without work
        conservation, one with a share (held to it even alone). The device poller reads per-process
        utilization every poll on these, and less often elsewhere."""
        return self._contended

    @property
    def preemption(self) -> Preemption | None:
        """The latency class's preemption (None without a cycler or a CPU reader)."""
        return self._preemption

    @property
    def cycling(self) -> bool:
        """Whether there is a cycler to run (audit counts its freezes, enforce makes them)."""
        return self._cycler is not None

    async def run(self) -> None:
        """The cycler (rotation or duty cycle), between polls, and the latency class's preemption beside it;
        returns at once without a cycler."""
        if self._cycler is None:
            return
        if self._preemption is None:
            await self._cycler.run()
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(self._cycler.run())
            group.create_task(self._preemption.run())

    def shutdown(self) -> int:
        """Thaw everything now: on SIGTERM/SIGINT and before any other cleanup."""
        if self._preemption is not None:
            self._preemption.stop()
        if self._cycler is not None:
            self._cycler.stop_all()
        for task in self._pending:
            task.cancel()
        return self.actions.thaw_all()

    def pause(self, seconds: float) -> int:
        """An operator's manual thaw: thaw everything now and decide no throttling for ``seconds`` (the
        memory ladder keeps running); how many cgroups were frozen. Throttling resumes by itself."""
        frozen = len(self.actions.frozen)
        self._paused_until = self._clock() + seconds
        if self._preemption is not None:
            self._preemption.unwatch_all()
        for key in list(self._throttling | self._preemptible):
            self._release(key)
        self._preemptible.clear()
        if self._cycler is not None:
            self._cycler.stop_all()
        self.actions.thaw_all()
        return frozen

    @property
    def paused_seconds(self) -> float:
        """Seconds of the manual pause left (0 when throttling is on)."""
        return max(0.0, self._paused_until - self._clock())

    @property
    def rules(self) -> tuple[PolicyRule, ...]:
        return self._owners.rules

    def set_rules(self, rules: Sequence[PolicyRule]) -> None:
        """New config policies (an admin reload), used from the next poll on."""
        self._owners.set_rules(rules)

    def update(self, snapshot: NodeSnapshot) -> EnforcementState:
        owners, problems = self._owners.group(snapshot)
        tenants: dict[str, int] = defaultdict(int)
        held: set[str] = set()  # GPUs with a shared workload: held even alone (not conserving)
        for owner in owners.values():
            if not owner.limits.exempt:
                for uuid in owner.gpus:
                    tenants[uuid] += 1
                    if owner.limits.share_ratio is not None:
                        held.add(uuid)
        self._contended = frozenset(uuid for uuid, n in tenants.items()
                                    if n >= 2 or (not self._work_conserving and uuid in held))
        shares = self._shares(snapshot, owners)
        self._memory(owners)
        return EnforcementState(
            mode=self.mode,
            shares=shares,
            memory=self._ladder.states(),
            actions_total=dict(self.actions.counts()),
            problems=problems,
            frozen_cgroups=len(self.actions.frozen),
            share_scheme=self._cycler.plan.name if self._cycler is not None else None,
            share_period_seconds=self._cycler.period if self._cycler is not None else None,
            limits=decisions(owners),
            **self._sensing(),
        )

    def _sensing(self) -> dict[str, object]:
        """The latency class's tick reading, while the preemption watches a GPU (see EnforcementState)."""
        preemption = self._preemption
        ticks = preemption.ticks if preemption is not None and preemption.watched else None
        if ticks is None:
            return {}
        return {"latency_ticks": ticks.state, "tick_seconds": ticks.tick}

    # -- who, with which limits --------------------------------------------------------------------

    # -- time-slice shares -------------------------------------------------------------------------

    def _shares(self, snapshot: NodeSnapshot, owners: dict[str, Owner]) -> tuple[ShareState, ...]:
        now = self._clock()
        fractions: dict[str, float] = defaultdict(float)
        groups: dict[str, str] = {}  # the GPU each throttled workload takes turns on: where it is held most
        paused = now < self._paused_until  # an operator's manual thaw (``pause``)
        decided: list[tuple[str, str, int, float, _Controller]] = []
        classed: dict[str, LatencyController] = {}  # GPUs with a latency class, their controllers
        tenants_by_gpu: dict[str, list[Tenant]] = {}  # in the owners' order, as the controllers saw them
        for key, o in owners.items():
            limits = o.limits
            if limits.exempt:
                continue
            share = None if _held_by_mps(o) else limits.share_ratio
            for uuid, util in o.util_by_gpu.items():
                tenant = Tenant(key, util, share, limits.priority)
                on_gpu = tenants_by_gpu.get(uuid)
                if on_gpu is None:
                    tenants_by_gpu[uuid] = [tenant]
                else:
                    on_gpu.append(tenant)
        for gpu in snapshot.gpus:
            uuid = gpu.info.uuid
            tenants = tenants_by_gpu.get(uuid, [])
            controller = self._controllers.get(uuid)
            if not tenants:
                if controller is not None:
                    del self._controllers[uuid]
                continue
            if controller is None:
                controller = self._controllers[uuid] = self._new_controller()
            controller = self._classed(uuid, controller, tenants, owners)
            if isinstance(controller, LatencyController):
                classed[uuid] = controller
                if self._preemption is not None:
                    with self._preemption.lock:  # its sensing thread steps the same controller
                        result = controller.update(now, tenants)
                else:
                    result = controller.update(now, tenants)
            else:
                result = controller.update(now, tenants)
            index = gpu.info.index
            for tenant in tenants:
                key = tenant.key
                fraction = 0.0 if paused else result.get(key, 0.0)  # paused: release all
                if fraction > fractions[key]:  # (a defaultdict: the key is there either way)
                    fractions[key] = fraction
                    groups[key] = uuid
                decided.append((key, uuid, index, fraction, controller))
        if self._cycler is not None:
            throttled = {k for k, f in fractions.items() if f > 0}
            preemptible = self._preemptible_now(classed, owners, paused)
            for key in (self._throttling | self._preemptible) - throttled - preemptible:
                self._release(key)
            for key in preemptible - throttled:  # out of the plan, still held while its service has work
                targets = sorted(owners[key].targets, key=str)
                for gone in self._targets.get(key, set()) - set(targets):
                    self.actions.release(gone)
                self._cycler.set(key, targets, 0.0)
                self._targets[key] = set(targets)
            self._preemptible = preemptible
            for key, fraction in fractions.items():
                if fraction > 0:
                    targets = sorted(owners[key].targets, key=str)
                    for gone in self._targets.get(key, set()) - set(targets):
                        self.actions.release(gone)
                    self._cycler.set(key, targets, fraction, groups.get(key))
                    self._targets[key] = set(targets)
            throttling = {k for k, f in fractions.items() if f > 0}
            for key in sorted(throttling - self._throttling):
                self._say_throttled(key, fractions[key], owners[key].limits.share_ratio)
            self._throttling = throttling
            for key in self._seen - owners.keys():  # workloads that left: drop their counters too
                self._cycler.forget(key)
            self._watch(classed, owners, paused)
        self._seen = set(owners)
        cycled = self._cycler is not None and self.mode == "enforce"  # audit: no time frozen to report
        throttled = self._cycler.throttled_seconds if cycled and self._cycler is not None else None
        states = []
        for key, uuid, index, fraction, controller in decided:
            owner = owners[key]
            limits = owner.limits
            # positional, in ShareState's field order: one of these per tenant per poll
            classed = isinstance(controller, LatencyController)
            states.append(ShareState(
                owner.name, owner.namespace, uuid, index, limits.share_ratio, controller.achieved(key),
                fraction, throttled(key) if throttled is not None else 0.0, limits.priority,
                None if isinstance(controller, ShareController) else controller.correction(key),
                controller.standing(key) if classed else None, controller.preemptions(key) if classed else 0,
            ))
        return tuple(states)

    def _classed(self, uuid: str, controller: _Controller, tenants: Sequence[Tenant],
                 owners: dict[str, Owner]) -> _Controller:
        """The GPU's controller for its latency class: its rotation wrapped while a workload with a share
        there is latency-sensitive, unwrapped (its state kept) once none is."""
        latency = {t.key for t in tenants
                   if t.share_ratio is not None and owners[t.key].limits.latency_sensitive}
        if isinstance(controller, LatencyController):
            if not latency:
                self._controllers[uuid] = controller.rotation
                return controller.rotation
            if latency != controller.latency:
                if self._preemption is not None:
                    with self._preemption.lock:
                        controller.set_latency(latency)
                else:
                    controller.set_latency(latency)
            return controller
        if not latency:
            return controller
        if isinstance(controller, RotationController):
            wrapped = LatencyController(latency, rotation=controller, preempt=self._preemption is not None,
                                        still_s=still_for(kernel_tick()))  # the tick of this kernel
            self._controllers[uuid] = wrapped
            return wrapped
        if not self._said_no_class:
            self._said_no_class = True
            log.warning("latency-sensitive workloads (%s) are not a class under share_scheme: duty: they "
                        "are throttled as any other (the latency class needs the rotation)",
                        ", ".join(sorted(latency)))
        return controller

    def _preemptible_now(self, classed: dict[str, LatencyController], owners: dict[str, Owner],
                         paused: bool) -> set[str]:
        """The batch workloads a preemption may hold now: those of the GPUs with a latency class, with a
        cgroup to freeze (none while paused, or without a CPU reader)."""
        if self._preemption is None or paused:
            return set()
        return {key for controller in classed.values() for key in controller.batch()
                if key in owners and owners[key].targets}

    def _watch(self, classed: dict[str, LatencyController], owners: dict[str, Owner], paused: bool) -> None:
        """Hand each GPU with a latency class to the preemption (its latency and batch workloads' targets);
        stop watching the others."""
        preemption = self._preemption
        if preemption is None:
            return
        for uuid in preemption.watched - (set() if paused else classed.keys()):
            preemption.unwatch(uuid)
        if paused:
            return
        for uuid, controller in classed.items():
            latency = {key: sorted(owners[key].targets, key=str)
                       for key in controller.latency if key in owners}
            batch = {key: sorted(owners[key].targets, key=str) for key in controller.batch()
                     if key in self._preemptible}
            preemption.watch(uuid, controller, latency, batch)

    def _say_throttled(self, key: str, fraction: float, share: float | None) -> None:
        """A throttling episode begins: at info the first time for a workload (its freezes are logged at
        debug, and in audit mode only where there is a cgroup to name), at debug after that."""
        first = key not in self._said_throttled
        if first:
            if len(self._said_throttled) >= 4096:
                self._said_throttled.clear()
            self._said_throttled.add(key)
        limit = f" (share {share:.0%})" if share is not None else ""
        if self.mode == "audit":
            what = f"audit: would freeze {key} {fraction:.0%} of each period{limit}; nothing is frozen"
        else:
            what = f"throttling {key}: frozen {fraction:.0%} of each period{limit}"
        log.log(logging.INFO if first else logging.DEBUG, "%s", what)

    def _release(self, key: str) -> None:
        """Stop throttling (or holding) a workload: thaw its cgroups now and take them off the journal."""
        if self._preemption is not None:
            self._preemption.forget(key)
        if self._cycler is not None:
            self._cycler.set(key, (), 0.0)
        for target in self._targets.pop(key, set()):
            self.actions.release(target)
        self._throttling.discard(key)
        self._preemptible.discard(key)

    # -- memory limits -----------------------------------------------------------------------------

    def _memory(self, owners: dict[str, Owner]) -> None:
        # The ladder keys pods as "ns/name"; a non-pod workload goes in under its owner key ("kind:name"),
        # so two workloads of different kinds with one name stay apart.
        items = [
            (o.name if o.namespace else key, o.namespace, _ladder_limit(o), o.memory_bytes, tuple(o.pids))
            for key, o in owners.items()
        ]
        for step in self._ladder.update(items):
            owner = owners.get(step.pod_key)
            if step.kind == "warn":
                log.warning("GPU memory limit exceeded: %s (%s); %s", step.pod_key, step.reason,
                            self._escalation())
            elif step.kind in ("term", "kill"):
                # A frozen process cannot run its SIGTERM handler (v2), nor die of SIGKILL (v1): thaw first.
                self._release(step.pod_key)
                sig = signal.SIGTERM if step.kind == "term" else signal.SIGKILL
                for pid in step.pids:
                    self.actions.signal(pid, sig, reason=step.reason)
            elif step.kind == "evict" and owner is not None and owner.namespace:
                eviction = self.actions.evict(owner.namespace, owner.name, reason=step.reason)
                task = asyncio.ensure_future(eviction)
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)

    def _escalation(self) -> str:
        """What the memory ladder does next to a pod that stays over, as the warning says it: in audit mode
        what it would do, the same steps at the same times, with nothing signalled or evicted."""
        settings = self._ladder.settings
        if settings.action == "warn":
            return "only warned (memory_action: warn)"
        if settings.action == "evict":
            plan = (f"evict the pod after {settings.term_after:g}s over, again every "
                    f"{settings.kill_grace:g}s while it stays over")
        else:
            plan = (f"SIGTERM its GPU processes after {settings.term_after:g}s over, SIGKILL those still "
                    f"on the GPU {settings.kill_grace:g}s later")
        if self.mode == "audit":
            return f"audit: would {plan}; nothing is signalled or evicted"
        return f"will {plan}"


def _held_by_mps(owner: Owner) -> bool:
    """Whether MPS already holds the workload to no more of the SMs than its share: then the controllers
    see it without a share (never throttled, it keeps what it uses), so MPS's limit is not fought."""
    share = owner.limits.share_ratio
    if share is None or not owner.mps_client:
        return False
    mps = combined_mps_limits(owner.processes)
    threads = mps.active_thread_percent if mps is not None else None
    return threads is not None and threads / 100.0 <= share


def _ladder_limit(owner: Owner) -> int | None:
    """The limit the ladder holds a workload to: its GPU memory limit, unless its processes are all MPS
    clients whose pinned limits add up to no more (MPS holds it to those already: see the module)."""
    limit = None if owner.limits.exempt else owner.limits.memory_bytes
    if limit is None:
        return None
    if not owner.mps_client:
        return limit  # no MPS client: MPS holds it to nothing (combined_mps_limits: None)
    mps = combined_mps_limits(owner.processes)
    held = mps.pinned_memory_limit_bytes if mps is not None else None
    return None if held is not None and held <= limit else limit
