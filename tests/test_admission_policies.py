"""The ValidatingAdmissionPolicies of deploy/admission-*.yaml, their CEL evaluated with cel-python.

Each request is built as the API server hands it to a policy: ``object`` and ``oldObject`` (null on a
create), ``request`` with the user's name and ``extra`` (where a pod-bound service account token puts its
node, ``authentication.kubernetes.io/node-name``), and ``variables`` evaluated in order before the
validations. A policy denies when any validation is false or fails to evaluate (``failurePolicy: Fail``).
What the agent really writes (the patches of :mod:`gpuagent.health.node` applied as the API server applies
them, the Lease bodies :class:`~gpuagent.health.budget.QuarantineBudget` sends) must be allowed; each thing
another node's agent could do with the RBAC it holds must be denied, naming why.

cel-python evaluates without the Kubernetes type-checker: the expressions keep to what Kubernetes' CEL
documents for admission policies (``has()`` on fields, map and list macros, ``matches``, ``contains``).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import FakeApiServer
from fake_cluster import make_node, merge_patch, strategic_merge_patch
from test_health import T0, UUIDS, gpu, snap

from gpuagent.health import table
from gpuagent.health.budget import LEASE_NAME, SLOT_SUFFIX, STAMP, QuarantineBudget, slot_key, stamp
from gpuagent.health.classify import Classifier
from gpuagent.health.node import ANNOTATION_MAX_BYTES, HELD_ANNOTATION, conditions_patch, spec_patch
from gpuagent.health.plan import TAINT_KEY, HealthSettings, conditions_of, plan_for
from gpuagent.health.tracker import FaultTracker
from gpuagent.kubeapi import ApiConnection
from gpuagent.snapshot.gpu import Health

celpy = pytest.importorskip("celpy", reason="cel-python is not installed (test extra)")

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
FILES = ("admission-gpunodestate.yaml", "admission-node.yaml", "admission-lease.yaml")  # the agent's identity
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
ME, OTHER = "gpu-node-1", "gpu-node-2"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _agent_username() -> str:
    daemonset = next(d for d in _docs("daemonset.yaml") if d["kind"] == "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{daemonset['metadata']['namespace']}:{account}"


AGENT = _agent_username()


@dataclass
class Verdict:
    matched: bool
    denied: list[str]  # the messages of the validations that failed

    @property
    def allowed(self) -> bool:
        return not self.denied


class Policy:
    """One ValidatingAdmissionPolicy compiled with cel-python, evaluated as the API server would."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        env = celpy.Environment()
        spec = doc["spec"]

        def program(text: str) -> Any:
            return env.program(env.compile(text))
        self.conditions = [(c["name"], program(c["expression"])) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], program(v["expression"])) for v in spec.get("variables", [])]
        self.validations = [(program(v["expression"]), v.get("message"),
                             program(v["messageExpression"]) if "messageExpression" in v else None)
                            for v in spec["validations"]]

    def covers(self, group: str, resource: str, operation: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and operation in r["operations"]
                   for r in self.doc["spec"]["matchConstraints"]["resourceRules"])

    def admit(self, request: Mapping[str, Any], obj: Any, old: Any = None) -> Verdict:
        activation: dict[str, Any] = {"request": celpy.json_to_cel(dict(request)),
                                      "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)}
        if not all(_true(prog, activation) for _, prog in self.conditions):
            return Verdict(False, [])
        variables: dict[str, Any] = {}
        for name, prog in self.variables:
            activation["variables"] = celpy.celtypes.MapType(variables)
            # an error is, as in Kubernetes, an error of the expressions that read it (here: no such member)
            with contextlib.suppress(celpy.CELEvalError):
                variables[celpy.celtypes.StringType(name)] = prog.evaluate(activation)
        activation["variables"] = celpy.celtypes.MapType(variables)
        denied = []
        for prog, message, message_prog in self.validations:
            if _true(prog, activation):
                continue
            text = message
            if message_prog is not None:
                text = str(message_prog.evaluate(activation))
            denied.append(text or "denied")
        return Verdict(True, denied)


def _true(prog: Any, activation: Mapping[str, Any]) -> bool:
    try:
        result = prog.evaluate(dict(activation))
    except celpy.CELEvalError:
        return False  # failurePolicy: Fail
    return not isinstance(result, Exception) and bool(result) is True


def _policies() -> dict[str, Policy]:
    out = {}
    for name in FILES:
        for doc in _docs(name):
            if doc["kind"] == "ValidatingAdmissionPolicy":
                out[doc["metadata"]["name"]] = Policy(doc)
    return out


POLICIES = _policies()
STATES = POLICIES["gpuagent-gpunodestate-own-node"]
NODES = POLICIES["gpuagent-node-own-gpu-fields"]
LEASES = POLICIES["gpuagent-lease-own-slot"]


def request(operation: str, *, user: str = AGENT, node: str | None = ME, extra: dict | None = None,
            sub_resource: str = "") -> dict[str, Any]:
    """An admission request's ``request`` as the API server builds it for a pod-bound token of ``node``."""
    info: dict[str, Any] = {"username": user, "uid": "0b1c", "groups": ["system:serviceaccounts",
                                                                       "system:authenticated"]}
    if extra is not None:
        info["extra"] = extra
    elif node is not None:
        info["extra"] = {"authentication.kubernetes.io/pod-name": ["gpuagent-x7k2p"],
                         "authentication.kubernetes.io/pod-uid": ["6f1e"], NODE_NAME_KEY: [node],
                         "authentication.kubernetes.io/node-uid": ["9a2d"]}
    return {"operation": operation, "userInfo": info, "subResource": sub_resource}


# --- the manifests -------------------------------------------------------------------------------------------


def test_every_policy_is_bound_to_deny_and_matches_only_the_agents_service_account() -> None:
    bindings = {d["spec"]["policyName"]: d for name in FILES for d in _docs(name)
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(POLICIES) == {"gpuagent-gpunodestate-own-node", "gpuagent-node-own-gpu-fields",
                                              "gpuagent-lease-own-slot"}
    for name, policy in POLICIES.items():
        assert bindings[name]["spec"]["validationActions"] == ["Deny"]
        assert policy.doc["spec"]["failurePolicy"] == "Fail"
        assert [c["expression"] for c in policy.doc["spec"]["matchConditions"]] == [
            f"request.userInfo.username == '{AGENT}'"]


def test_the_policies_cover_every_write_the_agents_role_allows_on_these_objects() -> None:
    assert STATES.covers("gpuagent.io", "gpunodestates", "CREATE") and STATES.covers("gpuagent.io",
                                                                                     "gpunodestates", "UPDATE")
    assert NODES.covers("", "nodes", "UPDATE") and NODES.covers("", "nodes/status", "UPDATE")
    assert LEASES.covers("coordination.k8s.io", "leases", "CREATE")
    assert LEASES.covers("coordination.k8s.io", "leases", "UPDATE")


def test_the_policies_name_what_the_code_writes() -> None:
    node_text = (DEPLOY / "admission-node.yaml").read_text()
    assert f"'{TAINT_KEY}'" in node_text and str(ANNOTATION_MAX_BYTES) in node_text
    assert f"[{', '.join(repr(c) for c in table.CONDITIONS)}]" in node_text
    assert f"'{SLOT_SUFFIX}'" in (DEPLOY / "admission-lease.yaml").read_text()


# --- GPUNodeState --------------------------------------------------------------------------------------------


def _state(name: str) -> dict[str, Any]:
    return {"apiVersion": "gpuagent.io/v1alpha1", "kind": "GPUNodeState", "metadata": {"name": name},
            "agent": {"epoch": 1, "sequence": 2}, "heartbeatTime": "2026-11-29T08:00:00Z", "hints": {}}


def test_an_agent_may_write_its_own_nodes_state() -> None:
    assert STATES.admit(request("CREATE"), _state(ME)).allowed
    assert STATES.admit(request("UPDATE"), _state(ME), _state(ME)).allowed


def test_an_agent_may_not_write_another_nodes_state() -> None:
    for operation, old in (("CREATE", None), ("UPDATE", _state(OTHER))):
        verdict = STATES.admit(request(operation), _state(OTHER), old)
        assert verdict.matched and verdict.denied == [
            f"the agent on node {ME} may write only its own node's GPUNodeState, not {OTHER}"]


@pytest.mark.parametrize("extra", [None, {}, {NODE_NAME_KEY: []}, {NODE_NAME_KEY: [ME, OTHER]},
                                   {"authentication.kubernetes.io/pod-name": ["gpuagent-x7k2p"]}],
                         ids=["no-extra", "empty", "no-value", "two-nodes", "pod-only"])
def test_a_token_that_names_no_single_node_writes_no_state(extra: dict | None) -> None:
    verdict = STATES.admit(request("CREATE", node=None, extra=extra), _state(ME))
    assert verdict.matched and any("names no node" in m for m in verdict.denied)


@pytest.mark.parametrize("user", ["system:serviceaccount:gpuagent:gpuagent-extender", "kubernetes-admin",
                                  "system:serviceaccount:other:gpuagent"])
def test_other_users_are_not_matched(user: str) -> None:
    verdict = STATES.admit(request("UPDATE", user=user, node=None), _state(OTHER), _state(OTHER))
    assert not verdict.matched and verdict.allowed


# --- the Node ------------------------------------------------------------------------------------------------


HUMAN_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def _fatal_plan(at: float) -> Any:
    """A fault held until a reset on GPU 0 (XID 79, then lost): taint, cordon, hand-off, held-faults."""
    tracker, classifier = FaultTracker(), Classifier()
    lost = snap(gpu(0, health=Health.LOST, health_detail="NVML_ERROR_GPU_IS_LOST"), gpu(1), at=at)
    faults, _ = tracker.update(lost, classifier.observe(lost), at)
    conditions = conditions_of(faults, {}, at)
    return plan_for(faults, conditions, lost, HealthSettings(mode="enforce"))


def _clear_plan(at: float) -> Any:
    healthy = snap(gpu(0), gpu(1), at=at)
    return plan_for((), conditions_of((), {}, at), healthy, HealthSettings(mode="enforce"))


def _agent_writes(node: dict[str, Any], plan: Any, *, quarantine: bool, at: float) -> list[tuple[dict, dict]]:
    """(new, old) for each write of a writer's round: the conditions (strategic merge on nodes/status), then
    taints, cordon and annotations (JSON merge patch)."""
    pairs = []
    status = conditions_patch(node, plan.conditions, at, 300.0)
    if status is not None:
        patched = strategic_merge_patch(node, status)
        pairs.append((patched, node))
        node = patched
    outcome = spec_patch(node, plan, quarantine=quarantine, remediation=True, now=at)
    if outcome.patch is not None:
        pairs.append((merge_patch(node, outcome.patch), node))
    return pairs


def test_what_the_agent_writes_to_its_node_is_allowed_through_quarantine_and_recovery() -> None:
    node = make_node(ME, taints=[HUMAN_TAINT])
    writes = _agent_writes(node, _fatal_plan(T0), quarantine=True, at=T0)
    quarantined = writes[-1][0]
    assert quarantined["spec"]["unschedulable"] is True and any(t["key"] == TAINT_KEY
                                                                for t in quarantined["spec"]["taints"])
    assert {"gpuagent.io/quarantine", "gpuagent.io/remediation"} <= set(quarantined["metadata"]["annotations"])
    writes += _agent_writes(quarantined, _clear_plan(T0 + 600), quarantine=False, at=T0 + 600)
    recovered = writes[-1][0]
    assert "unschedulable" not in recovered["spec"] and recovered["spec"]["taints"] == [HUMAN_TAINT]
    assert len(writes) == 4
    for new, old in writes:
        verdict = NODES.admit(request("UPDATE"), new, old)
        assert verdict.matched and verdict.allowed, verdict.denied


def test_the_held_faults_record_the_agent_writes_is_allowed() -> None:
    node = make_node(ME)
    old = copy.deepcopy(node)
    node["metadata"]["annotations"][HELD_ANNOTATION] = json.dumps(
        {"bootID": "b", "faults": [{"reason": "XidGspTimeout", "gpu": UUIDS[0], "index": 0, "since": T0}]})
    assert NODES.admit(request("UPDATE"), node, old).allowed


def _changed(change: Any, *, base: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    old = base or make_node(ME, taints=[HUMAN_TAINT])
    new = copy.deepcopy(old)
    change(new)
    return new, old


def _set_condition(kind: str, status: str) -> Any:
    def change(node: dict[str, Any]) -> None:
        for c in node["status"]["conditions"]:
            if c["type"] == kind:
                c["status"] = status
    return change


NODE_ATTACKS = {
    "relabel": (lambda n: n["metadata"]["labels"].update({"nvidia.com/gpu.product": "B200"}), "labels"),
    "drop-a-label": (lambda n: n["metadata"]["labels"].pop("kubernetes.io/os"), "labels"),
    "annotate": (lambda n: n["metadata"]["annotations"].update({"example.com/x": "1"}), "gpuagent.io/*"),
    "change-an-annotation": (lambda n: n["metadata"]["annotations"].update(
        {"node.alpha.kubernetes.io/ttl": "30"}), "gpuagent.io/*"),
    "remove-an-annotation": (lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl"),
                             "gpuagent.io/*"),
    "huge-held-faults": (lambda n: n["metadata"]["annotations"].update(
        {HELD_ANNOTATION: "x" * (ANNOTATION_MAX_BYTES + 1)}), "64 KiB"),
    "lift-a-persons-taint": (lambda n: n["spec"].update(taints=[]), "gpuagent.io/gpu-unhealthy"),
    "add-another-taint": (lambda n: n["spec"]["taints"].append(
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}), "gpuagent.io/gpu-unhealthy"),
    "set-provider-id": (lambda n: n["spec"].update(providerID="aws:///elsewhere"), "spec"),
    "drop-pod-cidr": (lambda n: n["spec"].pop("podCIDR"), "spec"),
    "not-ready": (_set_condition("Ready", "False"), "only its conditions"),
    "drop-a-condition": (lambda n: n["status"]["conditions"].pop(0), "only its conditions"),
    "more-gpus": (lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": "64"}), "allocatable"),
    "re-address": (lambda n: n["status"].update(addresses=[{"type": "InternalIP", "address": "10.9.9.9"}]),
                   "addresses"),
}


@pytest.mark.parametrize("attack", sorted(NODE_ATTACKS))
def test_what_else_the_role_allows_on_its_own_node_is_denied(attack: str) -> None:
    change, why = NODE_ATTACKS[attack]
    new, old = _changed(change)
    verdict = NODES.admit(request("UPDATE", sub_resource="status" if "status" in new else ""), new, old)
    assert verdict.matched and len(verdict.denied) == 1 and why in verdict.denied[0], verdict.denied


def test_a_held_faults_record_over_the_bound_already_there_does_not_block_the_agents_other_writes() -> None:
    base = make_node(ME)
    base["metadata"]["annotations"][HELD_ANNOTATION] = "x" * (ANNOTATION_MAX_BYTES + 1)
    new, old = _changed(lambda n: n["spec"].update(unschedulable=True), base=base)
    assert NODES.admit(request("UPDATE"), new, old).allowed


def test_a_cordon_a_person_set_is_not_lifted_by_the_agent() -> None:
    base = make_node(ME, unschedulable=True)
    new, old = _changed(lambda n: n["spec"].pop("unschedulable"), base=base)
    assert any("lift only a cordon" in m for m in NODES.admit(request("UPDATE"), new, old).denied)


@pytest.mark.parametrize("write", ["conditions", "quarantine"])
def test_the_agent_may_change_nothing_on_another_node(write: str) -> None:
    node = make_node(OTHER)
    new, old = _agent_writes(node, _fatal_plan(T0), quarantine=True, at=T0)[0 if write == "conditions" else 1]
    verdict = NODES.admit(request("UPDATE"), new, old)
    assert verdict.denied == [f"the agent on node {ME} may change only its own Node, not {OTHER}"]


def test_a_token_without_its_node_changes_no_node() -> None:
    new, old = _agent_writes(make_node(ME), _fatal_plan(T0), quarantine=True, at=T0)[1]
    assert any("names no node" in m for m in NODES.admit(request("UPDATE", node=None), new, old).denied)


def test_a_person_is_not_held_to_the_agents_fields() -> None:
    new, old = _changed(NODE_ATTACKS["relabel"][0])
    assert not NODES.admit(request("UPDATE", user="kubernetes-admin", node=None), new, old).matched


# --- the quarantine budget's Lease ---------------------------------------------------------------------------


def _lease(annotations: dict[str, str], *, name: str = LEASE_NAME) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "gpuagent", "resourceVersion": "3",
                         "annotations": annotations}, "spec": {}}


@pytest.mark.integration
async def test_what_the_budget_writes_is_allowed_create_renew_and_release() -> None:
    now = [T0]
    async with FakeApiServer() as api:
        key = ("gpuagent", LEASE_NAME)
        connection = ApiConnection(config=api.kubeconfig())
        try:
            other = QuarantineBudget(connection, OTHER, namespace="gpuagent", limit=2, clock=lambda: now[0])
            mine = QuarantineBudget(connection, ME, namespace="gpuagent", limit=2, clock=lambda: now[0])
            steps = [(other, "acquire", OTHER), (mine, "acquire", ME), (mine, "acquire", ME),
                     (mine, "release", ME)]
            for i, (budget, step, node) in enumerate(steps):
                now[0] = T0 + 120 * i  # past renew_every: every acquire writes
                old = copy.deepcopy(api.cluster.leases.get(key))
                await getattr(budget, step)()
                new = api.cluster.leases[key]
                assert new != old
                verdict = LEASES.admit(request("CREATE" if old is None else "UPDATE", node=node), new, old)
                assert verdict.matched and verdict.allowed, (step, node, verdict.denied)
        finally:
            await connection.aclose()
        assert api.cluster.leases[key]["metadata"]["annotations"] == {slot_key(OTHER): stamp(T0)}


MINE, THEIRS = slot_key(ME), slot_key(OTHER)
LEASE_ATTACKS = {
    "free-their-slot": ({THEIRS: stamp(T0)}, {}, "only its own slot"),
    "renew-their-slot": ({THEIRS: stamp(T0)}, {THEIRS: stamp(T0 + 60)}, "only its own slot"),
    "take-a-slot-for-them": ({}, {THEIRS: stamp(T0)}, "only its own slot"),
    "annotate": ({}, {"example.com/x": "1"}, "only its own slot"),
    "stamp-1e300": ({}, {MINE: "1e300"}, "unix seconds"),
    "stamp-infinity": ({}, {MINE: "Infinity"}, "unix seconds"),
    "stamp-400-digits": ({}, {MINE: "1" * 400}, "unix seconds"),
    "stamp-negative": ({}, {MINE: "-1764400000"}, "unix seconds"),
}


@pytest.mark.parametrize("attack", sorted(LEASE_ATTACKS))
def test_what_else_update_on_the_lease_allows_is_denied(attack: str) -> None:
    before, after, why = LEASE_ATTACKS[attack]
    verdict = LEASES.admit(request("UPDATE"), _lease(after), _lease(before))
    assert verdict.matched and len(verdict.denied) == 1 and why in verdict.denied[0], verdict.denied


def test_create_makes_only_the_budgets_lease_with_only_its_own_slot() -> None:
    assert LEASES.admit(request("CREATE"), _lease({MINE: stamp(T0)})).allowed
    assert "gpuagent-quarantine" in LEASES.admit(request("CREATE"), _lease({}, name="other")).denied[0]
    assert "only its own slot" in LEASES.admit(request("CREATE"), _lease({THEIRS: stamp(T0)})).denied[0]


def test_the_lease_spec_and_labels_stay_as_they_were() -> None:
    new = _lease({MINE: stamp(T0)})
    new["spec"] = {"holderIdentity": ME}
    assert any("labels or spec" in m for m in LEASES.admit(request("UPDATE"), new, _lease({})).denied)


def test_a_token_without_its_node_takes_no_slot() -> None:
    verdict = LEASES.admit(request("UPDATE", node=None), _lease({MINE: stamp(T0)}), _lease({}))
    assert any("names no node" in m for m in verdict.denied)


@pytest.mark.parametrize("value", ["0", "1764400000", "1764400000.125", "999999999999.999999", "1e3", "1.",
                                   ".5", "1764400000.1234567", "1" * 13, "١٢", " 1", "1\n"])
def test_the_policy_and_the_reader_agree_on_what_a_stamp_is(value: str) -> None:
    allowed = LEASES.admit(request("UPDATE"), _lease({MINE: value}), _lease({})).allowed
    assert allowed is bool(STAMP.fullmatch(value))
