"""The keys of enforcement (``gpuagent.enforce``): its mode, how throttled pods share a GPU, the defaults and
rules that set limits, what pods' annotations may do, the memory ladder, and the cgroup paths it acts on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuagent.config.keys import key
from gpuagent.config.values import (
    MODES,
    boolean,
    cgroup_globs,
    choice,
    number,
    number_or_null,
    percent_or_null,
    policy_rules,
    quantity_or_null,
    required_path,
)

MEMORY_ACTIONS = ("warn", "kill", "evict")
SHARE_SCHEMES = ("rotation", "duty")
# What a pod's gpuagent.io/* limit annotations may do (gpuagent.enforce.policy, docs/isolation.md): nothing,
# only make the operator's limit stricter, or anything (the operator trusts every pod author).
POD_ANNOTATION_MODES = ("ignore", "lower-only", "any")


@dataclass(frozen=True)
class EnforceConfig:
    """What the enforcer decides and how it acts (``config.enforce``)."""

    mode: str = key(
        "mode", "off", choice(*MODES),
        "enforcement: off, audit (decide and export, act on nothing) or enforce", "{" + ",".join(MODES) + "}",
    )
    share_scheme: str = key(
        "share_scheme", "rotation", choice(*SHARE_SCHEMES),
        "how throttled pods share a GPU: rotation (exclusive turns, docs/shares.md) or duty (the older duty "
        "cycle)",
        "{" + ",".join(SHARE_SCHEMES) + "}",
    )
    share_period: float | None = key(
        "share_period", None, number_or_null(0.01, high=10),
        "mean seconds of one rotation (or duty cycle), dithered; null: the scheme's (rotation 1.0, duty 0.1)",
        "SECONDS", "null",
    )
    work_conserving: bool = key(
        "work_conserving", True, boolean,
        "let a pod use what idle tenants leave (throttle only when another tenant is active)", "BOOL",
    )
    default_gpu_share: float | None = key(
        "default_gpu_share", None, percent_or_null,
        "GPU share (percent) of workloads no annotation or policies rule sets; the most a pod's "
        "gpuagent.io/gpu-share may ask under pod_annotations: lower-only",
        "PERCENT",
    )
    default_gpu_memory: str | None = key(
        "default_gpu_memory", None, quantity_or_null,
        "GPU memory limit of workloads no annotation or policies rule sets; the most a pod's "
        "gpuagent.io/gpu-memory may ask under pod_annotations: lower-only",
        "QUANTITY",
    )
    memory_action: str = key(
        "memory_action", "kill", choice(*MEMORY_ACTIONS),
        "over the GPU memory limit: warn, kill (TERM, then KILL) or evict",
        "{" + ",".join(MEMORY_ACTIONS) + "}",
    )
    memory_term_after: float = key(
        "memory_term_after", 10.0, number(0),
        "seconds over the memory limit before SIGTERM (or the eviction)", "SECONDS",
    )
    memory_kill_grace: float = key(
        "memory_kill_grace", 30.0, number(0),
        "seconds after SIGTERM before SIGKILL", "SECONDS",
    )
    journal_path: str = key(
        "journal_path", "/var/lib/gpuagent/freeze-journal.json", required_path,
        "file naming every cgroup the agent may have frozen, so a restart thaws them", "PATH",
    )
    cgroup_root: str = key(
        "cgroup_root", "/sys/fs/cgroup", required_path,
        "where cgroupfs is mounted", "PATH",
    )
    freezable_outside_kubepods: tuple[str, ...] = key(
        "freezable_outside_kubepods", (), cgroup_globs,
        "cgroup path globs outside kubepods the enforcer may act on (off Kubernetes)", "GLOBS",
    )
    policies: tuple[Mapping[str, Any], ...] = key(
        "policies", (), policy_rules,
        "limits (and the latency class) for workloads matched by namespace, pod, kind, name or cgroup "
        "(config file only)",
        "RULES",
    )
    pod_annotations: str = key(
        "pod_annotations", "lower-only", choice(*POD_ANNOTATION_MODES),
        "what pods' gpuagent.io/gpu-share, gpu-memory, priority and latency-sensitive annotations may do "
        "where no policies rule says: ignore, lower-only (only make the operator's limit stricter) or any; "
        "exempt is never a pod's",
        "{" + ",".join(POD_ANNOTATION_MODES) + "}",
    )
