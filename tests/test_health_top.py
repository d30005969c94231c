"""``gpuagent top`` shows the health classification: each GPU's worst fault beside its health, and the node's
failing conditions and quarantine in the header (audit: what would be done)."""

from __future__ import annotations

import json
from dataclasses import replace

from test_health import UUIDS, gpu, snap

from gpuagent.health import HealthMonitor, HealthSettings
from gpuagent.snapshot.gpu import Health, RemappedRows, XidRecord
from gpuagent.snapshot.pods import DraTaint
from gpuagent.snapshot.views import allocation_view, to_jsonable
from gpuagent.top import render
from gpuagent.top.arrange import ViewOptions, arrange
from gpuagent.top.client import OK, AgentStatus
from gpuagent.top.history import History
from gpuagent.top.model import node_view


def _state(mode: str) -> dict:
    s = snap(gpu(0, health=Health.LOST), gpu(1, remapped_rows=RemappedRows(0, 1, True, False)), gpu(2))
    s = replace(s, health=HealthMonitor(HealthSettings(mode=mode)).update(s))
    return json.loads(json.dumps({**to_jsonable(s), "allocation": allocation_view(s)}))


def _screen(state: dict) -> str:
    node = node_view(state)
    options = ViewOptions()
    head = render.header(node, AgentStatus(OK, "", 0.5), "http://gpu-node-1:9402", options, 200, now_unix=0)
    return render.plain([*head, *render.body(arrange(node, options), options, History(), 200)])


def test_top_shows_each_gpus_fault_and_the_nodes_quarantine() -> None:
    screen = _screen(_state("audit"))
    assert "FAULT GpuLost (fatal, reboot)" in screen
    assert "FAULT RowRemapPending (degraded, reset_gpu)" in screen
    assert "GpuHardwareHealthy: GpuLost" in screen
    assert "node would be cordoned, tainted" in screen
    gpu2 = next(line for line in screen.splitlines() if "GPU 2" in line)
    assert "FAULT" not in gpu2


def test_top_without_health_in_the_state_shows_no_fault() -> None:
    state = _state("audit")
    del state["health"]
    node = node_view(state)
    assert node.failing_conditions == () and node.quarantine == "" and all(g.fault is None for g in node.gpus)


def test_top_shows_a_dra_drivers_taint_as_the_gpus_fault_and_not_a_workloads_error() -> None:
    taint = DraTaint("gpu.nvidia.com", "gpu-node-1", "gpu-2", "gpu.nvidia.com/xid", "79", "NoSchedule", UUIDS[2])
    s = replace(snap(gpu(0, xid=XidRecord(13, 0.0, {13: 1}, {13: 1})), gpu(1), gpu(2)), dra_taints=(taint,))
    s = replace(s, health=HealthMonitor(HealthSettings(mode="audit")).update(s))
    screen = _screen(json.loads(json.dumps({**to_jsonable(s), "allocation": allocation_view(s)})))
    gpu2 = next(line for line in screen.splitlines() if "GPU 2" in line)
    assert "FAULT DraDeviceTainted (degraded, none)" in gpu2
    gpu0 = next(line for line in screen.splitlines() if "GPU 0" in line)
    assert "FAULT" not in gpu0  # XID 13 is the application's
