"""The device join: which pod UID seen on a GPU (from its processes' cgroups) is which pod the kubelet
allocated that GPU (by namespace and name), found by elimination over the devices both sides name.

The kubelet's pod-resources API names pods and their devices but carries no pod UID; a process's cgroup
carries the UID but no name. :func:`match_pods` pairs them through the GPUs themselves, weighing the
processes' own evidence (:mod:`gpuagent.pods.evidence`) where a device alone cannot tell; apart from
:mod:`gpuagent.pods.attribution`, which builds each poll's workloads and pods around this one decision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Protocol

from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.processes import ProcessSample

PodKey = tuple[str, str]  # (namespace, pod name)


class Allocation(Protocol):
    """What ``pods.podresources.DeviceAllocation`` provides."""

    namespace: str
    pod: str
    container: str
    device_id: str
    gpu_uuid: str | None
    mig_uuid: str | None


def device_key(gpu: GpuSample, process: ProcessSample) -> str:
    """The device a process runs on, as allocations name it: its MIG instance's UUID, else the GPU's."""
    if process.gpu_instance_id is not None:
        for mig in gpu.migs:
            if mig.gpu_instance_id == process.gpu_instance_id:
                return mig.uuid
    return gpu.info.uuid


def allocation_key(allocation: Allocation) -> str | None:
    return allocation.mig_uuid or allocation.gpu_uuid


Score = Callable[[str, PodKey], int]  # evidence for (UID, pod): > 0 confirmed, < 0 contradicted, 0 none


def _no_evidence(uid: str, pod: PodKey) -> int:
    return 0


def match_pods(
    uids_by_device: Mapping[str, set[str]],
    pods_by_device: Mapping[str, set[PodKey]],
    score: Score = _no_evidence,
) -> dict[str, PodKey]:
    """Pod UID -> (namespace, pod), by elimination over the devices both sides name, weighing ``score``.

    A device left with one open UID and one open pod pairs them when the evidence confirms it, or when it
    says nothing and every other device the UID is seen on is the pod's own or allocated to nobody: a pod
    that strays onto a free GPU (privileged, ``NVIDIA_VISIBLE_DEVICES=all``) keeps its name, and the free
    GPU is its unallocated use. Seen without evidence on a device allocated to another pod, the UID is
    left unnamed: it may be a third pod using both while their owners idle. A device left with several
    pairs each UID with the one pod its evidence confirms best, where no other UID there claims that pod.
    """
    matched: dict[str, PodKey] = {}
    taken: set[PodKey] = set()
    devices_of_uid: dict[str, set[str]] = defaultdict(set)
    for device, uids in uids_by_device.items():
        for uid in uids:
            devices_of_uid[uid].add(device)
    progress = True
    while progress:
        progress = False
        for device, uids in uids_by_device.items():
            open_uids = uids - matched.keys()
            open_pods = pods_by_device.get(device, set()) - taken
            if not open_uids or not open_pods:
                continue
            if len(open_uids) == 1 and len(open_pods) == 1:
                (uid,), (pod,) = open_uids, open_pods
                verdict = score(uid, pod)
                consistent = all(pod in pods_by_device.get(d, ()) or not pods_by_device.get(d)
                                 for d in devices_of_uid[uid])
                pairs = {uid: pod} if verdict > 0 or (verdict == 0 and consistent) else {}
            else:
                pairs = _best_confirmed(open_uids, open_pods, score)
            for uid, pod in pairs.items():
                matched[uid] = pod
                taken.add(pod)
                progress = True
    return matched


def _best_confirmed(uids: set[str], pods: set[PodKey], score: Score) -> dict[str, PodKey]:
    """Each UID's one best-confirmed pod, where that pod is no other UID's best."""
    best: dict[str, PodKey] = {}
    for uid in sorted(uids):
        scores = {pod: score(uid, pod) for pod in pods}
        top = max(scores.values())
        winners = [pod for pod, s in scores.items() if s == top]
        if top > 0 and len(winners) == 1:
            best[uid] = winners[0]
    claims = defaultdict(list)
    for uid, pod in best.items():
        claims[pod].append(uid)
    return {uid: pod for uid, pod in best.items() if len(claims[pod]) == 1}
