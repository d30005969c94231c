"""The agent's side of the cluster view: its node's ``GPUNodeState``, written when a decision could change.

Every poll offers the new hints (:meth:`StatePublisher.offer`, no I/O: the poll never waits on the API
server). :class:`PublishPolicy` decides, in the caller's monotonic time:

- the hints are projected (``hints.published.project``): moving figures held at their published values
  until they move by a whole step, so the object changes only when a fit or a score could;
- a changed projection is written at once if ``min_interval`` has passed since the last write, else when it
  has (coalesced: only the latest is written);
- an unchanged one is written again after ``heartbeat`` seconds, so the extender can tell a silent agent
  from a quiet node (its staleness bound is a few heartbeats);
- a failed write is retried after the same ``min_interval`` (the API server being down never blocks
  polling: nothing waits on it but the publisher's own task);
- nothing is written before a poll has seen a GPU: while NVML is still loading (the driver at boot, the
  ``faults`` scenario's first 5 s) the hints hold no GPU, and a state of 0 GPUs would make the node a
  plain "does not fit" for the extender, which invites preemption there, where no state leaves it
  unresolvable ("no GPUNodeState published") until the first complete poll. A node that never sees a GPU
  never publishes, which is the same verdict for the same reason. Once a GPU has been seen, every poll's
  hints are offered (a GPU lost later stays in them, marked).

:meth:`StatePublisher.run` writes with server-side apply (``PATCH`` ``application/apply-patch+yaml``, the
JSON body is valid YAML), one request a write whether the object exists or not, through the node-wide
write budget of ``gpuagent.kubeapi``. RBAC: ``patch`` and ``create`` on ``gpunodestates.gpuagent.io``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gpuagent.hints.published import (
    DEFAULT_STEPS,
    FIELD_MANAGER,
    Generation,
    Steps,
    object_path,
    project,
    same_state,
    state_object,
)
from gpuagent.kubeapi import ApiConnection, WriteBudget
from gpuagent.snapshot.hints import NodeHints, PublishState

log = logging.getLogger(__name__)

OUTCOMES = ("written", "failed", "unreachable", "rate_limited")
WRITE_BURST = 3  # the publisher's own bucket: a few writes at once, then one per min_interval


@dataclass(frozen=True, slots=True)
class Due:
    """A write the policy asks for: the projection, and why (changed or heartbeat)."""

    hints: NodeHints
    why: str


class PublishPolicy:
    """When to write (see the module docstring); pure, so the write-rate budget is measured on it."""

    def __init__(self, *, min_interval: float, heartbeat: float, steps: Steps = DEFAULT_STEPS) -> None:
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self.steps = steps
        self.published: NodeHints | None = None  # what the last successful write carried
        self.last_write: float | None = None  # monotonic time of the last successful write
        self.last_try: float | None = None  # of the last attempt, failed or not

    def decide(self, hints: NodeHints, now: float) -> Due | None:
        projected = project(hints, self.published, self.steps)
        if self.last_try is not None and now - self.last_try < self.min_interval:
            return None
        if self.published is None or self.last_write is None:
            return Due(projected, "first")
        if not same_state(projected, self.published):
            return Due(projected, "changed")
        if now - self.last_write >= self.heartbeat:
            return Due(projected, "heartbeat")
        return None

    def tried(self, now: float) -> None:
        self.last_try = now

    def written(self, due: Due, now: float) -> None:
        self.published = due.hints
        self.last_write = now


class StatePublisher:
    """Writes this node's ``GPUNodeState`` as :class:`PublishPolicy` decides; counts the outcomes."""

    def __init__(
        self,
        node: str,
        connection: ApiConnection,
        *,
        min_interval: float = 10.0,
        heartbeat: float = 300.0,
        steps: Steps = DEFAULT_STEPS,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.policy = PublishPolicy(min_interval=min_interval, heartbeat=heartbeat, steps=steps)
        self._connection = connection
        self._monotonic = monotonic
        self._wall = wall_clock
        self._budget = WriteBudget(WRITE_BURST, min_interval)
        self._epoch = int(wall_clock() * 1e9)
        self._sequence = 0
        self._latest: NodeHints | None = None
        self._wake = asyncio.Event()
        self._failure = ""
        self.outcomes: Counter[str] = Counter()
        self.last_bytes = 0
        self.last_write_unix: float | None = None

    def offer(self, hints: NodeHints | None) -> None:
        """This poll's hints (no I/O; the writing task looks at them); ignored until a poll has seen a GPU
        (the module docstring)."""
        if hints is not None and (hints.gpus or self._latest is not None):
            self._latest = hints
            self._wake.set()

    async def run(self) -> None:
        """Write as decided until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.publish_once()

    async def publish_once(self) -> str | None:
        """Decide on the latest hints and write if due; the outcome (None: nothing due)."""
        hints = self._latest
        if hints is None:
            return None
        now = self._monotonic()
        due = self.policy.decide(hints, now)
        if due is None:
            return None
        self.policy.tried(now)
        if not self._budget.take(now):
            return self._count("rate_limited")
        self._sequence += 1
        body = state_object(self.node, due.hints, Generation(self._epoch, self._sequence), self._wall())
        payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            status, message = await self._connection.apply(object_path(self.node), payload, FIELD_MANAGER)
        except Exception as exc:  # unreachable, TLS, timeout, a bad kubeconfig: counted, retried later
            self._note("unreachable", f"cannot reach the API server to publish the GPU state: {exc!r}")
            return self._count("unreachable")
        if status not in (200, 201):
            self._note(f"http {status}", f"publishing the GPU state ({due.why}): HTTP {status}"
                       + (f": {message}" if message else "")
                       + (" (RBAC must allow patch and create on gpunodestates.gpuagent.io)"
                          if status == 403 else ""))
            return self._count("failed")
        self.policy.written(due, now)
        self.last_bytes = len(payload)
        self.last_write_unix = self._wall()
        if self._failure:
            log.info("publishing the GPU state works again")
            self._failure = ""
        return self._count("written")

    def state(self) -> PublishState:
        """What the snapshot carries of the publishing (its metrics and ``/v1/state``)."""
        return PublishState(tuple(sorted(self.outcomes.items())), self.last_write_unix, self.last_bytes)

    async def close(self) -> None:
        await self._connection.aclose()

    def _count(self, outcome: str) -> str:
        self.outcomes[outcome] += 1
        return outcome

    def _note(self, kind: str, message: str) -> None:
        if kind != self._failure:
            log.warning("%s", message)
            self._failure = kind
