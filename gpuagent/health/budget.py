"""The cluster-wide quarantine budget: at most N nodes tainted, cordoned or drained by agents at once.

A fleet-wide problem (a bad driver rolled out everywhere, a hot data hall) must not let every agent take its
node out of service. The agents share one ``coordination.k8s.io/v1`` Lease, ``gpuagent-quarantine`` in the
agents' namespace, as a counter: its annotation ``gpuagent.io/quarantined`` is a JSON map of node name to
the time (unix seconds) that node's agent last renewed its slot. An agent takes a slot by replacing the
Lease with itself added, sending back the ``resourceVersion`` it read: the API server refuses a write made
from a stale read (409 Conflict), so two agents never both take the last slot; the loser reads again. A
slot not renewed for ``ttl`` seconds (its agent died, its node went away) is free again. A Lease rather than
a ConfigMap: it is the API's object for coordination, and granting ``update`` on one named Lease touches no
configuration. RBAC: ``get``, ``update`` on that Lease, ``create`` on leases in the namespace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from gpuagent.kubeapi import ApiConnection

LEASE_NAME = "gpuagent-quarantine"
ANNOTATION = "gpuagent.io/quarantined"
MAX_TRIES = 8


class BudgetError(Exception):
    """The API server did not let the budget be read or written (not a refusal for lack of room)."""


class QuarantineBudget:
    """``await acquire()`` -> True when this node holds a slot (taking one if there is room);
    ``await release()`` gives it back. ``limit`` 0: no node may quarantine."""

    def __init__(self, connection: ApiConnection, node: str, *, namespace: str, limit: int,
                 ttl: float = 900.0, renew_every: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._api = connection
        self.node = node
        self.limit = limit
        self.ttl = ttl
        self._renew_every = renew_every
        self._clock = clock
        self._path = f"apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
        self.namespace = namespace
        self.held = False
        self._renewed = 0.0
        self.holders: tuple[str, ...] = ()  # the nodes holding slots at the last read

    async def acquire(self) -> bool:
        now = self._clock()
        if self.held and now - self._renewed < self._renew_every:
            return True
        for _ in range(MAX_TRIES):
            lease = await self._read()
            slots = self._live(lease, now)
            if self.node not in slots and len(slots) >= self.limit:
                self.held = False
                self.holders = tuple(sorted(slots))
                return False
            slots[self.node] = now
            if await self._write(lease, slots):
                self.held, self._renewed = True, now
                self.holders = tuple(sorted(slots))
                return True
        raise BudgetError(f"the Lease {self.namespace}/{LEASE_NAME} kept changing under {MAX_TRIES} tries")

    async def release(self) -> None:
        for _ in range(MAX_TRIES):
            lease = await self._read()
            slots = self._live(lease, self._clock())
            if self.node not in slots:
                self.held = False
                return
            del slots[self.node]
            if await self._write(lease, slots):
                self.held = False
                self.holders = tuple(sorted(slots))
                return
        raise BudgetError(f"the Lease {self.namespace}/{LEASE_NAME} kept changing under {MAX_TRIES} tries")

    def _live(self, lease: dict[str, Any] | None, now: float) -> dict[str, float]:
        text = ((lease or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION, "{}")
        try:
            slots = json.loads(text)
        except ValueError:
            slots = {}
        if not isinstance(slots, dict):
            slots = {}
        return {str(node): float(at) for node, at in slots.items()
                if isinstance(at, (int, float)) and now - float(at) < self.ttl}

    async def _read(self) -> dict[str, Any] | None:
        status, body, message = await self._api.get_json(f"{self._path}/{LEASE_NAME}")
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise BudgetError(f"reading the Lease {self.namespace}/{LEASE_NAME}: HTTP {status} "
                              f"{message}".strip())
        return body

    async def _write(self, lease: dict[str, Any] | None, slots: dict[str, float]) -> bool:
        """True when written; False on a conflict (someone wrote in between: read again)."""
        text = json.dumps(slots, sort_keys=True)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                                 "annotations": {ANNOTATION: text}},
                    "spec": {}}
            status, _, message = await self._api.send_json("POST", self._path, body)
        else:
            meta = dict(lease.get("metadata") or {})
            meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: text}
            body = {**lease, "metadata": meta}  # with the resourceVersion read: the server checks it
            status, _, message = await self._api.send_json("PUT", f"{self._path}/{LEASE_NAME}", body)
        if status == 409:
            return False
        if not 200 <= status < 300:
            raise BudgetError(f"writing the Lease {self.namespace}/{LEASE_NAME}: HTTP {status} "
                              f"{message}".strip())
        return True
