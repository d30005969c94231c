"""The ``pods`` source: attributes each poll's GPU processes to workloads, and lists the pods holding GPUs.

Cgroup files are read on a worker thread (no file I/O on the event loop), once per PID and then again
only every ``identity_ttl`` seconds (a process rarely changes cgroup). The kubelet's allocations are read
on their own, slower cadence and the last answer is kept while the kubelet does not answer: allocations
outlive a kubelet restart, and attribution falls back to cgroups alone until the first answer. Devices of
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
from gpuagent.pods.podresources import PodResourcesClient, PodResourcesUnavailable
from gpuagent.snapshot import DraDevice, GpuSample, PodUse, SourceStatus

if TYPE_CHECKING:
    from gpuagent.kubeapi import ApiConnection
    from gpuagent.pods.dra.resolver import DraResolver
    from gpuagent.pods.metadata import PodMetadata

METADATA_SOURCE = "api_server"  # gpuagent_source_success{source=...}

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodsReading:
    gpus: tuple[GpuSample, ...]
    pods: tuple[PodUse, ...]
    statuses: tuple[SourceStatus, ...]
    dra: tuple[DraDevice, ...] = ()


class PodsSource:
    def __init__(
        self,
        *,
        cgroups: CgroupReader,
        podresources: PodResourcesClient | None = None,
        metadata: PodMetadata | None = None,
        dra: DraResolver | None = None,
        connection: ApiConnection | None = None,
        interval: float = 5.0,
        identity_ttl: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cgroups = cgroups
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
        self._attributor = Attributor()  # keeps what did not change since the last poll

    async def attribute(self, gpus: Sequence[GpuSample]) -> PodsReading:
        started = self._monotonic()
        statuses: list[SourceStatus] = []
        try:
            identities = await self._identify({p.pid for g in gpus for p in g.processes})
            statuses.append(SourceStatus("cgroups", True, self._monotonic() - started))
        except Exception as exc:  # a bug here must not cost the device figures
            log.exception("reading process cgroups failed")
            identities = {}
            statuses.append(SourceStatus("cgroups", False, self._monotonic() - started, repr(exc)))
        if self._client is not None:
            statuses.append(await self._refresh_allocations())
        names = None
        if self._metadata is not None:
            ok, error = self._metadata.status
            statuses.append(SourceStatus(METADATA_SOURCE, ok, 0.0, error))
            names = self._metadata.names_by_uid() if self._metadata.synced else None
        allocations, dra = self._allocations, ()
        if self._dra is not None:
            allocations, mapping = self._dra.allocations(self._allocations, self._dynamic, gpus)
            statuses.extend(self._dra.statuses(mapping))
            dra = mapping.devices
        attributed, pods = self._attributor.attribute(gpus, identities, allocations, names)
        return PodsReading(gpus=attributed, pods=pods, statuses=tuple(statuses), dra=dra)

    async def _identify(self, pids: set[int]) -> dict[int, CgroupIdentity | None]:
        now = self._monotonic()
        for pid in [p for p in self._identities if p not in pids]:
            del self._identities[pid]  # gone from the GPUs: forget it (a reused PID is read afresh)
            self._unparsable.discard(pid)
        known = self._identities
        due = sorted(p for p in pids if p not in known or now - known[p][1] >= self._ttl)
        if due:
            read = await asyncio.to_thread(lambda: [(pid, self._identify_one(pid)) for pid in due])
            for pid, identity in read:
                self._identities[pid] = (identity, now)
        return {pid: self._identities[pid][0] for pid in pids}

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
