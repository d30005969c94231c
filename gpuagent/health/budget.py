"""The cluster-wide quarantine budget: at most N nodes tainted, cordoned or drained by agents at once.

A fleet-wide problem (a bad driver rolled out everywhere, a hot data hall) must not let every agent take its
node out of service. The agents share one ``coordination.k8s.io/v1`` Lease, ``gpuagent-quarantine`` in the
agents' namespace, as a counter: each node holding a slot has one annotation there of its own,
``<node>.quarantine.gpuagent.io/slot``, whose value is the time (unix seconds, ``1764400000.125``) its agent
last renewed it. One key per node, not one JSON map of them all, so that the ValidatingAdmissionPolicy of
``deploy/admission-lease.yaml`` can hold each agent to adding, renewing and removing its own key only (CEL
reads no JSON); an agent never rewrites another node's key, not even an expired one (a person removes the
key of a node deleted while it held a slot: ``docs/health.md``).

An agent takes a slot by replacing the Lease with its key added, sending back the ``resourceVersion`` it
read: the API server refuses a write made from a stale read (409 Conflict), so two agents never both take
the last slot; the loser reads again. A slot is live while its stamp is within ``ttl`` seconds before the
reader's clock and at most ``max_skew`` seconds after it: a slot not renewed for ``ttl`` (its agent died,
its node went away) is free again, and so is one stamped further in the future than a clock may drift (a
forged ``1e300``, or a node whose clock runs far ahead), which would otherwise never expire. A stamp is read
by a pattern of at most 12 integer and 6 decimal digits, never by a number parser: nothing there can
overflow, be infinite or not a number. A Lease rather than a ConfigMap: it is the API's object for
coordination, and granting ``update`` on one named Lease touches no configuration. RBAC: ``get``,
``update`` on that Lease, ``create`` on leases in the namespace.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from gpuagent.kubeapi import ApiConnection

LEASE_NAME = "gpuagent-quarantine"
SLOT_SUFFIX = ".quarantine.gpuagent.io/slot"  # a node's slot: the annotation "<node>" + SLOT_SUFFIX
STAMP = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?")  # unix seconds; 12 digits reach beyond the year 30000
MAX_TRIES = 8
# A node name is a DNS subdomain; with the suffix's labels it must stay one (an annotation key's prefix is at
# most 253 characters), so the longest node name a slot can name is 230 characters.
_NODE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_NODE = 253 - len(SLOT_SUFFIX.split("/", 1)[0])


class BudgetError(Exception):
    """The API server did not let the budget be read or written (not a refusal for lack of room)."""


def slot_key(node: str) -> str:
    """The Lease annotation that holds ``node``'s slot; :class:`BudgetError` for a name no key can carry."""
    if len(node) > _MAX_NODE or not _NODE.fullmatch(node):
        raise BudgetError(f"the node name {node[:60]!r} cannot name a slot of the quarantine budget (a DNS "
                          f"subdomain of at most {_MAX_NODE} characters)")
    return node + SLOT_SUFFIX


def stamp(unix: float) -> str:
    """A renewal time as a slot's value: what :data:`STAMP` and the admission policy accept."""
    return f"{min(max(unix, 0.0), 999_999_999_999.0):.3f}"


def live_slots(annotations: Mapping[str, Any], now: float, *, ttl: float,
               max_skew: float) -> dict[str, float]:
    """The nodes holding a live slot in a Lease's ``annotations`` and their renewal times. A value that is
    not a stamp holds nothing; a stamp older than ``ttl`` or more than ``max_skew`` ahead of ``now`` has
    expired."""
    live = {}
    for key, value in annotations.items():
        if not isinstance(key, str) or not key.endswith(SLOT_SUFFIX) or not isinstance(value, str):
            continue
        if not STAMP.fullmatch(value):
            continue
        at = float(value)  # at most 19 characters of digits: finite, exact enough
        if now - ttl < at <= now + max_skew:
            live[key[:-len(SLOT_SUFFIX)]] = at
    return live


class QuarantineBudget:
    """``await acquire()`` -> True when this node holds a slot (taking one if there is room);
    ``await release()`` gives it back. ``limit`` 0: no node may quarantine."""

    def __init__(self, connection: ApiConnection, node: str, *, namespace: str, limit: int,
                 ttl: float = 900.0, renew_every: float = 60.0, max_skew: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._api = connection
        self.node = node
        self.limit = limit
        self.ttl = ttl
        self.max_skew = max_skew
        self._renew_every = renew_every
        self._clock = clock
        self._path = f"apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
        self.namespace = namespace
        self.held = False
        self._renewed = 0.0
        self.holders: tuple[str, ...] = ()  # the nodes holding slots at the last read

    async def acquire(self) -> bool:
        now = self._clock()
        if self.held and 0.0 <= now - self._renewed < self._renew_every:
            return True
        key = slot_key(self.node)
        for _ in range(MAX_TRIES):
            lease = await self._read()
            slots = self._live(lease, now)
            if self.node not in slots and len(slots) >= self.limit:
                self.held = False
                self.holders = tuple(sorted(slots))
                return False
            if await self._write(lease, key, stamp(now)):
                self.held, self._renewed = True, now
                self.holders = tuple(sorted({*slots, self.node}))
                return True
        raise BudgetError(f"the Lease {self.namespace}/{LEASE_NAME} kept changing under {MAX_TRIES} tries")

    async def release(self) -> None:
        key = slot_key(self.node)
        for _ in range(MAX_TRIES):
            lease = await self._read()
            if key not in _annotations(lease):  # expired or not, a key of ours left behind goes too
                self.held = False
                return
            if await self._write(lease, key, None):
                self.held = False
                self.holders = tuple(sorted(set(self._live(lease, self._clock())) - {self.node}))
                return
        raise BudgetError(f"the Lease {self.namespace}/{LEASE_NAME} kept changing under {MAX_TRIES} tries")

    def _live(self, lease: Mapping[str, Any] | None, now: float) -> dict[str, float]:
        return live_slots(_annotations(lease), now, ttl=self.ttl, max_skew=self.max_skew)

    async def _read(self) -> dict[str, Any] | None:
        status, body, message = await self._api.get_json(f"{self._path}/{LEASE_NAME}")
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise BudgetError(f"reading the Lease {self.namespace}/{LEASE_NAME}: HTTP {status} "
                              f"{message}".strip())
        return body

    async def _write(self, lease: dict[str, Any] | None, key: str, value: str | None) -> bool:
        """Our key set to ``value`` (None: removed), every other annotation as read. True when written;
        False on a conflict (someone wrote in between: read again)."""
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                                 "annotations": {key: value} if value is not None else {}},
                    "spec": {}}
            status, _, message = await self._api.send_json("POST", self._path, body)
        else:
            annotations = {k: v for k, v in _annotations(lease).items() if k != key}
            if value is not None:
                annotations[key] = value
            meta = {**(lease.get("metadata") or {}), "annotations": annotations}
            body = {**lease, "metadata": meta}  # with the resourceVersion read: the server checks it
            status, _, message = await self._api.send_json("PUT", f"{self._path}/{LEASE_NAME}", body)
        if status == 409:
            return False
        if not 200 <= status < 300:
            raise BudgetError(f"writing the Lease {self.namespace}/{LEASE_NAME}: HTTP {status} "
                              f"{message}".strip())
        return True


def _annotations(lease: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (lease or {}).get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}
