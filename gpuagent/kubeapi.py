"""One lazily opened HTTP connection to the Kubernetes API server, for the few requests gpuagent makes,
and the node-wide budget that keeps its writes (Evictions, Events) from flooding the server.

Used by the Eviction client (``enforce.actions``), the idle-GPU Event poster (``accounting.events``), the
publisher of the node's GPU state (``hints.publisher``), the GPU health writer (``health.writer``: Node
conditions, taints, cordon, its Lease, drains), the watchers of this node's pods and ResourceSlices
(``reflector``) and the extender's ResourceClaim reads and node list.
Where the API server is and how to authenticate come from lightkube, as for the pods watcher: ``config``
(a lightkube ``KubeConfig`` or ``SingleConfig``), else ``kubeconfig_path``, else ``KubeConfig.from_env()``
(the in-cluster service account, ``$KUBECONFIG``, ``~/.kube/config``). Nothing of lightkube is imported
before the first request, so an agent that never writes to the API server never pays for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import httpx2
    import lightkube

MAX_STATUS_BYTES = 65536
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def api_server_available(
    environ: Mapping[str, str] | None = None, service_account_dir: str = SERVICE_ACCOUNT_DIR
) -> bool:
    """True in a pod with a service account token: the in-cluster API server can be reached
    (what lightkube's ``KubeConfig.from_service_account`` needs: the service's host and port, the token)."""
    env = os.environ if environ is None else environ
    return (bool(env.get("KUBERNETES_SERVICE_HOST")) and bool(env.get("KUBERNETES_SERVICE_PORT"))
            and os.path.isfile(os.path.join(service_account_dir, "token")))


class WriteBudget:
    """A token bucket: ``burst`` writes at once, one more every ``refill_seconds``. ``take(now)`` spends a
    token and says whether there was one; ``now`` is the caller's monotonic clock (a clock going back
    refills nothing)."""

    __slots__ = ("_at", "_tokens", "burst", "refill_seconds")

    def __init__(self, burst: int, refill_seconds: float) -> None:
        if burst < 1 or refill_seconds <= 0:
            raise ValueError("a write budget needs burst >= 1 and refill_seconds > 0")
        self.burst = burst
        self.refill_seconds = refill_seconds
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        if self._at is not None and now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.refill_seconds)
        self._at = now if self._at is None else max(now, self._at)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def eviction_request(namespace: str, pod: str, *, grace_period_seconds: int | None = None
                     ) -> tuple[str, dict[str, Any]]:
    """(path, body) of the policy/v1 Eviction of one pod: the one place gpuagent builds an Eviction, for the
    enforcer's memory ladder (``enforce.actions.evictions``) and the GPU health drain (``health.drain``).
    The API server honours the pod's PodDisruptionBudgets (429 while one forbids it). RBAC: ``create`` on
    ``pods/eviction``."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": pod, "namespace": namespace}}
    if grace_period_seconds is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace_period_seconds}
    path = f"api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/eviction"
    return path, body


class ApiConnection:
    """``await post_json(path, body)`` -> (HTTP status, the API server's message); ``aclose()`` at the end.

    ``path`` is relative to the server (``api/v1/...``, ``apis/events.k8s.io/v1/...``). Errors reaching the
    server (DNS, refused, TLS, timeout, a bad kubeconfig) are raised as they are: the caller counts them.
    """

    def __init__(
        self,
        *,
        config: lightkube.KubeConfig | lightkube.SingleConfig | None = None,
        kubeconfig_path: str | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        self._config = config
        self._kubeconfig_path = kubeconfig_path
        self._timeout = request_timeout
        self._http: httpx2.AsyncClient | None = None

    async def post_json(self, path: str, body: Any) -> tuple[int, str]:
        response = await self.open().post(path, json=body)
        return response.status_code, status_message(response.content)

    async def apply(self, path: str, payload: bytes, field_manager: str) -> tuple[int, str]:
        """Server-side apply of ``payload`` (a whole object as JSON, which is YAML) at ``path``: creates it
        or updates it in one request; ``force`` takes over fields another manager set."""
        response = await self.open().patch(
            path, content=payload, params={"fieldManager": field_manager, "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        return response.status_code, status_message(response.content)

    async def get_json(
        self, path: str, *, timeout: float | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any, str]:
        """(HTTP status, the decoded body when 200, the API server's message otherwise)."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if headers:
            kwargs["headers"] = dict(headers)
        response = await self.open().get(path, **kwargs)
        if response.status_code != 200:
            return response.status_code, None, status_message(response.content)
        try:
            return 200, json.loads(response.content), ""
        except ValueError as exc:
            return 200, None, f"the answer is not JSON: {exc}"

    async def send_json(self, method: str, path: str, body: Any, *,
                        content_type: str = "application/json") -> tuple[int, Any, str]:
        """A PUT, PATCH or POST of ``body`` -> (HTTP status, the decoded answer when 2xx, the API server's
        message otherwise). ``content_type`` names a patch's kind (``application/merge-patch+json``,
        ``application/strategic-merge-patch+json``)."""
        response = await self.open().request(method, path, content=json.dumps(body).encode(),
                                             headers={"Content-Type": content_type})
        if not 200 <= response.status_code < 300:
            return response.status_code, None, status_message(response.content)
        try:
            return response.status_code, json.loads(response.content), ""
        except ValueError as exc:
            return response.status_code, None, f"the answer is not JSON: {exc}"

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def open(self) -> httpx2.AsyncClient:
        """The HTTP client, built from the configuration on first use."""
        if self._http is None:
            import httpx2
            from lightkube import KubeConfig
            from lightkube.config.client_adapter import AsyncClient, ConnectionParams

            config = self._config
            if config is None:
                path = self._kubeconfig_path
                config = KubeConfig.from_file(path) if path else KubeConfig.from_env()
            single = config.get() if isinstance(config, KubeConfig) else config
            self._http = AsyncClient(single, ConnectionParams(timeout=httpx2.Timeout(self._timeout)))
        return self._http


def status_message(body: bytes) -> str:
    """A Kubernetes Status body's message and causes, e.g. a PodDisruptionBudget's; "" if none."""
    try:
        status = json.loads(body[:MAX_STATUS_BYTES])
    except ValueError:
        return ""
    if not isinstance(status, dict):
        return ""
    parts = [str(status.get("message") or "")]
    details = status.get("details")
    if isinstance(details, dict) and isinstance(details.get("causes"), list):
        parts += [str(c["message"]) for c in details["causes"] if isinstance(c, dict) and c.get("message")]
    return "; ".join(p for p in parts if p)


MAX_EVENT_NOTE = 1024
MAX_EVENT_NAME = 253
MAX_REPORTING_INSTANCE = 128


def event_body(*, regarding: Mapping[str, Any], reason: str, action: str, note: str, event_type: str,
               reporting_instance: str, now_unix: float, related: Mapping[str, Any] | None = None,
               reporting_controller: str = "gpuagent.io/agent") -> dict[str, Any]:
    """An events.k8s.io/v1 Event about ``regarding`` (an ObjectReference: kind, apiVersion, name, and
    namespace for a namespaced object), in its namespace ("default" for a Node, as the kubelet's), named as
    client-go names Events (``<object name>.<hex unix nanoseconds>``), the note cut to the API's 1024."""
    moment = datetime.fromtimestamp(now_unix, tz=timezone.utc)
    suffix = f".{int(now_unix * 1e9):x}"
    name = str(regarding["name"])[: MAX_EVENT_NAME - len(suffix)].rstrip("-.") + suffix
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": regarding.get("namespace") or "default"},
        "eventTime": moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": reporting_controller,
        "reportingInstance": reporting_instance[:MAX_REPORTING_INSTANCE],
        "action": action,
        "reason": reason,
        "regarding": dict(regarding),
        "note": note if len(note) <= MAX_EVENT_NOTE else note[: MAX_EVENT_NOTE - 3] + "...",
        "type": event_type,
    }
    if related is not None:
        body["related"] = dict(related)
    return body
