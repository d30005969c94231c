"""Tenants cannot raise their own limits (issue 28, item 5): the operator's ``pod_annotations`` decides.

A pod's ``gpuagent.io/*`` annotations are set by whoever may create pods in its namespace; the operator's
config decides what they may do (``ignore``, ``lower-only`` by default, ``any``; per rule or for the node),
``exempt`` is never a pod's, and every annotation that did not count is reported and shown in ``/v1/state``
with where each value came from. The config keys are checked by ``check-config`` like every other key.
The admission policy shipped in ``deploy/`` (refusing the annotations unless the namespace allows them) is
evaluated here with cel-python on allowed and denied requests, and the docs' worked example is what the agent
says.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from test_fast_paths import pod_node

from gpuagent import cli
from gpuagent.api.app import build_app
from gpuagent.assembly import build_enforcer
from gpuagent.config import ConfigError, load_config
from gpuagent.enforce.policy import Limits, limits_for_pod, limits_for_workload
from gpuagent.enforce.rules import NodeDefaults, PolicyRule, parse_rules
from gpuagent.export import build_registry
from gpuagent.quantities import PolicyValueError
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import Workload

ROOT = Path(__file__).resolve().parent.parent
GI = 2**30
SHARE, MEMORY, PRIORITY, EXEMPT = (f"gpuagent.io/{k}" for k in ("gpu-share", "gpu-memory", "priority", "exempt"))
# The issue's tenant: every field asked beyond a namespace rule of 20 %, 8Gi, priority -100, not exempt.
GREEDY = {EXEMPT: "true", SHARE: "100", MEMORY: "80Gi", PRIORITY: "1000"}
NAMESPACE_RULE = PolicyRule(match_namespace="research", share_ratio=0.2, memory_bytes=8 * GI, priority=-100)


def pod(**annotations: str) -> PodUse:
    return PodUse(name="train-0", namespace="research", annotations=annotations)


def asked(**fields: str) -> PodUse:
    """A pod with these annotations, named by field: share, memory, priority, exempt."""
    keys = {"share": SHARE, "memory": MEMORY, "priority": PRIORITY, "exempt": EXEMPT}
    return pod(**{keys[name]: value for name, value in fields.items()})


def messages(problems) -> dict[str, str]:
    return {p.annotation: p.message for p in problems}


# --- lower-only, the default --------------------------------------------------------------------------------


def test_the_issues_greedy_tenant_gets_the_namespace_rule_and_four_problems() -> None:
    limits, problems = limits_for_pod(pod(**GREEDY), NodeDefaults(), [NAMESPACE_RULE])
    assert limits == Limits(share_ratio=0.2, memory_bytes=8 * GI, priority=-100, exempt=False, source="config")
    said = messages(problems)
    assert said[SHARE] == (
        "refused: 100% is above the operator's 20% (policies[0]) and pod_annotations is lower-only here "
        "(the config's pod_annotations): an annotation may only lower it; using policies[0] instead (20%)")
    assert said[MEMORY].startswith(f"refused: {80 * GI} bytes is above the operator's {8 * GI} bytes")
    assert said[PRIORITY].startswith("refused: 1000 is above the operator's -100 (policies[0])")
    assert said[EXEMPT] == ("ignored: exempt is the operator's (a policies rule's exempt: true), never a pod's; "
                            "using the node default instead (false)")
    assert list(said) == sorted(said)  # one problem per annotation, by key


def test_lower_only_honours_a_stricter_or_equal_annotation() -> None:
    limits, problems = limits_for_pod(asked(share="10%", memory="8Gi", priority="-200"), NodeDefaults(),
                                      [NAMESPACE_RULE])
    assert (limits.share_ratio, limits.memory_bytes, limits.priority) == (0.1, 8 * GI, -200)  # 8Gi: equal
    assert limits.source == "annotation" and problems == ()
    assert dict(limits.origins) == {"share_ratio": "annotation", "memory_bytes": "annotation",
                                    "priority": "annotation", "exempt": "the node default",
                                    "latency_sensitive": "the node default",
                                    "pod_annotations": "the config's pod_annotations"}


def test_lower_only_without_a_rule_is_capped_by_the_node_default() -> None:
    """Where no rule sets a field, the config's default is the operator's value: a tenant cannot exceed it."""
    defaults = NodeDefaults(share_ratio=0.25, memory_bytes=4 * GI)
    limits, problems = limits_for_pod(asked(share="40", memory="2Gi", priority="high"), defaults)
    assert (limits.share_ratio, limits.memory_bytes, limits.priority) == (0.25, 2 * GI, 0)
    said = messages(problems)
    assert set(said) == {SHARE, PRIORITY}
    assert said[SHARE].startswith("refused: 40% is above the operator's 25% (the node default)")
    assert said[PRIORITY].startswith("refused: 100 is above the operator's 0 (the node default)")
    limits, problems = limits_for_pod(asked(priority="low"), defaults)
    assert limits.priority == -100 and problems == ()


def test_lower_only_with_no_operator_value_lets_the_annotation_set_the_limit() -> None:
    """No rule and no default: no limit at all, and any annotated value is stricter than none. Priority
    always has an operator's value (0), so it can still only go down."""
    limits, problems = limits_for_pod(asked(share="40", memory="80Gi", priority="1000"), NodeDefaults())
    assert (limits.share_ratio, limits.memory_bytes, limits.priority) == (0.4, 80 * GI, 0)
    assert [p.annotation for p in problems] == [PRIORITY]


# --- ignore and any -----------------------------------------------------------------------------------------


def test_ignore_changes_nothing_even_a_stricter_value_and_does_not_parse() -> None:
    rules = [PolicyRule(match_namespace="research", pod_annotations="ignore"), NAMESPACE_RULE]
    limits, problems = limits_for_pod(asked(share="5", memory="lots", priority="-500"), NodeDefaults(), rules)
    assert (limits.share_ratio, limits.memory_bytes, limits.priority) == (0.2, 8 * GI, -100)
    said = messages(problems)
    assert said[SHARE] == "ignored: pod_annotations is ignore here (policies[0]); using policies[1] instead (20%)"
    assert said[MEMORY].startswith("ignored: pod_annotations is ignore here")  # not "expected a memory size"
    assert said[PRIORITY].startswith("ignored: pod_annotations is ignore here")


def test_any_lets_an_annotation_override_the_operator_but_never_exempt() -> None:
    rules = parse_rules([
        {"match_namespace": "research", "pod_annotations": "ANY"},  # any case, as config choices
        {"match_namespace": "research", "gpu_share": 20, "gpu_memory": "8Gi", "priority": -100},
    ])
    assert rules[1] == NAMESPACE_RULE
    limits, problems = limits_for_pod(pod(**GREEDY), NodeDefaults(), rules)
    assert (limits.share_ratio, limits.memory_bytes, limits.priority, limits.exempt) == (1.0, 80 * GI, 1000,
                                                                                         False)
    assert limits.pod_annotations == "any" and [p.annotation for p in problems] == [EXEMPT]


@pytest.mark.parametrize("mode", ["ignore", "lower-only", "any"])
def test_exempt_is_never_a_pods_and_a_rules_exempt_stands(mode: str) -> None:
    defaults = NodeDefaults(pod_annotations=mode)
    limits, problems = limits_for_pod(asked(exempt="yes"), defaults)
    assert limits.exempt is False
    assert messages(problems)[EXEMPT].startswith("ignored: exempt is the operator's")
    exempting = [PolicyRule(match_pod="train-*", exempt=True)]
    limits, problems = limits_for_pod(asked(exempt="false"), defaults, exempting)
    assert limits.exempt is True  # the operator's, whatever the pod says
    assert messages(problems)[EXEMPT].endswith("using policies[0] instead (true)")


def test_the_first_matching_rule_that_sets_pod_annotations_decides_else_the_node() -> None:
    rules = [
        PolicyRule(match_namespace="serving", pod_annotations="any"),  # does not match
        PolicyRule(match_pod="train-*", share_ratio=0.3),  # matches, says nothing on annotations
        PolicyRule(match_namespace="research", pod_annotations="any"),  # the first that says
        PolicyRule(match_kind="pod", pod_annotations="ignore"),
    ]
    limits, problems = limits_for_pod(asked(share="50"), NodeDefaults(pod_annotations="ignore"), rules)
    assert (limits.share_ratio, limits.pod_annotations, problems) == (0.5, "any", ())
    assert dict(limits.origins)["pod_annotations"] == "policies[2]"
    limits, problems = limits_for_pod(asked(share="50"), NodeDefaults(pod_annotations="ignore"), rules[:2])
    assert (limits.share_ratio, limits.pod_annotations) == (0.3, "ignore")
    assert messages(problems)[SHARE].startswith("ignored: pod_annotations is ignore here (the config's")


def test_a_workload_off_kubernetes_has_no_annotation_mode() -> None:
    rule = PolicyRule(match_kind="systemd_service", share_ratio=0.1, pod_annotations="any")
    limits = limits_for_workload(Workload(kind="systemd_service", name="a.service"), NodeDefaults(), [rule])
    assert limits.share_ratio == 0.1 and limits.pod_annotations is None
    assert "pod_annotations" not in dict(limits.origins)


# --- the config keys ----------------------------------------------------------------------------------------


def test_rules_read_pod_annotations_alone_or_beside_limits() -> None:
    rules = parse_rules([{"match_namespace": "a", "pod_annotations": "Lower-Only"},
                         {"match_namespace": "b", "pod_annotations": "ignore", "gpu_share": 10}])
    assert [r.pod_annotations for r in rules] == ["lower-only", "ignore"]


@pytest.mark.parametrize(("value", "fragment"), [
    ("lower", "expected one of ignore, lower-only, any, got 'lower'; did you mean lower-only?"),
    ("lower_only", "did you mean lower-only?"),
    ("everything", "expected one of ignore, lower-only, any, got 'everything'"),
    (3, "got '3'"),
    (None, "got 'None'"),
])
def test_a_bad_rule_mode_names_the_item_and_key(value: Any, fragment: str) -> None:
    with pytest.raises(PolicyValueError) as info:
        parse_rules([{"match_namespace": "a", "gpu_share": 10}, {"match_pod": "x", "pod_annotations": value}])
    assert info.value.key_path == "policies[1].pod_annotations"
    assert fragment in info.value.message


def test_node_defaults_refuse_an_unknown_mode() -> None:
    assert NodeDefaults().pod_annotations == "lower-only"
    with pytest.raises(PolicyValueError, match="pod_annotations: expected one of ignore, lower-only, any"):
        NodeDefaults(pod_annotations="all")


def test_check_config_passes_the_modes_and_the_env_is_checked_too(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("pod_annotations: ignore\npolicies:\n  - {match_namespace: ml, pod_annotations: any}\n")
    assert cli.main(["check-config", str(path)]) == 0, capsys.readouterr().err
    assert load_config(None, env={}).enforce.pod_annotations == "lower-only"
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"GPUAGENT_POD_ANNOTATIONS": "trust"})
    assert info.value.source == "env GPUAGENT_POD_ANNOTATIONS" and "lower-only" in info.value.message


# --- what the agent reports: the log, the problems, /v1/state -----------------------------------------------


async def test_state_shows_each_value_its_source_and_what_was_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "mode": "audit", "journal_path": str(tmp_path / "journal.json"), "cgroup_root": str(tmp_path / "cg"),
        "default_gpu_share": 20,
        "policies": [{"match_namespace": "ns", "gpu_memory": "8Gi", "priority": "low"}],
    }))
    enforcer = build_enforcer(load_config(str(path), env={}), monotonic=lambda: 0.0)
    assert enforcer is not None
    snapshot = pod_node(0.0, {"greedy": {**GREEDY}, "modest": {SHARE: "10"}})
    with caplog.at_level(logging.WARNING, logger="gpuagent.enforce.owners"):
        state = enforcer.update(snapshot)
        enforcer.update(snapshot)  # the same problems: logged once
    assert {p.annotation for p in state.problems if p.pod == "greedy"} == {SHARE, MEMORY, PRIORITY, EXEMPT}
    logged = [r.getMessage() for r in caplog.records if "greedy" in r.getMessage()]
    assert len(logged) == 4 and any("ignored: exempt is the operator's" in line for line in logged)

    snapshot = replace(snapshot, enforcement=state)
    app = build_app(lambda: snapshot, build_registry(lambda: snapshot))
    async with TestClient(TestServer(app)) as client:
        body = await (await client.get("/v1/state")).json()
    decided = {d["owner"]: d for d in body["enforcement"]["limits"]}
    greedy, modest = decided["ns/greedy"], decided["ns/modest"]
    assert (greedy["share_ratio"], greedy["memory_bytes"], greedy["priority"], greedy["exempt"]) == (
        0.2, 8 * GI, -100, False)
    assert greedy["pod_annotations"] == "lower-only"
    assert greedy["sources"] == {"share_ratio": "the node default", "memory_bytes": "policies[0]",
                                 "priority": "policies[0]", "exempt": "the node default",
                                 "latency_sensitive": "the node default",
                                 "pod_annotations": "the config's pod_annotations"}
    assert sorted(greedy["refused"]) == sorted(GREEDY)
    assert greedy["refused"][EXEMPT].startswith("ignored: exempt is the operator's")
    assert modest["share_ratio"] == 0.1 and modest["sources"]["share_ratio"] == "annotation"
    assert modest["refused"] == {}


def test_the_docs_worked_example_is_what_the_agent_says() -> None:
    """docs/isolation.md quotes two of the greedy tenant's problems: they must be the agent's words."""
    text = " ".join((ROOT / "docs" / "isolation.md").read_text().split())
    quoted = re.findall(r"`((?:refused|ignored): [^`]*)`", text)
    _, problems = limits_for_pod(pod(**GREEDY), NodeDefaults(), [NAMESPACE_RULE])
    said = set(messages(problems).values())
    assert len(quoted) == 2 and all(q in said for q in quoted), quoted


# --- the admission policy -----------------------------------------------------------------------------------

POLICY_FILE = ROOT / "deploy" / "admission-pod-annotations.yaml"


def _admission_policy() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(POLICY_FILE.read_text())}
    return docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]


def admit(operation: str, annotations: dict[str, str] | None, *, before: dict[str, str] | None = None,
          namespace_labels: dict[str, str] | None = None) -> list[str]:
    """The policy's refusals of a pod request, as the API server evaluates it: its variables in order, then
    each validation; [] when admitted."""
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed (test extra)")
    policy, _ = _admission_policy()
    env = celpy.Environment()

    def pod_object(notes: dict[str, str] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
        if notes is not None:
            meta["annotations"] = notes
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}

    namespace: dict[str, Any] = {"metadata": {"name": "team-a"}}
    if namespace_labels is not None:
        namespace["metadata"]["labels"] = namespace_labels
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(pod_object(annotations)),
        "oldObject": celpy.json_to_cel(pod_object(before) if operation == "UPDATE" else None),
        "namespaceObject": celpy.json_to_cel(namespace),
        "request": celpy.json_to_cel({"operation": operation, "namespace": "team-a"}),
    }
    variables: dict[Any, Any] = {}
    for variable in policy["spec"]["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        program = env.program(env.compile(variable["expression"]))
        variables[celpy.celtypes.StringType(variable["name"])] = program.evaluate(activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    refusals = []
    for validation in policy["spec"]["validations"]:
        if not env.program(env.compile(validation["expression"])).evaluate(activation):
            if "messageExpression" in validation:
                refusals.append(str(env.program(env.compile(validation["messageExpression"])).evaluate(activation)))
            else:
                refusals.append(validation["message"])
    return refusals


ALLOWED = {"gpuagent.io/pod-annotations": "allowed"}


@pytest.mark.parametrize(("operation", "annotations", "before", "labels"), [
    pytest.param("CREATE", None, None, None, id="no-annotations"),
    pytest.param("CREATE", {"team": "x", "gpuagent.io/placement": "spread"}, None, None, id="others-pass"),
    pytest.param("CREATE", {SHARE: "30", MEMORY: "8Gi", PRIORITY: "low"}, None, ALLOWED, id="allowed-namespace"),
    pytest.param("UPDATE", {SHARE: "30", "team": "y"}, {SHARE: "30"}, None, id="update-leaves-them-as-they-were"),
    pytest.param("UPDATE", {"team": "y"}, {SHARE: "30"}, None, id="update-removes-one"),
    pytest.param("UPDATE", {EXEMPT: "true", "x": "1"}, {EXEMPT: "true"}, None, id="old-exempt-unchanged"),
])
def test_the_admission_policy_admits(operation, annotations, before, labels) -> None:
    assert admit(operation, annotations, before=before, namespace_labels=labels) == []


@pytest.mark.parametrize(("operation", "annotations", "before", "labels", "fragment"), [
    pytest.param("CREATE", {SHARE: "100"}, None, None, "not allowed on pods in namespace team-a", id="share"),
    pytest.param("CREATE", {MEMORY: "80Gi"}, None, {}, "gpuagent.io/pod-annotations=allowed", id="memory"),
    pytest.param("CREATE", {PRIORITY: "1000"}, None, {"gpuagent.io/pod-annotations": "yes"}, "team-a",
                 id="priority-label-not-allowed"),
    pytest.param("UPDATE", {SHARE: "100"}, {SHARE: "10"}, None, "team-a", id="update-raises-a-share"),
    pytest.param("UPDATE", {SHARE: "10", MEMORY: "1Gi"}, {SHARE: "10"}, None, "team-a", id="update-adds-one"),
    pytest.param("CREATE", {"gpuagent.io/latency-sensitive": "true"}, None, None, "latency-sensitive are not allowed",
                 id="latency-class"),
    pytest.param("CREATE", {EXEMPT: "true"}, None, ALLOWED, "gpuagent.io/exempt is the operator's",
                 id="exempt-even-where-allowed"),
    pytest.param("UPDATE", {EXEMPT: "true"}, {}, None, "exempt is the operator's", id="exempt-added"),
])
def test_the_admission_policy_refuses(operation, annotations, before, labels, fragment) -> None:
    refusals = admit(operation, annotations, before=before, namespace_labels=labels)
    assert len(refusals) == 1 and fragment in refusals[0], refusals


def test_the_admission_policy_is_bound_and_applied_by_the_kustomization() -> None:
    policy, binding = _admission_policy()
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], sorted(rule["operations"])) == (["pods"], ["CREATE", "UPDATE"])
    kustomization = yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())
    assert POLICY_FILE.name in kustomization["resources"]
