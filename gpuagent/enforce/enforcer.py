"""The enforcer: turns each snapshot into share and memory decisions, and hands them to the actions gate.

Each poll, per workload (a pod, or a workload a config rule names): its limits (annotations > config rules >
node defaults), its measured SM use per GPU and its GPU memory. One controller per GPU decides frozen
fractions (:class:`RotationController` under ``share_scheme: rotation``, :class:`ShareController` under
``duty``); the :class:`Cycler` applies them between polls with the scheme's plan; the :class:`MemoryLadder`
decides warn → SIGTERM → SIGKILL (or eviction). ``Actions`` carries out, or in audit mode only counts, every
step. MIG instances are hard isolation already: no shares there.

The cycler runs in audit mode too, so that audit counts what enforce would do, decision for decision: one
``freeze`` (outcome "audit") each time a throttled workload's cgroup would go from thawed to frozen (once per
period while its frozen fraction is under 1; once for as long as it is held at 1) and one ``thaw`` each time
it would be let go, exactly the writes enforce counts as "done". ``Actions`` touches nothing in
audit mode, and the time a workload would have spent frozen is not reported as throttled time.

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
from dataclasses import dataclass, field

from gpuagent.enforce.actions import Actions, FreezeTarget
from gpuagent.enforce.memory import MemoryLadder, pod_key
from gpuagent.enforce.policy import Limits, NodeDefaults, PolicyRule, limits_for_pod, limits_for_workload
from gpuagent.enforce.timeslice import Cycler, RotationController, ShareController, Tenant
from gpuagent.snapshot import (
    MPS_CLIENT,
    MPS_SERVER,
    EnforcementState,
    NodeSnapshot,
    PodUse,
    PolicyProblem,
    ProcessSample,
    ShareState,
    Workload,
    combined_mps_limits,
    sm_share_ratio,
)

log = logging.getLogger(__name__)

_Answer = tuple[Limits, tuple[PolicyProblem, ...]]  # a workload's limits and its annotations' problems


def owner_key(workload: Workload) -> str:
    """One key per thing limits apply to: ``ns/pod`` for a pod, ``kind:name`` otherwise."""
    if workload.kind == "pod":
        return pod_key(workload.name, workload.namespace)  # the ladder's key: its steps name owners by it
    return f"{workload.kind}:{workload.name}"


@dataclass(slots=True)
class _Owner:
    """A workload's figures in one snapshot."""

    namespace: str | None
    name: str
    limits: Limits
    util_by_gpu: dict[str, float] = field(default_factory=dict)
    memory_bytes: int = 0
    pids: list[int] = field(default_factory=list)
    gpus: set[str] = field(default_factory=set)  # UUIDs of the GPUs it has processes on
    targets: set[FreezeTarget] = field(default_factory=set)
    processes: list[ProcessSample] = field(default_factory=list)
    mps_client: bool = False  # one of its processes is an MPS client


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
    ) -> None:
        self.mode = mode
        self._work_conserving = work_conserving
        self.actions = actions
        self._ladder = ladder
        self._defaults = defaults or NodeDefaults()
        self._rules = tuple(rules)
        self._cycler = cycler
        self._new_controller = controller
        self._controllers: dict[str, ShareController | RotationController] = {}
        self._clock = clock
        self._throttling: set[str] = set()
        self._targets: dict[str, set[FreezeTarget]] = {}  # what the cycler holds per workload
        self._seen: set[str] = set()
        self._reported: set[tuple[str, str, str]] = set()  # policy problems logged once each
        self._pending: set[asyncio.Task[object]] = set()
        self._paused_until = float("-inf")  # an operator's manual thaw holds throttling off until then
        # Each workload's limits and problems by what they are worked out from: this poll's and the last's.
        self._limits_now: dict[tuple[object, ...], tuple[Limits, tuple[PolicyProblem, ...]]] = {}
        self._limits_before: dict[tuple[object, ...], tuple[Limits, tuple[PolicyProblem, ...]]] = {}
        # The same by the identity of what they come from: id(workload) -> (workload, its pod's annotations
        # object, the key above, the answer).
        self._by_workload_now: dict[int, tuple[Workload, object, tuple[object, ...], _Answer]] = {}
        self._by_workload_before: dict[int, tuple[Workload, object, tuple[object, ...], _Answer]] = {}
        self._contended: frozenset[str] = frozenset()

    @property
    def contended_gpus(self) -> frozenset[str]:
        """UUIDs of the GPUs where the share controller acts: two or more non-exempt workloads with processes
        there at the last update (whether or not their use has been measured yet), or, without work
        conservation, one with a share (held to it even alone). The device poller reads per-process
        utilization every poll on these, and less often elsewhere."""
        return self._contended

    @property
    def cycling(self) -> bool:
        """Whether there is a cycler to run (audit counts its freezes, enforce makes them)."""
        return self._cycler is not None

    async def run(self) -> None:
        """The cycler (rotation or duty cycle), between polls; returns at once without one."""
        if self._cycler is not None:
            await self._cycler.run()

    def shutdown(self) -> int:
        """Thaw everything now: on SIGTERM/SIGINT and before any other cleanup."""
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
        for key in list(self._throttling):
            self._release(key)
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
        return self._rules

    def set_rules(self, rules: Sequence[PolicyRule]) -> None:
        """New config policies (an admin reload), used from the next poll on."""
        self._rules = tuple(rules)
        self._limits_now, self._limits_before = {}, {}
        self._by_workload_now, self._by_workload_before = {}, {}

    def update(self, snapshot: NodeSnapshot) -> EnforcementState:
        owners, problems = self._owners(snapshot)
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
        )

    # -- who, with which limits --------------------------------------------------------------------

    def _owners(self, snapshot: NodeSnapshot) -> tuple[dict[str, _Owner], tuple[PolicyProblem, ...]]:
        pods = {(p.namespace, p.name): p for p in snapshot.pods}
        self._limits_before, self._limits_now = self._limits_now, {}  # kept: what this poll asks for
        self._by_workload_before, self._by_workload_now = self._by_workload_now, {}
        owners: dict[str, _Owner] = {}
        problems: list[PolicyProblem] = []
        target_for = self.actions.target_for
        for gpu in snapshot.gpus:
            uuid, shared = gpu.info.uuid, not gpu.info.mig_enabled  # MIG: hard isolation, no shares
            for process in gpu.processes:
                w = process.workload
                if w is None or process.kind == MPS_SERVER:
                    continue  # the MPS server serves every tenant: never throttled, never killed
                key = owner_key(w)
                owner = owners.get(key)
                if owner is None:
                    limits, found = self._limits(w, pods.get((w.namespace, w.name)))
                    problems.extend(found)
                    owner = owners[key] = _Owner(w.namespace, w.name, limits)
                if shared:
                    share = sm_share_ratio(process)
                    if share is not None:
                        owner.util_by_gpu[uuid] = owner.util_by_gpu.get(uuid, 0.0) + share
                    owner.gpus.add(uuid)
                owner.memory_bytes += process.used_memory_bytes or 0
                owner.pids.append(process.pid)
                owner.processes.append(process)
                if process.kind == MPS_CLIENT:
                    owner.mps_client = True
                target = target_for(w.cgroup_v2, w.cgroup_freezer)
                if target is not None:
                    owner.targets.add(target)
        return owners, tuple(problems)

    def _limits(self, workload: Workload, pod: PodUse | None) -> tuple[Limits, tuple[PolicyProblem, ...]]:
        """A workload's limits and its annotations' problems; the last poll's answer while everything they
        are worked out from is the same (limits change only with annotations or rules, and every pod's
        are asked for on every poll)."""
        annotations = pod.annotations if pod is not None else None
        # First by identity: the same Workload object (the attribution passes an unchanged one on) with
        # the same annotations object (likewise, while the pod's names are the same) asks the same.
        same = self._by_workload_now.get(id(workload)) or self._by_workload_before.get(id(workload))
        if same is not None and same[0] is workload and same[1] is annotations:
            self._by_workload_now[id(workload)] = same
            self._limits_now[same[2]] = same[3]
            return same[3]
        if workload.kind != "pod":
            key: tuple[object, ...] = (workload.kind, workload.name, workload.namespace, workload.cgroup,
                                       workload.cgroup_v2, workload.cgroup_freezer)
        else:
            key = ("pod", workload.name, workload.namespace, tuple((annotations or {}).items()))
        known = self._limits_now.get(key) or self._limits_before.get(key)
        if known is None:
            known = self._work_out_limits(workload, pod)
        self._limits_now[key] = known
        self._by_workload_now[id(workload)] = (workload, annotations, key, known)
        return known

    def _work_out_limits(self, workload: Workload, pod: PodUse | None
                         ) -> tuple[Limits, tuple[PolicyProblem, ...]]:
        if workload.kind != "pod":
            return limits_for_workload(workload, self._defaults, self._rules), ()
        if pod is None:  # a pod only known from its cgroup: no annotations to read
            pod = PodUse(name=workload.name, namespace=workload.namespace, uid=workload.pod_uid)
        limits, problems = limits_for_pod(pod, self._defaults, self._rules)
        for problem in problems:
            seen = (f"{problem.namespace}/{problem.pod}", problem.annotation, problem.value)
            if seen not in self._reported:
                self._reported.add(seen)
                log.warning("pod %s: annotation %s=%r: %s", seen[0], problem.annotation, problem.value,
                            problem.message)
        return limits, problems

    # -- time-slice shares -------------------------------------------------------------------------

    def _shares(self, snapshot: NodeSnapshot, owners: dict[str, _Owner]) -> tuple[ShareState, ...]:
        now = self._clock()
        fractions: dict[str, float] = defaultdict(float)
        groups: dict[str, str] = {}  # the GPU each throttled workload takes turns on: where it is held most
        paused = now < self._paused_until  # an operator's manual thaw (``pause``)
        decided: list[tuple[str, str, int, float, ShareController | RotationController]] = []
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
            for key in self._throttling - {k for k, f in fractions.items() if f > 0}:
                self._release(key)
            for key, fraction in fractions.items():
                if fraction > 0:
                    targets = sorted(owners[key].targets, key=str)
                    for gone in self._targets.get(key, set()) - set(targets):
                        self.actions.release(gone)
                    self._cycler.set(key, targets, fraction, groups.get(key))
                    self._targets[key] = set(targets)
            self._throttling = {k for k, f in fractions.items() if f > 0}
            for key in self._seen - owners.keys():  # workloads that left: drop their counters too
                self._cycler.forget(key)
        self._seen = set(owners)
        cycled = self._cycler is not None and self.mode == "enforce"  # audit: no time frozen to report
        throttled = self._cycler.throttled_seconds if cycled and self._cycler is not None else None
        states = []
        for key, uuid, index, fraction, controller in decided:
            owner = owners[key]
            limits = owner.limits
            # positional, in ShareState's field order: one of these per tenant per poll
            states.append(ShareState(
                owner.name, owner.namespace, uuid, index, limits.share_ratio, controller.achieved(key),
                fraction, throttled(key) if throttled is not None else 0.0, limits.priority,
                controller.correction(key) if isinstance(controller, RotationController) else None,
            ))
        return tuple(states)

    def _release(self, key: str) -> None:
        """Stop throttling a workload: thaw its cgroups now and take them off the journal."""
        if self._cycler is not None:
            self._cycler.set(key, (), 0.0)
        for target in self._targets.pop(key, set()):
            self.actions.release(target)
        self._throttling.discard(key)

    # -- memory limits -----------------------------------------------------------------------------

    def _memory(self, owners: dict[str, _Owner]) -> None:
        # The ladder keys pods as "ns/name"; a non-pod workload goes in under its owner key ("kind:name"),
        # so two workloads of different kinds with one name stay apart.
        items = [
            (o.name if o.namespace else key, o.namespace, _ladder_limit(o), o.memory_bytes, tuple(o.pids))
            for key, o in owners.items()
        ]
        for step in self._ladder.update(items):
            owner = owners.get(step.pod_key)
            if step.kind == "warn":
                log.warning("GPU memory limit exceeded: %s (%s)", step.pod_key, step.reason)
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


def _held_by_mps(owner: _Owner) -> bool:
    """Whether MPS already holds the workload to no more of the SMs than its share: then the controllers
    see it without a share (never throttled, it keeps what it uses), so MPS's limit is not fought."""
    share = owner.limits.share_ratio
    if share is None or not owner.mps_client:
        return False
    mps = combined_mps_limits(owner.processes)
    threads = mps.active_thread_percent if mps is not None else None
    return threads is not None and threads / 100.0 <= share


def _ladder_limit(owner: _Owner) -> int | None:
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
