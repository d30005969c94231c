"""The PromQL of the accounting counters, built from their names (one place to read them all): the totals and
GPU models ``report`` and ``recommend`` both read, the report's efficiency timeline, and the selector helpers.

Totals are ``increase()`` of each counter over a range, evaluated at the range's end: a range selector
reads every sample inside it, so a series that ended (the pod finished, its series retired five minutes
later) inside the range is counted, and ``increase`` handles the resets of an agent's restart. They are
summed by (group, name, ``UUID``), so the GPU model (from ``gpuagent_gpu_info``, joined on ``UUID``) can
price each GPU's share, and by nothing else: a pod on several nodes or GPUs is one row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuagent.prom.errors import ReportError
from gpuagent.prom.timerange import promql_duration


@dataclass(frozen=True)
class Subject:
    """Who the counters are about: pods (``namespace``, ``pod``) or other workloads (``workload_kind``,
    ``workload``: systemd services, user sessions, Docker containers, Slurm jobs)."""

    kind: str
    prefix: str
    group_label: str
    name_label: str

    def counter(self, quantity: str) -> str:
        return f"{self.prefix}_{quantity}_total"


PODS = Subject("pod", "gpuagent_pod_gpu", "namespace", "pod")
WORKLOADS = Subject("workload", "gpuagent_workload_gpu", "workload_kind", "workload")
SUBJECTS = (PODS, WORKLOADS)

# The counters' quantities (``<prefix>_<quantity>_total``), in base units.
ALLOCATED = "allocated_seconds"
BUSY = "busy_seconds"
IDLE = "idle_allocated_seconds"
MEMORY = "memory_byte_seconds"
ENERGY = "energy_joules"
QUANTITIES = (ALLOCATED, BUSY, IDLE, MEMORY, ENERGY)

GPU_INFO = "gpuagent_gpu_info"
MODEL_LABEL = "modelName"
UUID_LABEL = "UUID"

_MATCHERS_RE = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"')


def selector(matchers: Sequence[str]) -> str:
    """``{a="b", c=~"d"}`` of the non-empty matchers, or ``""``."""
    parts = [m.strip() for m in matchers if m.strip()]
    return "{" + ", ".join(parts) + "}" if parts else ""


def namespace_matcher(namespaces: Sequence[str]) -> str:
    """``namespace=~"a|b"`` matching exactly those names (regex metacharacters escaped)."""
    alternatives = "|".join(re.escape(ns) for ns in namespaces)
    return f'namespace=~"{promql_string(alternatives)}"'


def subjects_and_matchers(matchers: Sequence[str], namespaces: Sequence[str]
                          ) -> tuple[tuple[Subject, ...], dict[str, tuple[str, ...]]]:
    """Whom to ask about, and the matchers of each (by ``Subject.kind``): pods and other workloads, or, with
    ``namespaces``, only those namespaces' pods."""
    pods = (*matchers, namespace_matcher(namespaces)) if namespaces else tuple(matchers)
    subjects = (PODS,) if namespaces else SUBJECTS
    return subjects, {PODS.kind: pods, WORKLOADS.kind: tuple(matchers)}


def check_matchers(text: str) -> str:
    """``--selector`` as given (``cluster="prod", Hostname=~"gpu-.*"``), after a shape check; Prometheus
    parses it for real and its error is reported as is."""
    stripped = text.strip().removeprefix("{").removesuffix("}")
    if not _MATCHERS_RE.match(stripped):
        raise ReportError(f'--selector: expected label matchers like cluster="prod", got {text!r}')
    return stripped


def promql_string(value: str) -> str:
    """``value`` escaped for a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def total_query(subject: Subject, quantity: str, range_seconds: float, matchers: Sequence[str]) -> str:
    """The counter's increase over ``range_seconds`` (evaluated at the range's end), per group, name and
    GPU UUID."""
    return (f"sum by ({subject.group_label}, {subject.name_label}, {UUID_LABEL}) "
            f"(increase({subject.counter(quantity)}{selector(matchers)}[{promql_duration(range_seconds)}]))")


def timeline_query(subject: Subject, quantity: str, step_seconds: float, matchers: Sequence[str]) -> str:
    """The counter's increase over each step, per namespace for pods and in one sum for workloads. For the
    efficiency, allocated time counts only on GPUs whose busy time is known, and busy time only on GPUs
    allocated in the step."""
    by = f" by ({subject.group_label})" if subject is PODS else ""
    window = promql_duration(step_seconds)
    expr = f"increase({subject.counter(quantity)}{selector(matchers)}[{window}])"
    if quantity == ALLOCATED:
        expr += f" and increase({subject.counter(BUSY)}{selector(matchers)}[{window}])"
    elif quantity == BUSY:  # on allocated GPUs only: a stray's busy time is not the allocation put to use
        expr += f" and increase({subject.counter(ALLOCATED)}{selector(matchers)}[{window}]) > 0"
    return f"sum{by} ({expr})"


def models_query(range_seconds: float, matchers: Sequence[str]) -> str:
    """The model of every GPU seen in the range, by UUID."""
    return (f"max by ({UUID_LABEL}, {MODEL_LABEL}) "
            f"(last_over_time({GPU_INFO}{selector(matchers)}[{promql_duration(range_seconds)}]))")
