"""examples/scenarios/health.yaml walked through in scenario time by the real agent (simulated NVML) against
the fake API server: each fault gives its condition, taint and cordon in enforce, and only reports in audit."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import NODE, FakeApiServer
from fake_cluster import make_node
from simclock import FakeClock
from test_agent_sim import make_agent, wait_for

from gpuagent.export.exposition import generate_text
from gpuagent.health.node import REMEDIATION_ANNOTATION
from gpuagent.health.plan import TAINT_KEY

pytestmark = pytest.mark.integration
HEALTH = Path(__file__).resolve().parents[1] / "examples" / "scenarios" / "health.yaml"


def _conditions(node: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in node["status"]["conditions"]}


def _agent(api: FakeApiServer, tmp_path: Path, clock: FakeClock, mode: str, **overrides: Any) -> Any:
    agent, _ = make_agent(HEALTH, clock, health_mode=mode, kubernetes_api="on", hostname=NODE,
                          kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                          pod_resources_socket=None, **overrides)
    return agent


async def _poll_at(agent: Any, clock: FakeClock, t: float) -> Any:
    clock.t = t
    await asyncio.sleep(0.06)  # past slow_poll_interval: ECC, remapped rows and NVLink are read again
    snapshot = await agent.poll_once()
    if agent.health.writer is not None:
        await agent.health.writer.round()
    return snapshot


async def test_the_health_scenario_in_enforce_mode(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        clock = FakeClock(start=0.0)
        agent = _agent(api, tmp_path, clock, "enforce", health_clear_after=0.01, health_quarantine_budget=5)
        try:
            snap = await _poll_at(agent, clock, 5.0)
            assert snap.health.severity == "ok" and agent.health.writer.status.api == "ok"
            ours = {k: v for k, v in _conditions(api.cluster.nodes[NODE]).items() if k.startswith("Gpu")}
            assert len(ours) == 4 and all(s == "True" for s, _ in ours.values())

            snap = await _poll_at(agent, clock, 21.0)  # GPU 0 hot
            node = api.cluster.nodes[NODE]
            assert _conditions(node)["GpuThermalHealthy"] == ("False", "ThermalSlowdown")
            assert node["spec"]["taints"] == [{"key": TAINT_KEY, "value": "degraded", "effect": "NoSchedule"}]
            assert "unschedulable" not in node["spec"]
            assert snap.hints.gpus[0].health == "degraded" and snap.hints.gpus[0].fault == "ThermalSlowdown"

            await _poll_at(agent, clock, 31.0)  # GPU 1's links 2 and 5 down
            assert _conditions(api.cluster.nodes[NODE])["GpuInterconnectHealthy"] == ("False", "NvlinkDown")

            clock.t = 46.0
            await wait_for(lambda: agent.devices.xids.record_for(2).totals.get(48) == 1)
            snap = await _poll_at(agent, clock, 46.0)  # GPU 2: DBE, XID 48, then the remapper fails
            node = api.cluster.nodes[NODE]
            assert _conditions(node)["GpuHardwareHealthy"] == ("False", "RowRemapFailure")
            assert node["spec"]["unschedulable"] is True
            assert {"key": TAINT_KEY, "value": "fatal", "effect": "NoSchedule"} in node["spec"]["taints"]
            assert json.loads(node["metadata"]["annotations"][REMEDIATION_ANNOTATION])["action"] == "replace"
            reasons = {f.reason for f in snap.health.faults if f.gpu_index == 2}
            assert {"XidDoubleBitEcc", "EccUncorrectable", "RowRemapFailure"} <= reasons

            clock.t = 52.0
            await wait_for(lambda: agent.devices.xids.record_for(3).totals.get(79) == 1)
            snap = await _poll_at(agent, clock, 52.0)  # GPU 3 fell off the bus
            assert {"XidFallenOffBus", "GpuLost"} <= {f.reason for f in snap.health.faults if f.gpu_index == 3}
            assert _uuid_of(snap, 3) in _message(api.cluster.nodes[NODE], "GpuHardwareHealthy")

            await _poll_at(agent, clock, 65.0)  # GPU 0 cooled down: its condition clears, the rest stay
            node = api.cluster.nodes[NODE]
            assert _conditions(node)["GpuThermalHealthy"] == ("True", "NoGpuFault")
            assert _conditions(node)["GpuHardwareHealthy"][0] == "False" and node["spec"]["unschedulable"] is True
            body = generate_text(agent.registry).decode()
            host = f'Hostname="{NODE}"'
            assert f'gpuagent_node_gpu_condition_healthy{{{host},condition="GpuHardwareHealthy"}} 0.0' in body
            assert f"gpuagent_node_gpu_quarantined{{{host}}} 1.0" in body
            assert [e.body["reason"] for e in api.events][:1] == ["ThermalSlowdown"]
        finally:
            await agent.devices.close()
            await agent.health.writer.aclose()


async def test_the_health_scenario_in_audit_mode_writes_nothing(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        clock = FakeClock(start=0.0)
        agent = _agent(api, tmp_path, clock, "audit")
        try:
            await _poll_at(agent, clock, 21.0)  # the XID watcher starts with the first poll
            clock.t = 46.0
            await wait_for(lambda: agent.devices.xids.record_for(2).totals.get(48) == 1)
            snap = await _poll_at(agent, clock, 46.0)
            assert agent.health.writer is None
            assert snap.health.severity == "fatal" and snap.health.cordoned and snap.health.remediation == "replace"
            assert {c.type for c in snap.health.conditions if c.status == "False"} == {
                "GpuHardwareHealthy", "GpuInterconnectHealthy", "GpuThermalHealthy"}
            assert api.cluster.node_patches == [] and api.events == []
        finally:
            await agent.devices.close()


def _uuid_of(snapshot: Any, index: int) -> str:
    return snapshot.gpus[index].info.uuid


def _message(node: dict[str, Any], condition: str) -> str:
    return next(c["message"] for c in node["status"]["conditions"] if c["type"] == condition)


async def test_the_serving_agent_polls_on_while_the_api_server_is_away_then_catches_up(tmp_path: Path) -> None:
    import aiohttp
    import yaml
    from test_faults import free_port

    from gpuagent.agent import Agent
    from gpuagent.config import load_config
    from gpuagent.devices.sim import SimulatedNvml, load_scenario

    scenario = tmp_path / "node.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "remap", "gpus": [{"model": "H100-SXM5-80GB",
                                        "count": 2}], "faults": [{"row_remap_failure": {"gpu": 1, "at": 0}}]}))
    api = FakeApiServer()
    await api.start()
    api.cluster.add_node(make_node(NODE))
    await api.stop()  # away from the start: its port refuses
    port = free_port()
    config = load_config(None, env={}, overrides={
        "backend": "sim", "scenario": str(scenario), "listen": f"127.0.0.1:{port}", "poll_interval": 0.1,
        "hostname": NODE, "health_mode": "enforce", "kubernetes_api": "on", "pod_resources_socket": None,
        "kubeconfig": str(api.write_kubeconfig(tmp_path / "kubeconfig")), "idle_events": "off",
        "journal_path": str(tmp_path / "journal.json")})
    agent = Agent(config, nvml=SimulatedNvml(load_scenario(scenario)), backend="sim")
    agent.health.writer.retry_seconds = 0.1
    stop = asyncio.Event()
    serving = asyncio.create_task(agent.serve(stop))

    async def state() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/v1/state") as response:
            return await response.json() if response.status == 200 else {}
    try:
        await wait_for(lambda: agent.latest is not None and agent.latest.polls_total >= 5, timeout=20)
        first = await state()
        assert first["health"]["severity"] == "fatal" and first["health"]["api"].startswith("failing")
        await wait_for(lambda: agent.latest.polls_total >= first["polls_total"] + 5, timeout=20)  # polls go on
        await api.start()  # back, on the same port
        await wait_for(lambda: api.cluster.nodes[NODE]["spec"].get("unschedulable") is True, timeout=20)
        conditions = _conditions(api.cluster.nodes[NODE])
        assert conditions["GpuHardwareHealthy"] == ("False", "RowRemapFailure")
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
        await api.stop()


def test_the_new_fault_kinds_are_checked_against_the_gpus() -> None:
    from gpuagent.devices.sim.scenario import ScenarioError, parse_scenario

    def problems(faults: list[dict[str, Any]], model: str = "H100-SXM5-80GB") -> str:
        with pytest.raises(ScenarioError) as caught:
            parse_scenario({"version": 1, "name": "bad", "gpus": [{"model": model}], "faults": faults})
        return str(caught.value)

    assert "has 18 NVLink links (0-based): no link 18" in problems([{"nvlink_down": {"gpu": 0, "at": 1,
                                                                                       "links": [2, 18]}}])
    assert "faults[0].row_remap_failure" in problems([{"row_remap_failure": {"gpu": 0, "at": 1}}], model="T4")
    assert "faults[0].nvlink_down" in problems([{"nvlink_down": {"gpu": 0, "at": 1}}])  # links required
