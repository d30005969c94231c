"""Nodes and Leases for the fake API server (``tests/fake_apiserver.py``), with the API server's write rules.

Routes, added to the fake's app by :meth:`ClusterObjects.add_routes`:

- ``GET /api/v1/nodes`` and ``/api/v1/nodes/{name}``; ``PATCH /api/v1/nodes/{name}`` (spec and metadata) and
  ``/api/v1/nodes/{name}/status`` (status only), as ``application/merge-patch+json`` (RFC 7386) or
  ``application/strategic-merge-patch+json`` (maps merged, ``status.conditions`` merged by ``type``, other
  lists replaced, as Node's patch strategies say). A patch carrying ``metadata.resourceVersion`` is refused
  with 409 Conflict when the Node has changed since: the API server's optimistic concurrency.
- ``GET``, ``POST`` (409 AlreadyExists), ``PUT`` (409 Conflict on a stale ``resourceVersion``) of
  ``coordination.k8s.io/v1`` Leases under ``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases``.
- Discovery for the real ``kubectl``: ``/api``, ``/api/v1``, ``/apis``.

``cluster.add_node(make_node("gpu-1"))``, ``cluster.nodes[name]``, ``cluster.leases[(ns, name)]``,
``cluster.node_patches`` (what was patched), ``cluster.fail_node_writes(503, times=2)``.
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web


def make_node(name: str, *, gpus: int = 8, unschedulable: bool = False,
              taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A GPU Node as the API server returns it, with the kubelet's conditions."""
    conditions = [
        {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": f"kubelet has {m}",
         "lastHeartbeatTime": "2026-11-27T10:00:00Z", "lastTransitionTime": "2026-11-20T08:00:00Z"}
        for t, r, m in (("MemoryPressure", "SufficientMemory", "sufficient memory available"),
                        ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                        ("PIDPressure", "SufficientPID", "sufficient PID available"))]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-11-27T10:00:00Z",
                       "lastTransitionTime": "2026-11-20T08:00:00Z"})
    capacity = {"cpu": "96", "memory": "2113425436Ki", "pods": "110", "ephemeral-storage": "3750662708Ki",
                "nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"],
                            "providerID": f"aws:///us-east-1a/i-0{uuid.uuid4().hex[:16]}"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "1",
                     "creationTimestamp": "2026-11-20T08:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
        "status": {
            "capacity": capacity, "allocatable": dict(capacity), "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.3.17"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()),
                         "bootID": str(uuid.uuid4()), "kernelVersion": "6.8.0-1015-aws",
                         "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                         "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
        },
    }


@dataclass(frozen=True)
class SeenPatch:
    node: str
    subresource: str  # "" or "status"
    content_type: str
    body: Any
    status: int


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merged recursively, null deletes, anything else (lists too) replaces."""
    return _patch(target, patch, {})


_MERGE_KEYS = {"conditions": "type", "addresses": "type"}  # NodeStatus' patchMergeKey lists


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The part of Kubernetes' strategic merge Node uses: lists with a merge key merged item by item."""
    return _patch(target, patch, _MERGE_KEYS)


def _patch(target: Any, patch: Any, merge_keys: Mapping[str, str]) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in merge_keys and isinstance(value, list):
            items = [dict(i) for i in out.get(key) or []]
            for item in value:
                same = [i for i, old in enumerate(items) if old.get(merge_keys[key]) == item.get(merge_keys[key])]
                if same:
                    items[same[0]] = _patch(items[same[0]], item, merge_keys)
                else:
                    items.append(copy.deepcopy(item))
            out[key] = items
        else:
            out[key] = _patch(out.get(key), value, merge_keys)
    return out


class ClusterObjects:
    """The Nodes and Leases of the fake API server ``api`` (its token, its resource versions)."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.node_patches: list[SeenPatch] = []
        self.lease_writes: list[tuple[str, int]] = []  # (method, status)
        self._versions = itertools.count(5000)
        self._failures: list[int] = []

    def add_node(self, node: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(node))
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.nodes[stored["metadata"]["name"]] = stored
        return stored

    def update_node(self, name: str, change: Any) -> dict[str, Any]:
        """A person's (or another controller's) change: ``change(node)`` in place, a new version."""
        node = copy.deepcopy(self.nodes[name])
        change(node)
        return self.add_node(node)

    def fail_node_writes(self, status: int = 503, *, times: int = 1) -> None:
        self._failures.extend([status] * times)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api", self._core_versions)
        app.router.add_get("/api/v1", self._core_resources)
        app.router.add_get("/apis", self._groups)
        # GET /api/v1/nodes is FakeApiServer's own route: metadata-only lists of names, else list_nodes
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_patch("/api/v1/nodes/{name}/status", self._patch_node)
        base = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        app.router.add_get(base + "/{name}", self._get_lease)
        app.router.add_post(base, self._create_lease)
        app.router.add_put(base + "/{name}", self._replace_lease)

    # --- checks
    def _refused(self, request: web.Request) -> web.Response | None:
        token = self._api.token
        if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        return None

    # --- discovery (what kubectl asks first)
    async def _core_versions(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self._api.port}"}]})

    async def _core_resources(self, request: web.Request) -> web.Response:
        def resource(name: str, kind: str, namespaced: bool, verbs: list[str], short: list[str] | None = None
                     ) -> dict[str, Any]:
            entry = {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                     "verbs": verbs}
            if short:
                entry["shortNames"] = short
            return entry
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            resource("nodes", "Node", False, ["get", "list", "patch", "update", "watch"], ["no"]),
            resource("nodes/status", "Node", False, ["get", "patch", "update"]),
            resource("pods", "Pod", True, ["get", "list", "watch"], ["po"]),
            resource("pods/eviction", "Eviction", True, ["create"]),
        ]})

    async def _groups(self, request: web.Request) -> web.Response:
        # no group is listed: kubectl would ask each for a resource list this fake does not serve
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    # --- nodes
    async def list_nodes(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.json_response({"kind": "NodeList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(next(self._versions))},
                                  "items": list(self.nodes.values())})

    async def _get_node(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        name = request.match_info["name"]
        node = self.nodes.get(name)
        if node is None:
            return web.json_response(_status(404, "NotFound", f'nodes "{name}" not found'), status=404)
        return web.json_response(node)

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        subresource = "status" if request.path.endswith("/status") else ""
        content_type = request.headers.get("Content-Type", "")
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None

        def answer(status: int, reply: Any) -> web.Response:
            self.node_patches.append(SeenPatch(name, subresource, content_type, body, status))
            return web.json_response(reply, status=status)

        refused = self._refused(request)
        if refused is not None:
            return refused
        if self._failures:
            code = self._failures.pop(0)
            return answer(code, _status(code, "ServiceUnavailable", f"the server reports HTTP {code}"))
        node = self.nodes.get(name)
        if node is None:
            return answer(404, _status(404, "NotFound", f'nodes "{name}" not found'))
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return answer(415, _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                                       f"format - accepted media types include: application/merge-patch+json, "
                                       f"application/strategic-merge-patch+json (got {content_type!r})"))
        if not isinstance(body, dict):
            return answer(400, _status(400, "BadRequest", "the patch is not a JSON object"))
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            return answer(409, _status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the '
                                       "object has been modified; please apply your changes to the latest "
                                       "version and try again"))
        apply = strategic_merge_patch if content_type.startswith("application/strategic") else merge_patch
        patched = apply(node, body)
        # the status subresource changes only the status; the main resource everything but the status
        if subresource:
            patched = {**node, "status": patched.get("status", node.get("status"))}
        else:
            patched["status"] = node.get("status")
        patched["metadata"] = {**patched["metadata"], "name": name, "uid": node["metadata"]["uid"]}
        return answer(200, self.add_node(patched))

    # --- leases
    async def _get_lease(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        key = (request.match_info["namespace"], request.match_info["name"])
        lease = self.leases.get(key)
        if lease is None:
            return web.json_response(_status(404, "NotFound", f'leases.coordination.k8s.io "{key[1]}" not found'),
                                     status=404)
        return web.json_response(lease)

    async def _create_lease(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = json.loads(await request.read())
        namespace = request.match_info["namespace"]
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            self.lease_writes.append(("POST", 409))
            return web.json_response(_status(409, "AlreadyExists",
                                             f'leases.coordination.k8s.io "{key[1]}" already exists'), status=409)
        body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                                resourceVersion=str(next(self._versions)))
        self.leases[key] = body
        self.lease_writes.append(("POST", 201))
        return web.json_response(body, status=201)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = json.loads(await request.read())
        key = (request.match_info["namespace"], request.match_info["name"])
        old = self.leases.get(key)
        if old is None:
            return web.json_response(_status(404, "NotFound", f'leases.coordination.k8s.io "{key[1]}" not found'),
                                     status=404)
        if body.get("metadata", {}).get("resourceVersion") != old["metadata"]["resourceVersion"]:
            self.lease_writes.append(("PUT", 409))
            return web.json_response(_status(409, "Conflict", f'Operation cannot be fulfilled on '
                                             f'leases.coordination.k8s.io "{key[1]}": the object has been '
                                             "modified; please apply your changes to the latest version and try "
                                             "again"), status=409)
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self.leases[key] = body
        self.lease_writes.append(("PUT", 200))
        return web.json_response(body)
