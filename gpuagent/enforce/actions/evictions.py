"""Evictions: policy/v1 Evictions posted to the API server, rate-limited on our side as well as on its side.

An Eviction, unlike a delete, honours the pod's PodDisruptionBudgets and grace period: the API server
answers 429 when a budget (or its own limit) forbids it, and the agent reports that as "blocked", never
as an error to retry at once. On top of that the agent limits itself, so that a misjudged memory limit
cannot empty a node: at most one eviction per pod per ``min_interval`` seconds, and a node-wide token
bucket of ``burst`` tokens refilled one per ``refill_interval`` seconds. Namespace and pod must be valid
Kubernetes names (rule ``name``). The limits count in audit mode too, so that audit counts what enforce
would do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuagent.enforce.actions.outcomes import MAX_REMEMBERED, Outcomes
from gpuagent.enforce.actions.rules import ActionRefused
from gpuagent.kubeapi import ApiConnection, WriteBudget, eviction_request

if TYPE_CHECKING:
    import lightkube

_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")


class Evictions:
    """Evicts pods through ``client`` (an :class:`EvictionClient` made on first use when None), within the
    limits above; ``clock`` (seconds) drives them. Meant for one event loop."""

    def __init__(self, *, mode: str, outcomes: Outcomes, clock: Callable[[], float],
                 client: EvictionClient | None = None, min_interval: float = 60.0, burst: int = 5,
                 refill_interval: float = 30.0) -> None:
        if burst < 1 or refill_interval <= 0 or min_interval < 0:
            raise ValueError("eviction limits: burst >= 1, refill interval > 0, min interval >= 0")
        self.mode = mode
        self._outcomes = outcomes
        self._clock = clock
        self._client = client
        self._min_interval = min_interval
        self._budget = WriteBudget(burst, refill_interval)
        self._last: dict[tuple[str, str], float] = {}

    async def evict(self, namespace: str, pod: str, *, reason: str) -> str:
        """Ask the API server to evict a pod. Returns "evicted", "blocked" (429: a PodDisruptionBudget, or
        the server's own limits), "gone" (404), "rate_limited" (ours), "audit", "off", "refused: ..." or
        "failed: ..."."""
        what = f"pod {namespace}/{pod}"
        note = self._outcomes.note
        if self.mode == "off":
            self._outcomes.say_off("evict", what)
            return "off"
        if not (isinstance(namespace, str) and _NAMESPACE.fullmatch(namespace)
                and isinstance(pod, str) and _POD_NAME.fullmatch(pod)):
            refused = ActionRefused("name", repr(what), "not a Kubernetes namespace and pod name")
            note("evict", "refused", what, str(refused))
            return f"refused: {refused}"
        now = self._clock()
        last = self._last.get((namespace, pod))
        if last is not None and 0 <= now - last < self._min_interval:
            note("evict", "rate_limited", what, f"not evicting {what}: evicted {now - last:.0f} s ago")
            return "rate_limited"
        if not self._budget.take(now):
            note("evict", "rate_limited", what, f"not evicting {what}: the node's eviction budget "
                 f"({self._budget.burst} per {self._budget.refill_seconds:.0f} s) is spent")
            return "rate_limited"
        self._remember((namespace, pod), now)
        if self.mode == "audit":
            note("evict", "audit", what, f"audit: would evict {what} ({reason})")
            return "audit"
        client = self._client
        try:
            if client is None:
                client = self._client = EvictionClient()
            status = await client.evict(namespace, pod)
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            note("evict", "failed", what, f"cannot evict {what}: {detail}")
            return f"failed: {detail}"
        message = getattr(client, "last_message", "") or ""
        if 200 <= status < 300:
            note("evict", "done", what, f"evicted {what} ({reason})")
            return "evicted"
        if status == 429:
            note("evict", "blocked", what, f"eviction of {what} refused by the API server (429): "
                 f"{message or 'a PodDisruptionBudget'}")
            return "blocked"
        if status == 404:
            note("evict", "gone", what, f"{what} no longer exists")
            return "gone"
        detail = f"HTTP {status}" + (f": {message}" if message else "")
        note("evict", "failed", what, f"cannot evict {what}: {detail}")
        return f"failed: {detail}"


    def _remember(self, key: tuple[str, str], now: float) -> None:
        if len(self._last) >= MAX_REMEMBERED:
            self._last = {k: t for k, t in self._last.items() if 0 <= now - t < self._min_interval}
        self._last[key] = now


class EvictionClient:
    """Posts policy/v1 Evictions to the API server: ``await evict(namespace, pod)`` -> the HTTP status.

    Where the API server is and how to authenticate come from lightkube, as for the pods watcher: ``config``
    (a lightkube ``KubeConfig`` or ``SingleConfig``), else ``kubeconfig_path``, else ``KubeConfig.from_env()``
    (the in-cluster service account, ``$KUBECONFIG``, ``~/.kube/config``); the connection is
    :class:`gpuagent.kubeapi.ApiConnection`, shared with the Event poster. Nothing of lightkube is imported
    before the first eviction. ``last_message`` is the API server's message of the last answer (a
    PodDisruptionBudget's, an RBAC refusal's). RBAC: ``create`` on ``pods/eviction``.
    """

    def __init__(
        self,
        *,
        config: lightkube.KubeConfig | lightkube.SingleConfig | None = None,
        kubeconfig_path: str | None = None,
        grace_period_seconds: int | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        self._api = ApiConnection(config=config, kubeconfig_path=kubeconfig_path,
                                  request_timeout=request_timeout)
        self._grace = grace_period_seconds
        self.last_message = ""

    async def evict(self, namespace: str, pod: str) -> int:
        url, body = eviction_request(namespace, pod, grace_period_seconds=self._grace)
        status, self.last_message = await self._api.post_json(url, body)
        return status

    async def aclose(self) -> None:
        await self._api.aclose()
