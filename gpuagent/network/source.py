"""The ``network`` source: node links, RDMA ports and pods' network namespaces, with bytes/s.

Each poll reads everything on one worker thread (netlink and file reads block) under a timeout; a read that
hangs is left to finish on its thread and no second one is started meanwhile, so reads never pile up. A
failed or timed-out poll gives ``NetworkState(error=...)`` and ``SourceStatus("network", ok=False)``; the
agent keeps polling everything else. Rates are computed on the event loop from the previous poll's counters
(see ``rates``). The log gets one line when the source starts failing, changes how it fails, or recovers,
and one line per pod skipped (host network, unreadable), not one per poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpuagent.config import NetworkConfig
from gpuagent.network.links import LinkCounters, LinkFilter, NetlinkLinks
from gpuagent.network.podnet import NetnsCounters, PodNetReader, PodNetReading, PodRef
from gpuagent.network.rates import RateTracker
from gpuagent.network.rdma import RdmaCounters, read_rdma
from gpuagent.snapshot.network import LinkSample, NetworkState, PodNetwork, RdmaPort
from gpuagent.snapshot.node import SourceStatus

__all__ = ["SOURCE_NAME", "NetworkSource", "RawNetwork", "network_source"]

SOURCE_NAME = "network"  # gpuagent_source_success{source="network"}
DEFAULT_TIMEOUT_SECONDS = 5.0

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RawNetwork:
    """One read, before rates."""

    links: Sequence[LinkCounters]
    rdma: Sequence[RdmaCounters]
    pods: PodNetReading


class NetworkSource:
    """Polls the node's network; ``status`` is the :class:`SourceStatus` of the last poll."""

    def __init__(
        self,
        *,
        read_links: Callable[[], Sequence[LinkCounters]],
        read_rdma_ports: Callable[[], Sequence[RdmaCounters]],
        pod_reader: PodNetReader,
        interval: float = 0.0,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_links = read_links
        self._read_rdma = read_rdma_ports
        self._pod_reader = pod_reader
        self._interval = interval
        self._timeout = timeout
        self._monotonic = monotonic
        self._links = RateTracker()
        self._rdma = RateTracker()
        self._pods = RateTracker()
        self._last_poll: float | None = None  # the last successful read
        self._last_attempt: float | None = None
        self._last_state = NetworkState()
        self._refresh: asyncio.Task[NetworkState] | None = None
        self._inflight: asyncio.Future[RawNetwork] | None = None
        self._failure = ""
        self._skipped: dict[PodRef, str] = {}  # what was last logged for each skipped pod
        self.status = SourceStatus(SOURCE_NAME, False, 0.0, "not polled yet")

    async def update(self, pod_pids: Mapping[PodRef, Sequence[int]]) -> NetworkState:
        """The state for one agent poll. The first call reads and waits, so the first snapshot has the
        network; later calls return the last finished read at once and, when one is due, start the next in
        the background: a read, and the trip back onto a busy event loop after it, never lengthens the
        agent's poll. The state is therefore up to ``interval`` plus one read old."""
        if self._last_attempt is None:
            return await self.poll(pod_pids)
        if (self._refresh is None or self._refresh.done()) and self._due(self._monotonic()):
            self._refresh = asyncio.create_task(self.poll(dict(pod_pids)), name="network-read")
        return self._last_state

    async def close(self) -> None:
        """Stop a background read (its thread, if any, finishes on its own)."""
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)

    def _due(self, now: float) -> bool:
        # 5 % of slack, so a read due on the agent's poll tick is not put off to the next tick by jitter
        return self._last_attempt is None or now - self._last_attempt >= 0.95 * self._interval

    async def poll(self, pod_pids: Mapping[PodRef, Sequence[int]]) -> NetworkState:
        """A read with rates, or the last one while ``interval`` has not passed since the last was tried.
        Never raises: a failure is in the state's ``error`` and in ``status``."""
        started = self._monotonic()
        if not self._due(started):
            return self._last_state
        self._last_attempt = started
        try:
            raw = await self._read(dict(pod_pids))
        except Exception as exc:
            self._last_state = self._failed(started, _describe(exc, self._timeout))
            return self._last_state
        try:
            self._last_state = self._publish(raw, started)
        except Exception as exc:  # a bug in turning counters into rates must not cost the agent's poll
            log.exception("network source: building the state failed")
            self._last_state = self._failed(started, f"building the state failed: {exc!r}")
        return self._last_state

    def _publish(self, raw: RawNetwork, started: float) -> NetworkState:
        now = self._monotonic()
        window = 0.0 if self._last_poll is None else now - self._last_poll
        self._last_poll = now
        state = NetworkState(
            links=tuple(self._link(link, now) for link in raw.links),
            rdma=tuple(self._port(port, now) for port in raw.rdma),
            pods=tuple(self._pod(counters, now) for counters in raw.pods.counters),
            window_seconds=window,
        )
        self._links.retain((link.index, link.name, d) for link in raw.links for d in "rt")
        self._rdma.retain((port.device, port.port, d) for port in raw.rdma for d in "rt")
        self._pods.retain((c.netns_inode, c.pod, d) for c in raw.pods.counters for d in "rt")
        self._note_skipped(raw.pods.skipped)
        if self._failure:
            log.info("network source recovered")
            self._failure = ""
        self.status = SourceStatus(SOURCE_NAME, True, self._monotonic() - started)
        return state

    async def _read(self, pod_pids: dict[PodRef, Sequence[int]]) -> RawNetwork:
        if self._inflight is not None and not self._inflight.done():
            raise _StillRunning
        future = asyncio.ensure_future(asyncio.to_thread(self._read_blocking, pod_pids))
        future.add_done_callback(_consume)
        self._inflight = future
        return await asyncio.wait_for(asyncio.shield(future), self._timeout)

    def _read_blocking(self, pod_pids: dict[PodRef, Sequence[int]]) -> RawNetwork:
        return RawNetwork(
            links=_part("links (netlink)", self._read_links),
            rdma=_part("RDMA ports (sysfs)", self._read_rdma),
            pods=_part("pod network namespaces (/proc)", lambda: self._pod_reader.read(pod_pids)),
        )

    def _failed(self, started: float, error: str) -> NetworkState:
        if error != self._failure:
            log.warning("network source failing: %s", error)
            self._failure = error
        self.status = SourceStatus(SOURCE_NAME, False, self._monotonic() - started, error)
        return NetworkState(error=error)

    def _link(self, link: LinkCounters, now: float) -> LinkSample:
        key = (link.index, link.name)
        return LinkSample(
            name=link.name,
            kind=link.kind,
            oper_state=link.oper_state,
            mtu=link.mtu,
            speed_bits_per_second=link.speed_bits_per_second,
            rx_bytes_total=link.rx_bytes_total,
            tx_bytes_total=link.tx_bytes_total,
            rx_bytes_per_second=self._links.rate((*key, "r"), link.rx_bytes_total, now),
            tx_bytes_per_second=self._links.rate((*key, "t"), link.tx_bytes_total, now),
            rx_errors_total=link.rx_errors_total,
            tx_errors_total=link.tx_errors_total,
            rx_dropped_total=link.rx_dropped_total,
            tx_dropped_total=link.tx_dropped_total,
        )

    def _port(self, port: RdmaCounters, now: float) -> RdmaPort:
        key = (port.device, port.port)
        return RdmaPort(
            device=port.device,
            port=port.port,
            state=port.state,
            link_layer=port.link_layer,
            rate_bits_per_second=port.rate_bits_per_second,
            netdev=port.netdev,
            rx_bytes_total=port.rx_bytes_total,
            tx_bytes_total=port.tx_bytes_total,
            rx_bytes_per_second=self._rdma.rate((*key, "r"), port.rx_bytes_total, now),
            tx_bytes_per_second=self._rdma.rate((*key, "t"), port.tx_bytes_total, now),
        )

    def _pod(self, c: NetnsCounters, now: float) -> PodNetwork:
        key = (c.netns_inode, c.pod)  # a pod whose sandbox was re-created starts afresh
        return PodNetwork(
            pod=c.pod.pod,
            namespace=c.pod.namespace,
            uid=c.pod.uid,
            interfaces=c.interfaces,
            rx_bytes_total=c.rx_bytes_total,
            tx_bytes_total=c.tx_bytes_total,
            rx_bytes_per_second=self._pods.rate((*key, "r"), c.rx_bytes_total, now),
            tx_bytes_per_second=self._pods.rate((*key, "t"), c.tx_bytes_total, now),
        )

    def _note_skipped(self, skipped: Mapping[PodRef, str]) -> None:
        """Log each pod's reason for being skipped once (and again only if the reason changes)."""
        for ref, reason in skipped.items():
            if self._skipped.get(ref) != reason:
                name = f"{ref.namespace}/{ref.pod}" if ref.namespace else ref.pod
                if reason == "host network":
                    log.info("pod %s uses the host network: its traffic is the node's, not counted as the "
                             "pod's", name)
                else:
                    log.warning("pod %s: network counters not read: %s", name, reason)
        self._skipped = dict(skipped)


class _StillRunning(Exception):
    """The previous read has not returned (a hung netlink socket or /proc read)."""


class _PartFailed(Exception):
    def __init__(self, part: str, error: BaseException) -> None:
        super().__init__(f"{part}: {error!r}")


def _part(part: str, read: Callable[[], T]) -> T:
    try:
        return read()
    except Exception as exc:
        raise _PartFailed(part, exc) from exc


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, _StillRunning):
        return "the previous read is still running (hung netlink or /proc read); not starting another"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"read took longer than {timeout:g}s"
    if isinstance(exc, _PartFailed):
        return str(exc)
    return f"read failed: {exc!r}"


def _consume(future: asyncio.Future[RawNetwork]) -> None:
    """Retrieve the result of a read nobody awaits any more (it timed out), so asyncio does not warn."""
    if not future.cancelled():
        future.exception()


def network_source(
    network: NetworkConfig, *, proc_root: str, monotonic: Callable[[], float] = time.monotonic
) -> NetworkSource | None:
    """The source the ``network`` keys ask for (None with ``network: false``); pods' network namespaces are
    found under ``proc_root``."""
    if not network.enabled:
        return None
    links = NetlinkLinks(LinkFilter(network.links, network.links_exclude), sysfs_root=network.sysfs_root)
    return NetworkSource(
        read_links=links.read,
        read_rdma_ports=lambda: read_rdma(network.sysfs_root),
        pod_reader=PodNetReader(proc_root),
        interval=network.interval,
        monotonic=monotonic,
    )
