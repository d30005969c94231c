"""Who owns a pod at the top of its controller chain, walked through the API server, cached and bounded.

A pod's ``ownerReferences`` name its direct controller; the workload people know is often one level up: a
Deployment above the ReplicaSet, a CronJob above the Job, a Kubeflow Notebook above the StatefulSet. Each
step up is one GET of an owner of a built-in kind (``apps/v1`` ReplicaSet, Deployment, StatefulSet;
``batch/v1`` Job, asked with ``resourceVersion=0``: served from the API server's cache), made by this
resolver's own tasks, never by the poll: until the answer comes, the pod's owner is unknown (``None``), and
:meth:`OwnerResolver.owner` never waits.

The answers are cached by the owner's UID (a ReplicaSet's Deployment does not change; its pods come and
go), at most ``max_entries`` of them (least recently used dropped first), and refreshed in the background
``ttl`` seconds later while the old answer is served. A walk that cannot go on (RBAC refuses the GET, the
owner is gone, the API server does not answer) ends at the last owner it knows, which is then retried
``retry_after`` seconds later; each kind of failure is logged once until the walk succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpuagent.pods.attribution import PodName

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger(__name__)

# (API group, kind) -> the path of one object, relative to the server URL (kept under a proxy's path)
WALKED = {
    ("apps", "ReplicaSet"): "apis/apps/v1/namespaces/{namespace}/replicasets/{name}",
    ("apps", "Deployment"): "apis/apps/v1/namespaces/{namespace}/deployments/{name}",
    ("apps", "StatefulSet"): "apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
    ("batch", "Job"): "apis/batch/v1/namespaces/{namespace}/jobs/{name}",
}
# A static pod's mirror is "owned" by its Node: that groups nothing, the pod stands for itself.
NOT_OWNERS = frozenset({"Node"})
MAX_DEPTH = 4  # owners above owners followed at most (a chain is 2 or 3 long in practice)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One ``ownerReferences`` entry (the controller's)."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0] if "/" in self.api_version else ""


@dataclass(frozen=True, slots=True)
class Owner:
    """The top of a pod's controller chain, as far as it could be walked."""

    kind: str
    name: str


@functools.cache
def _wire() -> SimpleNamespace:
    """Decoders of an owner object's few fields (msgspec comes with lightkube), built on first use."""
    import msgspec

    ref = msgspec.defstruct("OwnerReference", [
        ("apiVersion", str, ""), ("kind", str, ""), ("name", str, ""), ("uid", str, ""),
        ("controller", bool | None, None),
    ])
    meta = msgspec.defstruct("OwnerMeta", [
        ("uid", str, ""), ("name", str, ""), ("ownerReferences", list[ref] | None, None),  # type: ignore[valid-type]
    ])
    owned = msgspec.defstruct("Owned", [("metadata", meta, msgspec.field(default_factory=meta))])
    return SimpleNamespace(ref=ref, owned=msgspec.json.Decoder(owned), DecodeError=msgspec.DecodeError)


def reference_struct() -> Any:
    """The msgspec struct of one ``ownerReferences`` entry, for decoders of objects that carry them."""
    return _wire().ref


def controller_of(references: Sequence[Any] | None) -> OwnerRef | None:
    """The controller among decoded ``ownerReferences`` (``controller: true``), or None."""
    for ref in references or ():
        if ref.controller and ref.kind and ref.name and ref.uid:
            return OwnerRef(ref.apiVersion, ref.kind, ref.name, ref.uid)
    return None


class _WalkFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class OwnerResolver:
    """Resolves owner references to the top :class:`Owner`; see the module docstring.

    :meth:`owner` answers from memory at once; :meth:`run` (a task beside the pods watch) makes the GETs
    and calls ``on_resolved(uid)`` whenever the answer for a UID asked about changes.
    """

    def __init__(
        self,
        *,
        max_entries: int = 4096,
        ttl: float = 3600.0,
        retry_after: float = 300.0,
        workers: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or workers < 1:
            raise ValueError("max_entries and workers must be at least 1")
        self._max = max_entries
        self._ttl = ttl
        self._retry = retry_after
        self._workers = workers
        self._clock = clock
        self._cache: OrderedDict[str, tuple[Owner, float]] = OrderedDict()  # uid -> (top, refresh at)
        self._wanted: dict[str, tuple[str, OwnerRef]] = {}  # uid -> (namespace, ref): queued or in flight
        self._queue: deque[str] = deque()
        self._ready: asyncio.Event | None = None
        self._failing: set[str] = set()  # failure kinds logged, until a walk succeeds
        self.gets = 0  # GETs made, for tests and debugging

    def owner(self, namespace: str, ref: OwnerRef | None) -> Owner | None:
        """The top owner of an object in ``namespace`` whose controller is ``ref``: at once for a kind not
        walked (a CRD, a CronJob), from the cache, or None while the GETs are pending (then queued)."""
        if ref is None:
            return None
        if (ref.group, ref.kind) not in WALKED:
            return Owner(ref.kind, ref.name)
        cached = self._cache.get(ref.uid)
        if cached is None:
            self._want(namespace, ref)
            return None
        self._cache.move_to_end(ref.uid)
        if cached[1] <= self._clock():
            self._want(namespace, ref)  # served stale while it is asked again
        return cached[0]

    def of_pod(self, namespace: str, name: str, ref: OwnerRef | None) -> Owner | None:
        """A pod's top owner: :meth:`owner` of its controller; the pod itself when it has none (a bare pod)
        or only its Node (a static pod's mirror)."""
        if ref is None or ref.kind in NOT_OWNERS:
            return Owner("Pod", name)
        return self.owner(namespace, ref)

    def named(self, view: Mapping[str, PodName], pods: Iterable[tuple[OwnerRef | None, Sequence[str]]],
              owner_uid: str) -> Mapping[str, PodName]:
        """``view`` (key -> PodName) with the pods under ``owner_uid`` (``pods``: each one's controller and
        its keys in the view) given the owner known now: a new mapping if any changed, else ``view``."""
        changed: dict[str, PodName] | None = None
        for ref, keys in pods:
            if ref is None or ref.uid != owner_uid:
                continue
            for key in keys:
                name = view.get(key)
                owner = None if name is None else self.owner(name.namespace, ref)
                if name is None or owner is None or (name.owner_kind, name.owner_name) == (
                        owner.kind, owner.name):
                    continue
                changed = dict(view) if changed is None else changed
                changed[key] = dataclasses.replace(name, owner_kind=owner.kind, owner_name=owner.name)
        return view if changed is None else changed

    def forget(self, keep: set[str]) -> None:
        """Drop pending requests for owner UIDs no pod refers to any more (the cache keeps its answers)."""
        for uid in [u for u in self._wanted if u not in keep]:
            del self._wanted[uid]

    def _want(self, namespace: str, ref: OwnerRef) -> None:
        if ref.uid in self._wanted or len(self._wanted) >= self._max:
            return  # asked already; or too much asked at once: the next look asks again
        self._wanted[ref.uid] = (namespace, ref)
        self._queue.append(ref.uid)
        if self._ready is not None:
            self._ready.set()

    async def run(self, http: httpx2.AsyncClient, on_resolved: Callable[[str], None]) -> None:
        """Walk what is asked, ``workers`` GETs at a time, forever. Returns never; raises only
        CancelledError."""
        self._ready = asyncio.Event()
        if self._queue:
            self._ready.set()
        workers = [asyncio.create_task(self._work(http, on_resolved), name=f"pod-owners-{i}")
                   for i in range(self._workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*workers, return_exceptions=True)
            self._ready = None

    async def _work(self, http: httpx2.AsyncClient, on_resolved: Callable[[str], None]) -> None:
        assert self._ready is not None
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            uid = self._queue.popleft()
            wanted = self._wanted.get(uid)
            if wanted is None:
                continue  # forgotten meanwhile
            before = self._cache.get(uid)
            try:
                top, refresh_in = await self._walk(http, *wanted)
            except Exception as exc:  # a bug must not end the walks: keep the direct owner, say so
                log.warning("pod owners: walking %s %s/%s failed: %r", wanted[1].kind, wanted[0],
                            wanted[1].name, exc, exc_info=exc)
                top, refresh_in = Owner(wanted[1].kind, wanted[1].name), self._retry
            self._wanted.pop(uid, None)
            self._put(uid, top, refresh_in)
            if before is None or before[0] != top:
                on_resolved(uid)

    async def _walk(self, http: httpx2.AsyncClient, namespace: str, ref: OwnerRef) -> tuple[Owner, float]:
        """The top owner above ``ref`` and when to ask again; every owner passed on the way is cached."""
        passed: list[str] = []
        current = ref
        for _ in range(MAX_DEPTH):
            if (current.group, current.kind) not in WALKED:
                break
            cached = self._cache.get(current.uid)
            if cached is not None and current is not ref and cached[1] > self._clock():
                top = cached[0]
                break
            try:
                above = await self._controller(http, namespace, current)
            except _WalkFailed as failure:
                self._failed(failure)
                top = Owner(current.kind, current.name)
                for uid in passed:
                    self._put(uid, top, self._retry)
                return top, self._retry
            passed.append(current.uid)
            if above is None or above.kind in NOT_OWNERS:
                break
            current = above
        else:
            log.debug("pod owners: stopped at %s %s/%s after %d steps", current.kind, namespace,
                      current.name, MAX_DEPTH)
        top = Owner(current.kind, current.name)
        for uid in passed:
            self._put(uid, top, self._ttl)
        if self._failing:
            log.info("pod owners: the API server answers the owners' GETs again")
            self._failing.clear()
        return top, self._ttl

    async def _controller(self, http: httpx2.AsyncClient, namespace: str, ref: OwnerRef) -> OwnerRef | None:
        import httpx2

        wire = _wire()
        path = WALKED[(ref.group, ref.kind)].format(namespace=namespace, name=ref.name)
        what = f"get {ref.kind} {namespace}/{ref.name}"
        self.gets += 1
        try:  # resourceVersion=0: from the API server's watch cache, not a quorum read of etcd
            response = await http.get(path, params={"resourceVersion": "0"})
        except httpx2.RequestError as exc:
            raise _WalkFailed("unreachable", f"{what}: API server unreachable: {exc or type(exc).__name__}") \
                from exc
        if response.status_code == 403:
            resource = path.split("/")[-2]
            raise _WalkFailed(f"forbidden {resource}", f"forbidden: {what}: RBAC must allow get on "
                              f"{resource} ({ref.group}) for the agent's service account")
        if response.status_code == 404:
            raise _WalkFailed("gone", f"{what}: not found (deleted, or its pods were orphaned)")
        if response.status_code != 200:
            raise _WalkFailed(f"http {response.status_code}", f"{what}: HTTP {response.status_code}")
        try:
            owned = wire.owned.decode(response.content)
        except wire.DecodeError as exc:
            raise _WalkFailed("protocol", f"{what}: not an object with metadata: {exc}") from exc
        if owned.metadata.uid and owned.metadata.uid != ref.uid:
            raise _WalkFailed("gone", f"{what}: a new object of that name (UID {owned.metadata.uid})")
        return controller_of(owned.metadata.ownerReferences)

    def _put(self, uid: str, top: Owner, refresh_in: float) -> None:
        self._cache[uid] = (top, self._clock() + refresh_in)
        self._cache.move_to_end(uid)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)

    def _failed(self, failure: _WalkFailed) -> None:
        if failure.kind == "gone":  # an everyday race (a Job deleted after it finished): not a warning
            log.debug("pod owners: %s", failure)
            return
        if failure.kind not in self._failing:
            self._failing.add(failure.kind)
            log.warning("pod owners: %s; its pods keep it as their owner (retrying every %g s)", failure,
                        self._retry)
