"""The drain of the pods on the faulty GPUs: Evictions by namespace mode, round after round.

``evict``: a policy/v1 Eviction, which honours the pod's PodDisruptionBudgets and grace period; the API
server's 429 (a budget allows no disruption now) is "blocked" and tried again next round; an evicted pod is
left ``EVICT_AGAIN_SECONDS`` to terminate before it is asked again. ``wait``: the pod is left to finish (the
drain is "waiting" until it is gone from the node). ``skip``: left alone. Each Eviction spends a token of the
writer's budget. RBAC: ``create`` on ``pods/eviction``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuagent.health.plan import PodRef
from gpuagent.kubeapi import ApiConnection, eviction_request

log = logging.getLogger(__name__)

EVICT_AGAIN_SECONDS = 60.0


class Drain:
    def __init__(self, connection: ApiConnection, namespace_mode: Callable[[str], str], *,
                 spend: Callable[[], bool], count: Callable[[str, str], None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._api = connection
        self._mode = namespace_mode
        self._spend = spend
        self._count = count
        self._monotonic = monotonic
        self._evicted: dict[tuple[str, str], float] = {}
        self._blocked: set[tuple[str, str]] = set()

    def reset(self) -> None:
        """No drain wanted (any more): forget what was evicted and blocked."""
        self._evicted.clear()
        self._blocked.clear()

    async def step(self, pods: tuple[PodRef, ...]) -> str:
        """Evict what is due; the drain's state: "blocked", "draining", "waiting" or "done"."""
        now = self._monotonic()
        waiting = evicting = False
        self._blocked &= {(p.namespace, p.name) for p in pods}
        for pod in pods:
            key = (pod.namespace, pod.name)
            mode = self._mode(pod.namespace)
            if mode == "skip":
                continue
            if mode == "wait":
                waiting = True
                continue
            evicting = True
            last = self._evicted.get(key)
            if last is not None and now - last < EVICT_AGAIN_SECONDS:
                continue  # evicted: the pod is terminating
            if not self._spend():
                continue
            url, body = eviction_request(pod.namespace, pod.name)
            status, _, message = await self._api.send_json("POST", url, body)
            if 200 <= status < 300:
                self._evicted[key] = now
                self._blocked.discard(key)
                self._count("evict", "done")
            elif status == 429:
                self._blocked.add(key)
                self._count("evict", "blocked")
                log.info("eviction of %s/%s blocked: %s", pod.namespace, pod.name, message or "429")
            elif status == 404:
                self._count("evict", "gone")
            else:
                self._count("evict", "failed")
                raise RuntimeError(f"evicting {pod.namespace}/{pod.name}: HTTP {status} {message}".strip())
        if self._blocked:
            return "blocked"
        if evicting:
            return "draining"
        return "waiting" if waiting else "done"
