"""What a pod's own processes say about which pod they are: the evidence the device join weighs.

The device join (:func:`gpuagent.pods.matching.match_pods`) pairs a pod UID seen on a device with the
one pod allocated that device. The devices alone cannot tell a pod that strays onto a GPU nobody was
allocated (privileged, or ``NVIDIA_VISIBLE_DEVICES=all``) from an unallocated pod running on an idle
pod's GPU: either way a UID is seen on a device whose one allocated pod is P, and on another device. Nor
can they tell apart two pods time-sharing (or MPS-sharing) one GPU. The processes' environments can, and
this module weighs them for one (UID, pod) pair:

- **confirmed** (> 0): a process's ``HOSTNAME`` is the pod's hostname (container runtimes set it to the
  pod's name, cut to 63 characters as the kubelet cuts it): +2; a process was given
  (``NVIDIA_VISIBLE_DEVICES``, which the device plugin sets) exactly the devices one of the pod's
  containers was allocated: +1.
- **contradicted** (-1): nothing confirms, and a process's ``HOSTNAME`` names another host (neither the
  pod's hostname, nor a prefix of its name as an indexed Job's pods have it, nor the node's name as a
  ``hostNetwork`` pod has it), or a process was given devices that none of the pod's containers was.
- **nothing to say** (0): no environment could be read, or it holds neither.

Limits, said plainly: a pod whose spec sets another hostname, under a device plugin that passes no device
list (the CDI strategies), is contradicted and keeps its UID rather than its name (unnamed, never
misnamed). A tenant can set its own ``HOSTNAME`` and so take the name of a pod allocated a device it runs
on, as the devices alone would give it. With the API server configured, every pod is named outright.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuagent.pods.environ import HOSTNAME, Environ
from gpuagent.pods.visible import given_devices
from gpuagent.snapshot.gpu import GpuSample

PodKey = tuple[str, str]  # (namespace, pod name)
HOSTNAME_MAX = 63  # the kubelet cuts a pod's hostname to a DNS label


def pod_hostname(name: str) -> str:
    """The hostname the kubelet gives a pod of this name (no ``spec.hostname``): the name, cut to 63
    characters without a trailing ``-`` or ``.``."""
    return name if len(name) <= HOSTNAME_MAX else name[:HOSTNAME_MAX].rstrip("-.")


@dataclass(frozen=True, slots=True)
class _Seen:
    """What one UID's processes say: their hostnames and the device sets they were given."""

    hostnames: frozenset[str]
    given: tuple[frozenset[str], ...]


class Evidence:
    """Scores (UID, pod) pairs from the environments of the UIDs' processes."""

    def __init__(
        self,
        environs_by_uid: Mapping[str, Sequence[Environ]],
        gpus: Sequence[GpuSample],
        container_devices: Mapping[PodKey, tuple[frozenset[str], ...]],
        node_names: frozenset[str] = frozenset(),
    ) -> None:
        self._seen: dict[str, _Seen] = {}
        for uid, environs in environs_by_uid.items():
            hostnames = {e[HOSTNAME].strip() for e in environs if e.get(HOSTNAME, "").strip()}
            given = {d for d in (given_devices(e, gpus) for e in environs) if d is not None}
            if hostnames or given:
                self._seen[uid] = _Seen(frozenset(hostnames), tuple(given))
        self._containers = container_devices
        self._node_names = frozenset(n.lower() for n in node_names)

    def score(self, uid: str, pod: PodKey) -> int:
        """> 0 confirmed (2: its hostname, 1: its devices, 3: both), -1 contradicted, 0 nothing to say."""
        seen = self._seen.get(uid)
        if seen is None:
            return 0
        hostname = pod_hostname(pod[1])
        allocated = self._containers.get(pod, ())
        score = 2 if hostname in seen.hostnames else 0
        score += 1 if any(d in allocated for d in seen.given) else 0
        if score:
            return score
        other_host = any(
            h != hostname and not pod[1].startswith(h + "-") and h.lower() not in self._node_names
            for h in seen.hostnames
        )
        return -1 if other_host or seen.given else 0
