"""GPU health without an API server: the classification table, hysteresis and the hold until a reset, the
conditions and quarantine a policy asks for, and the Node patches (validated against Kubernetes' schemas)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_cluster import make_node, merge_patch, strategic_merge_patch

from gpuagent.health import HealthMonitor, HealthSettings, table
from gpuagent.health.classify import Classifier
from gpuagent.health.node import QUARANTINE_ANNOTATION, REMEDIATION_ANNOTATION, conditions_patch, spec_patch
from gpuagent.health.plan import TAINT_KEY, conditions_of, plan_for
from gpuagent.health.tracker import FaultTracker
from gpuagent.snapshot.gpu import EccCounts, GpuInfo, GpuSample, Health, RemappedRows, XidRecord
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.pods import PodUse

T0 = 1_760_000_000.0
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-ddddeeeeffff" for i in range(4)]
DOCS = Path(__file__).resolve().parent.parent / "docs"


def gpu(i: int, **kw: Any) -> GpuSample:
    info = GpuInfo(index=i, uuid=UUIDS[i], name="NVIDIA H100 80GB HBM3", serial=None, pci_bus_id=f"0000:1{i}:00.0",
                   minor_number=i, memory_total_bytes=80 << 30, power_limit_watts=700.0, mig_enabled=False,
                   nvlink_links_down=kw.pop("links_down", ()))
    return GpuSample(info=info, sampled_at_unix=T0, **kw)


def snap(*gpus: GpuSample, at: float = T0, nvml_ok: bool = True, pods: tuple[PodUse, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot(hostname="gpu-node-1", backend="sim", taken_at_unix=at, taken_at_monotonic=at,
                        poll_duration_seconds=0.01, gpus=gpus, pods=pods,
                        sources=(SourceStatus("nvml", nvml_ok, 0.01, "" if nvml_ok else "NVML_ERROR_UNINITIALIZED"),))


def reasons(observations: list) -> list[tuple[str, int | None]]:
    return [(o.rule.reason, o.gpu_index) for o in observations]


# --- the table -------------------------------------------------------------------------------------------
def test_application_xids_are_events_only_and_hardware_xids_set_conditions() -> None:
    for code in (13, 31, 43, 45):
        assert table.rule_for_xid(code).condition is None
        assert table.rule_for_xid(code).severity == table.INFO
    for code in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert table.rule_for_xid(code).condition in table.CONDITIONS, code
    assert table.rule_for_xid(79).action == "reboot" and table.rule_for_xid(79).severity == table.FATAL
    assert table.rule_for_xid(64).action == "replace"
    assert table.rule_for_xid(12345).reason == "XidOther"


def test_every_rule_cites_a_source_and_uses_known_words() -> None:
    for rule in (*table.XID_RULES.values(), *table.OTHER_RULES, table.XID_UNKNOWN):
        assert rule.source
        assert rule.severity in table.SEVERITIES and rule.action in table.ACTIONS
        assert rule.condition is None or rule.condition in table.CONDITIONS
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]*", rule.reason)  # a NodeCondition/Event reason: CamelCase


def test_the_docs_table_lists_every_rule_of_the_code() -> None:
    text = (DOCS / "health.md").read_text()
    for code, rule in table.XID_RULES.items():
        assert re.search(rf"\|\s*XID {code}\s*\|\s*`{rule.reason}`\s*\|\s*{rule.condition or '—'}\s*\|\s*"
                         rf"{rule.severity}\s*\|\s*{rule.action}\s*\|", text), code
    for rule in table.OTHER_RULES:
        assert re.search(rf"\|\s*`{rule.reason}`\s*\|\s*{rule.condition}\s*\|\s*{rule.severity}\s*\|\s*"
                         rf"{rule.action}\s*\|", text), rule.reason


# --- classification ----------------------------------------------------------------------------------------
def test_levels_are_classified_from_one_sample() -> None:
    sick = gpu(0, ecc=EccCounts(dbe_volatile_total=2, retired_pages_pending=True),
               remapped_rows=RemappedRows(0, 2, False, True), links_down=(3, 7),
               clock_event_reasons=table.CLOCKS_EVENT_HW_THERMAL | table.CLOCKS_EVENT_HW_POWER_BRAKE | 0x4)
    classifier = Classifier()
    classifier.observe(snap(gpu(0), gpu(1)))  # every link up at the first read
    found = reasons(classifier.observe(snap(sick, gpu(1, health=Health.LOST, health_detail="GPU_IS_LOST"))))
    assert found == [("EccUncorrectable", 0), ("PageRetirementPending", 0), ("RowRemapFailure", 0),
                     ("NvlinkDown", 0), ("ThermalSlowdown", 0), ("PowerBrakeSlowdown", 0), ("GpuLost", 1)]


def test_a_link_never_up_since_start_is_not_a_fault_and_one_that_goes_down_is() -> None:
    classifier = Classifier()
    assert classifier.observe(snap(gpu(0, links_down=(10, 11)))) == []  # a PCIe card's missing bridge
    assert classifier.observe(snap(gpu(0, links_down=(10, 11)))) == []
    [obs] = classifier.observe(snap(gpu(0, links_down=(2, 10, 11))))
    assert obs.rule is table.NVLINK_DOWN and obs.message == "NVLink links down: 2"
    classifier.observe(snap(gpu(0, links_down=(2,))))  # link 10 came up: from now on it counts
    [obs] = classifier.observe(snap(gpu(0, links_down=(10,))))
    assert obs.message == "NVLink links down: 10"


def test_the_power_cap_and_idle_clocks_are_not_faults() -> None:
    assert Classifier().observe(snap(gpu(0, clock_event_reasons=0x1 | 0x2 | 0x4))) == []


def test_an_xid_is_an_occurrence_once_however_many_come_in_a_poll() -> None:
    c = Classifier()
    storm = gpu(0, xid=XidRecord(13, T0, {13: 5000}, {13: 5000}))
    assert reasons(c.observe(snap(storm))) == [("XidGraphicsException", 0)]
    assert c.observe(snap(storm)) == []  # counted before: nothing new
    more = gpu(0, xid=XidRecord(79, T0, {13: 5000, 79: 1}, {79: 1}))
    assert reasons(c.observe(snap(more))) == [("XidFallenOffBus", 0)]


def test_nvml_failing_with_no_gpu_is_a_node_fault() -> None:
    [obs] = Classifier().observe(snap(nvml_ok=False))
    assert obs.rule is table.NVML_FAILING and obs.gpu_uuid is None and "UNINITIALIZED" in obs.message


# --- hysteresis and the hold ---------------------------------------------------------------------------------
def _track(tracker: FaultTracker, classifier: Classifier, snapshot: NodeSnapshot) -> list[tuple[str, bool, bool]]:
    faults, _ = tracker.update(snapshot, classifier.observe(snapshot), snapshot.taken_at_unix)
    return [(f.reason, f.active, f.held_until_reset) for f in faults]


def test_a_flapping_slowdown_is_one_fault_cleared_after_the_hysteresis() -> None:
    tracker, c = FaultTracker(clear_after=60), Classifier()
    hot, cool = gpu(0, clock_event_reasons=table.CLOCKS_EVENT_SW_THERMAL), gpu(0, clock_event_reasons=0)
    assert _track(tracker, c, snap(hot, at=T0)) == [("ThermalSlowdown", True, False)]
    assert _track(tracker, c, snap(cool, at=T0 + 10)) == [("ThermalSlowdown", False, False)]
    faults, new = tracker.update(snap(hot, at=T0 + 20), c.observe(snap(hot, at=T0 + 20)), T0 + 20)
    assert new == () and faults[0].since_unix == T0  # the same episode
    assert _track(tracker, c, snap(cool, at=T0 + 79)) == [("ThermalSlowdown", False, False)]
    assert _track(tracker, c, snap(cool, at=T0 + 80)) == []


def test_a_fault_needing_a_reset_is_held_until_the_gpu_answers_after_one() -> None:
    tracker, c = FaultTracker(clear_after=60), Classifier()
    xid48 = XidRecord(48, T0, {48: 1}, {48: 1})
    assert _track(tracker, c, snap(gpu(0, xid=xid48), at=T0)) == [("XidDoubleBitEcc", True, True)]
    # an hour later, nothing new: still held (no reset seen)
    assert _track(tracker, c, snap(gpu(0, xid=xid48), at=T0 + 3600)) == [("XidDoubleBitEcc", False, True)]
    # the reset: the GPU is away for a poll (nvidia-smi -r), then answers
    assert _track(tracker, c, snap(gpu(0, health=Health.ERROR, xid=xid48), at=T0 + 3601)) == [
        ("GpuReadError", True, False), ("XidDoubleBitEcc", False, False)]
    assert _track(tracker, c, snap(gpu(0, xid=xid48), at=T0 + 3602)) == [("GpuReadError", False, False)]


def test_xid79_then_lost_clears_when_the_gpu_comes_back() -> None:
    tracker, c = FaultTracker(clear_after=60), Classifier()
    xid = XidRecord(79, T0, {79: 1}, {79: 1})
    _track(tracker, c, snap(gpu(3, xid=xid), at=T0))
    assert _track(tracker, c, snap(gpu(3, health=Health.LOST, xid=xid), at=T0 + 1)) == [
        ("GpuLost", True, True), ("XidFallenOffBus", False, False)]
    assert _track(tracker, c, snap(gpu(3, health=Health.LOST, xid=xid), at=T0 + 500)) == [
        ("GpuLost", True, True), ("XidFallenOffBus", False, False)]
    assert _track(tracker, c, snap(gpu(3, xid=xid), at=T0 + 600)) == []


def test_the_volatile_dbe_counter_starting_again_is_a_reset() -> None:
    tracker, c = FaultTracker(), Classifier()
    _track(tracker, c, snap(gpu(0, ecc=EccCounts(dbe_volatile_total=3)), at=T0))
    assert _track(tracker, c, snap(gpu(0, ecc=EccCounts(dbe_volatile_total=0)), at=T0 + 30)) == []


# --- conditions and the plan ---------------------------------------------------------------------------------
def _plan(*gpus: GpuSample, settings: HealthSettings | None = None, pods: tuple[PodUse, ...] = ()) -> Any:
    s = snap(*gpus, pods=pods)
    faults, _ = FaultTracker().update(s, Classifier().observe(s), T0)
    conditions = conditions_of(faults, {}, T0)
    return plan_for(faults, conditions, s, settings or HealthSettings())


def test_conditions_name_the_worst_reason_and_the_gpus() -> None:
    plan = _plan(gpu(0, remapped_rows=RemappedRows(0, 1, True, False)), gpu(2, remapped_rows=RemappedRows(0, 1, False, True)),
                 gpu(1, clock_event_reasons=table.CLOCKS_EVENT_HW_THERMAL))
    by_type = {c.type: c for c in plan.conditions}
    hw = by_type["GpuHardwareHealthy"]
    assert (hw.status, hw.reason, hw.severity) == ("False", "RowRemapFailure", "fatal")
    assert hw.gpus == (UUIDS[0], UUIDS[2]) and "GPU 2" in hw.message and "held until a GPU reset" in hw.message
    assert by_type["GpuThermalHealthy"].reason == "ThermalSlowdown"
    assert by_type["GpuDriverHealthy"].status == "True" and by_type["GpuInterconnectHealthy"].status == "True"
    assert plan.severity == "fatal" and plan.cordon and plan.drain
    assert plan.taints == ((TAINT_KEY, "fatal", "NoSchedule"),)
    assert plan.remediation["action"] == "replace" and plan.remediation["gpus"] == [UUIDS[2]]


def test_a_degraded_node_is_tainted_not_cordoned_and_application_errors_change_nothing() -> None:
    plan = _plan(gpu(0, clock_event_reasons=table.CLOCKS_EVENT_SW_THERMAL))
    assert plan.severity == "degraded" and plan.taints == ((TAINT_KEY, "degraded", "NoSchedule"),)
    assert not plan.cordon and not plan.drain and plan.remediation is None
    app = _plan(gpu(0, xid=XidRecord(31, T0, {31: 1}, {31: 1})))
    assert app.severity == "ok" and not app.quarantine and all(c.status == "True" for c in app.conditions)


def test_no_execute_is_optional_and_thresholds_can_be_raised() -> None:
    lost = gpu(0, health=Health.LOST)
    assert _plan(lost, settings=HealthSettings(no_execute=True)).taints[-1] == (TAINT_KEY, "fatal", "NoExecute")
    lenient = _plan(lost, settings=HealthSettings(taint_at="never", cordon_at="never", drain_at="never"))
    assert not lenient.quarantine and lenient.remediation is not None


def test_the_drain_takes_the_pods_on_the_faulty_gpus_only() -> None:
    pods = (PodUse("train-a", "ml", "uid-a", allocated_gpus=(UUIDS[0],)),
            PodUse("train-b", "ml", "uid-b", allocated_gpus=(UUIDS[1],)),
            PodUse("stray", "ml", "uid-c", used_gpus=(UUIDS[0],)))
    plan = _plan(gpu(0, health=Health.LOST), gpu(1), pods=pods)
    assert [p.name for p in plan.pods] == ["train-a", "stray"]


def test_the_monitor_in_audit_mode_reports_what_enforce_would_do() -> None:
    monitor = HealthMonitor(HealthSettings(mode="audit"))
    state = monitor.update(snap(gpu(0, health=Health.LOST), gpu(1)))
    assert state.mode == "audit" and state.severity == "fatal" and state.unhealthy_gpus == (UUIDS[0],)
    assert state.cordoned and state.taints == (f"{TAINT_KEY}=fatal:NoSchedule",) and state.drain == "audit"
    assert state.remediation == "reboot" and state.api == "off"
    assert state.actions_total == {("taint", "audit"): 1, ("cordon", "audit"): 1, ("drain", "audit"): 1}


# --- the Node patches -----------------------------------------------------------------------------------------
def validate_node(node: dict[str, Any]) -> None:
    """Fails the test when ``node`` is not a valid Kubernetes 1.30 Node (strict: no unknown field)."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (test extra)")
    try:
        kv.validate(node, "1.30", strict=True)
    except kv.ValidationError as err:
        pytest.fail(f"{'.'.join(map(str, err.path))}: {err.message}")


def _apply(node: dict[str, Any], plan: Any, *, quarantine: bool = True, now: float = T0) -> tuple[dict, Any]:
    cond = conditions_patch(node, plan.conditions, now, 60)
    if cond is not None:
        node = strategic_merge_patch(node, cond)
    outcome = spec_patch(node, plan, quarantine=quarantine, remediation=True, now=now)
    if outcome.patch is not None:
        node = merge_patch(node, outcome.patch)
    return node, outcome


def test_patched_nodes_validate_and_keep_the_kubelets_conditions() -> None:
    node, outcome = _apply(make_node("gpu-node-1"), _plan(gpu(0, health=Health.LOST),
                                                          settings=HealthSettings(no_execute=True)))
    validate_node(node)
    types = [c["type"] for c in node["status"]["conditions"]]
    assert types[:4] == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    assert set(types[4:]) == set(table.CONDITIONS)
    assert node["spec"]["unschedulable"] is True and outcome.cordoned
    assert {(t["effect"], t["value"]) for t in node["spec"]["taints"]} == {("NoSchedule", "fatal"),
                                                                           ("NoExecute", "fatal")}
    handoff = json.loads(node["metadata"]["annotations"][REMEDIATION_ANNOTATION])
    assert handoff["action"] == "reboot" and handoff["node"] == "gpu-node-1" and handoff["gpus"] == [UUIDS[0]]
    recovered, outcome = _apply(node, _plan(gpu(0)), now=T0 + 10)
    validate_node(recovered)
    assert "taints" not in recovered["spec"] and "unschedulable" not in recovered["spec"]
    assert QUARANTINE_ANNOTATION not in recovered["metadata"]["annotations"]
    assert REMEDIATION_ANNOTATION not in recovered["metadata"]["annotations"]
    assert all(c["status"] == "True" for c in recovered["status"]["conditions"] if c["type"] in table.CONDITIONS)


def test_only_what_the_agent_did_is_undone() -> None:
    human_taint = {"key": "maintenance", "value": "rack-7", "effect": "NoSchedule"}
    node = make_node("gpu-node-1", unschedulable=True, taints=[human_taint])  # a person cordoned it first
    node, outcome = _apply(node, _plan(gpu(0, health=Health.LOST)))
    assert not outcome.cordoned  # already cordoned: not the agent's cordon
    node, _ = _apply(node, _plan(gpu(0)), now=T0 + 10)
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"] == [human_taint]


def test_a_manual_uncordon_is_respected_until_the_faults_change() -> None:
    lost = _plan(gpu(0, health=Health.LOST))
    node, _ = _apply(make_node("gpu-node-1"), lost)
    node = merge_patch(node, {"spec": {"unschedulable": None, "taints": None}})  # kubectl uncordon, untaint
    node, outcome = _apply(node, lost, now=T0 + 30)
    assert outcome.override and outcome.patch is None and "unschedulable" not in node["spec"]
    worse = _plan(gpu(0, health=Health.LOST), gpu(1, remapped_rows=RemappedRows(0, 1, False, True)))
    node, outcome = _apply(node, worse, now=T0 + 60)
    assert not outcome.override and node["spec"]["unschedulable"] is True and outcome.cordoned


def test_no_quarantine_slot_means_conditions_only() -> None:
    node, outcome = _apply(make_node("gpu-node-1"), _plan(gpu(0, health=Health.LOST)), quarantine=False)
    validate_node(node)
    assert "unschedulable" not in node["spec"] and not outcome.taints
    assert QUARANTINE_ANNOTATION not in node["metadata"]["annotations"]
    assert REMEDIATION_ANNOTATION in node["metadata"]["annotations"]  # the hand-off does not wait for a slot


def test_unchanged_conditions_are_not_rewritten_until_their_heartbeat_is_due() -> None:
    plan = _plan(gpu(0))
    node = strategic_merge_patch(make_node("n"), conditions_patch(make_node("n"), plan.conditions, T0, 60))
    assert conditions_patch(node, plan.conditions, T0 + 30, 60) is None
    again = conditions_patch(node, plan.conditions, T0 + 61, 60)
    assert again is not None and all(c["lastTransitionTime"] == "2025-10-09T08:53:20Z"
                                     for c in again["status"]["conditions"])


def test_a_stale_node_read_is_sent_with_its_resource_version() -> None:
    node = make_node("gpu-node-1")
    node["metadata"]["resourceVersion"] = "77"
    outcome = spec_patch(node, _plan(gpu(0, health=Health.LOST)), quarantine=True, remediation=True, now=T0)
    assert outcome.patch["metadata"]["resourceVersion"] == "77"


def test_a_garbled_quarantine_annotation_is_treated_as_none() -> None:
    node = make_node("gpu-node-1")
    node["metadata"]["annotations"][QUARANTINE_ANNOTATION] = "{not json"
    outcome = spec_patch(node, _plan(gpu(0)), quarantine=True, remediation=True, now=T0)
    assert outcome.patch is None  # not knowing what it says, the agent undoes nothing
    outcome = spec_patch(node, _plan(gpu(0, health=Health.LOST)), quarantine=True, remediation=True, now=T0)
    assert json.loads(outcome.patch["metadata"]["annotations"][QUARANTINE_ANNOTATION])["cordoned"] is True


# --- its configuration ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "value", "words"), [
    ("GPUAGENT_HEALTH_MODE", "quarantine", "one of off, audit, enforce"),
    ("GPUAGENT_HEALTH_CORDON", "always", "one of degraded, fatal, never"),
    ("GPUAGENT_HEALTH_DRAIN_NAMESPACES", "ml=evict,Bad_NS=skip", "'Bad_NS': not a namespace name"),
    ("GPUAGENT_HEALTH_DRAIN_NAMESPACES", "ml=delete", "'ml': not a namespace name with one of evict, wait, skip"),
    ("GPUAGENT_HEALTH_QUARANTINE_BUDGET", "-1", "a whole number >= 0"),
    ("GPUAGENT_HEALTH_BUDGET_NAMESPACE", "Kube System", "a Kubernetes namespace name"),
])
def test_bad_health_settings_are_refused_naming_the_key(key: str, value: str, words: str) -> None:
    from gpuagent.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config(None, env={key: value})
    assert key in str(caught.value) and words in str(caught.value)


def test_health_settings_from_a_file(tmp_path: Path) -> None:
    from gpuagent.assembly import build_health
    from gpuagent.config import load_config

    path = tmp_path / "gpuagent.yaml"
    path.write_text("health_mode: audit\nhealth_drain_namespaces: {ml: wait, kube-system: skip}\n"
                    "health_quarantine_budget: 3\nhealth_no_execute: true\n")
    monitor = build_health(load_config(str(path), env={}))
    assert monitor is not None and monitor.writer is None
    assert monitor.settings.namespace_mode("ml") == "wait" and monitor.settings.namespace_mode("web") == "evict"
    assert monitor.settings.quarantine_budget == 3 and monitor.settings.no_execute
    assert build_health(load_config(None, env={"GPUAGENT_HEALTH_MODE": "off"})) is None
