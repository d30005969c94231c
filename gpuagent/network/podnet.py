"""Per-pod network counters, read from each pod's network namespace without entering it.

``/proc/<pid>/net/dev`` shows the interfaces of *that PID's* network namespace, so one live process of a pod
is enough: no ``setns``, no netlink socket per pod. Pods are told apart by their namespace's inode
(``stat /proc/<pid>/ns/net``): every container of a pod shares the sandbox's namespace, and a pod with
``hostNetwork: true`` shares the node's, whose traffic is not the pod's to claim: such a pod is skipped
and reported as such. ``lo`` is left out. A PID that exited between attribution and this read is simply
passed over for the next PID of the same pod.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuagent.snapshot.gpu import GpuSample

__all__ = ["NetDevParseError", "NetnsCounters", "PodNetReader", "PodNetReading", "PodRef", "parse_net_dev",
           "pod_pids"]

# A process that is gone (or a zombie, whose /proc/PID/net no longer resolves): try the pod's next PID.
_VANISHED = (errno.ENOENT, errno.ESRCH, errno.EINVAL, errno.ENOTDIR)
_NET_DEV_FIELDS = 16  # 8 receive and 8 transmit columns
_TX_BYTES_COLUMN = 8


class NetDevParseError(ValueError):
    """A ``/proc/PID/net/dev`` line that is not ``<iface>: <16 counters>``."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as attribution names it (``pod`` is its UID when its name is unknown)."""

    pod: str
    namespace: str | None
    uid: str | None


@dataclass(frozen=True, slots=True)
class NetnsCounters:
    """The summed counters of one pod's network namespace (every interface but ``lo``)."""

    pod: PodRef
    netns_inode: int
    pid: int  # the process whose /proc/PID/net/dev was read
    interfaces: int
    rx_bytes_total: int
    tx_bytes_total: int


@dataclass(frozen=True, slots=True)
class PodNetReading:
    counters: tuple[NetnsCounters, ...] = ()
    # Pods not counted, with why: "host network", "no live process", "shares the namespace of <pod>", or
    # the error that reading it gave (e.g. permission denied when the agent is not privileged).
    skipped: Mapping[PodRef, str] = field(default_factory=dict)


def pod_pids(gpus: Iterable[GpuSample]) -> dict[PodRef, tuple[int, ...]]:
    """Pod -> its PIDs, from the attributed GPU processes of a poll (``workload.kind == "pod"``)."""
    pids: dict[PodRef, set[int]] = {}
    for gpu in gpus:
        for process in gpu.processes:
            w = process.workload
            if w is not None and w.kind == "pod":
                pids.setdefault(PodRef(w.name, w.namespace, w.pod_uid), set()).add(process.pid)
    return {ref: tuple(sorted(found)) for ref, found in pids.items()}


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` -> interface -> (rx bytes, tx bytes); the two header lines are skipped."""
    interfaces: dict[str, tuple[int, int]] = {}
    for number, line in enumerate(text.splitlines()[2:], start=3):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")  # an interface name cannot hold ':' (dev_valid_name)
        fields = rest.split()
        if not sep or len(fields) < _NET_DEV_FIELDS:
            raise NetDevParseError(f"line {number}: expected '<iface>: <16 counters>', got {line.strip()!r}")
        try:
            interfaces[name.strip()] = (int(fields[0]), int(fields[_TX_BYTES_COLUMN]))
        except ValueError:
            raise NetDevParseError(f"line {number}: non-numeric counter in {line.strip()!r}") from None
    return interfaces


class PodNetReader:
    """Reads pods' network namespaces through ``proc_root`` (blocking: call it on a worker thread)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def host_netns_inode(self) -> int | None:
        """The node's network namespace: that of PID 1 under ``proc_root`` (the host's init when the agent
        sees the host's PIDs), else the agent's own; None when neither can be read."""
        for path in (os.path.join(self.proc_root, "1", "ns", "net"), "/proc/self/ns/net"):
            try:
                return os.stat(path).st_ino
            except OSError:
                continue
        return None

    def read(self, pods: Mapping[PodRef, Sequence[int]]) -> PodNetReading:
        host = self.host_netns_inode()
        counters: list[NetnsCounters] = []
        skipped: dict[PodRef, str] = {}
        owner: dict[int, PodRef] = {}  # netns inode -> the pod counted for it
        for ref in sorted(pods, key=lambda r: (r.namespace or "", r.pod, r.uid or "")):
            found, reason = self._read_pod(ref, pods[ref])
            if found is None:
                skipped[ref] = reason
            elif found.netns_inode == host:
                skipped[ref] = "host network"
            elif found.netns_inode in owner:
                other = owner[found.netns_inode]
                skipped[ref] = f"shares the network namespace of {other.namespace}/{other.pod}"
            else:
                owner[found.netns_inode] = ref
                counters.append(found)
        return PodNetReading(tuple(counters), skipped)

    def _read_pod(self, ref: PodRef, pids: Sequence[int]) -> tuple[NetnsCounters | None, str]:
        reason = "no live process"
        for pid in pids:
            base = os.path.join(self.proc_root, str(pid))
            try:
                inode = os.stat(os.path.join(base, "ns", "net")).st_ino
                with open(os.path.join(base, "net", "dev"), encoding="ascii") as f:
                    text = f.read()
                # The PID may have exited and been reused between the two reads: same namespace still?
                if os.stat(os.path.join(base, "ns", "net")).st_ino != inode:
                    continue
            except PermissionError as exc:
                reason = f"PID {pid}: {exc.strerror} (the agent needs CAP_SYS_PTRACE to see other netns)"
                continue
            except OSError as exc:
                if exc.errno in _VANISHED:
                    continue
                raise
            try:
                interfaces = {name: c for name, c in parse_net_dev(text).items() if name != "lo"}
            except NetDevParseError as exc:
                return None, f"{base}/net/dev: {exc}"
            return NetnsCounters(
                pod=ref,
                netns_inode=inode,
                pid=pid,
                interfaces=len(interfaces),
                rx_bytes_total=sum(rx for rx, _ in interfaces.values()),
                tx_bytes_total=sum(tx for _, tx in interfaces.values()),
            ), ""
        return None, reason
