"""kube-scheduler's extender JSON (``k8s.io/kube-scheduler/extender/v1``), parsed and written exactly.

The Go structs have no json tags, so the keys are the Go field names in PascalCase and nil is sent as
``null``: ``ExtenderArgs`` is ``{"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}``
(``nodeCacheCapable: true`` sends ``NodeNames``, ``false`` the full ``Nodes``). Go's decoder matches keys
case-insensitively, so ``parse_args`` does too (an exact match first).

Replies mirror what was sent: a filter answers ``NodeNames`` when it got names and ``Nodes`` (the same node
objects, fewer of them) when it got a NodeList. Both null would filter out every node, so the reply always
sets the one the scheduler reads. Prioritize answers a bare ``[{"Host", "Score"}]`` list, scores 0-10.
``filter_reply`` and ``priorities`` make them from a call's verdicts in C-speed passes over the names (at
20,000 names every pass counts), and ``encode`` writes them with msgspec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, not_
from typing import Any

import msgspec

from gpuagent.hints.fitrequest import RequestError
from gpuagent.hints.malformed import json_kind

MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY = 0, 10
# Candidate nodes in one call, at most: Kubernetes supports clusters of up to 5,000 nodes; far past that, a
# list is an attack on the time the loop spends per name, refused before any per-name work.
MAX_CANDIDATES = 100_000


class ArgsError(RequestError):
    """A malformed ExtenderArgs: answered with a 400 naming ``field``."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]  # the candidates, in the order sent (from NodeNames, else Nodes.items)
    nodes: Mapping[str, Any] | None  # the NodeList as sent; None when the scheduler sent NodeNames
    names_sent: bool  # NodeNames was a list (nodeCacheCapable)


def _get(body: Mapping[str, Any], key: str) -> Any:
    """``body[key]`` with Go's key matching: exact first, else case-insensitive."""
    if key in body:
        return body[key]
    lowered = key.lower()
    for name, value in body.items():
        if isinstance(name, str) and name.lower() == lowered:
            return value
    return None


def parse_args(body: Any) -> ExtenderArgs:
    """Check an ExtenderArgs body; raises ``ArgsError`` naming the field."""
    if not isinstance(body, Mapping):
        raise ArgsError("body",
                        f"expected an ExtenderArgs object (Pod, Nodes, NodeNames), got {json_kind(body)}")
    pod = _get(body, "Pod")
    if not isinstance(pod, Mapping):
        raise ArgsError("Pod", f"expected the pod being scheduled (a v1 Pod object), got {json_kind(pod)}")
    raw_names = _get(body, "NodeNames")
    raw_nodes = _get(body, "Nodes")
    names: list[str] = []
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise ArgsError("NodeNames", f"expected a list of node names or null, got {json_kind(raw_names)}")
        _check_count("NodeNames", raw_names)
        if set(map(type, raw_names)) - {str} or "" in raw_names:  # at C speed; the loop names the culprit
            for index, name in enumerate(raw_names):
                if not isinstance(name, str) or not name:
                    raise ArgsError(f"NodeNames[{index}]", f"expected a node name, got {json_kind(name)}")
        names = raw_names
    nodes: Mapping[str, Any] | None = None
    if raw_nodes is not None:
        if not isinstance(raw_nodes, Mapping):
            raise ArgsError("Nodes", f"expected a v1 NodeList object or null, got {json_kind(raw_nodes)}")
        items = raw_nodes.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise ArgsError("Nodes.items", f"expected a list of v1 Node objects, got {json_kind(items)}")
        _check_count("Nodes.items", items)
        node_names = [_node_name(item, index) for index, item in enumerate(items)]
        if raw_names is None:
            names = node_names
        nodes = raw_nodes
    return ExtenderArgs(pod=pod, node_names=tuple(names), nodes=nodes, names_sent=raw_names is not None)


def _check_count(field: str, candidates: list[Any]) -> None:
    if len(candidates) > MAX_CANDIDATES:
        raise ArgsError(field, f"{len(candidates)} candidate nodes, over the limit of {MAX_CANDIDATES}")


def _node_name(item: Any, index: int) -> str:
    meta = item.get("metadata") if isinstance(item, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ArgsError(f"Nodes.items[{index}].metadata.name", f"expected a node name, got {json_kind(name)}")
    return name


def filter_result(
    args: ExtenderArgs,
    passing: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """An ExtenderFilterResult mirroring the form of ``args``; ``passing``: the names that pass, in the
    order of ``args.node_names`` (a name sent twice, twice)."""
    nodes = None
    if args.nodes is not None:
        keep = set(passing)
        items = args.nodes.get("items") or []
        nodes = {**args.nodes, "items": [item for item in items if item["metadata"]["name"] in keep]}
    names = None
    if args.names_sent or args.nodes is None:  # never both null: that would filter out every node
        names = passing if type(passing) is list else list(passing)  # a list of the caller's: not copied
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": failed if type(failed) is dict else dict(failed),
        "FailedAndUnresolvableNodes": unresolvable if type(unresolvable) is dict else dict(unresolvable),
        "Error": error,
    }


class HostPriority(msgspec.Struct):
    """One entry of a HostPriorityList, written by msgspec as ``{"Host": ..., "Score": ...}``."""

    Host: str
    Score: int


def host_priority_list(hosts: Sequence[str], scores: Sequence[int]) -> list[HostPriority]:
    """A HostPriorityList (one C-speed pass: ``map`` over the Struct). The scheduler does not check the
    scores, so every one out of 0-10 is clamped first (the extender's verdicts are within it already:
    ``extender_score``)."""
    low, high = MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY
    if scores and (min(scores) < low or max(scores) > high):
        scores = [max(low, min(high, int(score))) for score in scores]
    return list(map(HostPriority, hosts, scores))


def extender_score(score_0_100: int) -> int:
    """A 0-100 fit score as an extender priority, 0-10 (rounded half up)."""
    return max(MIN_EXTENDER_PRIORITY, min(MAX_EXTENDER_PRIORITY, (int(score_0_100) + 5) // 10))


_JSON = msgspec.json.Encoder()
_SCORE, _REASON, _UNRESOLVABLE = attrgetter("score"), attrgetter("reason"), attrgetter("unresolvable")


def filter_reply(args: ExtenderArgs, verdicts: Sequence[Any], fits: list[bool]) -> dict[str, Any]:
    """The ExtenderFilterResult of a call's verdicts (``extender_verdict.Verdict``, one a name in order;
    ``fits``: each one's ``fits``), in C-speed passes over the names (``map``, ``compress``)."""
    nodes = args.node_names
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if fits.count(True) == len(fits):
        return filter_result(args, nodes, failed, unresolvable)
    failing = list(map(not_, fits))
    names = list(compress(nodes, failing))
    bad = list(compress(verdicts, failing))
    if True in map(_UNRESOLVABLE, bad):
        for node, verdict in zip(names, bad, strict=True):
            (unresolvable if verdict.unresolvable else failed)[node] = verdict.reason
    else:
        failed = dict(zip(names, map(_REASON, bad), strict=True))
    return filter_result(args, list(compress(nodes, fits)), failed, unresolvable)


def priorities(args: ExtenderArgs, verdicts: Sequence[Any]) -> list[HostPriority]:
    """The HostPriorityList of a call's verdicts: each name's score."""
    return host_priority_list(args.node_names, list(map(_SCORE, verdicts)))


def encode(reply: Any) -> bytes:
    """JSON as kube-scheduler reads it, written by msgspec (C); a name no UTF-8 can hold (a lone surrogate
    sent as a ``\\ud800`` escape) is written back escaped, as ``json`` writes it."""
    try:
        return _JSON.encode(reply)
    except UnicodeEncodeError:
        return json.dumps(reply, separators=(",", ":")).encode()
