"""The simulated node's Kubernetes API server: its pods, their owners, and a sink for the agent's Events.

What the agent asks of an API server, answered in the API server's JSON (aiohttp on loopback):

- ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``: the node's pods (names, UIDs, annotations,
  QoS, container IDs, the controller ``ownerReferences``); with ``watch=true`` a watch that reports no
  change (the demo's pods do not change) and ends at its ``timeoutSeconds``, as a real one does;
- ``GET /apis/{apps,batch}/v1/namespaces/<ns>/<plural>/<name>``: the owners the agent walks up to the
  workload (a Deployment's ReplicaSet, a CronJob's Job; the Deployment, StatefulSet or Job itself);
- ``POST /apis/events.k8s.io/v1/namespaces/<ns>/events``: idle-pod Events, logged and answered 201.

Anything else is a 404 ``Status``. Only the loopback interface is served, and loopback is every local
user's: each request must carry the server's bearer token (a random one per start, 401 otherwise), which
only the kubeconfig written into the demo's own 0700 directory holds (the demo's agent reads it there).
What a writer can make it keep is bounded too: an Event's body (:data:`MAX_EVENT_BYTES`, 413 over it, read
through the bounded JSON reader), the Events kept (the last :data:`MAX_EVENTS`, a ring) and what is logged
of each (its reason, pod and note cut and their controls shown).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import os
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuagent import boundedjson
from gpuagent.demo.node import DemoNode, Pod
from gpuagent.untrusted import shown

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 64 * 1024  # an agent's idle Event is under 2 KB
EVENT_BOUNDS = boundedjson.Bounds(max_bytes=MAX_EVENT_BYTES, max_depth=16)
MAX_EVENTS = 1000  # kept for whoever looks (a test); older ones are dropped
LOGGED_CHARS = 200  # of an Event's reason, pod name and note each
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CREATED = "2026-01-05T09:00:00Z"
RESOURCE_VERSION = "1"
_OWNER_UIDS = uuid.UUID("0b5e1d9e-6a43-4c1f-8f0a-2d7c3e9b4a11")
# A Deployment's pods belong to a ReplicaSet, a CronJob's to a Job: (API group, kind, plural) of each level.
_KINDS = {
    "Deployment": ("apps", "Deployment", "deployments"), "ReplicaSet": ("apps", "ReplicaSet", "replicasets"),
    "StatefulSet": ("apps", "StatefulSet", "statefulsets"), "Job": ("batch", "Job", "jobs"),
    "CronJob": ("batch", "CronJob", "cronjobs"),
}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _reference(kind: str, namespace: str, name: str) -> dict[str, Any]:
    group = _KINDS[kind][0]
    return {"apiVersion": f"{group}/v1", "kind": kind, "name": name, "controller": True,
            "blockOwnerDeletion": True, "uid": str(uuid.uuid5(_OWNER_UIDS, f"{kind}/{namespace}/{name}"))}


def _object(kind: str, namespace: str, name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    group, _, _ = _KINDS[kind]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": RESOURCE_VERSION,
                            "uid": _reference(kind, namespace, name)["uid"], "creationTimestamp": CREATED}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"kind": kind, "apiVersion": f"{group}/v1", "metadata": meta}


def _middle(pod: Pod) -> str:
    """The ReplicaSet (or Job) between a Deployment (or CronJob) and the pod: its name from the pod's,
    as Kubernetes makes them (``<deployment>-<hash>-<random>``), else from a digest."""
    owner = pod.spec.owner_name or ""
    rest = pod.name.removeprefix(owner + "-")
    if rest != pod.name and "-" in rest:
        return f"{owner}-{rest.rsplit('-', 1)[0]}"
    return f"{owner}-{hashlib.sha256(pod.uid.encode()).hexdigest()[:9]}"


def owners_of(node: DemoNode) -> tuple[dict[tuple[str, str, str], dict[str, Any]], dict[str, dict[str, Any]]]:
    """The owner objects by (plural, namespace, name), and each pod's controller reference by UID."""
    objects: dict[tuple[str, str, str], dict[str, Any]] = {}
    references: dict[str, dict[str, Any]] = {}

    def put(kind: str, namespace: str, name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
        objects[(_KINDS[kind][2], namespace, name)] = _object(kind, namespace, name, owner)
        return _reference(kind, namespace, name)

    for pod in node.pods:
        kind, name, ns = pod.spec.owner_kind, pod.spec.owner_name, pod.namespace
        if kind is None or name is None:
            continue
        top = put(kind, ns, name, None)
        if kind == "Deployment":
            references[pod.uid] = put("ReplicaSet", ns, _middle(pod), top)
        elif kind == "CronJob":
            references[pod.uid] = put("Job", ns, _middle(pod), top)
        else:
            references[pod.uid] = top
    return objects, references


def pod_object(node: DemoNode, pod: Pod, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """``pod`` as the API server returns it (the fields a kubelet node's pods have that the agent reads,
    and enough of the rest to look like one)."""
    def resources(devices: Any) -> dict[str, Any]:
        counts: dict[str, str] = {}
        for device in devices:
            counts[device.resource_name] = str(int(counts.get(device.resource_name, "0")) + 1)
        return {"limits": counts, "requests": counts} if counts else {}

    meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                            "resourceVersion": RESOURCE_VERSION, "creationTimestamp": CREATED,
                            "labels": {"app.kubernetes.io/name": pod.spec.owner_name or pod.name},
                            "annotations": dict(pod.spec.annotations)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": meta,
        "spec": {"nodeName": node.hostname, "containers": [
            {"name": c.name, "image": "nvcr.io/nvidia/pytorch:24.05-py3", "resources": resources(c.devices)}
            for c in pod.containers]},
        "status": {"phase": "Running", "qosClass": pod.spec.qos, "startTime": CREATED, "containerStatuses": [
            {"name": c.name, "containerID": f"containerd://{c.container_id}", "ready": True, "started": True,
             "restartCount": 0, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
             "state": {"running": {"startedAt": CREATED}}} for c in pod.containers]},
    }


class ApiServer:
    """``start()`` serves ``node`` on 127.0.0.1 (a port of the OS's choosing, :attr:`url`); ``stop()``."""

    def __init__(self, node: DemoNode, *, token: str | None = None) -> None:
        self._node = node
        objects, references = owners_of(node)
        self._owners = objects
        self._pods = [pod_object(node, pod, references.get(pod.uid)) for pod in node.pods]
        self._runner: web.AppRunner | None = None
        self._watches: set[asyncio.Task[Any]] = set()
        self.url = ""
        self.token = token or secrets.token_urlsafe(32)
        self._expected = f"Bearer {self.token}".encode()
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)  # a ring

    async def start(self) -> None:
        app = web.Application(middlewares=[self._authenticated], client_max_size=MAX_EVENT_BYTES)
        app.router.add_get("/api/v1/pods", self._list_or_watch)
        app.router.add_get("/apis/{group}/v1/namespaces/{namespace}/{plural}/{name}", self._owner)
        app.router.add_post("/apis/events.k8s.io/v1/namespaces/{namespace}/events", self._event)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner

    async def stop(self) -> None:
        for task in list(self._watches):
            task.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming this server and its token, readable by its owner alone (created 0600, never
        through a file that was there): put it in a directory only the demo's user can enter."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "demo",
            "clusters": [{"name": "demo", "cluster": {"server": self.url}}],
            "users": [{"name": "demo", "user": {"token": self.token}}],
            "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}],
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(json.dumps(config, indent=2) + "\n")  # JSON is YAML
        return path

    @web.middleware
    async def _authenticated(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self._expected):
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        return await handler(request)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        selector = request.query.get("fieldSelector", "")
        pods = [p for p in self._pods if f"spec.nodeName={p['spec']['nodeName']}" in selector.split(",")
                or not selector]
        if request.query.get("watch") not in ("true", "1"):
            return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": RESOURCE_VERSION}, "items": pods})
        try:
            timeout = min(float(request.query.get("timeoutSeconds", "300")), 3600.0)
        except ValueError:
            return web.json_response(_status(400, "BadRequest", "timeoutSeconds: not a number"), status=400)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if request.query.get("resourceVersion", "") in ("", "0"):  # "any": the state now, as ADDED events
            for pod in pods:
                await response.write(json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n")
        task = asyncio.current_task()
        if task is not None:
            self._watches.add(task)
        try:
            await asyncio.sleep(timeout)  # nothing changes; the watch ends at its timeout, cleanly
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the agent went away, or the demo is stopping
        finally:
            if task is not None:
                self._watches.discard(task)
        return response

    async def _owner(self, request: web.Request) -> web.Response:
        key = (request.match_info["plural"], request.match_info["namespace"], request.match_info["name"])
        found = self._owners.get(key)
        if found is None:
            return web.json_response(_status(404, "NotFound", f'{key[0]} "{key[2]}" not found'), status=404)
        return web.json_response(found)

    async def _event(self, request: web.Request) -> web.Response:
        try:
            event = boundedjson.loads(await request.read(), EVENT_BOUNDS, "the Event")
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(_status(413, "RequestEntityTooLarge",
                                             f"an Event is at most {MAX_EVENT_BYTES} bytes"), status=413)
        except boundedjson.Unreadable:
            event = None
        if not isinstance(event, dict):
            return web.json_response(_status(400, "BadRequest", "the body is no Event"), status=400)
        self.events.append(event)
        regarding = event.get("regarding")
        name = regarding.get("name") if isinstance(regarding, dict) else None
        log.info("Event %s on pod %s: %s", _logged(event.get("reason")), _logged(name),
                 _logged(event.get("note")))
        return web.json_response(event, status=201)


def _logged(value: object) -> str:
    """A field of an Event as one log line shows it: quoted, its controls shown, cut."""
    text = shown(value if isinstance(value, str) else repr(value))
    return repr(text[:LOGGED_CHARS] + ("..." if len(text) > LOGGED_CHARS else ""))

