"""The families of the node's published ``GPUNodeState`` (the extender's cluster view): the writes by
outcome, when the API server last took one, and the object's size.

From ``snapshot.publish`` (``hints.publisher``); nothing while the node does not publish. A node whose
writes keep failing drops out of GPU scheduling once its state is older than the extender's
``published_max_age`` (15 minutes by default): ``GpuagentStatePublishFailing`` watches the last write.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import add, counter, gauge, non_empty, with_label
from gpuagent.export.labels import GpuLabels
from gpuagent.snapshot.node import NodeSnapshot

OUTCOMES = ("written", "failed", "unreachable", "rate_limited")


def publish_families(snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
    state = snapshot.publish
    if state is None:
        return []
    host = labels.host
    writes = counter("gpuagent_state_publish_writes_total",
                     "Writes of the node's GPUNodeState by outcome (written, failed, unreachable, "
                     "rate_limited).")
    counts = dict(state.writes_total)
    for outcome in OUTCOMES:
        add(writes, with_label(host, "outcome", outcome), counts.get(outcome, 0))
    last = gauge("gpuagent_state_publish_last_write_timestamp_seconds",
                 "When the API server last took a write of the node's GPUNodeState (unix seconds).")
    if state.last_write_unix is not None:
        add(last, host, state.last_write_unix)
    size = gauge("gpuagent_state_publish_object_bytes", "The size of the last GPUNodeState written.")
    add(size, host, float(state.object_bytes))
    return non_empty([writes, last, size])
