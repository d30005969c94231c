"""The pods of this node from the Kubernetes API server, by UID: the names that cgroups lack.

A cgroup path gives a process's pod UID and container ID; the kubelet's pod-resources API gives names
without either. The API server has both, so with it the agent names every pod outright. This module keeps
one view, pod UID -> :class:`PodName`, for the pods bound to this node, the way client-go's reflector
does: list (field selector ``spec.nodeName=<node>``), then watch from the list's ``resourceVersion``.

Choices that matter on thousands of nodes:
- The first list asks for ``resourceVersion=0`` (served from the API server's watch cache, like the
  kubelet's own list); a re-list after a broken watch asks for the last version seen (never older data);
  only after 410 Gone does it ask for a consistent list (no ``resourceVersion``).
- The watch asks for bookmarks, so a quiet node keeps a fresh ``resourceVersion`` and resumes a watch
  without a re-list, and for a server-side timeout spread over [T, 2T) so agents do not reconnect in step.
  A connection silent past that timeout is dead (no FIN from a vanished peer): it is dropped and resumed.
- Only the few fields used are decoded (msgspec structs that skip everything else), and only
  ``gpuagent.io/*`` annotations are kept: a pod's managed fields and large annotations never stay in memory.
- A pod's owner (``ownerReferences``) is walked up to the workload people know (ReplicaSet -> Deployment,
  Job -> CronJob) by ``pods/owners.py`` in a task of its own, cached by owner UID: the view names a pod's
  owner as soon as that answer is in, and never waits for it.
- lightkube supplies the configuration (in-cluster service account with token rotation, kubeconfig, exec
  plugins, TLS); the requests are plain GETs on its HTTP client, so the watch parameters, the 410 handling
  and the timeouts are ours. Nothing of lightkube is imported until :meth:`PodMetadata.run`.

Failures never end :meth:`PodMetadata.run`: the view is kept and ``status`` says what is wrong. A watch
that had been healthy and breaks is resumed at once; failures back off exponentially up to
``max_backoff``; 401 and 403 (RBAC) retry every ``max_backoff``. Each failure is logged once per change
of kind, and the return to health once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpuagent.pods.attribution import PodName
from gpuagent.pods.owners import Owner, OwnerRef, OwnerResolver, controller_of, reference_struct

if TYPE_CHECKING:
    import httpx2
    import lightkube

log = logging.getLogger(__name__)

SOURCE = "api_server"  # the ``source`` label of gpuagent_source_success
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ANNOTATION_PREFIX = "gpuagent.io/"
# A static pod runs under the kubelet's own UID (its config hash, 32 hex); the API server's mirror pod has
# another UID and carries the kubelet's in this annotation. Cgroups name the kubelet's.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PODS_PATH = "api/v1/pods"  # relative: kept under a server URL with a path (API proxies)
WATCH_IDLE_MARGIN_S = 30.0  # silence past the server's own timeout plus this means a dead connection
_READ_LIMIT = 64 * 1024  # bytes of an error body kept for its message


def api_server_available(
    environ: Mapping[str, str] | None = None, service_account_dir: str = SERVICE_ACCOUNT_DIR
) -> bool:
    """True in a pod with a service account token: the in-cluster API server can be reached
    (what lightkube's ``KubeConfig.from_service_account`` needs: the service's host and port, the token)."""
    env = os.environ if environ is None else environ
    return (bool(env.get("KUBERNETES_SERVICE_HOST")) and bool(env.get("KUBERNETES_SERVICE_PORT"))
            and os.path.isfile(os.path.join(service_account_dir, "token")))


@functools.cache
def _wire() -> SimpleNamespace:
    """Decoders of the few fields used, built on first use (msgspec comes with lightkube)."""
    import msgspec

    meta = msgspec.defstruct("ObjectMeta", [
        ("uid", str, ""), ("name", str, ""), ("namespace", str, ""), ("resourceVersion", str, ""),
        ("annotations", dict[str, str] | None, None),
        ("ownerReferences", list[reference_struct()] | None, None),  # type: ignore[misc]
    ])
    container = msgspec.defstruct("ContainerStatus", [("name", str, ""), ("containerID", str | None, None)])
    containers = list[container] | None  # type: ignore[valid-type]
    status = msgspec.defstruct("PodStatus", [
        ("qosClass", str | None, None),
        ("containerStatuses", containers, None),
        ("initContainerStatuses", containers, None),
        ("ephemeralContainerStatuses", containers, None),
    ])
    pod = msgspec.defstruct("Pod", [
        ("metadata", meta, msgspec.field(default_factory=meta)), ("status", status | None, None),
    ])
    list_meta = msgspec.defstruct("ListMeta", [("resourceVersion", str, "")])
    pod_list = msgspec.defstruct("PodList", [
        ("metadata", list_meta, msgspec.field(default_factory=list_meta)), ("items", list[pod] | None, None),
    ])
    event = msgspec.defstruct("WatchEvent", [("type", str, ""), ("object", msgspec.Raw, msgspec.Raw(b"{}"))])
    api_status = msgspec.defstruct("Status", [
        ("code", int, 0), ("reason", str, ""), ("message", str, ""),
    ])
    return SimpleNamespace(
        pod=msgspec.json.Decoder(pod),
        pod_list=msgspec.json.Decoder(pod_list),
        event=msgspec.json.Decoder(event),
        status=msgspec.json.Decoder(api_status),
        DecodeError=msgspec.DecodeError,
    )


def strip_runtime(container_id: str) -> str:
    """``containerd://<64 hex>`` (or ``cri-o://``, ``docker://``) -> the bare ID cgroups carry."""
    _, sep, bare = container_id.partition("://")
    return bare if sep else container_id


def pod_name(pod: Any, owner: Owner | None = None) -> PodName:
    """The :class:`PodName` of a decoded pod: names, container IDs, gpuagent.io annotations, QoS, and its
    top ``owner`` when known."""
    meta, status = pod.metadata, pod.status
    containers: dict[str, str] = {}
    if status is not None:
        for statuses in (status.containerStatuses, status.initContainerStatuses,
                         status.ephemeralContainerStatuses):
            for cs in statuses or ():
                if cs.containerID and cs.name:
                    containers[strip_runtime(cs.containerID)] = cs.name
    annotations = {k: v for k, v in (meta.annotations or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    qos = status.qosClass.lower() if status is not None and status.qosClass else None
    return PodName(namespace=meta.namespace, name=meta.name, containers_by_id=containers,
                   annotations=annotations, qos=qos, owner_kind=owner.kind if owner else None,
                   owner_name=owner.name if owner else None)


def _uids(pod: Any) -> tuple[str, ...]:
    """The UIDs a pod is known by in cgroups: its own, and the kubelet's for a static pod's mirror."""
    mirror = (pod.metadata.annotations or {}).get(MIRROR_ANNOTATION)
    return (pod.metadata.uid, mirror) if mirror and mirror != pod.metadata.uid else (pod.metadata.uid,)


class _Expired(Exception):
    """410 Gone: the resourceVersion is older than the server keeps; list again."""


@dataclass
class _Failure(Exception):
    kind: str  # the state logged once: "forbidden", "unauthorized", "unreachable", "http 500", ...
    message: str
    relist: bool = True  # list again before watching (False: resume the watch from the last version)
    slow: bool = False  # retry only every max_backoff (credentials and RBAC do not fix themselves quickly)

    def __str__(self) -> str:
        return self.message


class PodMetadata:
    """Watches the pods of one node (field selector spec.nodeName=<node>) and keeps PodName by UID.

    ``config`` (a lightkube ``KubeConfig`` or ``SingleConfig``) or ``client`` (a ``lightkube.AsyncClient``,
    whose connection pool and credentials are then shared) says where the API server is; with neither,
    lightkube's ``KubeConfig.from_env()``: the in-cluster service account, else ``$KUBECONFIG``, else
    ``~/.kube/config``. ``watch_timeout`` is the server-side watch timeout (spread over [T, 2T)).
    """

    def __init__(
        self,
        node_name: str,
        *,
        client: lightkube.AsyncClient | None = None,
        config: lightkube.KubeConfig | lightkube.SingleConfig | None = None,
        kubeconfig_path: str | None = None,
        relist_backoff: float = 1.0,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout: float = 300.0,
        request_timeout: float = 10.0,
        owners: OwnerResolver | None = None,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required: the API server is asked for this node's pods only")
        self.node_name = node_name
        self._selector = f"spec.nodeName={node_name}"
        self._client = client
        self._config = config
        self._kubeconfig_path = kubeconfig_path  # read on connecting: a bad file is a status, not a crash
        self._base = relist_backoff
        self._max = max_backoff
        self._clock = clock
        self._watch_timeout = watch_timeout
        self._request_timeout = request_timeout
        self._view: dict[str, PodName] = {}
        self._uids_of: dict[str, tuple[str, ...]] = {}  # API UID -> its keys in the view
        self._rv: str | None = None  # the version to watch from; None: list first
        self._list_rv = "0"  # "0": any (watch cache); a version: not older; "": consistent (after 410)
        self._synced = False
        self._status: tuple[bool, str] = (False, "the pods of this node have not been listed yet")
        self._failure_kind = ""
        self._failures = 0  # in a row, for the backoff; cleared by a watch that proves healthy
        self._expiries = 0  # 410s in a row: the first re-lists at once, more back off
        self.lists = 0  # requests made, for tests and debugging
        self.watches = 0
        # Owners above the pods' controllers (ReplicaSet -> Deployment, ...), walked by their own task
        self.owners = owners or OwnerResolver()
        self._controller_of: dict[str, OwnerRef | None] = {}  # API UID -> its controller reference

    # -- the view ---------------------------------------------------------------------------------------
    def names_by_uid(self) -> Mapping[str, PodName]:
        """The current view; a new dict replaces it on every change, so a caller's copy never moves."""
        return self._view

    @property
    def status(self) -> tuple[bool, str]:
        """(ok, error) for gpuagent_source_success{source="api_server"}."""
        return self._status

    @property
    def synced(self) -> bool:
        """True once a list has succeeded (the view is then kept through any later failure)."""
        return self._synced

    # -- the loop ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """List, then watch, forever. Returns never; raises only CancelledError."""
        http, owned = None, False
        walks: asyncio.Task | None = None
        try:
            while True:
                try:
                    if http is None:
                        http, owned = self._open()
                        walks = asyncio.create_task(self.owners.run(http, self._owner_resolved),
                                                    name="pod-owners")
                    if self._rv is None:
                        await self._list(http)
                    healthy = await self._watch(http)
                    if not healthy:  # closed at once without a word: do not hammer the server
                        self._failures += 1
                        await asyncio.sleep(self._delay())
                except _Expired:
                    self._rv, self._list_rv = None, ""
                    self._expiries += 1
                    log.debug("pods watch on node %s: resourceVersion expired (410); listing again",
                              self.node_name)
                    if self._expiries > 1:
                        await asyncio.sleep(self._delay(self._expiries - 1))
                except _Failure as failure:
                    self._fail(failure)
                    await asyncio.sleep(self._max if failure.slow else self._delay())
                except Exception as exc:  # a bug must not end the source: report it, back off, go on
                    self._fail(_Failure("internal", f"internal error: {exc!r}"), exc_info=exc)
                    await asyncio.sleep(self._delay())
        finally:
            if walks is not None:
                walks.cancel()
                await asyncio.gather(walks, return_exceptions=True)
            if http is not None and owned:
                await http.aclose()

    def _delay(self, failures: int | None = None) -> float:
        n = self._failures if failures is None else failures
        delay = min(self._max, self._base * 2 ** max(0, n - 1))
        return delay * (0.75 + 0.25 * random.random())  # spread agents that failed together

    def _open(self) -> tuple[httpx2.AsyncClient, bool]:
        try:
            import httpx2

            if self._client is not None:
                inner = getattr(getattr(self._client, "_client", None), "_client", None)
                if not isinstance(inner, httpx2.AsyncClient):
                    raise TypeError(f"client: expected a lightkube.AsyncClient, got {type(self._client)!r}")
                return inner, False
            from lightkube import KubeConfig
            from lightkube.config.client_adapter import AsyncClient, ConnectionParams

            config = self._config
            if config is None:
                path = self._kubeconfig_path
                config = KubeConfig.from_file(path) if path else KubeConfig.from_env()
            single = config.get() if isinstance(config, KubeConfig) else config
            params = ConnectionParams(timeout=httpx2.Timeout(self._request_timeout))
            return AsyncClient(single, params), True
        except Exception as exc:
            raise _Failure("config", f"no Kubernetes API configuration: {exc}", slow=True) from exc

    async def _list(self, http: httpx2.AsyncClient) -> None:
        import httpx2

        wire = _wire()
        params = {"fieldSelector": self._selector}
        if self._list_rv:
            params["resourceVersion"] = self._list_rv
        self.lists += 1
        try:
            response = await http.get(PODS_PATH, params=params)
        except httpx2.RequestError as exc:
            raise self._transport_failure("list", exc) from exc
        if response.status_code != 200:
            raise self._http_failure("list", response.status_code, response.content)
        try:
            body = wire.pod_list.decode(response.content)
        except wire.DecodeError as exc:
            raise _Failure("protocol", f"pods list on node {self.node_name}: bad PodList: {exc}") from exc
        view: dict[str, PodName] = {}
        uids_of: dict[str, tuple[str, ...]] = {}
        self._controller_of = {}
        for pod in body.items or ():
            name, uids = pod_name(pod, self._owner(pod)), _uids(pod)
            uids_of[pod.metadata.uid] = uids
            for uid in uids:
                view[uid] = name
        if view != self._view:
            self._view = view
        self._uids_of = uids_of
        self.owners.forget({ref.uid for ref in self._controller_of.values() if ref is not None})
        self._rv = body.metadata.resourceVersion or None
        if self._rv is None:
            raise _Failure("protocol", f"pods list on node {self.node_name}: no resourceVersion")
        self._list_rv = self._rv
        if not self._synced:
            log.info("API server: %d pods on node %s", len(uids_of), self.node_name)
        self._synced = True
        self._healthy()

    async def _watch(self, http: httpx2.AsyncClient) -> bool:
        """Follows one watch connection; True when it ended after proving healthy (resume at once)."""
        import httpx2

        assert self._rv is not None
        server_timeout = int(self._watch_timeout * (1 + random.random())) or 1
        params = {
            "watch": "true",
            "resourceVersion": self._rv,
            "fieldSelector": self._selector,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(server_timeout),
        }
        timeout = httpx2.Timeout(self._request_timeout, read=server_timeout + WATCH_IDLE_MARGIN_S)
        self.watches += 1
        connected_at: float | None = None
        events = 0
        try:
            async with http.stream("GET", PODS_PATH, params=params, timeout=timeout) as response:
                if response.status_code != 200:
                    body = await _read_some(response)
                    raise self._http_failure("watch", response.status_code, body)
                connected_at = self._clock()
                self._healthy()
                async for line in response.aiter_lines():
                    if line.strip():
                        self._apply(line)
                        events += 1
                        self._failures = self._expiries = 0
        except httpx2.RequestError as exc:  # refused, reset, timed out, cut mid-stream
            if connected_at is None:
                raise self._transport_failure("watch", exc) from exc
            if events or self._clock() - connected_at >= self._max:
                log.debug("pods watch on node %s interrupted (%r); resuming", self.node_name, exc)
                self._failures = self._expiries = 0
                return True
            raise _Failure("interrupted", f"pods watch on node {self.node_name} interrupted: {exc!r}",
                           relist=False) from exc
        assert connected_at is not None
        healthy = bool(events) or self._clock() - connected_at >= self._max
        if healthy:
            self._failures = self._expiries = 0
        return healthy

    def _apply(self, line: str) -> None:
        wire = _wire()
        try:
            event = wire.event.decode(line)
            if event.type == "ERROR":
                status = wire.status.decode(event.object)
                if status.code == 410:
                    raise _Expired()
                raise self._api_failure("watch", status.code, status.reason, status.message)
            pod = wire.pod.decode(event.object)
        except wire.DecodeError as exc:
            raise _Failure("protocol", f"pods watch on node {self.node_name}: bad event: {exc}") from exc
        if event.type in ("ADDED", "MODIFIED"):
            self._put(pod)
        elif event.type == "DELETED":
            self._drop(pod.metadata.uid)
        elif event.type != "BOOKMARK":
            log.debug("pods watch on node %s: ignoring event type %r", self.node_name, event.type)
        if pod.metadata.resourceVersion:
            self._rv = self._list_rv = pod.metadata.resourceVersion

    def _put(self, pod: Any) -> None:
        uid = pod.metadata.uid
        if not uid:
            return
        name, uids = pod_name(pod, self._owner(pod)), _uids(pod)
        old = self._uids_of.get(uid, ())
        if old == uids and all(self._view.get(u) == name for u in uids):
            return  # a status change we do not keep (conditions, IPs, ...): same view
        view = dict(self._view)
        for u in old:
            view.pop(u, None)
        for u in uids:
            view[u] = name
        self._uids_of[uid] = uids
        self._view = view

    def _drop(self, uid: str) -> None:
        self._controller_of.pop(uid, None)
        uids = self._uids_of.pop(uid, ())
        if uids:
            view = dict(self._view)
            for u in uids:
                view.pop(u, None)
            self._view = view

    # -- owners ------------------------------------------------------------------------------------------
    def _owner(self, pod: Any) -> Owner | None:
        """The pod's top owner as known now (None: being asked), its controller remembered."""
        meta = pod.metadata
        ref = controller_of(meta.ownerReferences)
        self._controller_of[meta.uid] = ref
        return self.owners.of_pod(meta.namespace, meta.name, ref)

    def _owner_resolved(self, owner_uid: str) -> None:
        """An owner's walk has an answer: the pods under it get their owner (one new view for them all)."""
        under = ((ref, self._uids_of.get(uid, ())) for uid, ref in self._controller_of.items())
        self._view = self.owners.named(self._view, under, owner_uid)

    # -- health ------------------------------------------------------------------------------------------
    def _healthy(self) -> None:
        if self._failure_kind:
            log.info("API server answers again: watching %d pods on node %s", len(self._uids_of),
                     self.node_name)
            self._failure_kind = ""
        self._status = (True, "")

    def _fail(self, failure: _Failure, exc_info: BaseException | None = None) -> None:
        self._failures += 1
        if failure.relist:
            self._rv = None
        self._status = (False, failure.message)
        if failure.kind != self._failure_kind:
            kept = f"keeping the last {len(self._uids_of)} pods" if self._synced else "no pod names yet"
            log.warning("pod metadata from the API server: %s (%s; retrying)", failure.message, kept,
                        exc_info=exc_info)
            self._failure_kind = failure.kind
        else:
            log.debug("pod metadata from the API server: %s", failure.message)

    def _transport_failure(self, verb: str, exc: Exception) -> _Failure:
        import httpx2

        where = f"pods {verb} on node {self.node_name}"
        if isinstance(exc, httpx2.TimeoutException):
            kind, what = "timeout", "API server did not answer in time"
        else:
            kind, what = "unreachable", "API server unreachable"
        detail = str(exc) or type(exc).__name__
        # A refused or timed-out connection says nothing of the data: resume the watch where it was.
        return _Failure(kind, f"{what}: {where}: {detail}", relist=False)

    def _http_failure(self, verb: str, code: int, body: bytes) -> _Failure | _Expired:
        wire = _wire()
        reason = message = ""
        try:
            status = wire.status.decode(body)
            reason, message = status.reason, status.message
        except wire.DecodeError:
            message = body[:200].decode("utf-8", "replace").strip()
        if code == 410:
            return _Expired()
        return self._api_failure(verb, code, reason, message)

    def _api_failure(self, verb: str, code: int, reason: str, message: str) -> _Failure:
        where = f"pods {verb} on node {self.node_name}"
        if code == 403:
            return _Failure("forbidden", f"forbidden: {where}: RBAC must allow get, list and watch on pods "
                            f"for the agent's service account ({message or reason or 'HTTP 403'})", slow=True)
        if code == 401:
            return _Failure("unauthorized", f"unauthorized: {where}: the API server rejected the "
                            f"credentials (expired or invalid token): {message or reason or 'HTTP 401'}",
                            slow=True)
        detail = ": ".join(p for p in (reason, message) if p)
        return _Failure(f"http {code}", f"{where}: HTTP {code}" + (f" ({detail})" if detail else ""))


async def _read_some(response: httpx2.Response) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= _READ_LIMIT:
            break
    return body
