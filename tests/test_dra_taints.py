"""A DRA driver's device taints (KEP-5055) read from its ResourceSlices: parsed defensively (a bad taint costs
itself, never the slice nor the poll), put on their GPUs by UUID, and classified like the agent's own faults:
the GPU is not offered, and the Node is touched only when the policy says so."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import NODE, FakeApiServer, eventually, gpu_device, make_slice, metadata_runner
from fake_cluster import make_node
from podresources_server import PodResourcesServer, short_socket_dir
from test_health import DOCS, UUIDS, gpu, snap
from test_health_kube import Rig

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export.exposition import generate_text
from gpuagent.health import HealthMonitor, HealthSettings, table
from gpuagent.health.classify import Classifier, dra_observations
from gpuagent.health.plan import TAINT_KEY
from gpuagent.hints.engine import HintsEngine
from gpuagent.hints.score import parse_fit_request, score_node
from gpuagent.pods.dra.resolver import TAINTS_SOURCE, DraResolver
from gpuagent.pods.dra.slices import ResourceSlices, SliceDevice
from gpuagent.pods.dra.taints import MAX_TAINTS, DeviceTaint, parse_taints, tainted_gpus
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import DraTaint, PodUse
from gpuagent.snapshot.views import to_jsonable

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
DRIVER = "gpu.nvidia.com"
T0 = 1_760_000_000.0


def fixture(api_version: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"resourceslice-{api_version}-taints.json").read_text())


def on_node(slice_body: dict[str, Any], node: str = NODE) -> dict[str, Any]:
    """The fixture slice as this test node's."""
    body = copy.deepcopy(slice_body)
    body["spec"]["nodeName"] = body["spec"]["pool"]["name"] = node
    return body


def with_taints(snapshot: NodeSnapshot, *taints: DraTaint) -> NodeSnapshot:
    return replace(snapshot, dra_taints=taints)


def taint(effect: str, gpu_index: int = 0, *, key: str = "gpu.nvidia.com/xid", value: str = "79",
          device: str | None = None) -> DraTaint:
    return DraTaint(DRIVER, NODE, device or f"gpu-{gpu_index}", key, value, effect, UUIDS[gpu_index],
                    time_added="2026-11-02T09:14:07Z")


# -- parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "error"), [
    ({"key": "a"}, "taints is a dict, not a list"),
    ("NoSchedule", "taints is a str, not a list"),
    (["x"], "taint 0: a str, not an object"),
    ([{"key": 7, "effect": "NoSchedule"}], "taint 0: key is a int, not a string"),
    ([{"key": "a", "effect": ["NoSchedule"]}], "taint 0: effect is a list, not a string"),
    ([{"effect": "NoSchedule"}], "taint 0: no key"),
    ([{"key": "a", "value": "1"}], "taint 0: no effect"),
    ([{"key": "a\nb", "effect": "NoSchedule"}], "taint 0: key is not a label-like string (3 characters)"),
    ([{"key": "a" * 400, "effect": "NoSchedule"}], "taint 0: key is not a label-like string (400 characters)"),
])
def test_a_malformed_taint_is_left_out_with_what_was_wrong(raw: Any, error: str) -> None:
    assert parse_taints(raw) == ((), (error,))


def test_good_taints_beside_a_bad_one_are_kept_and_unknown_effects_as_written() -> None:
    taints, errors = parse_taints([{"key": "k", "effect": "NoExecute", "timeAdded": "2026-11-02T09:00:00Z"}, 3,
                                   {"key": "k2", "value": "v", "effect": "PreferNoSchedule"}])
    assert taints == (DeviceTaint("k", "", "NoExecute", "2026-11-02T09:00:00Z"),
                      DeviceTaint("k2", "v", "PreferNoSchedule"))
    assert errors == ("taint 1: a int, not an object",)
    assert parse_taints(None) == ((), ()) and parse_taints([]) == ((), ())
    many, errors = parse_taints([{"key": f"k{i}", "effect": "None"} for i in range(MAX_TAINTS + 2)])
    assert len(many) == MAX_TAINTS and errors == (f"{MAX_TAINTS + 2} taints, more than {MAX_TAINTS}: the first "
                                                  f"{MAX_TAINTS} are read",)


def test_tainted_devices_fall_on_their_gpu_by_uuid_attributes() -> None:
    t = (DeviceTaint("gpu.nvidia.com/xid", "79", "NoSchedule"),)
    devices = [
        ((DRIVER, NODE, "gpu-0"), SliceDevice(UUIDS[0], type="gpu", slice="s1", taints=t)),
        ((DRIVER, NODE, "gpu-1-mig-9-4-4"), SliceDevice("MIG-1", parent_uuid=UUIDS[1], type="mig", slice="s1",
                                                        taints=t)),
        ((DRIVER, NODE, "gpu-2"), SliceDevice(UUIDS[2], type="gpu", slice="s1")),  # untainted: nothing
        ((DRIVER, NODE, "gpu-3-mig-9-0-4"), SliceDevice("MIG-2", type="mig", slice="s1", taints=t)),
        ((DRIVER, NODE, "gpu-9"), SliceDevice("GPU-elsewhere", type="gpu", slice="s1", taints=t)),
    ]
    found, problems = tainted_gpus(devices, UUIDS)
    assert [(d.device, d.gpu_uuid, d.mig_uuid, d.slice) for d in found] == [
        ("gpu-0", UUIDS[0], None, "s1"), ("gpu-1-mig-9-4-4", UUIDS[1], "MIG-1", "s1")]
    assert problems == (f"{DRIVER}/{NODE}/gpu-3-mig-9-0-4: tainted, but its slice gives no GPU UUID",
                        f"{DRIVER}/{NODE}/gpu-9: tainted, but its GPU GPU-elsewhere is not on this node")


# -- from the API server --------------------------------------------------------------------------------------
@pytest.fixture
async def watch(api: FakeApiServer) -> AsyncIterator[Callable[..., ResourceSlices]]:
    async with metadata_runner(api, ResourceSlices, drivers=(DRIVER,)) as start:
        yield start


@pytest.mark.parametrize("api_version", ["v1", "v1beta2"])
async def test_nvidia_driver_slices_give_their_taints(api: FakeApiServer, watch, api_version: str) -> None:
    body = on_node(fixture(api_version))
    api.add_slice(body)
    slices = watch(wanted=True)
    await eventually(lambda: slices.synced)
    view = slices.devices()
    gpu0 = view[(DRIVER, NODE, "gpu-0")]
    assert gpu0.taints == (DeviceTaint("gpu.nvidia.com/xid", "79", "NoSchedule", "2026-11-02T09:14:07Z"),
                           DeviceTaint("gpu.nvidia.com/xid", "43", "None", "2026-11-02T09:10:00Z"))
    part = view[(DRIVER, NODE, "gpu-1-mig-9-4-4")]
    assert part.taints == (DeviceTaint("example.com/maintenance", "", "NoExecute", "2026-11-02T09:20:00Z"),)
    lost = (DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoSchedule", "2026-11-02T09:30:00Z"),)
    assert view[(DRIVER, NODE, "gpu-2")].taints == (lost if api_version == "v1beta2" else ())
    assert all(not d.taint_errors for d in view.values())

    uuids = [d["attributes"]["uuid"]["string"] for d in body["spec"]["devices"] if d["name"] != "gpu-1-mig-9-4-4"]
    parent = body["spec"]["devices"][1]["attributes"]["parentUUID"]["string"]
    found, problems = tainted_gpus(view.items(), [uuids[0], parent, uuids[1]])
    assert problems == ()
    assert {(t.device, t.key, t.effect) for t in found} >= {("gpu-0", "gpu.nvidia.com/xid", "NoSchedule"),
                                                            ("gpu-1-mig-9-4-4", "example.com/maintenance",
                                                             "NoExecute")}


async def test_a_malformed_taint_costs_itself_not_the_slice_and_is_named_once(
        api: FakeApiServer, watch, caplog: pytest.LogCaptureFixture) -> None:
    bad = gpu_device("gpu-1", UUIDS[1])
    bad["taints"] = {"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}  # an object, not a list
    good = gpu_device("gpu-0", UUIDS[0])
    good["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}, {"key": 1}]
    api.add_slice(make_slice(NODE, [good, bad], name="broken"))
    slices = watch(wanted=True)
    resolver = DraResolver(slices=slices)
    await eventually(lambda: slices.synced)
    assert slices.status == (True, "")  # the slice itself is read
    gpus = (gpu(0), gpu(1))
    taints, status = resolver.taints(gpus)
    assert [(t.device, t.value) for t in taints] == [("gpu-0", "48")]
    assert status is not None and status.name == TAINTS_SOURCE and not status.ok
    assert status.error == (f"2 device taint(s) left out: {DRIVER}/{NODE}/gpu-0 (slice broken): taint 1: key is a "
                            f"int, not a string; {DRIVER}/{NODE}/gpu-1 (slice broken): taints is a dict, not a list")
    for _ in range(3):
        assert resolver.taints(gpus) == (taints, status)
    assert sum("DRA device taints: 2 left out" in r.message for r in caplog.records) == 1


# -- classification -------------------------------------------------------------------------------------------
def test_no_schedule_is_degraded_no_execute_fatal_and_informational_taints_are_none() -> None:
    index = {UUIDS[0]: 0, UUIDS[1]: 1}
    found = dra_observations([taint("NoSchedule"), taint("None", value="43"), taint("PreferNoSchedule"),
                              taint("NoExecute", 1, key="example.com/maintenance", value=""),
                              taint("NoSchedule", 1, device="gpu-1-mig-9-4-4"),
                              taint("NoSchedule", 1, key="gpu.nvidia.com/gpu-lost", value="")], index)
    assert [(o.rule.reason, o.rule.severity, o.rule.condition, o.gpu_index) for o in found] == [
        ("DraDeviceTainted", "degraded", None, 0), ("DraDeviceTainted", "degraded", None, 1),
        ("DraDeviceTaintedNoExecute", "fatal", None, 1)]
    assert found[1].message == ("the DRA driver tainted the device NoSchedule: gpu.nvidia.com device gpu-1 "
                                "gpu.nvidia.com/gpu-lost:NoSchedule since 2026-11-02T09:14:07Z; gpu.nvidia.com "
                                "device gpu-1-mig-9-4-4 gpu.nvidia.com/xid=79:NoSchedule since "
                                "2026-11-02T09:14:07Z")
    classified = dra_observations([taint("NoSchedule", value="119"), taint("NoExecute", 1, key="x/y", value="")],
                                  index, classify=True)
    assert [o.rule.condition for o in classified] == [table.DRIVER, table.HARDWARE]
    assert dra_observations([taint("NoSchedule", 3)], index) == []  # a GPU not in this poll


def test_the_classifier_reads_them_as_a_source_of_its_own_unless_off() -> None:
    node = with_taints(snap(gpu(0), gpu(1)), taint("NoSchedule"))
    assert [o.rule.reason for o in Classifier().observe(node)] == ["DraDeviceTainted"]
    assert Classifier(dra_taints="off").observe(node) == []
    with pytest.raises(ValueError, match="dra_taints must be one of"):
        Classifier(dra_taints="on")


def offered(monitor: HealthMonitor, snapshot: Any) -> dict[str, str]:
    hints = HintsEngine().update(replace(snapshot, health=monitor.update(snapshot)))
    assert hints is not None
    return {g.uuid: g.health for g in hints.gpus if g.memory_free_bytes}


def test_report_takes_the_gpu_off_offer_without_touching_the_node_then_gives_it_back() -> None:
    monitor = HealthMonitor(HealthSettings(mode="audit", clear_after=300.0))
    assert set(offered(monitor, snap(gpu(0), gpu(1)))) == {UUIDS[0], UUIDS[1]}
    tainted = with_taints(snap(gpu(0), gpu(1), at=T0 + 1), taint("NoExecute"))
    state = monitor.update(tainted)
    assert state.unhealthy_gpus == (UUIDS[0],) and state.severity == "ok"  # no node condition: no quarantine
    assert not state.taints and not state.cordoned and state.drain == "none" and state.remediation is None
    assert all(c.status == "True" for c in state.conditions)
    assert [(f.reason, f.severity, f.condition) for f in state.faults] == [
        ("DraDeviceTaintedNoExecute", "fatal", None)]
    assert set(offered(monitor, with_taints(snap(gpu(0), gpu(1), at=T0 + 2), taint("NoExecute")))) == {UUIDS[1]}
    # the driver lifts its taint: the GPU is offered again at once (a taint does not flap: no hysteresis)
    state = monitor.update(snap(gpu(0), gpu(1), at=T0 + 3))
    assert state.faults == () and state.unhealthy_gpus == ()
    assert set(offered(monitor, snap(gpu(0), gpu(1), at=T0 + 4))) == {UUIDS[0], UUIDS[1]}


def test_classify_counts_for_the_node_by_the_policy_of_its_severity() -> None:
    monitor = HealthMonitor(HealthSettings(mode="audit", dra_taints="classify"))
    state = monitor.update(with_taints(snap(gpu(0), gpu(1)), taint("NoSchedule")))
    hardware = next(c for c in state.conditions if c.type == table.HARDWARE)
    assert (hardware.status, hardware.reason, hardware.gpus) == ("False", "DraDeviceTainted", (UUIDS[0],))
    assert state.taints == (f"{TAINT_KEY}=degraded:NoSchedule",) and not state.cordoned  # degraded's policy
    state = monitor.update(with_taints(snap(gpu(0), gpu(1), at=T0 + 1), taint("NoExecute")))
    assert state.severity == "fatal" and state.cordoned and state.drain == "audit"  # fatal's policy
    assert state.remediation is None  # the agent hands off nothing for a driver's taint: action none


def test_the_docs_name_the_dra_rules_and_the_config_key() -> None:
    text = (DOCS / "health.md").read_text()
    for rule in table.DRA_RULES.values():
        assert f"`{rule.reason}`" in text and rule.source
    assert "`health_dra_taints`" in (DOCS / "configuration.md").read_text()



# -- through the whole agent ---------------------------------------------------------------------------------
SCENARIO = {"version": 1, "name": "dra-taints", "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],
            "processes": []}


def hinted(snapshot: NodeSnapshot) -> dict[str, tuple[str, int]]:
    assert snapshot.hints is not None
    return {g.uuid: (g.health, g.memory_free_bytes) for g in snapshot.hints.gpus}


@pytest.mark.integration
async def test_a_taint_added_mid_run_takes_the_gpu_off_offer_then_its_removal_gives_it_back(
        tmp_path: Path) -> None:
    """The agent in audit, its GPUs given by a DRA driver: the driver taints GPU 0 (a watch event), the hints
    stop offering it and every view shows the fault; the driver lifts the taint, the GPU is offered again;
    nothing is ever written to the API server."""
    scenario = tmp_path / "dra-taints.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        stored = api.add_slice(make_slice(NODE, [gpu_device(f"gpu-{i}", u) for i, u in enumerate(uuids)]))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with short_socket_dir() as directory:
            socket = directory / "kubelet.sock"
            config = load_config(None, env={}, overrides={
                "backend": "sim", "scenario": str(scenario), "proc_root": str(tmp_path),
                "pod_resources_socket": str(socket), "kubernetes_api": "on", "kubeconfig": str(kubeconfig),
                "dra_resource_slices": "on", "cdi_spec_dirs": "none", "hostname": NODE, "network": False,
                "idle_events": "off", "health_mode": "audit"})
            agent = Agent(config, nvml=SimulatedNvml(load_scenario(scenario)), backend="sim")
            slices = agent.pods.dra.slices
            task = asyncio.create_task(slices.run())
            try:
                async with PodResourcesServer(socket, pods=[]):
                    await eventually(lambda: slices.synced)
                    snapshot = await agent.poll_once()
                    assert {u: h for u, (h, _) in hinted(snapshot).items()} == {uuids[0]: "ok", uuids[1]: "ok"}
                    assert snapshot.dra_taints == ()

                    tainted = copy.deepcopy(stored)
                    tainted["spec"]["devices"][0]["taints"] = [
                        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
                         "timeAdded": "2026-11-27T17:00:00Z"},
                        {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None",
                         "timeAdded": "2026-11-27T16:59:00Z"}]
                    api.add_slice(tainted)  # MODIFIED, on the open watch
                    await eventually(lambda: slices.devices()[(DRIVER, NODE, "gpu-0")].taints)
                    snapshot = await agent.poll_once()
                    assert hinted(snapshot) == {uuids[0]: ("degraded", 0), uuids[1]: hinted(snapshot)[uuids[1]]}
                    assert hinted(snapshot)[uuids[1]][0] == "ok" and hinted(snapshot)[uuids[1]][1] > 0
                    assert snapshot.health is not None and snapshot.health.unhealthy_gpus == (uuids[0],)
                    state = to_jsonable(snapshot)
                    assert [(t["device"], t["value"], t["effect"]) for t in state["dra_taints"]] == [
                        ("gpu-0", "79", "NoSchedule"), ("gpu-0", "13", "None")]
                    assert [(f["reason"], f["severity"], f["gpu_uuid"]) for f in state["health"]["faults"]] == [
                        ("DraDeviceTainted", "degraded", uuids[0])]
                    assert state["health"]["taints"] == [] and not state["health"]["cordoned"]  # report
                    sources = {s.name: s for s in snapshot.sources}
                    assert sources["dra_device_taints"].ok  # every taint read and placed
                    body = generate_text(agent.registry).decode()
                    assert re.search(r'gpuagent_gpu_fault_info\{[^}]*reason="DraDeviceTainted"[^}]*\} 1', body)
                    assert 'gpuagent_source_success{source="dra_device_taints"} 1.0' in body
                    fit = score_node(snapshot.hints, parse_fit_request({"gpus": 2}), now=snapshot.taken_at_unix)
                    assert not fit.fits and "unhealthy (degraded)" in fit.reasons[uuids[0]]  # one of two on offer

                    api.add_slice(stored)  # the driver lifts its taint
                    await eventually(lambda: not slices.devices()[(DRIVER, NODE, "gpu-0")].taints)
                    snapshot = await agent.poll_once()
                    assert {u: h for u, (h, _) in hinted(snapshot).items()} == {uuids[0]: "ok", uuids[1]: "ok"}
                    assert snapshot.health is not None and snapshot.health.faults == ()
                    assert score_node(snapshot.hints, parse_fit_request({"gpus": 2}), now=snapshot.taken_at_unix).fits
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await agent.aclose()
        assert {r.method for r in api.requests} == {"GET"}  # audit: the API server is only read
        assert api.cluster.node_patches == [] and api.events == []


@pytest.mark.integration
async def test_enforce_never_copies_a_device_taint_onto_the_node_unless_classify_says_so() -> None:
    """In enforce, ``report`` keeps the Node untouched but for the pods' Events; ``classify`` sets the
    condition and the agent's own NoSchedule taint, and lifts them the poll the driver lifts its taint."""
    pod = PodUse("train-a", "ml", "uid-a", allocated_gpus=(UUIDS[0],))
    tainted = with_taints(snap(gpu(0), gpu(1), pods=(pod,)), taint("NoSchedule"))
    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        report = Rig(api)
        state = await report.poll(tainted)
        node = api.cluster.nodes[NODE]
        assert {c["type"]: c["status"] for c in node["status"]["conditions"] if c["type"] in table.CONDITIONS} == {
            c: "True" for c in table.CONDITIONS}
        assert not node["spec"].get("taints") and not node["spec"].get("unschedulable")
        assert state.unhealthy_gpus == (UUIDS[0],) and not state.quarantined
        assert [(e.body["regarding"]["kind"], e.body["reason"]) for e in api.events] == [
            ("Pod", "DraDeviceTainted")]

    async with FakeApiServer() as api:
        api.cluster.add_node(make_node(NODE))
        classify = Rig(api, dra_taints="classify")
        state = await classify.poll(tainted)
        node = api.cluster.nodes[NODE]
        hardware = next(c for c in node["status"]["conditions"] if c["type"] == table.HARDWARE)
        assert (hardware["status"], hardware["reason"]) == ("False", "DraDeviceTainted")
        assert "gpu.nvidia.com/xid=79:NoSchedule" in hardware["message"]
        assert node["spec"]["taints"] == [{"key": TAINT_KEY, "value": "degraded", "effect": "NoSchedule"}]
        assert not node["spec"].get("unschedulable") and state.quarantined
        state = await classify.poll(snap(gpu(0), gpu(1), pods=(pod,), at=T0 + 5))  # the driver lifted it
        node = api.cluster.nodes[NODE]
        assert {c["type"]: c["status"] for c in node["status"]["conditions"] if c["type"] in table.CONDITIONS} == {
            c: "True" for c in table.CONDITIONS}
        assert not node["spec"].get("taints") and not state.quarantined
