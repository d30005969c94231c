"""The Node object's side: the patches that make it show a plan, from the Node as the API server has it.

Pure functions (no I/O), so that they are tested against the Kubernetes schemas and the writer only sends.
The agent marks what it did in one annotation, ``gpuagent.io/quarantine`` (JSON: the fault signature it
acted for, the taints it added, whether it cordoned), and undoes only that: a taint of its key it finds
without having added it, or a cordon a person set, stays. A person's undoing is respected too: when the
annotation's signature is the plan's and a taint it added is gone, or the cordon it set was lifted, the
agent does not put them back until the faults change (a new signature). The remediation hand-off is the
annotation ``gpuagent.io/remediation`` (docs/health.md).

Every annotation read back is read as another party's text: anyone allowed to patch the Node can write it
(``deploy/admission-node.yaml`` narrows that to this node's agent and to people). Each is read through
:mod:`gpuagent.boundedjson` (size, depth, finite numbers of bounded length) and then by shape, so 5,000
nested brackets or a 400-digit number are one refusal, never a ``RecursionError`` or ``OverflowError`` that
costs the writer its round (every round, for the two annotations read each time). The held faults are
read strictly (:func:`held_of`): a bounded list of faults of known shape, each time within bounds; which of
them concern a GPU of this node is the tracker's to decide (:meth:`~.tracker.FaultTracker.adopt`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpuagent.boundedjson import Bounds, Unreadable, in_range, loads
from gpuagent.health.plan import TAINT_KEY, Plan
from gpuagent.snapshot.health import NodeCondition

QUARANTINE_ANNOTATION = "gpuagent.io/quarantine"
REMEDIATION_ANNOTATION = "gpuagent.io/remediation"
HELD_ANNOTATION = "gpuagent.io/held-faults"  # faults held until a reset, kept across agent restarts
# What the agent writes fits well inside these (a held fault is ~110 bytes: 16 GPUs x 30 reasons < 64 KiB);
# deploy/admission-node.yaml refuses gpuagent.io/* annotations over ANNOTATION_MAX_BYTES.
ANNOTATION_MAX_BYTES = 64 << 10
HELD_BOUNDS = Bounds(max_bytes=ANNOTATION_MAX_BYTES, max_depth=3)  # {"faults": [{...}]}
MARK_BOUNDS = Bounds(max_bytes=ANNOTATION_MAX_BYTES, max_depth=2)  # {"taints": [...]}
HANDOFF_BOUNDS = Bounds(max_bytes=ANNOTATION_MAX_BYTES, max_depth=3)  # {"faults": [{...}]}
LATEST_UNIX = 1e11  # a time later than this (the year 5138) is no time the agent wrote


def held_of(node: Mapping[str, Any]) -> list[tuple[str, str, int | None, float]]:
    """The faults a previous run held until a reset, when the node has not rebooted since (same bootID):
    (reason, GPU UUID, index or None, since). [] when there is no annotation or the node rebooted since (a
    reboot is a reset); :class:`~gpuagent.boundedjson.Unreadable` naming the fault when the annotation is
    not what the agent writes (over the bounds, another shape, a time out of range)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(HELD_ANNOTATION)
    boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    if not text or not boot:
        return []
    if not isinstance(text, str):
        raise Unreadable(f"{HELD_ANNOTATION}: not a string")
    mark = loads(text, HELD_BOUNDS, HELD_ANNOTATION)
    if not isinstance(mark, dict) or not isinstance(mark.get("faults", []), list):
        raise Unreadable(f"{HELD_ANNOTATION}: not an object with a list of faults")
    if mark.get("bootID") != boot:
        return []
    return [_held_fault(f, f"{HELD_ANNOTATION}: faults[{i}]") for i, f in enumerate(mark.get("faults", []))]


def _held_fault(fault: Any, path: str) -> tuple[str, str, int | None, float]:
    if not isinstance(fault, dict):
        raise Unreadable(f"{path}: not an object")
    reason, uuid, index = fault.get("reason"), fault.get("gpu"), fault.get("index")
    if not isinstance(reason, str) or not 0 < len(reason) <= 128:
        raise Unreadable(f"{path}.reason: not a reason")
    if not isinstance(uuid, str) or not 0 < len(uuid) <= 128:
        raise Unreadable(f"{path}.gpu: not a GPU UUID")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise Unreadable(f"{path}.index: not a whole number")
    if index is not None:
        in_range(index, 0, 1023, f"{path}.index")
    return reason, uuid, index, float(in_range(fault.get("since", 0.0), 0, LATEST_UNIX, f"{path}.since"))


def _held_annotation(node: Mapping[str, Any], plan: Plan) -> str | None:
    boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    if not plan.held or not boot:
        return None
    faults = [{"reason": r, "gpu": u, "index": i, "since": round(t, 3)} for r, u, i, t in sorted(plan.held)]
    return json.dumps({"bootID": boot, "faults": faults}, sort_keys=True)


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions_patch(node: Mapping[str, Any], conditions: tuple[NodeCondition, ...], now: float,
                     heartbeat_seconds: float) -> dict[str, Any] | None:
    """A strategic-merge patch of ``status.conditions`` (merged by ``type``, so the kubelet's stay) setting
    ours, or None when the Node already shows them and their heartbeat is recent enough."""
    listed = (node.get("status") or {}).get("conditions") or []
    have = {c.get("type"): c for c in listed if isinstance(c, dict)}
    out = []
    for cond in conditions:
        old = have.get(cond.type)
        same = old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
            cond.status, cond.reason, cond.message)
        if same and now - _parse_time(old.get("lastHeartbeatTime")) < heartbeat_seconds:
            continue
        moved = old is None or old.get("status") != cond.status
        out.append({"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message,
                    "lastHeartbeatTime": rfc3339(now),
                    "lastTransitionTime": rfc3339(now) if moved or old is None
                    else old.get("lastTransitionTime", rfc3339(now))})
    return {"status": {"conditions": out}} if out else None


def _parse_time(text: Any) -> float:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class SpecOutcome:
    patch: dict[str, Any] | None  # a JSON merge patch with the read resourceVersion, None: nothing to change
    taints: tuple[str, ...]  # "key=value:Effect" of ours on the Node after the patch
    cordoned: bool  # the agent's cordon stands after the patch
    override: bool  # a person undid the agent's quarantine for these faults


def ours(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the agent recorded it did to this Node, None if nothing or not what the agent writes (then
    nothing there is taken for the agent's: a taint it cannot show it added stays)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(QUARANTINE_ANNOTATION)
    if not text or not isinstance(text, str):
        return None
    try:
        mark = loads(text, MARK_BOUNDS, QUARANTINE_ANNOTATION)
    except Unreadable:
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("signature", ""), str) \
            or not isinstance(mark.get("cordoned", False), bool):
        return None
    taints = mark.get("taints", [])
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        return None
    return mark


def spec_patch(node: Mapping[str, Any], plan: Plan, *, quarantine: bool, remediation: bool,
               now: float) -> SpecOutcome:
    """The patch of taints, cordon and the two annotations for ``plan``; ``quarantine`` False (the budget
    said no, or the faults cleared): undo what is ours."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    annotations = meta.get("annotations") or {}
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    unschedulable = bool(spec.get("unschedulable"))
    mark = ours(node)
    new_taints, new_unschedulable, new_mark = taints, unschedulable, mark
    override = False
    if quarantine and plan.quarantine:
        if mark is not None and mark.get("signature") == plan.signature:
            present = {_taint_id(t) for t in taints}
            override = (bool(mark.get("cordoned")) and not unschedulable) or any(
                t not in present for t in mark.get("taints", []))
        else:
            wanted = [_taint(key, value, effect, now) for key, value, effect in plan.taints]
            new_taints = [t for t in taints if t.get("key") != TAINT_KEY or _taint_id(t) not in _ids(mark)]
            new_taints += [t for t in wanted if _taint_id(t) not in {_taint_id(x) for x in new_taints}]
            cordoned = bool(mark and mark.get("cordoned"))
            if plan.cordon and not unschedulable:
                new_unschedulable, cordoned = True, True
            elif not plan.cordon and cordoned and unschedulable:
                new_unschedulable, cordoned = False, False
            new_mark = {"signature": plan.signature, "taints": [_taint_id(t) for t in wanted],
                        "cordoned": cordoned, "since": rfc3339(now)}
    elif mark is not None:
        new_taints = [t for t in taints if not (t.get("key") == TAINT_KEY and _taint_id(t) in _ids(mark))]
        if mark.get("cordoned") and unschedulable:
            new_unschedulable = False
        new_mark = None
    patch: dict[str, Any] = {}
    changed_annotations: dict[str, Any] = {}
    if new_mark != mark:
        changed_annotations[QUARANTINE_ANNOTATION] = json.dumps(new_mark, sort_keys=True) if new_mark \
            else None
    handoff = json.dumps({**plan.remediation, "node": meta.get("name")}, sort_keys=True) \
        if remediation and plan.remediation else None
    old_handoff = annotations.get(REMEDIATION_ANNOTATION)
    if handoff is not None and _without_since(old_handoff) != _without_since(handoff):
        changed_annotations[REMEDIATION_ANNOTATION] = json.dumps(
            {**json.loads(handoff), "since": rfc3339(now)}, sort_keys=True)
    elif handoff is None and old_handoff is not None:
        changed_annotations[REMEDIATION_ANNOTATION] = None
    held = _held_annotation(node, plan)
    if held != annotations.get(HELD_ANNOTATION):
        changed_annotations[HELD_ANNOTATION] = held
    if changed_annotations:
        patch.setdefault("metadata", {})["annotations"] = changed_annotations
    spec_changes: dict[str, Any] = {}
    if new_taints != taints:
        spec_changes["taints"] = new_taints or None
    if new_unschedulable != unschedulable:
        spec_changes["unschedulable"] = new_unschedulable or None
    if spec_changes:
        patch["spec"] = spec_changes
    if patch:
        patch.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
    mine = set(_ids(new_mark)) & {_taint_id(t) for t in new_taints}
    return SpecOutcome(patch or None, tuple(sorted(mine)), bool(new_mark and new_mark.get("cordoned")
                                                               and new_unschedulable), override)


def _taint(key: str, value: str, effect: str, now: float) -> dict[str, Any]:
    taint = {"key": key, "value": value, "effect": effect}
    if effect == "NoExecute":
        taint["timeAdded"] = rfc3339(now)
    return taint


def _taint_id(taint: Mapping[str, Any]) -> str:
    return f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"


def _ids(mark: Mapping[str, Any] | None) -> list[str]:
    return list(mark.get("taints", [])) if mark else []


def _without_since(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        value = loads(text, HANDOFF_BOUNDS, REMEDIATION_ANNOTATION)
    except Unreadable:
        return text
    if isinstance(value, dict):
        value.pop("since", None)
    return value
