"""The pods of this node from the Kubernetes API server, by UID: the names that cgroups lack.

A cgroup path gives a process's pod UID and container ID; the kubelet's pod-resources API gives names
without either. The API server has both, so with it the agent names every pod outright. This module keeps
one view, pod UID -> :class:`PodName`, for the pods bound to this node, listed and watched by
:class:`gpuagent.reflector.Reflector` (field selector ``spec.nodeName=<node>``; how it lists, watches,
backs off and reports is said there). Only the few fields used are decoded (msgspec structs that skip
everything else), and only ``gpuagent.io/*`` annotations are kept: a pod's managed fields and large
annotations never stay in memory. Nothing of lightkube is imported until :meth:`PodMetadata.run`.

A pod's owner (``ownerReferences``) is walked up to the workload people know (ReplicaSet -> Deployment,
Job -> CronJob) by ``pods/owners.py`` in a task of its own, cached by owner UID: the view names a pod's
owner as soon as that answer is in, and never waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpuagent.kubeapi import SERVICE_ACCOUNT_DIR, api_server_available
from gpuagent.pods.attribution import PodName
from gpuagent.pods.owners import Owner, OwnerRef, OwnerResolver, controller_of, reference_struct
from gpuagent.reflector import Reflector, list_decoder

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger(__name__)
__all__ = ["SERVICE_ACCOUNT_DIR", "PodMetadata", "api_server_available", "pod_name", "strip_runtime"]

SOURCE = "api_server"  # the ``source`` label of gpuagent_source_success
ANNOTATION_PREFIX = "gpuagent.io/"
# A static pod runs under the kubelet's own UID (its config hash, 32 hex); the API server's mirror pod has
# another UID and carries the kubelet's in this annotation. Cgroups name the kubelet's.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PODS_PATH = "api/v1/pods"  # relative: kept under a server URL with a path (API proxies)


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
    return SimpleNamespace(pod=msgspec.json.Decoder(pod), pod_list=list_decoder(pod))


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


class PodMetadata(Reflector):
    """Watches the pods of one node (field selector spec.nodeName=<node>) and keeps PodName by UID.

    Where the API server is (``connection``, ``client``, ``config``, ``kubeconfig_path``) and the timing
    (``relist_backoff``, ``max_backoff``, ``watch_timeout``, ``request_timeout``) are
    :class:`~gpuagent.reflector.Reflector`'s; ``owners`` walks the pods' owners.
    """

    path = PODS_PATH
    resource = "pods"
    what = "pod metadata"

    def __init__(self, node_name: str, *, owners: OwnerResolver | None = None, **kwargs: Any) -> None:
        super().__init__(node_name, log=log, **kwargs)
        self._view: dict[str, PodName] = {}
        self._uids_of: dict[str, tuple[str, ...]] = {}  # API UID -> its keys in the view
        # Owners above the pods' controllers (ReplicaSet -> Deployment, ...), walked by their own task
        self.owners = owners or OwnerResolver()
        self._controller_of: dict[str, OwnerRef | None] = {}  # API UID -> its controller reference
        self._walks: asyncio.Task[None] | None = None

    def names_by_uid(self) -> Mapping[str, PodName]:
        """The current view; a new dict replaces it on every change, so a caller's copy never moves."""
        return self._view

    # -- the reflector's hooks --------------------------------------------------------------------------
    def _opened(self, http: httpx2.AsyncClient) -> None:
        self._walks = asyncio.create_task(self.owners.run(http, self._owner_resolved), name="pod-owners")

    async def _closed(self) -> None:
        walks, self._walks = self._walks, None
        if walks is not None:
            walks.cancel()
            await asyncio.gather(walks, return_exceptions=True)

    def _decode_list(self, body: bytes) -> tuple[list[Any], str]:
        decoded = _wire().pod_list.decode(body)
        return list(decoded.items or ()), decoded.metadata.resourceVersion

    def _decode_object(self, raw: Any) -> Any:
        return _wire().pod.decode(raw)

    def _size(self) -> int:
        return len(self._uids_of)

    def _replace(self, items: list[Any]) -> None:
        view: dict[str, PodName] = {}
        uids_of: dict[str, tuple[str, ...]] = {}
        self._controller_of = {}
        for pod in items:
            name, uids = pod_name(pod, self._owner(pod)), _uids(pod)
            uids_of[pod.metadata.uid] = uids
            for uid in uids:
                view[uid] = name
        if view != self._view:
            self._view = view
        self._uids_of = uids_of
        self.owners.forget({ref.uid for ref in self._controller_of.values() if ref is not None})

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

    def _drop(self, pod: Any) -> None:
        self._controller_of.pop(pod.metadata.uid, None)
        uids = self._uids_of.pop(pod.metadata.uid, ())
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
