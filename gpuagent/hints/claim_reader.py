"""The extender's reads of a pod's ResourceClaims and ResourceClaimTemplates from the API server.

kube-scheduler sends the extender the pod, not its claims: for a pod with ``spec.resourceClaims`` the
extender GETs each claim (or template) to learn how many GPUs, or MIG devices of which profile, it asks for
(``gpuagent.hints.claims``). Each answer is kept ``ttl`` seconds (the replicas of a workload share their
templates, and prioritize follows filter), concurrent reads of one object share one request, and a read takes
at most ``timeout``. Anything that stops a judgement, a read that fails included, raises
:class:`~gpuagent.hints.claims.Unjudged` with its reason: the extender then passes the pod everywhere.
RBAC: get on ``resourceclaims`` and ``resourceclaimtemplates`` in ``resource.k8s.io``.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from gpuagent.hints.claims import (
    DEFAULT_GPU_CLASSES,
    DEFAULT_MIG_CLASSES,
    ClaimGpus,
    ClaimRef,
    Unjudged,
    claim_refs,
    object_gpus,
)
from gpuagent.kubeapi import ApiConnection

API = "apis/resource.k8s.io/v1"
MAX_CACHED = 4096

Outcome = ClaimGpus | Unjudged


class ClaimReader:
    """``connection`` None: no API server access, and every pod with claims is unjudged, saying so."""

    def __init__(
        self,
        connection: ApiConnection | None,
        *,
        gpu_classes: Sequence[str] = DEFAULT_GPU_CLASSES,
        mig_classes: Sequence[str] = DEFAULT_MIG_CLASSES,
        timeout: float = 1.0,
        ttl: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = connection
        self._gpu_classes = tuple(gpu_classes)
        self._mig_classes = tuple(mig_classes)
        self._timeout = timeout
        self._ttl = ttl
        self._monotonic = monotonic
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, Outcome]] = OrderedDict()
        self._inflight: dict[tuple[str, str, str], asyncio.Task[Outcome]] = {}
        self.reads = 0  # requests made, for tests and debugging

    @property
    def connection(self) -> ApiConnection | None:
        """The API server connection (shared with the extender's node list), None without one."""
        return self._connection

    async def pod_gpus(self, pod: Mapping[str, Any], field: str = "Pod") -> ClaimGpus | None:
        """The GPUs the pod's claims ask for (None: it names no claim). Raises Unjudged, MalformedPod."""
        refs = claim_refs(pod, field)
        if not refs:
            return None
        if self._connection is None:
            raise Unjudged("no_api", "its ResourceClaims are not read: the extender has no API server access "
                           "(kubernetes_api off, or no service account token or kubeconfig)")
        total: dict[str | None, int] = {}
        for ref in refs:
            outcome = await self._read(ref)
            if isinstance(outcome, Unjudged):
                raise outcome
            for kind, count in outcome.by_kind.items():
                total[kind] = total.get(kind, 0) + count
        return ClaimGpus(total)

    async def close(self) -> None:
        for task in self._inflight.values():
            task.cancel()
        if self._connection is not None:
            await self._connection.aclose()

    async def _read(self, ref: ClaimRef) -> Outcome:
        key = (ref.kind, ref.namespace, ref.name)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self._monotonic():
            self._cache.move_to_end(key)
            return cached[1]
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.create_task(self._fetch(ref))
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        outcome = await asyncio.shield(task)  # one caller giving up does not cancel the others' read
        self._cache[key] = (self._monotonic() + self._ttl, outcome)
        self._cache.move_to_end(key)
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return outcome

    async def _fetch(self, ref: ClaimRef) -> Outcome:
        assert self._connection is not None
        path = f"{API}/namespaces/{quote(ref.namespace, safe='')}/{ref.kind}/{quote(ref.name, safe='')}"
        self.reads += 1
        try:
            status, body, message = await asyncio.wait_for(
                self._connection.get_json(path, timeout=self._timeout), self._timeout)
        except (TimeoutError, asyncio.TimeoutError):
            return Unjudged("unreadable", f"cannot read {ref.label}: the API server did not answer within "
                            f"{self._timeout:g} s")
        except Exception as exc:  # DNS, refused, TLS, a bad kubeconfig: the pod passes, saying why
            detail = str(exc) or type(exc).__name__
            return Unjudged("unreadable", f"cannot read {ref.label}: {type(exc).__name__}: {detail}"[:300])
        if status == 200 and isinstance(body, Mapping):
            try:
                return object_gpus(ref, body, gpu_classes=self._gpu_classes, mig_classes=self._mig_classes)
            except Unjudged as unjudged:
                return unjudged
        if status == 404:
            return Unjudged("unreadable", f"{ref.label} does not exist (yet)")
        if status == 403:
            why = (f"forbidden: RBAC must allow get on {ref.kind} (API group resource.k8s.io) for the "
                   f"extender's service account ({message})")
        else:
            why = f"HTTP {status} ({message or 'no message'})"
        return Unjudged("unreadable", f"cannot read {ref.label}: {why}"[:300])
