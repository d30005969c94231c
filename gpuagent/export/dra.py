"""Devices of pods' ResourceClaims (DRA) and the GPUs they were mapped to: ``gpuagent_pod_dra_*``.

A mapped DRA device is also an allocation, so the pod's ``gpuagent_pod_gpu_allocated`` and accounting
series carry it like a device plugin's; these families say which claim and driver device it is, how it was
mapped (``mapped_by``: ``resource_slice`` or ``cdi``), and count the devices that could not be mapped to a
GPU (never guessed: they are not attributed, not accounted, until a source names them). They are pod
families: the ``pods`` collector renders them.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import add, extend, family, gauge, join, non_empty
from gpuagent.export.labels import GpuLabels, pod_labels
from gpuagent.snapshot.node import NodeSnapshot


def dra_families(snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
    """``snapshot.dra`` as metric families (none without DRA devices)."""
    if not snapshot.dra:
        return []
    info = family("gpuagent_pod_dra_device_info", "A device of a pod's ResourceClaim (DRA) and the GPU "
                  "it maps to (mapped_by none: unmapped).", "info")
    unmapped = gauge("gpuagent_pod_dra_unmapped_devices", "Devices of the pod's ResourceClaims of GPU "
                     "drivers that could not be mapped to a GPU.")
    by_uuid = {g.info.uuid: g for g in snapshot.gpus}
    migs = {m.uuid: (g, m) for g in snapshot.gpus for m in g.migs}
    missing: Counter[tuple[str, str]] = Counter()
    for d in snapshot.dra:
        pod = pod_labels(d.namespace, d.pod)
        facts = (("container", d.container), ("claim", d.claim), ("driver", d.driver), ("pool", d.pool),
                 ("device", d.device), ("mapped_by", d.mapped_by or "none"))
        where = ""
        if d.mig_uuid is not None and d.mig_uuid in migs:
            where = labels.gpu(*migs[d.mig_uuid])
        elif d.gpu_uuid is not None and d.gpu_uuid in by_uuid:
            where = labels.gpu(by_uuid[d.gpu_uuid])
        elif d.mig_uuid or d.gpu_uuid:  # mapped to a UUID this node's NVML does not list (yet)
            facts += (("UUID", d.mig_uuid or d.gpu_uuid or ""),)
        add(info, join(extend(pod, facts), where) if where else extend(pod, facts), 1)
        missing[(d.namespace, d.pod)] += d.mapped_by is None
    for (namespace, pod_name), count in missing.items():
        add(unmapped, pod_labels(namespace, pod_name), count)
    return non_empty([info, unmapped])

