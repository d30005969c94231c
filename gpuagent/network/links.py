"""The node's network links, read over netlink (pyroute2) with their speed from sysfs.

One ``RTM_GETLINK`` dump gives every link's name, type, ``IFLA_OPERSTATE``, MTU, ``IFLA_LINKINFO`` kind and
64-bit counters (``IFLA_STATS64``). The speed is not in netlink: it is ``/sys/class/net/<if>/speed`` in Mb/s,
which reads -1 or fails with EINVAL for virtual links and links that are down (``None`` here, never 0).

pyroute2 costs about 10 MiB of RSS in the agent (25 MiB in a bare interpreter), so it is imported only when a
:class:`NetlinkLinks` first reads a link.
Which links are reported is a :class:`LinkFilter`: by default not ``lo`` and not the per-pod veths and CNI
bridges, so a 100-pod node does not export 100 links.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuagent.config import NETWORK_LINK_EXCLUDE

__all__ = [
    "LinkCounters",
    "LinkFilter",
    "NetlinkLinks",
    "link_counters",
    "link_kind",
    "read_speed_bits_per_second",
]


# ARPHRD_* types of links that carry no IFLA_INFO_KIND (include/uapi/linux/if_arp.h).
_ARPHRD_ETHER = 1
_ARPHRD_INFINIBAND = 32
_ARPHRD_LOOPBACK = 772
_ARPHRD_KINDS = {_ARPHRD_INFINIBAND: "infiniband", _ARPHRD_LOOPBACK: "loopback"}


@dataclass(frozen=True, slots=True)
class LinkFilter:
    """Which link names are reported: those matching an ``include`` glob and no ``exclude`` glob."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = NETWORK_LINK_EXCLUDE  # lo, per-pod veths, CNI bridges and tunnels

    def matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, g) for g in self.include) and not any(
            fnmatch.fnmatchcase(name, g) for g in self.exclude
        )


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """One link as read, before rates: what :class:`~gpuagent.snapshot.network.LinkSample`
    holds but bytes/s."""

    index: int
    name: str
    kind: str
    oper_state: str
    mtu: int
    speed_bits_per_second: int | None
    rx_bytes_total: int
    tx_bytes_total: int
    rx_errors_total: int
    tx_errors_total: int
    rx_dropped_total: int
    tx_dropped_total: int


def link_kind(info_kind: str | None, arphrd_type: int) -> str:
    """``IFLA_INFO_KIND`` when the link has one ("veth", "bond", "bridge", "vlan", ...); else "loopback",
    "infiniband" or (an Ethernet device with a driver of its own) "physical"; "arphrd-<n>" otherwise."""
    if info_kind:
        return info_kind
    if arphrd_type in _ARPHRD_KINDS:
        return _ARPHRD_KINDS[arphrd_type]
    return "physical" if arphrd_type == _ARPHRD_ETHER else f"arphrd-{arphrd_type}"


def read_speed_bits_per_second(sysfs_root: str, name: str) -> int | None:
    """``/sys/class/net/<name>/speed`` (Mb/s) in bits/s; None when unknown (-1, EINVAL, absent, garbage)."""
    try:
        with open(os.path.join(sysfs_root, "class", "net", name, "speed"), encoding="ascii") as f:
            text = f.read().strip()
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR, errno.EOPNOTSUPP, errno.ENODEV):
            return None
        raise
    except UnicodeDecodeError:
        return None
    try:
        megabits = int(text)
    except ValueError:
        return None
    # SPEED_UNKNOWN is -1; a u32 read of it shows 4294967295 on some drivers.
    if megabits <= 0 or megabits >= 0xFFFFFFFF:
        return None
    return megabits * 1_000_000


def link_counters(message: Any, speed: int | None) -> LinkCounters:
    """A pyroute2 ``ifinfmsg`` as :class:`LinkCounters`; ``KeyError``/``ValueError`` name a missing field."""
    name = message.get_attr("IFLA_IFNAME")
    if not name:
        raise ValueError(f"link {message.get('index')} has no IFLA_IFNAME")
    info = message.get_attr("IFLA_LINKINFO")
    info_kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    stats = message.get_attr("IFLA_STATS64") or message.get_attr("IFLA_STATS")
    if stats is None:
        raise ValueError(f"link {name}: no IFLA_STATS64 or IFLA_STATS")
    return LinkCounters(
        index=int(message.get("index", 0)),
        name=name,
        kind=link_kind(info_kind, int(message.get("ifi_type", 0))),
        oper_state=str(message.get_attr("IFLA_OPERSTATE") or "unknown").lower(),
        mtu=int(message.get_attr("IFLA_MTU") or 0),
        speed_bits_per_second=speed,
        rx_bytes_total=int(stats["rx_bytes"]),
        tx_bytes_total=int(stats["tx_bytes"]),
        rx_errors_total=int(stats["rx_errors"]),
        tx_errors_total=int(stats["tx_errors"]),
        rx_dropped_total=int(stats["rx_dropped"]),
        tx_dropped_total=int(stats["tx_dropped"]),
    )


class NetlinkLinks:
    """Reads the links of the agent's network namespace (blocking; call it on a worker thread).

    Only the links that pass the filter are asked for, one ``RTM_GETLINK`` each: pyroute2 decodes every
    attribute of every message in Python, and a full dump of a node with 100 pods (200 links) took about
    350 ms of CPU here, against about 1 ms per link asked for. The names come from ``if_nameindex()``
    (libc, the same namespace); a link gone between the two is skipped.
    """

    def __init__(self, link_filter: LinkFilter = LinkFilter(), *, sysfs_root: str = "/sys") -> None:
        self.filter = link_filter
        self.sysfs_root = sysfs_root

    def read(self) -> list[LinkCounters]:
        wanted = [index for index, name in socket.if_nameindex() if self.filter.matches(name)]
        if not wanted:
            return []
        from pyroute2 import IPRoute  # ~10 MiB: only once the network source actually reads a link
        from pyroute2.netlink.exceptions import NetlinkError

        messages = []
        with IPRoute() as ipr:
            for index in wanted:
                try:
                    messages.extend(ipr.get_links(index))
                except NetlinkError as exc:
                    if exc.code != errno.ENODEV:  # ENODEV: deleted since it was listed
                        raise
        return self.select(messages)

    def select(self, messages: Iterable[Any]) -> list[LinkCounters]:
        links = []
        for message in messages:
            name = message.get_attr("IFLA_IFNAME")
            if name is None or not self.filter.matches(name):
                continue
            links.append(link_counters(message, read_speed_bits_per_second(self.sysfs_root, name)))
        return sorted(links, key=lambda link: link.name)
