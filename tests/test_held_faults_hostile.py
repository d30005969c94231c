"""The Node's gpuagent.io/* annotations as another party may have written them (issue 28, item 6).

A forged ``gpuagent.io/held-faults`` with the node's bootID must not quarantine the node for a GPU it does
not have, nor for ever; 5,000 nested brackets or a 400-digit number there (or in ``gpuagent.io/quarantine``
and ``gpuagent.io/remediation``, read every round) are one refusal, never a lost round.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_apiserver import NODE, FakeApiServer
from fake_cluster import make_node
from test_health import T0, UUIDS, gpu, snap

from gpuagent.boundedjson import Unreadable
from gpuagent.health import HealthMonitor, HealthSettings
from gpuagent.health.classify import Classifier
from gpuagent.health.node import (
    HELD_ANNOTATION,
    QUARANTINE_ANNOTATION,
    REMEDIATION_ANNOTATION,
    held_of,
    ours,
    spec_patch,
)
from gpuagent.health.plan import TAINT_KEY, plan_for
from gpuagent.health.tracker import FaultTracker
from gpuagent.health.writer import NodeWriter
from gpuagent.kubeapi import ApiConnection
from gpuagent.snapshot.gpu import Health, XidRecord

BOOT = "8d3c0f2e-boot"
ABSENT = "GPU-deadbeef-0000-0000-0000-000000000000"  # on no node of these tests


def _node(annotations: dict[str, str], boot: str = BOOT) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "annotations": annotations}, "status": {"nodeInfo": {"bootID": boot}}}


def _held(*faults: Any, boot: str = BOOT) -> str:
    return json.dumps({"bootID": boot, "faults": list(faults)})


FAULT = {"reason": "XidGspTimeout", "gpu": UUIDS[0], "index": 0, "since": T0}


def _short(value: object) -> str | None:
    return value[-24:] if isinstance(value, str) else None  # a test id, not 10,000 brackets


# --- reading the annotation ----------------------------------------------------------------------------------


def test_what_the_agent_writes_reads_back_as_it_was() -> None:
    tracker = FaultTracker()
    xid = XidRecord(119, T0, {119: 1}, {119: 1})
    faults, _ = tracker.update(snap(gpu(0, xid=xid), gpu(1)), Classifier().observe(snap(gpu(0, xid=xid))), T0)
    faults, _ = tracker.update(snap(gpu(0), gpu(1), at=T0 + 5), [], T0 + 5)  # held: no reset seen
    plan = plan_for(faults, (), snap(gpu(0), gpu(1), at=T0 + 5), HealthSettings(mode="enforce"))
    written = spec_patch(_node({}), plan, quarantine=True, remediation=True, now=T0 + 5).patch
    assert written is not None
    node = _node({HELD_ANNOTATION: written["metadata"]["annotations"][HELD_ANNOTATION]})
    assert held_of(node) == [("XidGspTimeout", UUIDS[0], 0, T0)]


@pytest.mark.parametrize(("text", "why"), [
    ("[" * 5000 + "]" * 5000, "nested deeper"),
    ('{"bootID": "' + BOOT + '", "faults": [{"x": ' + "[" * 5000 + "]" * 5000 + "}]}", "nested deeper"),
    (_held({**FAULT, "since": int("9" * 400)}), "digits"),
    (_held(FAULT).replace(str(T0), "1e999"), "out of range"),
    (_held(FAULT).replace(str(T0), "NaN"), "not a number"),
    (_held({**FAULT, "since": 1e300}), "since"),
    (_held({**FAULT, "since": -1}), "since"),
    (_held({**FAULT, "index": 10 ** 19}), "index"),
    (_held({**FAULT, "index": "0"}), "index"),
    (_held({**FAULT, "index": 1.5}), "index"),
    (_held({**FAULT, "index": True}), "index"),
    (_held({**FAULT, "gpu": None}), "gpu"),
    (_held({**FAULT, "gpu": "G" * 129}), "gpu"),
    (_held({**FAULT, "reason": 7}), "reason"),
    (_held("XidGspTimeout"), "not an object"),
    (json.dumps({"bootID": BOOT, "faults": {"0": FAULT}}), "list of faults"),
    (_held(*[FAULT] * 1000), "bytes"),
], ids=_short)
def test_an_annotation_the_agent_did_not_write_is_refused_by_name_never_raising_else(text: str, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        held_of(_node({HELD_ANNOTATION: text}))


def test_another_boot_or_no_annotation_holds_nothing() -> None:
    assert held_of(_node({HELD_ANNOTATION: _held(FAULT, boot="before-the-reboot")})) == []
    assert held_of(_node({})) == []
    assert held_of({"metadata": {"annotations": {HELD_ANNOTATION: _held(FAULT)}}}) == []  # no bootID known


@pytest.mark.parametrize("text", [
    "[" * 5000 + "]" * 5000, '{"signature": "x", "taints": ' + "9" * 400 + "}", '{"taints": "gpuagent.io"}',
    '{"taints": [1]}', '{"cordoned": "yes"}', '{"signature": 7}', "[]", "not json",
], ids=_short)
def test_a_quarantine_mark_the_agent_did_not_write_is_nothing_of_its_own(text: str) -> None:
    assert ours(_node({QUARANTINE_ANNOTATION: text})) is None


def test_the_agents_own_quarantine_mark_reads_back() -> None:
    mark = {"signature": "XidGspTimeout@GPU-0", "taints": [f"{TAINT_KEY}=fatal:NoSchedule"], "cordoned": True,
            "since": "2025-10-09T08:53:20Z"}
    assert ours(_node({QUARANTINE_ANNOTATION: json.dumps(mark)})) == mark


# --- adopting held faults -------------------------------------------------------------------------------------


def test_a_held_fault_for_a_gpu_not_on_the_node_is_not_adopted() -> None:
    tracker = FaultTracker()
    held = [("XidGspTimeout", ABSENT, 7, T0), ("XidGspTimeout", UUIDS[0], 0, T0)]
    assert tracker.adopt(held, gpus={UUIDS[0], UUIDS[1]}, now=T0 + 60) == 1
    faults, _ = tracker.update(snap(gpu(0), gpu(1), at=T0 + 60), [], T0 + 60)
    assert [(f.reason, f.gpu_uuid) for f in faults] == [("XidGspTimeout", UUIDS[0])]


def test_a_held_fault_with_an_onset_in_the_future_still_clears_at_the_next_reset() -> None:
    tracker, classifier = FaultTracker(), Classifier()
    assert tracker.adopt([("XidGspTimeout", UUIDS[0], 0, 9e10)], gpus={UUIDS[0]}, now=T0) == 1
    away = snap(gpu(0, health=Health.ERROR), at=T0 + 10)  # the reset: the GPU away for a poll...
    tracker.update(away, classifier.observe(away), T0 + 10)
    back = snap(gpu(0), at=T0 + 20)  # ...then answering
    faults, _ = tracker.update(back, classifier.observe(back), T0 + 20)
    assert [f.reason for f in faults] == ["GpuReadError"]  # the read error's hysteresis; the hold is gone


# --- against the (fake) API server ---------------------------------------------------------------------------


class _Agent:
    def __init__(self, api: FakeApiServer) -> None:
        self.now = T0
        self.connection = ApiConnection(config=api.kubeconfig())
        settings = HealthSettings(mode="enforce")
        self.writer = NodeWriter(NODE, self.connection, settings_namespace_mode=settings.namespace_mode,
                                 budget=None, clock=lambda: self.now)
        self.monitor = HealthMonitor(settings, self.writer)

    async def polls(self, n: int, *gpus: Any) -> Any:
        for i in range(n):
            self.now = T0 + i
            self.monitor.update(snap(*gpus, at=self.now))
            await self.writer.round()
        return self.monitor.update(snap(*gpus, at=self.now))


def _boot(api: FakeApiServer) -> str:
    return api.cluster.nodes[NODE]["status"]["nodeInfo"]["bootID"]


def _annotate(api: FakeApiServer, annotations: dict[str, str]) -> None:
    api.cluster.update_node(NODE, lambda n: n["metadata"].setdefault("annotations", {}).update(annotations))


@pytest.mark.integration
async def test_a_forged_held_fault_on_a_gpu_the_node_lacks_quarantines_nothing_and_is_removed() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        forged = {"reason": "XidGspTimeout", "gpu": ABSENT, "index": 0, "since": T0 - 60}
        _annotate(api, {HELD_ANNOTATION: _held(forged, boot=_boot(api))})
        agent = _Agent(api)
        try:
            state = await agent.polls(3, gpu(0), gpu(1))
        finally:
            await agent.connection.aclose()
        node = api.cluster.nodes[NODE]
        assert state.faults == () and state.api == "ok"
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
        assert HELD_ANNOTATION not in node["metadata"]["annotations"]


@pytest.mark.integration
@pytest.mark.parametrize("annotation", [HELD_ANNOTATION, QUARANTINE_ANNOTATION, REMEDIATION_ANNOTATION])
@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"since": ' + "9" * 400 + "}"],
                         ids=["nested", "long-number"])
async def test_a_hostile_annotation_costs_the_writer_no_round(annotation: str, text: str) -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        _annotate(api, {annotation: text})
        agent = _Agent(api)
        lost = gpu(0, health=Health.LOST, health_detail="NVML_ERROR_GPU_IS_LOST")
        try:
            state = await agent.polls(3, lost, gpu(1))
        finally:
            await agent.connection.aclose()
        node = api.cluster.nodes[NODE]
        assert state.api == "ok" and node["spec"]["unschedulable"] is True
        assert any(t["key"] == TAINT_KEY for t in node["spec"]["taints"])
