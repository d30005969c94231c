"""A workload's limits: the config's ``policies`` and node defaults, and what pod annotations may change.

The operator decides; a pod's author (anyone who may create or update pods in its namespace) may only ask.
Per field, the operator's value is the first matching rule that sets the field, else the node default
(``default_gpu_share``, ``default_gpu_memory``, priority 0, not exempt). A pod's ``gpuagent.io/gpu-share``,
``gpu-memory`` and ``priority`` annotations then count as the operator's ``pod_annotations`` says there
(the first matching rule that sets it, else the config key of that name):

- ``lower-only`` (the default): an annotation may make a limit stricter (a smaller share, less memory, a
  lower priority), never looser; where the operator set no share or memory limit at all, any annotated
  value is stricter than none and counts. Priority always has the operator's value (the default is 0).
- ``ignore``: annotations change nothing.
- ``any``: an annotation wins over the operator's value (the operator trusts every pod author).

``gpuagent.io/exempt`` is never a pod's to set: only a rule exempts. It is still parsed, and reported.

``gpuagent.io/latency-sensitive`` (rules: ``latency_sensitive``) puts a workload in the latency class
(``gpuagent/enforce/timeslice/latency.py``): never frozen while under its share, and its requests preempt
the batch pods of its GPU. Preempting one's neighbours raises one's own priority, so it is governed as
priority is: under ``lower-only`` a pod may say ``false`` (leave a class a rule gave it), and ``true``
counts only where the operator's value is already true (a rule's ``latency_sensitive: true``), else it is
refused and reported; under ``any`` it counts; under ``ignore`` it is not read.

A rule matches when every ``match_*`` selector it has matches (globs, ``fnmatch`` style, case-sensitive;
``*`` also crosses ``/`` in cgroup paths). Rules serve pods and non-Kubernetes workloads alike; annotations
only pods.

Nothing a pod asks is dropped silently: an annotation that does not parse, one the operator's
``pod_annotations`` refuses, an exempt annotation and an unknown ``gpuagent.io/*`` key (with a "did you
mean" hint) each become a ``PolicyProblem`` saying what is used instead (a log line, the
``gpuagent_pod_policy_problem`` series, ``/v1/state``), and ``Limits.origins`` says where each value came
from. A bad ``policies`` item is a config error (``PolicyValueError`` naming the item and key).

The operator's rules and the values both sides write are read in :mod:`gpuagent.enforce.rules`.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuagent.enforce.rules import LOWER_ONLY, NodeDefaults, PolicyRule, parse_bool, parse_priority
from gpuagent.quantities import (
    PolicyValueError,
    parse_memory,
    parse_share,
)
from gpuagent.snapshot.enforcement import PolicyProblem
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import Workload

ANNOTATION_PREFIX = "gpuagent.io/"
ANNOTATION_SHARE = "gpuagent.io/gpu-share"
ANNOTATION_MEMORY = "gpuagent.io/gpu-memory"
ANNOTATION_PRIORITY = "gpuagent.io/priority"
ANNOTATION_EXEMPT = "gpuagent.io/exempt"
ANNOTATION_LATENCY = "gpuagent.io/latency-sensitive"
ANNOTATIONS = (ANNOTATION_SHARE, ANNOTATION_MEMORY, ANNOTATION_PRIORITY, ANNOTATION_EXEMPT,
               ANNOTATION_LATENCY)

SOURCES = ("annotation", "config", "default")
NODE_DEFAULT = "the node default"  # where a value no annotation or rule gave comes from
MODE_DEFAULT = "the config's pod_annotations"  # where the annotation mode no rule gave comes from


@dataclass(frozen=True, slots=True)
class Limits:
    """What a workload may use; ``None``: no limit. ``source``: the highest-precedence origin of any field.

    ``origins`` and ``pod_annotations`` explain the decision (``/v1/state``) and take no part in equality.
    """

    share_ratio: float | None  # share of a GPU's SM time, (0, 1]
    memory_bytes: int | None  # > 0
    priority: int = 0
    exempt: bool = False
    source: str = "default"  # "annotation" | "config" | "default"
    # (field, where its value came from): "annotation", "policies[i]" or NODE_DEFAULT; for pods also
    # ("pod_annotations", the rule or MODE_DEFAULT)
    origins: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # what its pod's annotations may do (POD_ANNOTATION_MODES); None: not a pod
    pod_annotations: str | None = field(default=None, compare=False)
    latency_sensitive: bool = False  # the latency class (see the module)


def _glob(pattern: str | None, value: str | None) -> bool:
    return pattern is None or (value is not None and fnmatch.fnmatchcase(value, pattern))


def _matches(
    rule: PolicyRule, *, kind: str, name: str, namespace: str | None, pod: str | None, cgroups: Sequence[str]
) -> bool:
    return (
        _glob(rule.match_namespace, namespace)
        and _glob(rule.match_pod, pod)
        and _glob(rule.match_kind, kind)
        and _glob(rule.match_name, name)
        and (rule.match_cgroup is None or any(fnmatch.fnmatchcase(c, rule.match_cgroup) for c in cgroups))
    )


# --- resolution ---------------------------------------------------------------------------------------------

_FIELDS = ("share_ratio", "memory_bytes", "priority", "exempt", "latency_sensitive")
_ANNOTATION_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    ANNOTATION_SHARE: ("share_ratio", parse_share),
    ANNOTATION_MEMORY: ("memory_bytes", parse_memory),
    ANNOTATION_PRIORITY: ("priority", parse_priority),
    ANNOTATION_EXEMPT: ("exempt", parse_bool),
    ANNOTATION_LATENCY: ("latency_sensitive", parse_bool),
}
_EXEMPT_IS_THE_OPERATORS = "ignored: exempt is the operator's (a policies rule's exempt: true), never a pod's"


def _operators(
    matching: Sequence[tuple[int, PolicyRule]], defaults: NodeDefaults
) -> dict[str, tuple[Any, str]]:
    """Per field, and for ``pod_annotations``: the operator's value and where it came from (the first
    matching rule that sets it, else the node default)."""
    chosen: dict[str, tuple[Any, str]] = {}
    for name in (*_FIELDS, "pod_annotations"):
        for index, rule in matching:
            value = getattr(rule, name)
            if value is not None:
                chosen[name] = (value, f"policies[{index}]")
                break
        else:
            default = getattr(defaults, name, False)  # NodeDefaults has no exempt nor class: False
            chosen[name] = (default, MODE_DEFAULT if name == "pod_annotations" else NODE_DEFAULT)
    return chosen


def _limits(values: Mapping[str, tuple[Any, str]], pod_annotations: str | None) -> Limits:
    origins = tuple((name, origin) for name, (_, origin) in values.items())
    found = {origin for name, origin in origins if name != "pod_annotations"}
    source = ("annotation" if "annotation" in found
              else "config" if any(o.startswith("policies[") for o in found) else "default")
    return Limits(**{name: values[name][0] for name in _FIELDS}, source=source, origins=origins,
                  pod_annotations=pod_annotations)


def _refusal(name: str, asked: Any, operators: Mapping[str, tuple[Any, str]]) -> str | None:
    """Why an annotation's parsed value does not count (exempt never does; under ``pod_annotations:
    lower-only`` a looser limit than the operator's does not: a higher priority, the latency class the
    operator did not give); None: it counts. ``ignore`` is decided before parsing (``_ignored``)."""
    if name == "exempt":
        return _EXEMPT_IS_THE_OPERATORS
    mode, mode_origin = operators["pod_annotations"]
    if mode != LOWER_ONLY:
        return None  # any
    limit, origin = operators[name]
    if limit is None or asked <= limit:
        return None  # stricter than the operator's (or than no limit at all)
    if name == "latency_sensitive":
        return (f"refused: the latency class preempts the GPU's other pods, and the operator did not give "
                f"it ({origin}) while pod_annotations is lower-only here ({mode_origin}): an annotation may "
                f"only leave it")
    return (f"refused: {_describe(name, asked)} is above the operator's {_describe(name, limit)} ({origin}) "
            f"and pod_annotations is lower-only here ({mode_origin}): an annotation may only lower it")


def _ignored(operators: Mapping[str, tuple[Any, str]]) -> str:
    mode, mode_origin = operators["pod_annotations"]
    return f"ignored: pod_annotations is {mode} here ({mode_origin})"


def _describe(name: str, value: Any) -> str:
    if value is None:
        return "no limit"
    if name == "share_ratio":
        return f"{value * 100:g}%"
    if name == "memory_bytes":
        return f"{value} bytes"
    return str(value).lower() if isinstance(value, bool) else str(value)


def limits_for_pod(
    pod: PodUse, defaults: NodeDefaults, rules: Sequence[PolicyRule] = ()
) -> tuple[Limits, tuple[PolicyProblem, ...]]:
    """A pod's limits and the problems with its annotations: each annotation that does not parse, that the
    operator's ``pod_annotations`` refuses (see the module), every exempt one, every unknown key. A field
    whose annotation does not count keeps the operator's value.

    Annotations outside ``gpuagent.io/`` are not ours and are ignored. Rules see the pod as kind "pod"
    with its name as both ``match_pod`` and ``match_name``; a ``match_cgroup`` rule never matches a
    ``PodUse`` (it carries no cgroup: match its processes' workloads with ``limits_for_workload``).
    Problems come sorted by annotation key.
    """
    matching = [
        (i, rule)
        for i, rule in enumerate(rules)
        if _matches(rule, kind="pod", name=pod.name, namespace=pod.namespace, pod=pod.name, cgroups=())
    ]
    operators = _operators(matching, defaults)
    values = dict(operators)
    mode = operators["pod_annotations"][0]
    unused: list[tuple[str, str, str, str]] = []  # (key, value, why, field)
    unknown: list[tuple[str, str]] = []
    for key, value in sorted(pod.annotations.items()):
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        known = _ANNOTATION_FIELDS.get(key)
        if known is None:
            unknown.append((key, value))
            continue
        name, parse = known
        if mode == "ignore" and name != "exempt":  # not even parsed: fixing the value would change nothing
            unused.append((key, value, _ignored(operators), name))
            continue
        try:
            asked = parse(value)
        except PolicyValueError as error:
            unused.append((key, value, error.message, name))
            continue
        why = _refusal(name, asked, operators)
        if why is None:
            values[name] = (asked, "annotation")
        else:
            unused.append((key, value, why, name))
    limits = _limits(values, mode)
    problems = [
        PolicyProblem(
            pod=pod.name, namespace=pod.namespace, annotation=key, value=value,
            message=f"{why}; using {values[name][1]} instead ({_describe(name, values[name][0])})",
        )
        for key, value, why, name in unused
    ]
    for key, value in unknown:
        problems.append(
            PolicyProblem(pod=pod.name, namespace=pod.namespace, annotation=key, value=value,
                          message=_unknown_annotation(key))
        )
    problems.sort(key=lambda p: p.annotation)
    return limits, tuple(problems)


def _unknown_annotation(key: str) -> str:
    suffix = key[len(ANNOTATION_PREFIX):].lower().replace("_", "-")
    names = [a[len(ANNOTATION_PREFIX):] for a in ANNOTATIONS]
    hint = difflib.get_close_matches(suffix, names, n=1, cutoff=0.6)
    if hint:
        return f"unknown annotation, ignored: did you mean {ANNOTATION_PREFIX}{hint[0]}?"
    return "unknown annotation, ignored: known are " + ", ".join(ANNOTATIONS)


def limits_for_workload(
    workload: Workload, defaults: NodeDefaults, rules: Sequence[PolicyRule] = ()
) -> Limits:
    """A workload's limits from the rules and node defaults (no annotations: that is ``limits_for_pod``).

    ``match_pod`` matches only workloads of kind "pod" (on their name); ``match_cgroup`` matches any of the
    workload's cgroup paths (``cgroup``, ``cgroup_v2``, ``cgroup_freezer``).
    """
    cgroups = [c for c in (workload.cgroup, workload.cgroup_v2, workload.cgroup_freezer) if c]
    matching = [
        (i, rule)
        for i, rule in enumerate(rules)
        if _matches(
            rule, kind=workload.kind, name=workload.name, namespace=workload.namespace,
            pod=workload.name if workload.kind == "pod" else None, cgroups=cgroups,
        )
    ]
    operators = _operators(matching, defaults)
    del operators["pod_annotations"]  # no pod, no annotations
    return _limits(operators, None)
