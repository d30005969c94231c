"""A fake Kubernetes API server for tests: real aiohttp on 127.0.0.1, the API server's JSON for pods.

It serves ``GET /api/v1/pods`` and ``GET /apis/resource.k8s.io/v1/resourceslices`` as a list (a
``PodList``/``ResourceSliceList`` with ``metadata.resourceVersion``) and, with ``watch=true``, as a watch: a
chunked stream of newline-delimited ``{"type", "object"}`` events, replayed from the requested
``resourceVersion`` and then live (one version sequence for every kind, as etcd has). It honours
``fieldSelector=spec.nodeName=<node>`` (an object that starts or stops matching is ADDED or DELETED for that
watch, as the real watch cache does), ``timeoutSeconds`` (the stream ends cleanly) and
``allowWatchBookmarks``; it needs the bearer token.

Lists are paged as the real API server pages them (``limit`` and ``continue``): ``resourceVersion=0`` is
served from the watch cache, which ignores ``limit`` (one answer, everything); without a resourceVersion a
list is consistent and honours ``limit``, in key order, each page carrying ``metadata.continue`` (an opaque
token naming the first page's version and the last key) and ``remainingItemCount``; every page of a
continued list is the store as it was at the first page's version, whatever was written since (the
``resourceVersion`` of every page is that version, so a watch from it sees those writes); a continue whose
version was compacted away (``expire_watch``) is 410 Expired, as etcd's compaction makes it; a continue
beside a ``resourceVersion`` is 400. Each object's JSON is encoded when it is written and kept (the real
watch cache keeps its objects' serialisations likewise: a list's time here is mostly its bytes); ``api.list_pages`` records what each list answer
served (kind, items, bytes, seconds, whether a continue followed)::

    async with FakeApiServer() as api:
        api.add_pod(make_pod("job-0", node="gpu-1"))  # ADDED (or MODIFIED if its UID is known)
        api.delete_pod(uid)                            # DELETED (notify=False: watches miss it)
        api.add_slice(make_slice(NODE, [gpu_device("gpu-0", uuid)]))  # a DRA ResourceSlice, likewise
        api.delete_slice(uid)
        api.add_claim(claim) / api.add_claim_template(template)  # GET .../resourceclaims/<name> answers it
        api.expire_watch()                             # open watches get ERROR 410; older versions are gone
        api.drop_connections()                         # open watches are cut (no chunked terminator)
        api.fail_next(status=403, times=2)             # the next two requests get a Status error
        api.send_bookmark()                            # BOOKMARK to watches that asked for them
        api.send_raw(b"{}")                            # any bytes, as they are, to open watches
        await api.stop(); await api.start()            # the server is away, then back on the same port
        config = api.kubeconfig()                      # a lightkube KubeConfig pointing here
        api.requests, api.lists, api.watches           # requests seen: path, query, token, time
        api.list_pages                                 # list answers served: items, bytes, seconds
        api.after_page = lambda served: ...            # called after each list answer (writes between pages)
        api.pdb_blocks("ml-team", "job-0")             # its Evictions get 429 (a PodDisruptionBudget)
        api.evictions                                  # Evictions seen (POST .../pods/<name>/eviction)
        api.add_owner(make_owner("Deployment", "web"))  # GET /apis/{apps,batch}/v1/.../<kind>s/<name>
        api.fail_owner_gets(403, times=2)              # the next two owner GETs get a Status error
        api.owner_gets                                 # owner GETs seen (not in api.requests)
        api.owner_delay = 0.5                          # owner GETs answered after this long
        api.cluster.add_node(make_node("gpu-1"))        # Nodes and Leases: tests/fake_cluster.py

For the agent's watcher against it: ``async with metadata_runner(api) as start: metadata = start()`` (a
running ``PodMetadata`` of NODE with quick retries, cancelled on exit), and ``await eventually(predicate)``.

Pods are plain dicts in the API's JSON; :func:`make_pod` builds realistic ones (spec, status, managed
fields, a large last-applied annotation), and :func:`container_id` gives the bare ID of a container.
A pod's controller is a ReplicaSet ``<name>-rs`` unless ``owner=`` names one (an object of
:func:`make_owner`, whose own controller its ``owner=`` names) or ``owner=None`` (a bare pod). Owners of
the kinds the agent walks (ReplicaSet, Deployment, StatefulSet, Job, CronJob) are served by
``GET /apis/apps/v1/namespaces/{ns}/<kind>s/{name}`` (``batch/v1`` for jobs and cron jobs) once added.

``GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`` (and ``resourceclaimtemplates``)
answers the object added with ``add_claim`` (``add_claim_template``), as owners are served (404 otherwise,
``fail_owner_gets`` applies). :func:`make_slice`, :func:`gpu_device`, :func:`mig_device` build
ResourceSlices as NVIDIA's DRA driver publishes them; :func:`make_claim` and :func:`make_claim_template`
a ResourceClaim and a ResourceClaimTemplate.

``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` (policy/v1 Eviction) answers 201 with the
fixture's ``Status`` body, or 429 with the PodDisruptionBudget fixture's after ``pdb_blocks(ns, name)``;
400 when the body is not an Eviction of that pod. Evictions are recorded in ``api.evictions`` (not in
``api.requests``), and ``fail_next`` applies to them too.

``POST /apis/events.k8s.io/v1/namespaces/{ns}/events`` (events.k8s.io/v1 Event) answers 201 with the Event,
after the API server's validation of the fields it requires (``eventTime``, ``reportingController``,
``reportingInstance``, ``action``, ``reason``, ``type`` Normal/Warning, the namespace matching
``regarding``'s, no ``deprecated*`` fields): 422 otherwise. Events are recorded in ``api.events``;
``fail_next`` applies to them too.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import copy
import hashlib
import heapq
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from fake_cluster import ClusterObjects
from fixture_files import kubernetes_body

NODE = "gpu-node-1"
TOKEN = "test-token"
RUNTIME_PREFIX = {"containerd": "containerd://", "cri-o": "cri-o://", "docker": "docker://"}
_DROP, _END = object(), object()


# -- pods ------------------------------------------------------------------------------------------------
def container_id(pod_uid: str, container: str) -> str:
    """The bare 64-hex ID :func:`make_pod` gives a container (what its cgroup path carries)."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    node: str | None = NODE,
    uid: str | None = None,
    containers: Sequence[str] = ("main",),
    init_containers: Sequence[str] = (),
    ephemeral_containers: Sequence[str] = (),
    runtime: str = "containerd",
    annotations: Mapping[str, str] | None = None,
    qos: str = "Burstable",
    phase: str = "Running",
    started: bool = True,
    gpus: int = 1,
    mirror_of: str | None = None,
    owner: Mapping[str, Any] | str | None = "replicaset",
) -> dict[str, Any]:
    """A pod as the API server returns it. ``started=False``: containers still waiting (no IDs yet);
    ``mirror_of``: the mirror of a static pod whose kubelet-side UID (config hash) is this."""
    uid = uid or str(uuid.uuid4())
    prefix = RUNTIME_PREFIX[runtime]
    annotations = dict(annotations or {})
    annotations.setdefault(
        "kubectl.kubernetes.io/last-applied-configuration",
        json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"containers": [{"name": c, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                             "command": ["python", "-m", "train", "--epochs", "100"] * 20}
                                            for c in containers]}}),
    )
    if owner == "replicaset":
        owners = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs", "uid": str(uuid.uuid4()),
                   "controller": True, "blockOwnerDeletion": True}]
    else:
        owners = [owner_ref(owner)] if isinstance(owner, Mapping) else []
    if mirror_of:
        annotations.update({"kubernetes.io/config.mirror": mirror_of, "kubernetes.io/config.hash": mirror_of,
                            "kubernetes.io/config.source": "file"})
        owners = [{"apiVersion": "v1", "kind": "Node", "name": node or NODE, "uid": str(uuid.uuid4()),
                   "controller": True}]
    resources = {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"},
                 "requests": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "16Gi"}} if gpus else {}

    def spec_of(c: str) -> dict[str, Any]:
        return {"name": c, "image": "nvcr.io/nvidia/pytorch:24.05-py3", "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-m", "train"], "resources": resources,
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}

    def status_of(c: str) -> dict[str, Any]:
        s: dict[str, Any] = {"name": c, "image": "nvcr.io/nvidia/pytorch:24.05-py3", "imageID": "",
                             "ready": started, "restartCount": 0, "started": started}
        if started:
            s.update(containerID=prefix + container_id(uid, c),
                     imageID="nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32,
                     state={"running": {"startedAt": "2026-08-07T10:20:11Z"}})
        else:
            s["state"] = {"waiting": {"reason": "ContainerCreating"}}
        return s

    spec: dict[str, Any] = {
        "containers": [spec_of(c) for c in containers],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "schedulerName": "default-scheduler", "priority": 0,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
    }
    if node:
        spec["nodeName"] = node
    if init_containers:
        spec["initContainers"] = [spec_of(c) for c in init_containers]
    if ephemeral_containers:
        spec["ephemeralContainers"] = [{"name": c, "image": "busybox:1.36", "targetContainerName": containers[0]}
                                       for c in ephemeral_containers]
    status: dict[str, Any] = {
        "phase": phase, "qosClass": qos, "hostIP": "10.0.3.17", "podIP": "10.244.3.41",
        "podIPs": [{"ip": "10.244.3.41"}], "startTime": "2026-08-07T10:20:05Z",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": "2026-08-07T10:20:11Z"}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled")],
        "containerStatuses": [status_of(c) for c in containers],
    }
    if init_containers:
        status["initContainerStatuses"] = [status_of(c) for c in init_containers]
    if ephemeral_containers:
        status["ephemeralContainerStatuses"] = [status_of(c) for c in ephemeral_containers]
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid, "resourceVersion": "0",
            "creationTimestamp": "2026-08-07T10:20:05Z", "labels": {"app": name, "pod-template-hash": "7d9c6b8f5d"},
            "annotations": annotations, **({"ownerReferences": owners} if owners else {}),
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-08-07T10:20:11Z", "fieldsType": "FieldsV1", "subresource": "status",
                               "fieldsV1": {"f:status": {f"f:{k}": {} for k in status}}}],
        },
        "spec": spec,
        "status": status,
    }


# -- DRA objects -----------------------------------------------------------------------------------------
def gpu_device(name: str, uuid: str | None, *, product: str = "NVIDIA H100 80GB HBM3",
               bus: str = "0000:18:00.0", qualified: bool = False) -> dict[str, Any]:
    """A whole GPU as NVIDIA's DRA driver publishes it (``gpu-<minor>``); ``uuid`` None leaves it out;
    ``qualified`` names the attributes with the driver's domain (``gpu.nvidia.com/uuid``)."""
    attributes: dict[str, Any] = {
        "type": {"string": "gpu"}, "productName": {"string": product}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.105.8"}, "cudaDriverVersion": {"version": "13.0.0"},
        "pcieBusID": {"string": bus}, "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "addressingMode": {"string": "None"},
    }
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    if qualified:
        attributes = {(k if "/" in k else f"gpu.nvidia.com/{k}"): v for k, v in attributes.items()}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}


def mig_device(name: str, uuid: str | None, parent: str, profile: str) -> dict[str, Any]:
    """A MIG device as NVIDIA's DRA driver publishes it (``gpu-<minor>-mig-<profile id>-<start>-<size>``)."""
    device = gpu_device(name, uuid)
    device["attributes"].update(type={"string": "mig"}, parentUUID={"string": parent},
                                profile={"string": profile})
    device["capacity"] = {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "60"}}
    return device


def make_slice(node: str | None, devices: Sequence[Mapping[str, Any]], *, driver: str = "gpu.nvidia.com",
               pool: str | None = None, generation: int = 1, name: str | None = None) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceSlice of ``node``'s pool (the pool is named after the node)."""
    pool = pool or node or "cluster"
    name = name or f"{node}-{driver}-{uuid.uuid4().hex[:5]}"
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool, "generation": generation,
                                                       "resourceSliceCount": 1},
                            "devices": [dict(d) for d in devices]}
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1",
            "metadata": {"name": name, "generateName": f"{node}-{driver}-", "uid": str(uuid.uuid4()),
                         "resourceVersion": "0", "creationTimestamp": "2026-08-07T10:00:00Z",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node or "",
                                              "uid": str(uuid.uuid4()), "controller": True}]},
            "spec": spec}


def make_claim_template(name: str, requests: Sequence[Mapping[str, Any]], *, namespace: str = "default",
                        config: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaimTemplate with these device requests."""
    spec: dict[str, Any] = {"devices": {"requests": [dict(r) for r in requests]}}
    if config:
        spec["devices"]["config"] = [dict(c) for c in config]
    return {"kind": "ResourceClaimTemplate", "apiVersion": "resource.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "7"},
            "spec": {"spec": spec}}


def make_claim(name: str, requests: Sequence[Mapping[str, Any]], *, namespace: str = "default",
               allocated_on: str | None = None) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim; ``allocated_on`` a node: its status has an allocation there."""
    claim: dict[str, Any] = {
        "kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "resourceVersion": "9"},
        "spec": {"devices": {"requests": [dict(r) for r in requests]}},
    }
    if allocated_on is not None:
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": r["name"], "driver": "gpu.nvidia.com", "pool": allocated_on,
                                     "device": f"gpu-{i}"} for i, r in enumerate(requests)]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [allocated_on]}]}]}}}
    return claim


_API_VERSIONS = {"ReplicaSet": "apps/v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                 "Job": "batch/v1", "CronJob": "batch/v1"}


def make_owner(kind: str, name: str, *, namespace: str = "default", owner: Mapping[str, Any] | None = None,
               api_version: str | None = None, uid: str | None = None) -> dict[str, Any]:
    """A controller object as the API server returns it (what the agent reads of it: metadata), controlled
    by ``owner`` (another object of this function) when given."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4()),
                                "resourceVersion": "1", "labels": {"app": name},
                                "annotations": {"deployment.kubernetes.io/revision": "3"}}
    if owner is not None:
        metadata["ownerReferences"] = [owner_ref(owner)]
    return {"apiVersion": api_version or _API_VERSIONS.get(kind, "example.com/v1"), "kind": kind,
            "metadata": metadata, "spec": {"replicas": 1}, "status": {"replicas": 1}}


def owner_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ``ownerReferences`` entry pointing at ``obj``."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


# -- the server ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    query: Mapping[str, str]
    authorization: str | None
    at: float  # time.monotonic() when it arrived

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass(frozen=True)
class ServedList:
    """One list answer (a page, or a whole list): what the API server's side of a list costs."""

    kind: str
    items: int
    bytes: int
    seconds: float  # building the answer (the objects' encodings are kept, as the watch cache keeps them)
    continued: bool  # a continue token went with it (more pages follow)
    resource_version: str


@dataclass(eq=False)
class _Watcher:
    node: str | None
    bookmarks: bool
    kind: str = "pods"
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


def _node_of(selector: str | None) -> str | None:
    """``spec.nodeName=<node>`` (or ``==``) -> node; no selector -> None (all pods)."""
    if not selector:
        return None
    # kubectl describe node adds status.phase!=Succeeded,status.phase!=Failed: the fake's pods all run
    selector = ",".join(t for t in selector.split(",") if not t.startswith("status.phase!="))
    key, _, value = selector.partition("=")
    if key != "spec.nodeName" or not value or "," in value:
        raise ValueError(f"unsupported field selector {selector!r} (this fake knows spec.nodeName=<node>)")
    return value.removeprefix("=")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


_KINDS = {"pods": ("PodList", "v1"), "resourceslices": ("ResourceSliceList", "resource.k8s.io/v1"),
          "gpunodestates": ("GPUNodeStateList", "gpuagent.io/v1alpha1")}
STATES_PATH = "/apis/gpuagent.io/v1alpha1/gpunodestates"
_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 410: "Expired", 429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable"}


class FakeApiServer:
    def __init__(self, *, token: str | None = TOKEN, port: int = 0) -> None:
        self.token = token
        self.port = port
        self.requests: list[SeenRequest] = []
        self._stores: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in _KINDS}  # kind -> uid -> obj
        self.pods = self._stores["pods"]  # uid -> pod
        self.slices = self._stores["resourceslices"]  # uid -> ResourceSlice
        self.states = self._stores["gpunodestates"]  # "state-<name>" -> GPUNodeState (cluster-scoped)
        self.state_writes: list[SeenRequest] = []  # server-side applies of GPUNodeStates
        self._rv = 1000
        self._oldest = self._rv  # a watch from a version older than this gets 410
        self._history: list[tuple[str, int, dict | None, dict | None]] = []  # (kind, rv, before, after)
        self._watchers: set[_Watcher] = set()
        self._failures: list[tuple[int, str | None]] = []
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._handlers: set[asyncio.Task] = set()
        self.evictions: list[SeenEviction] = []
        self.events: list[SeenEvent] = []
        self._pdb_blocked: set[tuple[str, str]] = set()
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, namespace, name) -> object
        self.owner_gets: list[SeenRequest] = []
        self._owner_failures: list[int] = []
        self.owner_delay = 0.0  # seconds before an owner GET is answered
        self.cluster = ClusterObjects(self)  # Nodes, Leases and discovery (tests/fake_cluster.py)
        self.node_names: list[str] = []  # the cluster's Nodes, listed by name (metadata only)
        self.node_lists: list[SeenRequest] = []
        self.list_pages: list[ServedList] = []
        self.after_page: Callable[[ServedList], None] | None = None  # called once each list answer is made
        self._encoded: dict[str, tuple[str, bytes]] = {}  # uid -> (its resourceVersion, its JSON)
        self._sorted: dict[str, list[str] | None] = {}  # kind -> its uids in key order (None: to sort again)
        self._at_version: dict[tuple[str, int], tuple[dict[str, Any], int]] = {}  # a paged list's past store

    # lifecycle
    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/api/v1/nodes", self._nodes)
        app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", self._resource_slices)
        app.router.add_get(STATES_PATH, self._gpu_node_states)
        app.router.add_patch(STATES_PATH + "/{name}", self._apply_state)
        self.cluster.add_routes(app)  # before the owners' catch-all GET
        app.router.add_get("/apis/{group}/v1/namespaces/{namespace}/{plural}/{name}", self._owner)
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", self._evict)
        app.router.add_post("/apis/events.k8s.io/v1/namespaces/{namespace}/events", self._event)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()
        server = self._site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every open connection (the API server went away)."""
        self.drop_connections()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = self._site = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file for this server (plain HTTP, bearer token), for an agent run by its config."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "agent", "user": {"token": self.token or "x"}}],
            "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "agent"}}],
        }))
        return path

    def kubeconfig(self, token: str | None = None) -> Any:
        """A lightkube KubeConfig for this server (plain HTTP, bearer token)."""
        from lightkube import KubeConfig
        from lightkube.config.models import Cluster, User

        return KubeConfig.from_one(cluster=Cluster(server=self.url), user=User(token=token or self.token or "x"))

    # what the cluster does
    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def add_pod(self, pod: Mapping[str, Any], *, notify: bool = True) -> dict[str, Any]:
        """Creates the pod or, when its UID is known, replaces it (MODIFIED). Returns the stored copy.
        ``notify=False``: open watches miss it (as when its event is compacted away before delivery)."""
        return self._put("pods", pod, notify)

    def add_slice(self, resource_slice: Mapping[str, Any], *, notify: bool = True) -> dict[str, Any]:
        """Creates the ResourceSlice or, when its UID is known, replaces it (MODIFIED), as ``add_pod``."""
        return self._put("resourceslices", resource_slice, notify)

    def delete_slice(self, uid: str, *, notify: bool = True) -> None:
        self._delete("resourceslices", uid, notify)

    def put_state(self, obj: Mapping[str, Any], *, notify: bool = True) -> dict[str, Any]:
        """Creates or replaces a GPUNodeState by name (as the agents' server-side applies do)."""
        metadata = dict(obj.get("metadata") or {})
        metadata["uid"] = "state-" + metadata["name"]
        return self._put("gpunodestates", {**obj, "metadata": metadata}, notify)  # copied there

    def delete_state(self, name: str, *, notify: bool = True) -> None:
        self._delete("gpunodestates", "state-" + name, notify)

    def add_claim(self, claim: Mapping[str, Any]) -> None:
        """A ResourceClaim that ``GET .../resourceclaims/<name>`` answers (served as owners are)."""
        self.add_owner(claim)

    def add_claim_template(self, template: Mapping[str, Any]) -> None:
        """A ResourceClaimTemplate that ``GET .../resourceclaimtemplates/<name>`` answers."""
        self.add_owner(template)

    def _put(self, kind: str, obj: Mapping[str, Any], notify: bool) -> dict[str, Any]:
        after = copy.deepcopy(dict(obj))
        uid = after["metadata"]["uid"]
        self._rv += 1
        after["metadata"]["resourceVersion"] = str(self._rv)
        store = self._stores[kind]
        before = store.get(uid)
        store[uid] = after
        self._encoded[uid] = (after["metadata"]["resourceVersion"], json.dumps(after).encode())
        if before is None:
            self._sorted[kind] = None
        self._record(kind, before, after, notify)
        return after

    def _delete(self, kind: str, uid: str, notify: bool) -> None:
        before = self._stores[kind].pop(uid)
        self._encoded.pop(uid, None)
        self._sorted[kind] = None
        self._rv += 1
        self._record(kind, before, None, notify)

    def update_pod(self, uid: str, change: Any) -> dict[str, Any]:
        """Applies ``change(pod)`` (in place) to a copy of the stored pod and stores it (MODIFIED)."""
        pod = copy.deepcopy(self.pods[uid])
        change(pod)
        return self.add_pod(pod)

    def delete_pod(self, uid: str, *, notify: bool = True) -> None:
        self._delete("pods", uid, notify)

    def expire_watch(self) -> None:
        """Compaction: every open watch gets ERROR 410 and ends; a watch from any older version gets 410."""
        self._rv += 1
        self._oldest = self._rv
        self._history.clear()
        self._at_version.clear()  # a continue from before is 410 now
        event = {"type": "ERROR", "object": _status(410, "Expired", "too old resource version: 1 (1001)")}
        for w in self._watchers:
            w.queue.put_nowait(event)
            w.queue.put_nowait(_END)

    def send_bookmark(self) -> None:
        for w in self._watchers:
            if w.bookmarks:
                w.queue.put_nowait(self._bookmark(w.kind))

    def send_raw(self, line: bytes) -> None:
        """Writes this line, as is, to every open watch (a broken or unknown event)."""
        for w in self._watchers:
            w.queue.put_nowait(line)

    def drop_connections(self) -> None:
        """Cuts every open watch mid-stream, as a dying server or a load balancer does."""
        for w in self._watchers:
            w.queue.put_nowait(_DROP)

    def fail_next(self, status: int = 500, *, times: int = 1, message: str | None = None) -> None:
        """The next ``times`` requests (lists or watches) get an error Status with this HTTP code."""
        self._failures.extend([(status, message)] * times)

    def clear_failures(self) -> None:
        self._failures.clear()

    def pdb_blocks(self, namespace: str, name: str, blocked: bool = True) -> None:
        """Evictions of this pod get 429: a PodDisruptionBudget allows no disruption (``blocked=False``
        lifts it)."""
        if blocked:
            self._pdb_blocked.add((namespace, name))
        else:
            self._pdb_blocked.discard((namespace, name))

    def add_owner(self, obj: Mapping[str, Any]) -> None:
        """Serves ``obj`` (of :func:`make_owner`) to GETs of its kind, namespace and name."""
        meta = obj["metadata"]
        self.owners[(obj["kind"].lower() + "s", meta["namespace"], meta["name"])] = copy.deepcopy(dict(obj))

    def fail_owner_gets(self, status: int = 500, *, times: int = 1) -> None:
        self._owner_failures.extend([status] * times)

    # what tests look at
    @property
    def lists(self) -> list[SeenRequest]:
        return [r for r in self.requests if not r.watch]

    @property
    def watches(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.watch]

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    # internals
    def _bookmark(self, kind: str) -> dict[str, Any]:
        list_kind, api_version = _KINDS[kind]
        return {"type": "BOOKMARK", "object": {"kind": list_kind.removesuffix("List"), "apiVersion": api_version,
                                               "metadata": {"resourceVersion": str(self._rv),
                                                            "annotations": {"k8s.io/initial-events-end": "true"}}}}

    def _record(self, kind: str, before: dict | None, after: dict | None, notify: bool) -> None:
        self._history.append((kind, self._rv, before, after))
        for w in self._watchers if notify else ():
            if w.kind != kind:
                continue
            event = self._event_for(w.node, self._rv, before, after)
            if event is not None:
                w.queue.put_nowait(event)

    @staticmethod
    def _matches(node: str | None, pod: dict | None) -> bool:
        return pod is not None and (node is None or pod.get("spec", {}).get("nodeName") == node)

    def _event_for(self, node: str | None, rv: int, before: dict | None, after: dict | None) -> dict | None:
        was, now = self._matches(node, before), self._matches(node, after)
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": after}
        if not was:
            return None
        if after is None:  # deleted: the last state, at the deletion's version
            assert before is not None
            after = copy.deepcopy(before)
            after["metadata"]["resourceVersion"] = str(rv)
        return {"type": "DELETED", "object": after}

    def _check(self, request: web.Request, verb: str, kind: str = "pods") -> web.Response | None:
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        if self._failures:
            code, message = self._failures.pop(0)
            if message is None:
                group = _KINDS.get(kind, ("", "v1"))[1].rpartition("/")[0]
                message = (f'{kind} is forbidden: User "system:serviceaccount:gpu-system:gpuagent" cannot {verb} '
                           f'resource "{kind}" in API group "{group}" at the cluster scope') if code == 403 else \
                    f"the server reports HTTP {code}"
            return web.json_response(_status(code, _REASONS.get(code, "Unknown"), message), status=code)
        return None

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "pods")

    async def _resource_slices(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "resourceslices")

    async def _list_or_watch(self, request: web.Request, kind: str) -> web.StreamResponse:
        query = dict(request.query)
        watch = query.get("watch") in ("true", "1")
        self.requests.append(SeenRequest(request.method, request.path, query,
                                         request.headers.get("Authorization"), time.monotonic()))
        refused = self._check(request, "watch" if watch else "list", kind)
        if refused is not None:
            return refused
        try:
            node = _node_of(query.get("fieldSelector"))
        except ValueError as exc:
            return web.json_response(_status(400, "BadRequest", str(exc)), status=400)
        if not watch:
            return self._list(query, node, kind)
        return await self._watch(request, query, node, kind)

    def _list(self, query: Mapping[str, str], node: str | None, kind: str) -> web.Response:
        """One list answer: everything (``resourceVersion=0``, or no ``limit``), or a page (see the module
        docstring)."""
        started = time.perf_counter()
        version, token = query.get("resourceVersion", ""), query.get("continue", "")
        limit = int(query.get("limit") or 0)
        if token and version:
            return web.json_response(_status(400, "BadRequest", "specifying resource version is not allowed "
                                             "when using continue"), status=400)
        start = ""
        at = self._rv
        if token:
            try:
                decoded = json.loads(base64.b64decode(token, validate=True))
                at, start = int(decoded["rv"]), str(decoded["start"])
            except (ValueError, KeyError, TypeError):
                return web.json_response(_status(400, "BadRequest", "continue key is not valid"), status=400)
            if at < self._oldest:
                return web.json_response(_status(
                    410, "Expired", "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."), status=410)
        if version == "0" or limit <= 0:
            limit = 0  # the watch cache ignores limit; no limit: everything
        store, extra = self._store_at(kind, at)
        keys = self._sorted.get(kind)
        if keys is None:
            keys = self._sorted[kind] = sorted(self._stores[kind])
        ahead = sorted(k for k in extra if k > start)
        chosen: list[bytes] = []
        last = ""
        more = False
        for key in heapq.merge(keys[bisect.bisect_right(keys, start):], ahead):
            obj = store.get(key) if key in store else self._stores[kind].get(key)
            if obj is None or not self._matches(node, obj):
                continue
            if limit and len(chosen) == limit:
                more = True
                break
            chosen.append(self._encoding(key, obj))
            last = key
        meta: dict[str, Any] = {"resourceVersion": str(at)}
        if more:
            token = base64.b64encode(json.dumps({"v": "meta.k8s.io/v1", "rv": at, "start": last}).encode())
            meta["continue"] = token.decode()
            if node is None and not store:  # counted where it is cheap (the real one omits it at times too)
                meta["remainingItemCount"] = len(keys) - bisect.bisect_right(keys, last)
        list_kind, api_version = _KINDS[kind]
        head = json.dumps({"kind": list_kind, "apiVersion": api_version, "metadata": meta})
        body = head[:-1].encode() + b',"items":[' + b",".join(chosen) + b"]}"
        served = ServedList(kind, len(chosen), len(body), time.perf_counter() - started, more, str(at))
        self.list_pages.append(served)
        if self.after_page is not None:  # a test's writes between two pages
            self.after_page(served)
        return web.Response(body=body, content_type="application/json")

    def _store_at(self, kind: str, version: int) -> tuple[dict[str, Any], list[str]]:
        """The objects of ``kind`` written since ``version``, as they were at it (uid -> object, None where
        it did not exist yet), and the uids among them no longer stored (deleted since). Kept per version and
        brought up to date from the history at each page, so a list of many pages walks it once."""
        if version >= self._rv:
            return {}, []
        cached = self._at_version.get((kind, version))
        past, scanned = cached if cached is not None else ({}, bisect.bisect_right(
            self._history, version, key=lambda entry: entry[1]))
        for seen_kind, _rv, before, after in self._history[scanned:]:
            if seen_kind == kind:
                uid = (before or after or {}).get("metadata", {}).get("uid")
                past.setdefault(uid, before)  # the first write after the version holds what it was
        self._at_version[(kind, version)] = (past, len(self._history))
        while len(self._at_version) > 8:
            del self._at_version[next(iter(self._at_version))]
        return past, [uid for uid in past if uid not in self._stores[kind]]

    def _encoding(self, uid: str, obj: dict[str, Any]) -> bytes:
        """``obj``'s JSON, encoded once per version of it."""
        version = obj["metadata"].get("resourceVersion", "")
        cached = self._encoded.get(uid)
        if cached is not None and cached[0] == version and self._stores_hold(uid, obj):
            return cached[1]
        encoded = json.dumps(obj).encode()
        if self._stores_hold(uid, obj):
            self._encoded[uid] = (version, encoded)
        return encoded

    def _stores_hold(self, uid: str, obj: dict[str, Any]) -> bool:
        return any(store.get(uid) is obj for store in self._stores.values())

    async def _watch(self, request: web.Request, query: Mapping[str, str], node: str | None,
                     kind: str = "pods") -> web.StreamResponse:
        w = _Watcher(node, query.get("allowWatchBookmarks") == "true", kind)
        since = query.get("resourceVersion", "")
        if since in ("", "0"):  # "any": the current state as ADDED events, then what follows
            for obj in list(self._stores[kind].values()):
                if self._matches(node, obj):
                    w.queue.put_nowait({"type": "ADDED", "object": obj})
        elif int(since) < self._oldest:
            w.queue.put_nowait({"type": "ERROR", "object": _status(
                410, "Expired", f"too old resource version: {since} ({self._oldest})")})
            w.queue.put_nowait(_END)
        else:
            for seen_kind, rv, before, after in self._history:
                if seen_kind == kind and rv > int(since):
                    event = self._event_for(node, rv, before, after)
                    if event is not None:
                        w.queue.put_nowait(event)
        timeout = float(query.get("timeoutSeconds", "1800"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._watchers.add(w)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                try:
                    item = await asyncio.wait_for(w.queue.get(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    break  # timeoutSeconds: the stream ends cleanly
                if item is _END:
                    break
                if item is _DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                await response.write(item if isinstance(item, bytes) else json.dumps(item).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.discard(w)
        return response

    async def _gpu_node_states(self, request: web.Request) -> web.StreamResponse:
        return await self._list_or_watch(request, "gpunodestates")

    async def _apply_state(self, request: web.Request) -> web.Response:
        """Server-side apply of one GPUNodeState: the whole object, created or replaced (201 or 200)."""
        seen = SeenRequest(request.method, request.path, dict(request.query),
                           request.headers.get("Authorization"), time.monotonic())
        self.requests.append(seen)
        self.state_writes.append(seen)
        refused = self._check(request, "patch", "gpunodestates")
        if refused is not None:
            return refused
        name = request.match_info["name"]
        problems = []
        if request.content_type != "application/apply-patch+yaml":
            problems.append(f"content type {request.content_type!r} is not application/apply-patch+yaml")
        if not request.query.get("fieldManager"):
            problems.append("fieldManager is required for apply patch")
        try:
            body = yaml.safe_load(await request.text())
        except yaml.YAMLError as exc:
            body, problems = None, [*problems, f"the body is not YAML: {exc}"]
        if isinstance(body, dict):
            if body.get("apiVersion") != "gpuagent.io/v1alpha1" or body.get("kind") != "GPUNodeState":
                problems.append("apiVersion/kind must be gpuagent.io/v1alpha1 GPUNodeState")
            if (body.get("metadata") or {}).get("name") != name:
                problems.append("metadata.name must match the path")
        elif body is not None:
            problems.append("the body is not an object")
        if problems:
            return web.json_response(_status(422, "Invalid", "; ".join(problems)), status=422)
        created = "state-" + name not in self.states
        stored = self.put_state(body)
        return web.json_response(stored, status=201 if created else 200)

    async def _nodes(self, request: web.Request) -> web.Response:
        """A list of Nodes by name, paged by ``limit`` and ``continue`` (the token is the next offset), when
        the client asks for metadata only (the extender's node lister); else the Node objects of
        ``self.cluster`` (the health tests, kubectl)."""
        if "PartialObjectMetadataList" not in request.headers.get("Accept", ""):
            return await self.cluster.list_nodes(request)
        self.node_lists.append(SeenRequest(request.method, request.path, dict(request.query),
                                           request.headers.get("Authorization"), time.monotonic()))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(self.node_names)
        page = self.node_names[start:start + limit]
        token = str(start + limit) if start + limit < len(self.node_names) else ""
        return web.json_response({
            "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": self.resource_version, **({"continue": token} if token else {})},
            "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": {"name": name}} for name in page],
        })

    async def _owner(self, request: web.Request) -> web.Response:
        self.owner_gets.append(SeenRequest(request.method, request.path, dict(request.query),
                                           request.headers.get("Authorization"), time.monotonic()))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        plural, namespace, name = (request.match_info[k] for k in ("plural", "namespace", "name"))
        if self.owner_delay:
            await asyncio.sleep(self.owner_delay)
        if self._owner_failures:
            code = self._owner_failures.pop(0)
            message = (f'{plural}.{request.match_info["group"]} "{name}" is forbidden: User '
                       f'"system:serviceaccount:gpuagent:gpuagent" cannot get resource "{plural}"')
            return web.json_response(_status(code, _REASONS.get(code, "Unknown"), message), status=code)
        obj = self.owners.get((plural, namespace, name))
        if obj is None:
            return web.json_response(_status(404, "NotFound", f'{plural} "{name}" not found'), status=404)
        return web.json_response(obj)

    async def _evict(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None

        def answer(status: int, reply: Mapping[str, Any]) -> web.Response:
            self.evictions.append(SeenEviction(namespace, name, body, request.headers.get("Authorization"),
                                               status, time.monotonic()))
            return web.json_response(reply, status=status)

        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return answer(401, _status(401, "Unauthorized", "Unauthorized"))
        if self._failures:
            code, message = self._failures.pop(0)
            if message is None:
                message = (f'pods "{name}" is forbidden: User "system:serviceaccount:gpu-system:gpuagent" '
                           f'cannot create resource "pods/eviction" in API group "" in the namespace '
                           f'"{namespace}"') if code == 403 else f"the server reports HTTP {code}"
            return answer(code, _status(code, _REASONS.get(code, "Unknown"), message))
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(body, dict) or body.get("kind") != "Eviction" or not isinstance(meta, dict):
            return answer(400, _status(400, "BadRequest", "the body is not an Eviction"))
        if meta.get("name") != name:
            return answer(400, _status(400, "BadRequest", "name in URL does not match name in Eviction object"))
        if meta.get("namespace") not in (None, namespace):
            return answer(400, _status(400, "BadRequest", "the namespace of the object does not match the "
                                       "namespace on the request"))
        if (namespace, name) in self._pdb_blocked:
            return answer(429, EVICTION_PDB)
        return answer(201, EVICTION_SUCCESS)

    async def _event(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None

        def answer(status: int, reply: Mapping[str, Any]) -> web.Response:
            self.events.append(SeenEvent(namespace, body, status, time.monotonic()))
            return web.json_response(reply, status=status)

        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return answer(401, _status(401, "Unauthorized", "Unauthorized"))
        if self._failures:
            code, message = self._failures.pop(0)
            if message is None:
                message = (f'events.events.k8s.io is forbidden: User "system:serviceaccount:gpu-system:gpuagent" '
                           f'cannot create resource "events" in API group "events.k8s.io" in the namespace '
                           f'"{namespace}"') if code == 403 else f"the server reports HTTP {code}"
            return answer(code, _status(code, _REASONS.get(code, "Unknown"), message))
        problems = _event_problems(body, namespace)
        if problems:
            return answer(422, {**_status(422, "Invalid", "Event is invalid: " + "; ".join(problems)),
                                "details": {"kind": "Event", "group": "events.k8s.io"}})
        return answer(201, {**body, "metadata": {**body["metadata"], "uid": str(uuid.uuid4()),
                                                  "resourceVersion": str(self._rv)}})


@dataclass(frozen=True)
class SeenEvent:
    namespace: str
    body: Any  # the decoded JSON body (None when it was not JSON)
    status: int  # what the fake answered
    at: float


@dataclass(frozen=True)
class SeenEviction:
    namespace: str
    name: str
    body: Any  # the decoded JSON body (None when it was not JSON)
    authorization: str | None
    status: int  # what the fake answered
    at: float


def _event_problems(body: Any, namespace: str) -> list[str]:
    """What the API server's validation of an events.k8s.io/v1 Event create would reject."""
    if not isinstance(body, dict) or body.get("kind") != "Event" or body.get("apiVersion") != "events.k8s.io/v1":
        return ["not an events.k8s.io/v1 Event"]
    problems = []
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    if not meta.get("name") or len(meta["name"]) > 253:
        problems.append("metadata.name: Required value")
    if meta.get("namespace") not in (None, namespace):
        problems.append("metadata.namespace: does not match the namespace of the request")
    for key, limit in (("reportingController", 253), ("reportingInstance", 128), ("action", 128),
                       ("reason", 128), ("eventTime", 64)):
        if not isinstance(body.get(key), str) or not body[key] or len(body[key]) > limit:
            problems.append(f"{key}: Required value (at most {limit} characters)")
    if body.get("type") not in ("Normal", "Warning"):
        problems.append("type: Unsupported value")
    regarding = body.get("regarding")
    if isinstance(regarding, dict) and regarding.get("namespace") not in (None, namespace):
        problems.append("regarding.namespace: does not match the event's namespace")
    if len(body.get("note") or "") > 1024:
        problems.append("note: Too long: may not be longer than 1024")
    problems += [f"{k}: needs to be unset" for k in body if k.startswith("deprecated")]
    return problems


EVICTION_SUCCESS = kubernetes_body("eviction-response-success.json")
EVICTION_PDB = kubernetes_body("eviction-response-429-pdb.json")


def pod_list(pods: Iterable[Mapping[str, Any]], resource_version: str = "1000") -> dict[str, Any]:
    """A PodList body of these pods."""
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": resource_version},
            "items": list(pods)}


# -- the agent's watcher against it --------------------------------------------------------------------------
FAST_RETRIES = {"relist_backoff": 0.02, "max_backoff": 0.1}


async def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Until ``predicate()`` is true, polling every 5 ms; fails after ``timeout`` seconds (generous: a
    passing test returns as soon as it is true, and a loaded machine delays what it waits for)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {predicate}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def metadata_runner(
    api: FakeApiServer, cls: type | None = None, **defaults: Any
) -> AsyncIterator[Callable[..., Any]]:
    """``start(**kwargs)`` -> a running ``PodMetadata`` (or ``cls``, another ``reflector.Reflector``,
    with ``defaults``) of NODE against ``api`` (quick retries unless given); every one started is cancelled
    on exit."""
    if cls is None:
        from gpuagent.pods.metadata import PodMetadata as cls

    tasks: list[asyncio.Task] = []

    def start(**kwargs: Any) -> Any:
        kwargs.setdefault("config", api.kubeconfig())
        for key, value in {**FAST_RETRIES, **defaults}.items():
            kwargs.setdefault(key, value)
        made = cls(NODE, **kwargs)
        tasks.append(asyncio.create_task(made.run()))
        return made

    try:
        yield start
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
