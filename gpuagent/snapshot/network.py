"""The network source's poll: the node's links (netlink), RDMA ports (sysfs) and each GPU pod's traffic.
``network/`` produces :class:`NetworkState`; the exporter renders it and the hints engine summarises it
(:class:`~gpuagent.snapshot.hints.NetworkHints`). It refers to no other part of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class LinkSample:
    """One network link of the node, as netlink reports it; bytes/s over the source's last window."""

    name: str
    kind: str  # "physical", "veth", "bond", "bridge", "vlan", "infiniband", "loopback", or the IFLA_INFO_KIND
    oper_state: str  # lower-case IFLA_OPERSTATE: "up", "down", "unknown", "dormant", ...
    mtu: int
    speed_bits_per_second: int | None  # None: unknown (virtual, or down)
    rx_bytes_total: int
    tx_bytes_total: int
    rx_bytes_per_second: float | None  # None on the first poll
    tx_bytes_per_second: float | None
    rx_errors_total: int = 0
    tx_errors_total: int = 0
    rx_dropped_total: int = 0
    tx_dropped_total: int = 0


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port of an RDMA (InfiniBand / RoCE) device, from /sys/class/infiniband."""

    device: str
    port: int
    state: str  # e.g. "active", "down", "init" (the word of the sysfs "4: ACTIVE", lower-case)
    link_layer: str  # "infiniband" or "ethernet" (RoCE)
    rate_bits_per_second: int | None
    netdev: str | None  # the associated network interface, if any
    rx_bytes_total: int | None  # None: the port exposes no data counters
    tx_bytes_total: int | None
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class PodNetwork:
    """Traffic of one pod's network namespace (all its interfaces but lo)."""

    pod: str
    namespace: str | None
    uid: str | None
    interfaces: int
    rx_bytes_total: int
    tx_bytes_total: int
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class NetworkState:
    """The network source's last poll: node links, RDMA ports, pods' network namespaces."""

    links: tuple[LinkSample, ...] = ()
    rdma: tuple[RdmaPort, ...] = ()
    pods: tuple[PodNetwork, ...] = ()
    window_seconds: float = 0.0  # the interval the bytes/s figures cover (0: first poll)
    error: str = ""  # non-empty when the poll failed; the tuples are then empty


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
