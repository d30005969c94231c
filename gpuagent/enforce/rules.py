"""The operator's ``policies`` rules and node defaults, read once at the edge (a bad item is a config
error naming ``policies[i].key``), and the value parsers a pod's annotations share with them; what a
workload's limits then are, and what its pod's annotations may change, is :mod:`gpuagent.enforce.policy`.

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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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

PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
PRIORITY_WORDS = {"high": 100, "normal": 0, "low": -100}

# The kinds a Workload has (snapshot.processes.Workload); a match_kind outside these, and no glob, is a typo.
WORKLOAD_KINDS = (
    "pod", "systemd_service", "user_session", "docker", "podman", "slurm_job", "host", "unknown",
)

LOWER_ONLY = "lower-only"

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


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
