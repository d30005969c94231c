"""Hostile GPUNodeStates and /v1/hints bodies: one bad object is one node's problem, never the view's.

Each test is a finding of issue 28 (items 1 and 4) or 31 that failed on the code before its fix: a field
nested 1,200 levels deep knocked msgspec over with ``RecursionError`` (the watch broke for every node, a
cold start never listed); a heartbeat in the year 9999 or a forged generation held a node's state against
its own agent's later writes; an unreadable object was "no GPUNodeState published"; a bookmark did not
move the watch's resourceVersion; the CRD kept unknown fields, so the API server took what the extender
refuses. The view is driven through the reflector's own entry points (``_decode_list``/``_replace`` for a
list, ``_apply`` for a watch line) so a 5,000-node fleet takes a fraction of a second.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixture_files import filter_request
from test_extender import all_free, all_held

from gpuagent import boundedjson
from gpuagent.export.exposition import generate_text
from gpuagent.hints import agents
from gpuagent.hints.cluster_view import UNKNOWN_REASON, ClusterView
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_registry
from gpuagent.hints.published import (
    MAX_GENERATION,
    Generation,
    crd_manifest,
    decode_list,
    decode_state,
    identify,
    project,
    state_object,
)
from gpuagent.snapshot.hints import NodeHints

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "deploy" / "gpunodestate-crd.yaml"
NOW = 1_800_000_000.0
DEEP = 1200  # the object: 5 KB, about 1,200 levels inside hints


class Wall:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def body(node: str, hints: NodeHints | None = None, *, epoch: int = int(NOW * 1e9) - 10**12,
         sequence: int = 1, heartbeat: float = NOW, rv: int = 1) -> dict[str, Any]:
    obj = state_object(node, project(hints if hints is not None else all_free(node), None),
                       Generation(epoch, sequence), heartbeat)
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def deep_inside_hints(obj: dict[str, Any], depth: int = DEEP) -> bytes:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return raw.replace(b'"hints":{', b'"hints":{"x":' + b"[" * depth + b"]" * depth + b",", 1)


def listing(items: list[bytes], rv: int = 100) -> bytes:
    return b'{"metadata":{"resourceVersion":"%d"},"items":[%s]}' % (rv, b",".join(items))


def event(kind: str, raw: bytes) -> str:
    return (b'{"type":"%s","object":%s}' % (kind.encode(), raw)).decode()


def raw_of(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def view_of(items: list[bytes], wall: Wall) -> ClusterView:
    view = ClusterView(wall_clock=wall, max_clock_skew=300.0)
    decoded, rv = view._decode_list(listing(items))
    view._replace(decoded)
    view._rv = rv
    return view


async def verdicts(view: ClusterView, nodes: list[str]) -> dict[str, Any]:
    """Each node's verdict for a one-GPU pod: "pass", or the reason it failed."""
    request = {**filter_request(), "NodeNames": nodes}
    reply = await Extender(view, max_age_seconds=900.0, wall_clock=view._wall).filter(request)
    return {**dict.fromkeys(reply["NodeNames"] or [], "pass"), **reply["FailedNodes"],
            **reply["FailedAndUnresolvableNodes"]}


# --- the bounded reader ----------------------------------------------------------------------------------------


def test_brackets_left_open_count_as_depth() -> None:
    """Was 0: an opener with no closer stopped the count, and msgspec then recursed 2,000 levels."""
    assert boundedjson.depth(b"[" * 2000, 32) is None
    assert boundedjson.depth(b'{"a":' + b"[" * 40 + b"]", 32) is None
    assert boundedjson.depth(b"[[[}", 32) == 3  # crossed: shallow, left to the parser to name


def test_a_cut_document_stays_refused_but_its_name_can_be_read() -> None:
    raw = deep_inside_hints(body("node-b"))
    cut = boundedjson.shallow(raw, 32)
    assert boundedjson.depth(cut, 32) is None and boundedjson.depth(cut, 33) == 33
    assert json.loads(cut)["metadata"]["name"] == "node-b"
    tricky = b'{"s":"[[[\\"{{","a":[[[[1]]]],"t":"]]"}'
    assert json.loads(boundedjson.shallow(tricky, 2)) == {"s": '[[["{{', "a": [[]], "t": "]]"}


# --- decoding one object ---------------------------------------------------------------------------------------


def test_an_object_nested_1200_deep_is_refused_and_still_named() -> None:
    """Was RecursionError, which no ``except ValueError`` caught."""
    raw = deep_inside_hints(body("node-b", rv=7))
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        decode_state(raw)
    assert identify(raw) == ("node-b", "7")
    assert identify(b"{not json") == ("", "")


@pytest.mark.parametrize(("change", "path"), [
    (lambda o: o["hints"]["gpus"][0].update(schedulable_share_ratio=1.5), "schedulable_share_ratio"),
    (lambda o: o["hints"]["gpus"][0].update(memory_free_bytes=2**62), "memory_free_bytes"),
    (lambda o: o["hints"]["gpus"][0].update(index=-1), "index"),
    (lambda o: o["hints"].update(gpus=o["hints"]["gpus"] * 20), "gpus"),
    (lambda o: o["hints"].update(hostname="x" * 600), "hostname"),
    (lambda o: o["agent"].update(sequence=-5), "agent.sequence"),
    (lambda o: o["hints"]["gpus"][0].update(memory_free_bytes=10**30), "memory_free_bytes"),
    (lambda o: o.update(heartbeatTime="99999-01-01T00:00:00Z"), "heartbeatTime"),
])
def test_figures_out_of_their_physical_range_are_refused_naming_the_field(change: Any, path: str) -> None:
    obj = body("n1")
    change(obj)
    with pytest.raises(ValueError, match=path.replace(".", r"\.")):
        decode_state(raw_of(obj))


def test_numbers_json_has_no_place_for_are_refused() -> None:
    raw = raw_of(body("n1")).replace(b'"schedulable_share_ratio":1.0', b'"schedulable_share_ratio":1e999', 1)
    with pytest.raises(ValueError):
        decode_state(raw)
    with pytest.raises(ValueError, match="over the limit"):
        decode_state(raw_of(body("n1"))[:-1] + b',"pad":"' + b"x" * 600_000 + b'"}')


def test_a_list_with_one_deep_item_lists_the_others() -> None:
    """Was RecursionError for the whole list: a cold start never became ready."""
    items, rv, checked = decode_list(listing([raw_of(body("a")), deep_inside_hints(body("b")),
                                              raw_of(body("c"))]))
    assert rv == "100" and len(items) == 3 and not checked  # cut: each item's depth is counted again
    assert decode_state(items[0]).node == "a" and decode_state(items[2]).node == "c"
    with pytest.raises(ValueError, match="nested deeper"):
        decode_state(items[1])
    assert identify(items[1])[0] == "b"


def test_a_v1_hints_body_is_read_bounded() -> None:
    """``/v1/hints`` from an agent: was ``json.loads``, whose RecursionError escaped the fetch's handler."""
    good = json.dumps(body("n1")["hints"], separators=(",", ":")).encode()
    assert agents._decode(good).hostname == "n1"
    for bad, match in [(b'{"x":' + b"[" * DEEP + b"]" * DEEP + b"}", "nested deeper"),
                       (good.replace(b'"schedulable_share_ratio":1.0', b'"schedulable_share_ratio":NaN', 1),
                        "NaN"),
                       (good.replace(b'"schedulable_share_ratio":1.0', b'"schedulable_share_ratio":7.5', 1),
                        "schedulable_share_ratio")]:
        with pytest.raises(ValueError, match=match):
            agents._decode(bad)


# --- the view ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("depth", "refused"), [(32, False), (33, True), (40, True), (70, True)])
async def test_the_depth_bound_holds_exactly_by_list_and_by_watch(depth: int, refused: bool) -> None:
    """The depth is counted once, on the list's or the watch line's bytes: an object at the bound is read,
    one level more is refused, whichever way it comes and whether or not the bytes around it were cut."""
    honest = body("n1")
    inside = depth - 2  # the object's own braces, and "hints"'s
    raw = raw_of(honest).replace(b'"hints":{', b'"hints":{"x":' + b"[" * inside + b"]" * inside + b",", 1)
    assert boundedjson.depth(raw, 100) == depth
    view = view_of([raw], Wall())
    assert (view.get("n1").unreadable is not None) is refused
    view._apply(event("MODIFIED", raw_of(body("n1", sequence=2, rv=5))))
    assert view.get("n1").unreadable is None
    view._apply(event("MODIFIED", raw.replace(b'"sequence":1', b'"sequence":3')))
    assert (view.get("n1").unreadable is not None) is refused


async def test_in_a_5000_node_view_one_hostile_object_changes_that_node_only() -> None:
    wall = Wall()
    nodes = [f"node-{i}" for i in range(5000)]
    hostile = "node-78"  # an idle node: it would pass
    idle, busy = raw_of(body("NODE")), raw_of(body("NODE", all_held("NODE")))  # named per node below
    items = [deep_inside_hints(body(n)) if n == hostile else (busy if i % 2 else idle).replace(
        b"NODE", n.encode()) for i, n in enumerate(nodes)]
    view = view_of(items, wall)  # a cold start: the list is read, the hostile object refused
    before = await verdicts(view, nodes)
    assert "GPUNodeState cannot be read" in before[hostile] and "nested deeper" in before[hostile]
    assert sum(v == "pass" for v in before.values()) == 2500 - 1  # every even node but the hostile one
    # by watch: the hostile write lands on another node, then honest writes of every other kind follow
    view._apply(event("MODIFIED", deep_inside_hints(body("node-4", rv=200))))
    view._apply(event("MODIFIED", raw_of(body("node-1", all_free("node-1"), sequence=2, rv=201))))
    view._apply(event("MODIFIED", raw_of(body(hostile, all_free(hostile), sequence=2, rv=202))))
    assert view._rv == "202"
    after = await verdicts(view, nodes)
    changed = {n for n in nodes if after[n] != before[n]}
    assert changed == {"node-4", "node-1", hostile}
    assert "GPUNodeState cannot be read" in after["node-4"] and after["node-1"] == after[hostile] == "pass"


async def test_a_heartbeat_or_epoch_from_the_future_pins_nothing() -> None:
    """Was: epoch 2^63-1 and a heartbeat in 9999 held node B's state against its own agent for ever."""
    wall = Wall()
    view = view_of([raw_of(body("b", sequence=5))], wall)
    forged = body("b", all_free("b"), epoch=MAX_GENERATION, sequence=MAX_GENERATION, rv=2)
    forged["heartbeatTime"] = "9999-12-31T23:59:59.000000Z"
    view._apply(event("MODIFIED", raw_of(forged)))
    reason = (await verdicts(view, ["b"]))["b"]
    assert "ahead of the extender's clock" in reason and "clock-skew bound" in reason
    wall.now += 30
    view._apply(event("MODIFIED", raw_of(body("b", all_held("b"), sequence=6, heartbeat=wall.now, rv=3))))
    assert view.get("b").hints is not None and view.get("b").hints.free_gpu_count == 0
    assert (await verdicts(view, ["b"]))["b"] != "pass"  # judged on its own agent's write: all GPUs held


async def test_a_forged_sequence_is_outrun_by_the_agent_s_next_heartbeat() -> None:
    """Was: the same epoch with sequence 2^63-1 made every later write of the real agent 'stale'."""
    wall = Wall()
    epoch = int(NOW * 1e9) - 10**12
    view = view_of([raw_of(body("b", epoch=epoch, sequence=5))], wall)
    view._apply(event("MODIFIED", raw_of(body("b", all_free("b"), epoch=epoch, sequence=MAX_GENERATION,
                                              heartbeat=NOW + 299, rv=2))))  # within the skew: trusted
    wall.now += 300
    view._apply(event("MODIFIED", raw_of(body("b", all_held("b"), epoch=epoch, sequence=6, heartbeat=wall.now,
                                              rv=3))))
    assert view.get("b").hints.free_gpu_count == 0 and view.stale_writes == 0
    # and a write older by both its generation and its heartbeat is still ignored
    view._apply(event("MODIFIED", raw_of(body("b", all_free("b"), epoch=epoch, sequence=4, heartbeat=NOW,
                                              rv=4))))
    assert view.get("b").hints.free_gpu_count == 0 and view.stale_writes == 1


async def test_bookmarks_and_unreadable_events_move_the_resource_version() -> None:
    """Was: neither did, so a re-watch replayed from an old version."""
    view = view_of([raw_of(body("a"))], Wall())
    view._apply('{"type":"BOOKMARK","object":{"kind":"GPUNodeState","apiVersion":"gpuagent.io/v1alpha1",'
                '"metadata":{"resourceVersion":"150","annotations":{"k8s.io/initial-events-end":"true"}}}}')
    assert view._rv == "150"
    bad = body("a", rv=160)
    bad["hints"]["gpus"] = "none"
    view._apply(event("MODIFIED", raw_of(bad)))
    assert view._rv == "160" and view.get("a").unreadable is not None
    view._apply(event("DELETED", deep_inside_hints(body("a", rv=170))))  # deleted while unreadable
    assert view._rv == "170" and view.get("a") is None and not view.knows("a")


async def test_refusals_are_counted_and_named_in_the_metrics(caplog: pytest.LogCaptureFixture) -> None:
    wall = Wall()
    view = view_of([raw_of(body("a")), deep_inside_hints(body("b"))], wall)
    future = body("c", heartbeat=NOW + 3600)
    view._apply(event("ADDED", raw_of(future)))
    text = generate_text(build_registry(Extender(view, max_age_seconds=900.0))).decode()
    assert 'gpuagent_extender_published_writes_total{outcome="unreadable"} 1.0' in text
    assert 'gpuagent_extender_published_writes_total{outcome="ahead_of_clock"} 1.0' in text
    assert 'gpuagent_extender_published_writes_total{outcome="applied"} 1.0' in text
    assert "gpuagent_extender_published_refused_nodes 2.0" in text
    assert 'gpuagent_extender_published_refused_node_info{node="b",reason="unreadable"} 1.0' in text
    assert 'gpuagent_extender_published_refused_node_info{node="c",reason="ahead_of_clock"} 1.0' in text
    assert "'b'" in caplog.text and "'c'" in caplog.text
    lines = len(caplog.records)
    view._apply(event("MODIFIED", deep_inside_hints(body("b", rv=5))))  # the same refusal again: not logged
    assert len(caplog.records) == lines and view.bad_objects == 2
    assert UNKNOWN_REASON not in (await verdicts(view, ["b"]))["b"]


# --- the CRD -----------------------------------------------------------------------------------------------------

CRD_HEADER = """\
# GPUNodeState: one node's GPU state as its agent publishes it for the scheduler extender (the cluster
# view, docs/scheduling.md). Cluster-scoped, named after the node. Written by the node's agent with
# server-side apply when a scheduling decision could change (rate-limited) and on a heartbeat; read by the
# extender with one list and watch.
#
# GENERATED from gpuagent.hints.published.crd_manifest (tests/test_hostile_objects.py checks it; rewrite
# with GPUAGENT_UPDATE_GOLDEN=1). The schema is structural and closed: every field typed, every number in
# its physical range, every string and list capped, no unknown field kept, so the API server refuses or
# prunes what the extender would refuse (hints.codec's limits are the one table behind both). An agent
# that adds fields ships with the CRD that names them.
"""


def write_crd() -> None:
    CRD.write_text(CRD_HEADER + yaml.safe_dump(crd_manifest(), sort_keys=False, width=110))


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        out += walk(prop, f"{path}.{name}")
    if "items" in schema:
        out += walk(schema["items"], f"{path}[]")
    return out


def test_the_crd_is_generated_structural_and_closed() -> None:
    if os.environ.get("GPUAGENT_UPDATE_GOLDEN") == "1":
        write_crd()
    assert yaml.safe_load(CRD.read_text()) == crd_manifest(), \
        "deploy/gpunodestate-crd.yaml is not crd_manifest(): GPUAGENT_UPDATE_GOLDEN=1 rewrites it"
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        assert "type" in node, path
        if node["type"] == "string" and path != ".apiVersion" and path != ".kind":
            assert "maxLength" in node, path
        if node["type"] == "array":
            assert "maxItems" in node, path
        if node["type"] in ("integer", "number"):
            assert "minimum" in node and "maximum" in node, path
        if node["type"] == "object" and path not in ("", ".metadata"):
            assert node.get("properties"), path


def test_the_crd_refuses_what_the_extender_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    good = body("n1")
    validator = jsonschema.Draft7Validator(nullable_to_jsonschema(schema))
    assert not list(validator.iter_errors(good))
    for change in (lambda o: o["hints"]["gpus"][0].update(schedulable_share_ratio=1.5),
                   lambda o: o["agent"].update(epoch=-1),
                   lambda o: o["hints"].update(gpus=o["hints"]["gpus"] * 20)):
        bad = json.loads(json.dumps(good))
        change(bad)
        assert list(validator.iter_errors(bad))
        with pytest.raises(ValueError):
            decode_state(raw_of(bad))


def nullable_to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3's ``nullable: true`` as JSON Schema's ``type: [t, "null"]`` (what validators read)."""
    if isinstance(schema, list):
        return [nullable_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: nullable_to_jsonschema(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable"):
        out["type"] = [schema["type"], "null"]
    if out.get("format") in ("int64",):
        del out["format"]
    return out


def test_decoding_stays_cheap() -> None:
    """A coarse bound, not the measurement (docs/scheduling.md has that): decoding an 8-GPU object, bounds
    and all, in well under a millisecond even on a loaded machine."""
    raw = raw_of(body("n1", all_held("n1")))
    started = time.process_time()
    for _ in range(200):
        decode_state(raw)
    assert (time.process_time() - started) / 200 < 1e-3
