"""Makes the Node show the plan: conditions, Events, taints, cordon, drain and the remediation hand-off.

A task of its own (:meth:`NodeWriter.run`): the poll only hands it the latest plan (:meth:`submit`, no
waiting), so an API server that is slow or away never holds a poll up; the writer catches up with the newest
plan when it answers again (a failed round is tried again after ``retry_seconds``, doubling up to
``resync_seconds``), and re-checks the Node every ``resync_seconds`` (a person's change, a lost write).
Every write (patch, Event, Eviction) spends a token of the node's write budget
(:class:`gpuagent.kubeapi.WriteBudget`); what it refuses waits for the next round. Only ``enforce`` writes.

The order of a round: Events for what is new; the conditions (``PATCH nodes/<node>/status``, a strategic
merge by condition type); then, when the plan asks for a quarantine, a slot of the cluster-wide budget
(:mod:`gpuagent.health.budget`), the taints, cordon and annotations (one JSON merge patch carrying the
resourceVersion read, so a concurrent change makes it fail with 409 and the next round reads again), with
an Event on the Node when they change, and the drain of the pods on the faulty GPUs
(:mod:`gpuagent.health.drain`). When the faults clear, it undoes what is its own and gives the slot back.
RBAC: ``get``, ``patch`` on nodes and ``patch`` on nodes/status; ``create`` on pods/eviction and
events.events.k8s.io; the Lease of the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gpuagent.boundedjson import Unreadable
from gpuagent.health import node as nodes
from gpuagent.health.budget import BudgetError, QuarantineBudget
from gpuagent.health.drain import Drain
from gpuagent.health.plan import Plan, PodRef
from gpuagent.kubeapi import ApiConnection, WriteBudget, event_body
from gpuagent.snapshot.health import GpuFault

log = logging.getLogger(__name__)

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


@dataclass
class WriterStatus:
    """What the writer last managed; the monitor reports it in the snapshot."""

    api: str = "idle"
    taints: tuple[str, ...] = ()
    cordoned: bool = False
    quarantined: bool = False
    budget_deferred: bool = False
    override: bool = False
    drain: str = "none"
    remediation: str | None = None
    actions: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass(frozen=True)
class _Notice:
    fault: GpuFault
    pods: tuple[PodRef, ...]


class NodeWriter:
    """Writes one Node's health through ``connection``; ``budget`` None: quarantine without a cluster
    limit (tests, a single node)."""

    def __init__(self, node: str, connection: ApiConnection, *, settings_namespace_mode: Callable[[str], str],
                 budget: QuarantineBudget | None, events: bool = True, write_burst: int = 20,
                 write_refill_seconds: float = 2.0, resync_seconds: float = 30.0,
                 heartbeat_seconds: float = 300.0, retry_seconds: float = 2.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self._api = connection
        self._namespace_mode = settings_namespace_mode
        self._budget = budget
        self._events = events
        self._writes = WriteBudget(write_burst, write_refill_seconds)
        self._resync = resync_seconds
        self.retry_seconds = retry_seconds  # after a failed round; doubled each failure, up to resync_seconds
        self._failures = 0
        self._heartbeat = heartbeat_seconds
        self._clock = clock
        self._monotonic = monotonic
        self._plan: Plan | None = None
        self._notices: list[_Notice] = []
        self._wake = asyncio.Event()
        self._drain = Drain(connection, settings_namespace_mode, spend=self._spend, count=self._count,
                            monotonic=monotonic)
        self.status = WriterStatus()
        self.on_held: Callable[[list[tuple[str, str, int | None, float]]], None] | None = None
        self._adopted = False
        self._problem = ""

    def submit(self, plan: Plan, new_faults: Iterable[GpuFault], pods_by_gpu: Mapping[str, tuple[PodRef, ...]]
               ) -> None:
        """The latest plan, and Events to post for the faults new this poll; never waits."""
        if plan != self._plan:
            self._wake.set()
        self._plan = plan
        for fault in new_faults:
            if self._events and len(self._notices) < 256:
                self._notices.append(_Notice(fault, pods_by_gpu.get(fault.gpu_uuid or "", ())))
                self._wake.set()

    async def aclose(self) -> None:
        """At shutdown: what is on the Node stays (the fault outlives the agent); the connection closes."""
        await self._api.aclose()

    async def run(self) -> None:
        while True:
            wait = self._resync if not self._failures else min(
                self._resync, self.retry_seconds * 2 ** min(self._failures - 1, 10))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            await self.round()

    async def round(self) -> None:
        """One reconciliation; failures are reported in the status and logged once per change."""
        try:
            await self._round()
        except Exception as exc:  # unreachable, TLS, a bad kubeconfig, a refusal: reported, tried again
            self._failures += 1
            self._fail(str(exc) or type(exc).__name__)
            return
        self._failures = 0
        if self.status.api.startswith("failing") or self.status.api == "idle":
            if self._problem:
                log.info("writing node %s's GPU health works again", self.node)
            self._problem = ""
            self.status.api = "ok"

    def _fail(self, message: str) -> None:
        self.status.api = f"failing: {message}"[:300]
        if message != self._problem:
            log.warning("cannot write node %s's GPU health: %s (tried again)", self.node, message)
            self._problem = message

    def _spend(self) -> bool:
        return self._writes.take(self._monotonic())

    async def _round(self) -> None:
        plan = self._plan
        if plan is None:
            return
        await self._post_notices()
        path = f"api/v1/nodes/{quote(self.node, safe='')}"
        status, node, message = await self._api.get_json(path)
        if status != 200 or not isinstance(node, dict):
            raise RuntimeError(f"GET node {self.node}: HTTP {status} {message}".strip())
        if not self._adopted:  # once: what a previous run held until a reset, on this boot, is held again
            self._adopted = True
            try:
                held = nodes.held_of(node)
            except Unreadable as exc:  # not what an agent writes: ignored, and replaced by this run's own
                log.warning("node %s: ignoring the held faults on the Node: %s", self.node, exc)
                held = []
            if held and self.on_held is not None:
                self.on_held(held)
                self._plan = None  # made without them: wait for the next poll's plan, which has them
                return
        now = self._clock()
        patch = nodes.conditions_patch(node, plan.conditions, now, self._heartbeat)
        if patch is not None and self._spend():
            _, answer = await self._send("conditions", "PATCH", f"{path}/status", patch, STRATEGIC)
            if isinstance(answer, dict):
                node = answer  # the Node as patched: its new resourceVersion guards the next patch
        holding = await self._slot(plan)
        outcome = nodes.spec_patch(node, plan, quarantine=holding, remediation=True, now=now)
        if outcome.patch is not None:
            if not self._spend():
                return
            code, _ = await self._send("quarantine" if holding else "release", "PATCH", path, outcome.patch,
                                       MERGE)
            if code == 409:
                self._wake.set()  # the Node changed since it was read: read it again
                return
        s = self.status
        await self._say_quarantine(s.taints, s.cordoned, outcome, plan)
        s.taints, s.cordoned, s.override = outcome.taints, outcome.cordoned, outcome.override
        s.remediation = str(plan.remediation["action"]) if plan.remediation else None
        if not plan.quarantine and self._budget is not None and self._budget.held:
            await self._budget.release()
            self._count("budget", "released")
        s.quarantined = holding
        if holding and plan.drain and not outcome.override:
            s.drain = await self._drain.step(plan.pods)
        else:
            s.drain = "none"
            self._drain.reset()

    async def _say_quarantine(self, taints: tuple[str, ...], cordoned: bool,
                              outcome: nodes.SpecOutcome, plan: Plan) -> None:
        """An Event on the Node when the agent's taints or cordon change (what ``describe node`` lists)."""
        if (taints, cordoned) == (outcome.taints, outcome.cordoned):
            return
        if outcome.taints or outcome.cordoned:
            done = [*outcome.taints, *(["cordoned"] if outcome.cordoned else [])]
            await self._post_event(None, "GpuQuarantined", "Quarantine",
                                   f"{', '.join(done)} for GPU faults {plan.signature}")
        else:
            await self._post_event(None, "GpuQuarantineLifted", "Quarantine",
                                   "the agent's taints and cordon are lifted: its GPU faults cleared",
                                   "Normal")

    async def _slot(self, plan: Plan) -> bool:
        """Whether this node may be quarantined now (taking a slot of the budget when it is free)."""
        s = self.status
        if not plan.quarantine:
            s.budget_deferred = False
            return False
        if self._budget is None:
            return True
        try:
            held = await self._budget.acquire()
        except BudgetError as exc:
            self._count("budget", "failed")
            raise RuntimeError(str(exc)) from exc
        if not held and not s.budget_deferred:
            self._count("budget", "deferred")
            holders = ", ".join(self._budget.holders) or "none"
            log.warning("not quarantining node %s: the cluster-wide budget (%d nodes) is spent by %s",
                        self.node, self._budget.limit, holders)
            await self._post_event(None, "GpuQuarantineDeferred", "Quarantine",
                                   f"not tainted or cordoned: the cluster-wide quarantine budget "
                                   f"({self._budget.limit} nodes) is held by {holders}")
        elif held and not s.quarantined:
            self._count("budget", "acquired")
        s.budget_deferred = not held
        return held

    async def _send(self, action: str, method: str, path: str, body: Any,
                    content_type: str) -> tuple[int, Any]:
        status, answer, message = await self._api.send_json(method, path, body, content_type=content_type)
        if 200 <= status < 300:
            self._count(action, "done")
        elif status == 409:
            self._count(action, "conflict")
        else:
            self._count(action, "failed")
            raise RuntimeError(f"{method} {path}: HTTP {status} {message}".strip())
        return status, answer

    async def _post_notices(self) -> None:
        while self._notices:
            notice = self._notices.pop(0)
            f = notice.fault
            where = f"GPU {f.gpu_index} ({f.gpu_uuid})" if f.gpu_uuid else "the node's GPUs"
            note = f"{where}: {f.message}; severity {f.severity}, recommended action: {f.action}"
            if f.condition is not None:  # the node's own fault; a workload's error goes on its pods only
                await self._post_event(None, f.reason, "DetectGpuFault", note)
            for pod in notice.pods:
                await self._post_event(pod, f.reason, "DetectGpuFault", note)

    async def _post_event(self, pod: PodRef | None, reason: str, action: str, note: str,
                          event_type: str = "Warning") -> None:
        """One Event on the Node (``pod`` None) or on a pod, related to the Node; within the write budget."""
        if not self._events:
            return
        if not self._spend():
            self._count("event", "rate_limited")
            return
        node_ref = {"kind": "Node", "apiVersion": "v1", "name": self.node}
        regarding = node_ref
        if pod is not None:
            regarding = {"kind": "Pod", "apiVersion": "v1", "namespace": pod.namespace, "name": pod.name}
            if pod.uid:
                regarding["uid"] = pod.uid
        body = event_body(regarding=regarding, reason=reason, action=action, note=note, event_type=event_type,
                          reporting_instance=self.node, now_unix=self._clock(),
                          related=node_ref if pod is not None else None)
        namespace = quote(body["metadata"]["namespace"], safe="")
        path = f"apis/events.k8s.io/v1/namespaces/{namespace}/events"
        status, message = await self._api.post_json(path, body)
        self._count("event", "posted" if 200 <= status < 300 else "failed")
        if not 200 <= status < 300:
            log.warning("Event %s on %s refused: HTTP %d %s", reason, regarding["name"], status, message)

    def _count(self, action: str, outcome: str) -> None:
        self.status.actions[(action, outcome)] += 1
