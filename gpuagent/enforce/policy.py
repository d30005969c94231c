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

Value rules (the annotation text and the YAML values alike):

- ``gpu-share``: percent of a GPU's SM time in (0, 100], ``30``, ``30%`` or ``30.5%``. A bare number below 1
  (``0.5``) is refused as ambiguous (half a percent, or half a GPU?): write ``50`` or ``0.5%``.
- ``gpu-memory``: a Kubernetes quantity: a plain or decimal number with one suffix, binary ``Ki Mi Gi Ti Pi
  Ei``, decimal ``k M G T P E``, or a decimal exponent ``e3``/``E3`` alone, > 0 and within a signed 64-bit
  count. ``1e3Gi`` is refused, as Kubernetes refuses it (an exponent takes no suffix); ``512m`` is refused
  (``m`` is milli, thousandths of a byte: a classic slip for ``Mi``); a fraction of a byte above one byte
  rounds up, as Kubernetes' ``Quantity.Value()`` does (``0.1Ki`` = 103 bytes).
- ``priority``: an integer in [-1000, 1000], or ``high`` (100), ``normal`` (0), ``low`` (-100).
- ``exempt``, ``latency-sensitive``: ``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0``, any
  case.
- ``pod_annotations`` (rules only): ``ignore``, ``lower-only`` or ``any``, any case.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuagent.config import POD_ANNOTATION_MODES, choice_word
from gpuagent.quantities import MAX_TEXT as _MAX_TEXT
from gpuagent.quantities import MEMORY_EXPECTED as _MEMORY_EXPECTED
from gpuagent.quantities import (
    MEMORY_MAX_BYTES,
    PolicyValueError,
    parse_memory,
    parse_share,
)
from gpuagent.quantities import quoted as _shown
from gpuagent.quantities import share_from_number as _share_from_number
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

PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
PRIORITY_WORDS = {"high": 100, "normal": 0, "low": -100}

# The kinds a Workload has (snapshot.processes.Workload); a match_kind outside these, and no glob, is a typo.
WORKLOAD_KINDS = (
    "pod", "systemd_service", "user_session", "docker", "podman", "slurm_job", "host", "unknown",
)

SOURCES = ("annotation", "config", "default")
LOWER_ONLY = "lower-only"
NODE_DEFAULT = "the node default"  # where a value no annotation or rule gave comes from
MODE_DEFAULT = "the config's pod_annotations"  # where the annotation mode no rule gave comes from

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


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


@dataclass(frozen=True, slots=True)
class NodeDefaults:
    """The node's limits for workloads that no annotation or rule gives one, and what pods' annotations may
    do where no rule says (the config's ``pod_annotations``)."""

    share_ratio: float | None = None
    memory_bytes: int | None = None
    priority: int = 0
    pod_annotations: str = LOWER_ONLY

    def __post_init__(self) -> None:
        if self.pod_annotations not in POD_ANNOTATION_MODES:
            raise PolicyValueError(
                f"expected one of {', '.join(POD_ANNOTATION_MODES)}, got {_shown(self.pod_annotations)}",
                "pod_annotations",
            )
        if self.share_ratio is not None and not 0 < self.share_ratio <= 1:
            raise PolicyValueError(
                f"expected a share ratio in (0, 1], got {self.share_ratio!r}", "share_ratio"
            )
        if self.memory_bytes is not None and not 0 < self.memory_bytes <= MEMORY_MAX_BYTES:
            raise PolicyValueError(f"expected a byte count > 0, got {self.memory_bytes!r}", "memory_bytes")
        if not PRIORITY_MIN <= self.priority <= PRIORITY_MAX:
            raise PolicyValueError(
                f"expected a priority from {PRIORITY_MIN} to {PRIORITY_MAX}, got {self.priority!r}",
                "priority",
            )


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One item of the config's ``policies``: selectors (every one set must match) and the limits it sets."""

    match_namespace: str | None = None  # glob on the namespace
    match_pod: str | None = None  # glob on the pod name (only pods match)
    match_kind: str | None = None  # glob on the workload kind, e.g. "systemd_service"
    match_name: str | None = None  # glob on the workload name (unit, container, job; a pod's name)
    match_cgroup: str | None = None  # glob on the workload's cgroup path (pods from the snapshot carry none)
    share_ratio: float | None = None
    memory_bytes: int | None = None
    priority: int | None = None
    exempt: bool | None = None
    latency_sensitive: bool | None = None
    pod_annotations: str | None = None  # one of POD_ANNOTATION_MODES: what matching pods' annotations may do


def node_defaults(
    gpu_share_percent: float | None = None, gpu_memory: str | None = None, priority: int = 0,
    pod_annotations: str = LOWER_ONLY,
) -> NodeDefaults:
    """``NodeDefaults`` from the config's ``default_gpu_share`` (percent), ``default_gpu_memory`` and
    ``pod_annotations``."""
    share = None
    if gpu_share_percent is not None:
        share = _share_from_number(gpu_share_percent, str(gpu_share_percent))
    memory = None if gpu_memory is None else parse_memory(gpu_memory)
    return NodeDefaults(share_ratio=share, memory_bytes=memory, priority=priority,
                        pod_annotations=pod_annotations)


# --- value parsers ------------------------------------------------------------------------------------------


def parse_priority(value: str) -> int:
    """A priority: an integer from -1000 to 1000, or high (100), normal (0), low (-100)."""
    expected = f"expected an integer from {PRIORITY_MIN} to {PRIORITY_MAX} or high, normal, low"
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise PolicyValueError(f"{expected}, got {_shown(value)}")
    if text.lower() in PRIORITY_WORDS:
        return PRIORITY_WORDS[text.lower()]
    if not _INT_RE.fullmatch(text) or not PRIORITY_MIN <= int(text) <= PRIORITY_MAX:
        raise PolicyValueError(f"{expected}, got {_shown(value)}")
    return int(text)


def parse_bool(value: str) -> bool:
    """true/false, yes/no, on/off, 1/0, in any case."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in _TRUE + _FALSE:
        raise PolicyValueError(f"expected true or false (also yes/no, 1/0), got {_shown(value)}")
    return text in _TRUE


# --- the config's rules -------------------------------------------------------------------------------------

_MATCH_KEYS = ("match_namespace", "match_pod", "match_kind", "match_name", "match_cgroup")
_LIMIT_KEYS = ("gpu_share", "gpu_memory", "priority", "exempt", "latency_sensitive", "pod_annotations")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rule_share(value: object) -> float:
    if _is_number(value):
        return _share_from_number(value, str(value))  # type: ignore[arg-type]
    if isinstance(value, str):
        return parse_share(value)
    raise PolicyValueError(f"expected a percent in (0, 100] like 30 or 30%, got {_shown(value)}")


def _rule_memory(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 < value <= MEMORY_MAX_BYTES:
            raise PolicyValueError(f"expected a memory size > 0 and <= {MEMORY_MAX_BYTES}, got {value}")
        return value
    if isinstance(value, str):
        return parse_memory(value)
    raise PolicyValueError(f"expected {_MEMORY_EXPECTED}, got {_shown(value)}")


def _rule_priority(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return parse_priority(str(value))
    if isinstance(value, str):
        return parse_priority(value)
    return parse_priority(repr(value))  # raises, naming what came


def _rule_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return parse_bool(str(value))
    if isinstance(value, str):
        return parse_bool(value)
    return parse_bool(repr(value))  # raises, naming what came


def _rule_annotations(value: object) -> str:
    word = choice_word(value, POD_ANNOTATION_MODES)
    if word is None:
        text = str(value).strip().lower().replace("_", "-").replace(" ", "-")
        hint = difflib.get_close_matches(text, POD_ANNOTATION_MODES, n=1)
        known = f"; did you mean {hint[0]}?" if hint else ""
        raise PolicyValueError(
            f"expected one of {', '.join(POD_ANNOTATION_MODES)}, got {_shown(value)}{known}"
        )
    return word


def _rule_glob(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise PolicyValueError(f"expected a non-empty string (a glob; quote it in YAML), got {_shown(value)}")
    if key == "match_kind" and not any(c in value for c in "*?[") and value not in WORKLOAD_KINDS:
        hint = difflib.get_close_matches(value, WORKLOAD_KINDS, n=1)
        known = f"did you mean {hint[0]}?" if hint else "one of " + ", ".join(WORKLOAD_KINDS)
        raise PolicyValueError(f"unknown workload kind {_shown(value)}: {known}")
    return value


_RULE_FIELDS: dict[str, tuple[str, Callable[[object], Any]]] = {
    "gpu_share": ("share_ratio", _rule_share),
    "gpu_memory": ("memory_bytes", _rule_memory),
    "priority": ("priority", _rule_priority),
    "exempt": ("exempt", _rule_bool),
    "latency_sensitive": ("latency_sensitive", _rule_bool),
    "pod_annotations": ("pod_annotations", _rule_annotations),
}


def parse_rules(raw: object) -> tuple[PolicyRule, ...]:
    """The config's ``policies`` list as rules, in order; a bad item raises naming ``policies[i].key``.

    Each item is a mapping of ``match_*`` selectors (at least one) and the limits it sets (at least one):
    ``gpu_share`` (percent, a number or "30%"), ``gpu_memory`` (bytes or a quantity), ``priority``,
    ``exempt``, ``latency_sensitive``, ``pod_annotations`` (what the matching pods' annotations may do). A
    catch-all is spelled out, e.g. ``match_kind: "*"``.
    """
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise PolicyValueError(f"expected a list of rules, got {type(raw).__name__}", "policies")
    rules = []
    for index, item in enumerate(raw):
        where = f"policies[{index}]"
        if not isinstance(item, Mapping):
            raise PolicyValueError(
                f"expected a mapping of match_* keys and limits, got {type(item).__name__}", where
            )
        fields: dict[str, Any] = {}
        for key, value in item.items():
            if key in _MATCH_KEYS:
                try:
                    fields[key] = _rule_glob(key, value)
                except PolicyValueError as error:
                    raise PolicyValueError(error.message, f"{where}.{key}") from None
            elif key in _RULE_FIELDS:
                name, parse = _RULE_FIELDS[key]
                try:
                    fields[name] = parse(value)
                except PolicyValueError as error:
                    raise PolicyValueError(error.message, f"{where}.{key}") from None
            else:
                keys = _MATCH_KEYS + _LIMIT_KEYS
                hint = difflib.get_close_matches(str(key).replace("-", "_"), keys, n=1)
                known = f"did you mean {hint[0]}?" if hint else "known: " + ", ".join(keys)
                raise PolicyValueError(f"unknown key; {known}", f"{where}.{key}")
        if not any(key in fields for key in _MATCH_KEYS):
            raise PolicyValueError(
                "expected at least one of " + ", ".join(_MATCH_KEYS) + ' (a catch-all says match_kind: "*")',
                where,
            )
        if not any(name in fields for name, _ in _RULE_FIELDS.values()):
            raise PolicyValueError("expected at least one limit: " + ", ".join(_LIMIT_KEYS), where)
        rules.append(PolicyRule(**fields))
    return tuple(rules)


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
