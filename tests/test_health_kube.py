"""GPU health written to a (fake) API server: conditions, Events, taints, cordon, drain, the remediation
hand-off, the cluster-wide budget with many agents, a person's override, the API server away; the Node as
the real ``kubectl`` shows it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import NODE, FakeApiServer
from fake_cluster import make_node
from test_health import UUIDS, gpu, snap
from test_health import validate_node as _validate

from gpuagent.health import HealthMonitor, HealthSettings, table
from gpuagent.health.budget import LEASE_NAME, QuarantineBudget, live_slots
from gpuagent.health.node import QUARANTINE_ANNOTATION, REMEDIATION_ANNOTATION
from gpuagent.health.plan import TAINT_KEY
from gpuagent.health.writer import NodeWriter
from gpuagent.kubeapi import ApiConnection
from gpuagent.snapshot.gpu import Health, RemappedRows, XidRecord
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import PodUse

pytestmark = pytest.mark.integration
T0 = 1_760_000_000.0

LOST = gpu(0, health=Health.LOST, health_detail="NVML_ERROR_GPU_IS_LOST")
POD_A = PodUse("train-a", "ml", "uid-a", allocated_gpus=(UUIDS[0],))


class Rig:
    """One agent's health (monitor + writer) against the fake API server."""

    def __init__(self, api: FakeApiServer, node: str = NODE, *, budget: int | None = None,
                 **settings: Any) -> None:
        settings.setdefault("mode", "enforce")
        self.settings = HealthSettings(**settings)
        self.connection = ApiConnection(config=api.kubeconfig())
        quota = None if budget is None else QuarantineBudget(self.connection, node, namespace="gpuagent",
                                                             limit=budget, clock=lambda: self.now)
        self.writer = NodeWriter(node, self.connection, settings_namespace_mode=self.settings.namespace_mode,
                                 budget=quota, clock=lambda: self.now)
        self.monitor = HealthMonitor(self.settings, self.writer)
        self.now = T0

    async def poll(self, snapshot: NodeSnapshot, rounds: int = 1) -> Any:
        """As the agent: a poll (the monitor's update), the writer's round, ``rounds`` times; then the state
        of one more poll of the same snapshot (what the writer achieved)."""
        self.now = snapshot.taken_at_unix
        state = self.monitor.update(snapshot)
        for _ in range(rounds):
            await self.writer.round()
            state = self.monitor.update(snapshot)
        return state


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"]["conditions"]}


async def test_enforce_sets_conditions_events_taint_cordon_and_handoff_then_recovery_clears_them() -> None:
    human = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE, taints=[human]))
        rig = Rig(api)
        xid79 = gpu(0, xid=XidRecord(79, T0, {79: 1}, {79: 1}))
        state = await rig.poll(snap(xid79, gpu(1), pods=(POD_A,)))
        node = api.cluster.nodes[NODE]
        _validate(node)
        hw = _conditions(node)["GpuHardwareHealthy"]
        assert (hw["status"], hw["reason"]) == ("False", "XidFallenOffBus") and UUIDS[0] in hw["message"]
        assert _conditions(node)["Ready"]["status"] == "True"  # the kubelet's conditions are kept
        assert node["spec"]["unschedulable"] is True
        assert human in node["spec"]["taints"]
        assert {"key": TAINT_KEY, "value": "fatal", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert json.loads(node["metadata"]["annotations"][REMEDIATION_ANNOTATION])["action"] == "reboot"
        events = [(e.body["regarding"]["kind"], e.body["reason"], e.status) for e in api.events]
        assert events == [("Node", "XidFallenOffBus", 201), ("Pod", "XidFallenOffBus", 201),
                          ("Node", "GpuQuarantined", 201)]
        assert api.events[1].namespace == "ml" and api.events[0].namespace == "default"
        assert state.cordoned and state.quarantined and state.api == "ok" and state.remediation == "reboot"
        # the GPU is lost, then comes back after a reset: everything the agent set goes, the rest stays
        await rig.poll(snap(gpu(0, health=Health.LOST), gpu(1), at=T0 + 5))
        state = await rig.poll(snap(gpu(0), gpu(1), at=T0 + 600))
        node = api.cluster.nodes[NODE]
        _validate(node)
        assert all(_conditions(node)[c]["status"] == "True" for c in table.CONDITIONS)
        assert node["spec"]["taints"] == [human] and "unschedulable" not in node["spec"]
        assert not {QUARANTINE_ANNOTATION, REMEDIATION_ANNOTATION} & set(node["metadata"]["annotations"])
        assert not state.cordoned and not state.quarantined and state.severity == "ok"
        assert [e.body["reason"] for e in api.events][-2:] == ["GpuLost", "GpuQuarantineLifted"]


async def test_audit_mode_reports_and_writes_nothing() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        before = json.dumps(api.cluster.nodes[NODE], sort_keys=True)
        rig = Rig(api, mode="audit")
        state = await rig.poll(snap(LOST, pods=(POD_A,)), rounds=0)
        assert state.cordoned and state.taints and state.drain == "audit" and state.api == "off"
        await asyncio.sleep(0)
        assert api.cluster.node_patches == [] and api.events == [] and api.evictions == []
        assert json.dumps(api.cluster.nodes[NODE], sort_keys=True) == before


async def test_a_degraded_gpu_taints_without_cordoning_and_thermal_clears_after_hysteresis() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        rig = Rig(api, clear_after=60)
        hot = gpu(1, clock_event_reasons=table.CLOCKS_EVENT_HW_THERMAL)
        await rig.poll(snap(gpu(0), hot))
        node = api.cluster.nodes[NODE]
        assert _conditions(node)["GpuThermalHealthy"]["reason"] == "ThermalSlowdown"
        assert node["spec"]["taints"] == [{"key": TAINT_KEY, "value": "degraded", "effect": "NoSchedule"}]
        assert "unschedulable" not in node["spec"]
        await rig.poll(snap(gpu(0), gpu(1), at=T0 + 30))
        assert api.cluster.nodes[NODE]["spec"].get("taints")  # still inside the hysteresis
        await rig.poll(snap(gpu(0), gpu(1), at=T0 + 61))
        assert "taints" not in api.cluster.nodes[NODE]["spec"]


async def test_the_drain_honours_a_pdb_and_the_namespace_modes() -> None:
    pods = (POD_A, PodUse("etl", "batch", "uid-b", allocated_gpus=(UUIDS[0],)),
            PodUse("dcgm", "kube-system", "uid-c", used_gpus=(UUIDS[0],)),
            PodUse("other-gpu", "ml", "uid-d", allocated_gpus=(UUIDS[1],)))
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        api.pdb_blocks("ml", "train-a")
        rig = Rig(api, namespace_modes={"batch": "wait", "kube-system": "skip"})
        state = await rig.poll(snap(LOST, gpu(1), pods=pods))
        assert state.drain == "blocked"
        assert [(e.namespace, e.name, e.status) for e in api.evictions] == [("ml", "train-a", 429)]
        api.pdb_blocks("ml", "train-a", blocked=False)
        state = await rig.poll(snap(LOST, gpu(1), pods=pods, at=T0 + 5))
        assert [(e.name, e.status) for e in api.evictions] == [("train-a", 429), ("train-a", 201)]
        assert state.drain == "draining"  # train-a terminating, etl left to finish
        state = await rig.poll(snap(LOST, gpu(1), pods=pods[1:], at=T0 + 10))  # train-a is gone
        assert state.drain == "waiting"
        state = await rig.poll(snap(LOST, gpu(1), pods=pods[2:], at=T0 + 20))  # etl finished
        assert state.drain == "done"
        assert {e.name for e in api.evictions} == {"train-a"}  # never etl, dcgm, or a pod of a healthy GPU


async def test_a_manual_uncordon_is_respected_until_the_fault_changes() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        rig = Rig(api, drain_at="never")
        await rig.poll(snap(LOST, gpu(1)))
        assert api.cluster.nodes[NODE]["spec"]["unschedulable"] is True

        def uncordon(node: dict[str, Any]) -> None:
            node["spec"].pop("unschedulable")
        api.cluster.update_node(NODE, uncordon)
        state = await rig.poll(snap(LOST, gpu(1), at=T0 + 40))
        assert "unschedulable" not in api.cluster.nodes[NODE]["spec"] and state.manual_override
        worse = gpu(1, remapped_rows=RemappedRows(0, 4, False, True))
        state = await rig.poll(snap(LOST, worse, at=T0 + 80))
        assert api.cluster.nodes[NODE]["spec"]["unschedulable"] is True and not state.manual_override


async def test_a_concurrent_change_to_the_node_is_not_overwritten() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        rig = Rig(api)
        rig.monitor.update(snap(LOST))
        # someone adds a taint between the agent's read and its write: the write is refused (409), read again
        original = rig.connection.send_json

        async def write_then_change(method: str, path: str, body: Any, **kw: Any) -> Any:
            answer = await original(method, path, body, **kw)
            if path.endswith("/status"):
                api.cluster.update_node(NODE, lambda n: n["spec"].setdefault("taints", []).append(
                    {"key": "other", "effect": "NoSchedule"}))
                rig.connection.send_json = original
            return answer
        rig.connection.send_json = write_then_change
        await rig.writer.round()
        assert [p.status for p in api.cluster.node_patches if not p.subresource] == [409]
        await rig.writer.round()
        taints = api.cluster.nodes[NODE]["spec"]["taints"]
        assert {"key": "other", "effect": "NoSchedule"} in taints and any(t["key"] == TAINT_KEY for t in taints)


async def test_the_cluster_budget_stops_a_fleet_wide_fault_at_its_limit() -> None:
    nodes = [f"gpu-{i:02d}" for i in range(12)]
    async with FakeApiServer() as api:
        for name in nodes:
            api.cluster.add_node(make_node(name))
        rigs = [Rig(api, name, budget=3, drain_at="never") for name in nodes]
        states = await asyncio.gather(*(r.poll(snap(LOST)) for r in rigs))  # every node at once
        cordoned = [n for n in nodes if api.cluster.nodes[n]["spec"].get("unschedulable")]
        assert len(cordoned) == 3
        assert sum(s.quarantined for s in states) == 3 and sum(s.budget_deferred for s in states) == 9
        deferred = [e for e in api.events if e.body["reason"] == "GpuQuarantineDeferred"]
        assert len(deferred) == 9 and "budget (3 nodes)" in deferred[0].body["note"]
        assert all(_conditions(api.cluster.nodes[n])["GpuHardwareHealthy"]["status"] == "False" for n in nodes)
        lease = api.cluster.leases[("gpuagent", LEASE_NAME)]
        assert sorted(live_slots(lease["metadata"]["annotations"], T0, ttl=900, max_skew=300)) == sorted(cordoned)
        assert ("PUT", 409) in api.cluster.lease_writes or ("POST", 409) in api.cluster.lease_writes
        # the three recover: their slots go back and three others take them
        for rig in rigs:
            if rig.writer.node in cordoned:
                await rig.poll(snap(gpu(0), at=T0 + 100))
        await asyncio.gather(*(r.poll(snap(LOST, at=T0 + 101)) for r in rigs if r.writer.node not in cordoned))
        now_cordoned = [n for n in nodes if api.cluster.nodes[n]["spec"].get("unschedulable")]
        assert len(now_cordoned) == 3 and not set(now_cordoned) & set(cordoned)


async def test_the_api_server_away_never_blocks_the_poll_and_writes_resume() -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        rig = Rig(api)
        await api.stop()
        state = await rig.poll(snap(LOST))  # the round fails fast; the poll's update never waits on it
        assert state.api.startswith("failing") and state.severity == "fatal"
        await api.start()
        state = await rig.poll(snap(LOST, at=T0 + 5))
        assert state.api == "ok" and api.cluster.nodes[NODE]["spec"]["unschedulable"] is True
        api.cluster.fail_node_writes(503)
        state = await rig.poll(snap(LOST, gpu(1, clock_event_reasons=table.CLOCKS_EVENT_HW_THERMAL), at=T0 + 9))
        assert "503" in state.api


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_get_and_describe_show_the_conditions_and_taints(tmp_path: Path) -> None:
    async with FakeApiServer(token=None) as api:  # kubectl sends no bearer token over plain HTTP
        api.cluster.add_node(make_node(NODE))
        await Rig(api).poll(snap(gpu(0, remapped_rows=RemappedRows(0, 1, False, True)), gpu(1)))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}

        def kubectl(*args: str) -> str:
            done = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout
        out = await asyncio.to_thread(kubectl, "get", "node", NODE, "-o", "yaml")
        assert "type: GpuHardwareHealthy" in out and "reason: RowRemapFailure" in out
        assert f"key: {TAINT_KEY}" in out and "unschedulable: true" in out
        columns = await asyncio.to_thread(kubectl, "get", "node", NODE, "-o",
                                          "custom-columns=NAME:.metadata.name,HW:.status.conditions[?(@.type=="
                                          "'GpuHardwareHealthy')].reason")
        assert "RowRemapFailure" in columns
        described = await asyncio.to_thread(kubectl, "describe", "node", NODE)
        assert re.search(rf"Taints:\s+{TAINT_KEY}=fatal:NoSchedule", described)
        assert re.search(r"Unschedulable:\s+true", described)
        assert re.search(r"GpuHardwareHealthy\s+False .* RowRemapFailure\s+GPU 0 ", described)


async def test_a_restarted_agent_keeps_holding_until_a_reset_and_a_reboot_is_one() -> None:
    xid119 = gpu(0, xid=XidRecord(119, T0, {119: 1}, {119: 1}))
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        first = Rig(api)
        await first.poll(snap(xid119, gpu(1)))
        await first.poll(snap(xid119, gpu(1), at=T0 + 5))  # no new XID: held, waiting for a reset
        node = api.cluster.nodes[NODE]
        _validate(node)
        driver = _conditions(node)["GpuDriverHealthy"]
        assert (driver["status"], driver["reason"]) == ("False", "XidGspTimeout")
        assert "gpuagent.io/held-faults" in node["metadata"]["annotations"]
        # the agent restarts (a DaemonSet rollout): its memory is empty, the GPU answers, no reset happened
        second = Rig(api)
        state = await second.poll(snap(gpu(0), gpu(1), at=T0 + 60), rounds=2)
        node = api.cluster.nodes[NODE]
        assert _conditions(node)["GpuDriverHealthy"]["status"] == "False" and node["spec"]["unschedulable"]
        assert [f.reason for f in state.faults] == ["XidGspTimeout"] and state.faults[0].held_until_reset
        # the node reboots (a new bootID): that is the reset; the next agent clears what the last one set
        api.cluster.update_node(NODE, lambda n: n["status"]["nodeInfo"].update(bootID="after-the-reboot"))
        third = Rig(api)
        state = await third.poll(snap(gpu(0), gpu(1), at=T0 + 600), rounds=2)
        node = api.cluster.nodes[NODE]
        assert _conditions(node)["GpuDriverHealthy"]["status"] == "True" and "unschedulable" not in node["spec"]
        assert "gpuagent.io/held-faults" not in node["metadata"]["annotations"] and state.faults == ()
