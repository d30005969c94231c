"""Kubernetes Events (events.k8s.io/v1) on pods found holding GPUs idle: posted once per idle episode.

The poll never waits on the API server: :meth:`IdleEventPoster.submit` only queues (a bounded queue) and
:meth:`IdleEventPoster.run`, a task of its own, posts. A node-wide token bucket (``burst`` Events, one more
every ``refill_seconds``) caps the rate; what it or a full queue refuses is counted and dropped. An answer
other than 2xx, or an API server that cannot be reached, is counted and logged once per change, and never
retried: the next idle episode gets its own Event. RBAC: ``create`` on ``events.events.k8s.io``.

The Event: ``type: Warning`` (it asks a person to act: give the GPU back), ``reason: GpuIdle``,
``action: FlagIdle``, ``regarding`` the pod (with its UID when known), ``related`` the node,
``reportingController: gpuagent.io/agent``, ``reportingInstance`` the node name.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpuagent.kubeapi import ApiConnection, WriteBudget, event_body

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "gpuagent.io/agent"
REASON = "GpuIdle"
ACTION = "FlagIdle"
EVENT_TYPE = "Warning"
OUTCOMES = ("posted", "failed", "unreachable", "rate_limited", "dropped")


@dataclass(frozen=True, slots=True)
class IdleNotice:
    """A pod that started an idle episode long enough to flag: what its Event says."""

    namespace: str
    pod: str
    pod_uid: str | None
    gpus: Sequence[str]  # e.g. "GPU 0 (GPU-8f2c…)", "GPU 1 (GPU-…) MIG 3g.40gb instance 2"
    idle_seconds: float
    threshold_ratio: float


def idle_event(notice: IdleNotice, *, node: str, now_unix: float) -> dict[str, Any]:
    """The events.k8s.io/v1 Event body for ``notice``."""
    regarding: dict[str, Any] = {"kind": "Pod", "apiVersion": "v1", "namespace": notice.namespace,
                                 "name": notice.pod}
    if notice.pod_uid:
        regarding["uid"] = notice.pod_uid
    minutes = notice.idle_seconds / 60
    note = (f"{', '.join(notice.gpus)} held for {minutes:.0f} min with SM use under "
            f"{notice.threshold_ratio * 100:g}% of what the pod holds; nothing is stopped (report only)")
    return event_body(regarding=regarding, reason=REASON, action=ACTION, note=note, event_type=EVENT_TYPE,
                      reporting_instance=node, now_unix=now_unix, reporting_controller=REPORTING_CONTROLLER,
                      related={"kind": "Node", "apiVersion": "v1", "name": node})


_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


class IdleEventPoster:
    """Queues idle notices and posts them as Events from :meth:`run` (a task of the agent).

    ``connection`` (default: one from ``kubeconfig_path``, else lightkube's environment) reaches the API
    server; ``clock`` (monotonic seconds) drives the rate limit, ``wall_clock`` the Events' times.
    """

    def __init__(
        self,
        node: str,
        connection: ApiConnection | None = None,
        *,
        kubeconfig_path: str | None = None,
        queue_size: int = 64,
        burst: int = 10,
        refill_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if burst < 1 or refill_seconds <= 0 or queue_size < 1:
            raise ValueError("idle events: burst >= 1, refill_seconds > 0, queue_size >= 1")
        self.node = node
        self._connection = connection or ApiConnection(kubeconfig_path=kubeconfig_path)
        self._queue: asyncio.Queue[IdleNotice] = asyncio.Queue(queue_size)
        self._budget = WriteBudget(burst, refill_seconds)
        self._clock = clock
        self._wall = wall_clock
        self._counts: Counter[str] = Counter()
        self._problem = ""  # the last failure logged, "" while posting works

    def submit(self, notice: IdleNotice) -> str:
        """Queue an Event for ``notice`` without waiting: "queued", "rate_limited" or "dropped"."""
        if not _NAMESPACE.fullmatch(notice.namespace):
            return self._count("dropped", "namespace", f"no Event for {notice.pod}: bad namespace "
                               f"{notice.namespace!r}")
        if not self._budget.take(self._clock()):
            return self._count("rate_limited")
        try:
            self._queue.put_nowait(notice)
        except asyncio.QueueFull:
            return self._count("dropped", "queue", "idle Events: the queue is full")
        return "queued"

    def counts(self) -> Mapping[str, int]:
        """Outcome -> Events since start; a copy."""
        return dict(self._counts)

    async def run(self) -> None:
        """Post what was queued, one at a time, until cancelled."""
        while True:
            notice = await self._queue.get()
            try:
                await self._post(notice)
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Wait until everything queued so far was posted (or failed); for tests and shutdown."""
        await self._queue.join()

    async def aclose(self) -> None:
        await self._connection.aclose()

    async def _post(self, notice: IdleNotice) -> None:
        body = idle_event(notice, node=self.node, now_unix=self._wall())
        path = f"apis/events.k8s.io/v1/namespaces/{quote(notice.namespace, safe='')}/events"
        what = f"Event {REASON} on pod {notice.namespace}/{notice.pod}"
        try:
            status, message = await self._connection.post_json(path, body)
        except Exception as exc:  # unreachable, TLS, timeout, a bad kubeconfig: counted, not retried
            detail = str(exc) or type(exc).__name__
            self._count("unreachable", f"unreachable {type(exc).__name__}", f"cannot post {what}: {detail}")
            return
        if 200 <= status < 300:
            if self._problem:
                log.info("posting idle-GPU Events works again")
                self._problem = ""
            self._count("posted")
            log.info("posted %s", what)
            return
        self._count("failed", f"HTTP {status}", f"{what} refused: HTTP {status}" + (f": {message}" if message
                                                                                      else ""))

    def _count(self, outcome: str, problem: str = "", message: str = "") -> str:
        """Count an outcome; log a problem once until a different one (or success) comes."""
        self._counts[outcome] += 1
        if problem and problem != self._problem:
            log.warning("%s (counted in gpuagent_accounting_events_total; not retried)", message)
            self._problem = problem
        return outcome

