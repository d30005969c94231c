"""RDMA (InfiniBand and RoCE) ports, from ``/sys/class/infiniband``.

Per port ``ports/<n>/``: ``state`` ("4: ACTIVE"), ``rate`` ("200 Gb/sec (4X HDR)"), ``link_layer``
("InfiniBand" or "Ethernet" for RoCE) and ``counters/port_rcv_data`` / ``port_xmit_data``, which count
4-byte words, not bytes. A HCA without PortCountersExtended exposes those two as 32-bit counters that
*saturate* at 0xFFFFFFFF rather than wrap: a saturated counter is reported as unknown (``None``), since its
value says nothing any more. The port's network interface is ``ports/<n>/gid_attrs/ndevs/0`` (RoCE), else
the one interface of ``device/net/`` (or the one whose ``dev_port`` is the port's, counted from 0).

A node without RDMA has no ``/sys/class/infiniband``: no ports, no error.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

__all__ = ["RdmaCounters", "parse_rate_bits_per_second", "parse_state", "read_rdma"]

_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EINVAL, errno.ENODEV, errno.EOPNOTSUPP, errno.ENXIO)
_WORD_BYTES = 4
_SATURATED_32 = 0xFFFFFFFF
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*[0-9]+\s*:\s*(\S+)")


@dataclass(frozen=True, slots=True)
class RdmaCounters:
    """One RDMA port as read, before rates."""

    device: str
    port: int
    state: str
    link_layer: str
    rate_bits_per_second: int | None
    netdev: str | None
    rx_bytes_total: int | None
    tx_bytes_total: int | None


def parse_state(text: str) -> str:
    """ "4: ACTIVE" -> "active"; a bare word is taken as is, lower-cased; "" -> "unknown"."""
    match = _STATE.match(text)
    word = match.group(1) if match else text.strip()
    return word.lower() or "unknown"


def parse_rate_bits_per_second(text: str) -> int | None:
    """ "100 Gb/sec (4X EDR)" -> 100e9, "2.5 Gb/sec (1X SDR)" -> 2.5e9; None when unparsable or 0."""
    match = _RATE.match(text)
    if match is None:
        return None
    bits = round(float(match.group(1)) * 1_000_000_000)
    return bits or None


def read_rdma(sysfs_root: str) -> list[RdmaCounters]:
    """Every port of every RDMA device under ``<sysfs_root>/class/infiniband``, sorted by device, port."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    ports = []
    for device in devices:
        ports_dir = os.path.join(base, device, "ports")
        try:
            numbers = sorted(int(n) for n in os.listdir(ports_dir) if n.isdigit())
        except FileNotFoundError:  # the device went away while we looked
            continue
        for number in numbers:
            ports.append(_read_port(os.path.join(base, device), device, number))
    return ports


def _read_port(device_dir: str, device: str, number: int) -> RdmaCounters:
    port_dir = os.path.join(device_dir, "ports", str(number))
    return RdmaCounters(
        device=device,
        port=number,
        state=parse_state(_read(os.path.join(port_dir, "state")) or ""),
        link_layer=(_read(os.path.join(port_dir, "link_layer")) or "unknown").lower(),
        rate_bits_per_second=parse_rate_bits_per_second(_read(os.path.join(port_dir, "rate")) or ""),
        netdev=_netdev(device_dir, port_dir, number),
        rx_bytes_total=_data_bytes(os.path.join(port_dir, "counters", "port_rcv_data")),
        tx_bytes_total=_data_bytes(os.path.join(port_dir, "counters", "port_xmit_data")),
    )


def _data_bytes(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        words = int(text)
    except ValueError:
        return None
    if words < 0 or words == _SATURATED_32:
        return None
    return words * _WORD_BYTES


def _netdev(device_dir: str, port_dir: str, number: int) -> str | None:
    ndev = _read(os.path.join(port_dir, "gid_attrs", "ndevs", "0"))
    if ndev:
        return ndev
    net_dir = os.path.join(device_dir, "device", "net")
    try:
        names = sorted(os.listdir(net_dir))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if len(names) == 1:
        return names[0]
    for name in names:  # a dual-port HCA on one PCI function: dev_port counts ports from 0
        if _read(os.path.join(net_dir, name, "dev_port")) == str(number - 1):
            return name
    return None


def _read(path: str) -> str | None:
    """A sysfs attribute's text, stripped; None when absent or not supported (an IB port's ``ndevs/0``
    fails with EINVAL); any other error (permissions, I/O) is raised for the source to report."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None
        raise
