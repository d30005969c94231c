"""The ``pods`` source: attributes each poll's GPU processes to workloads, and lists the pods holding GPUs.

Cgroup files are read on a worker thread (no file I/O on the event loop), once per PID and then again
only every ``identity_ttl`` seconds (a process rarely changes cgroup). The environment of a pod's process
or an MPS client (a few variables: :mod:`gpuagent.pods.environ`) is read once per PID, with it: it gives
each MPS client its limits and the device join its evidence. The kubelet's allocations are read on their
own, slower cadence and the last answer is kept while the kubelet does not answer: allocations outlive a
kubelet restart, and attribution falls back to cgroups alone until the first answer. Devices of
ResourceClaims (DRA) are mapped to GPUs by ``pods.dra`` and joined as the device plugin's are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuagent.pods.attribution import Attributor
from gpuagent.pods.cgroup import CgroupIdentity, CgroupParseError, CgroupReader
from gpuagent.pods.environ import Environ, EnvironReader
from gpuagent.pods.mps import MpsLimitError, with_client_limits
from gpuagent.pods.podresources import PodResourcesClient, PodResourcesUnavailable
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.node import SourceStatus
from gpuagent.snapshot.pods import DraDevice, DraTaint, PodUse
from gpuagent.snapshot.processes import MPS_CLIENT

if TYPE_CHECKING:
    from gpuagent.kubeapi import ApiConnection
    from gpuagent.pods.dra.resolver import DraResolver
    from gpuagent.pods.metadata import PodMetadata

METADATA_SOURCE = "api_server"  # gpuagent_source_success{source=...}
ENVIRON_RETRIES = 3  # polls in a row a PID's unknown environment is read again

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodsReading:
    gpus: tuple[GpuSample, ...]
    pods: tuple[PodUse, ...]
    statuses: tuple[SourceStatus, ...]
    dra: tuple[DraDevice, ...] = ()
    dra_taints: tuple[DraTaint, ...] = ()  # the DRA drivers' device taints on this node's GPUs


class PodsSource:
    def __init__(
        self,
        *,
        cgroups: CgroupReader,
        podresources: PodResourcesClient | None = None,
        metadata: PodMetadata | None = None,
        environs: EnvironReader | None = None,
        node_names: frozenset[str] = frozenset(),
        dra: DraResolver | None = None,
        connection: ApiConnection | None = None,
        interval: float = 5.0,
        identity_ttl: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cgroups = cgroups
        self._environ_reader = environs if environs is not None else EnvironReader(cgroups.proc_root)
        self._environs: dict[int, Environ | None] = {}  # read once per PID, while it stays on a GPU
        self._environ_misses: dict[int, int] = {}  # PID -> reads that found it unknown (retried a few times)
        self._bad_limits: set[tuple[int, str]] = set()  # MPS limits that did not resolve, logged once each
        self._client = podresources
        self._metadata = metadata
        self._dra = dra
        self._connection = connection  # shared by the API-server sources; closed with this source
        self._dynamic: Sequence[Any] = ()  # the kubelet's DRA devices (of GPU drivers)
        self._interval = interval
        self._ttl = identity_ttl
        self._monotonic = monotonic
        self._identities: dict[int, tuple[CgroupIdentity | None, float]] = {}
        self._unparsable: set[int] = set()  # logged once each
        self._allocations: Sequence[Any] | None = None
        self._next_fetch = float("-inf")
        self._podresources_status: SourceStatus | None = None
        self._failure = ""
        self._attributor = Attributor(node_names)  # keeps what did not change since the last poll

    async def attribute(self, gpus: Sequence[GpuSample]) -> PodsReading:
        started = self._monotonic()
        statuses: list[SourceStatus] = []
        try:
            clients = {p.pid for g in gpus for p in g.processes if p.kind == MPS_CLIENT}
            identities = await self._identify({p.pid for g in gpus for p in g.processes}, clients)
            statuses.append(SourceStatus("cgroups", True, self._monotonic() - started))
        except Exception as exc:  # a bug here must not cost the device figures
            log.exception("reading process cgroups failed")
            identities, clients = {}, set()
            statuses.append(SourceStatus("cgroups", False, self._monotonic() - started, repr(exc)))
        if clients:
            gpus = with_client_limits(gpus, self._environs, self._limits_failed)
        if self._client is not None:
            statuses.append(await self._refresh_allocations())
        names = None
        if self._metadata is not None:
            ok, error = self._metadata.status
            statuses.append(SourceStatus(METADATA_SOURCE, ok, 0.0, error))
            names = self._metadata.names_by_uid() if self._metadata.synced else None
        allocations, dra, dra_taints = self._allocations, (), ()
        if self._dra is not None:
            allocations, mapping = self._dra.allocations(self._allocations, self._dynamic, gpus)
            statuses.extend(self._dra.statuses(mapping))
            dra = mapping.devices
            dra_taints, taints_status = self._dra.taints(gpus)
            if taints_status is not None:
                statuses.append(taints_status)
        attributed, pods = self._attributor.attribute(gpus, identities, allocations, names, self._environs)
        return PodsReading(gpus=attributed, pods=pods, statuses=tuple(statuses), dra=dra,
                           dra_taints=dra_taints)

    async def _identify(self, pids: set[int], clients: set[int]) -> dict[int, CgroupIdentity | None]:
        """Each PID's identity, and the environment of a pod's process or MPS client until it is read (one
        that reads as unknown is tried again the next polls, ENVIRON_RETRIES of them: a process that just
        started may not show it yet; after that, with its identity every ``identity_ttl``)."""
        now = self._monotonic()
        for pid in [p for p in self._identities if p not in pids]:
            del self._identities[pid]  # gone from the GPUs: forget it (a reused PID is read afresh)
            self._environs.pop(pid, None)
            self._environ_misses.pop(pid, None)
            self._unparsable.discard(pid)
            self._bad_limits = {seen for seen in self._bad_limits if seen[0] != pid}
        known = self._identities
        due = {p for p in pids if p not in known or now - known[p][1] >= self._ttl}
        missing = {p for p in pids - due
                   if p not in self._environs and self._environ_misses.get(p, 0) < ENVIRON_RETRIES
                   and _wants_environ(known[p][0], p in clients)}
        if due or missing:
            read = await asyncio.to_thread(
                lambda: [self._read_one(pid, pid in due, pid in clients) for pid in sorted(due | missing)])
            for pid, identity, environ, tried in read:
                if pid in due:
                    self._identities[pid] = (identity, now)
                if environ is not None:
                    self._environs[pid] = environ
                elif tried:
                    self._environ_misses[pid] = self._environ_misses.get(pid, 0) + 1
        return {pid: self._identities[pid][0] for pid in pids}

    def _read_one(
        self, pid: int, identify: bool, client: bool
    ) -> tuple[int, CgroupIdentity | None, Environ | None, bool]:
        """(pid, identity, environment or None, whether it was read): on the worker thread."""
        identity = self._identify_one(pid) if identify else self._identities[pid][0]
        if pid in self._environs or not _wants_environ(identity, client):
            return pid, identity, None, False
        return pid, identity, self._environ_reader.read(pid), True

    def _limits_failed(self, pid: int, error: MpsLimitError) -> None:
        if (pid, str(error)) not in self._bad_limits:
            self._bad_limits.add((pid, str(error)))
            log.warning("MPS client PID %d: %s; its limits are unknown", pid, error)

    def _identify_one(self, pid: int) -> CgroupIdentity | None:
        """One PID's identity; a file that does not parse costs that PID its workload, not the poll."""
        try:
            return self._cgroups.identify(pid)
        except CgroupParseError as exc:
            if pid not in self._unparsable:
                self._unparsable.add(pid)
                log.warning("cannot attribute PID %d: /proc/%d/cgroup: %s", pid, pid, exc)
            return None

    async def _refresh_allocations(self) -> SourceStatus:
        assert self._client is not None
        now = self._monotonic()
        if now < self._next_fetch and self._podresources_status is not None:
            return self._podresources_status
        self._next_fetch = now + self._interval
        try:
            answer = await self._client.fetch()
        except PodResourcesUnavailable as exc:
            status = SourceStatus("pod_resources", False, self._monotonic() - now, str(exc))
            if str(exc) != self._failure:
                self._failure = str(exc)
                kept = "keeping the last allocations" if self._allocations is not None else "cgroups only"
                log.warning("kubelet pod-resources unavailable (%s); attributing with %s", exc, kept)
        else:
            if answer.allocations != self._allocations:  # unchanged: keep the object the index is built on
                self._allocations = answer.allocations
            if answer.dynamic != self._dynamic:
                self._dynamic = answer.dynamic
            status = SourceStatus("pod_resources", True, self._monotonic() - now)
            if self._failure:
                log.info("kubelet pod-resources answers again: %d GPU allocations", len(answer.allocations))
                self._failure = ""
        self._podresources_status = status
        if self._dra is not None:
            await self._dra.refresh(self._dynamic, self._monotonic)
        return status

    @property
    def metadata(self) -> PodMetadata | None:
        return self._metadata

    @property
    def dra(self) -> DraResolver | None:
        return self._dra

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._connection is not None:
            await self._connection.aclose()


def _wants_environ(identity: CgroupIdentity | None, client: bool) -> bool:
    """An MPS client's environment gives its limits; a pod's process's, the evidence of the device join."""
    return client or (identity is not None and identity.is_k8s)
