"""What the enforcer decided at the last poll: each pod's time-slice share and memory stage, every
workload's limits and where they came from, the annotations it could not use, and its action counters.
``enforce/`` produces :class:`EnforcementState`; the exporter and ``/v1/state`` show it. Apart from the rest
because only the enforcer writes it, and it refers to no other part of the model (pods by name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuagent.frozen import faster_inits


@dataclass(frozen=True, slots=True)
class ShareState:
    """One pod's time-slice share on one GPU, as the enforcer last decided it. Ratios are 0-1."""

    pod: str
    namespace: str | None
    gpu_uuid: str
    gpu_index: int
    limit_ratio: float | None  # the pod's share of the GPU's SM time; None: no limit
    achieved_ratio: float  # its measured SM use over the controller's window
    frozen_ratio: float  # the part of each period its cgroups are frozen (0: not throttled)
    throttled_seconds_total: float  # time spent frozen since the agent started
    priority: int = 0
    # share_scheme rotation: how much of the period its slot was shortened by what NVML's view showed it
    # getting beyond the slot (a queue running on past it; negative: lengthened); None under duty
    correction_ratio: float | None = None
    # the latency class (docs/isolation.md): "exempt" (never frozen, its requests preempt the GPU's batch
    # pods), "over" (over its share: preempts no one), "capped" (takes turns at its share); None: not in it
    latency_standing: str | None = None
    preemptions_total: int = 0  # its requests that began with the GPU's batch pods to hold frozen


@dataclass(frozen=True, slots=True)
class MemoryState:
    """One pod's GPU memory against its limit, and where it stands on the escalation ladder."""

    pod: str
    namespace: str | None
    limit_bytes: int | None
    used_bytes: int
    stage: str  # "ok" | "warned" | "terminating" | "killed" | "evicted"
    over_since_unix: float | None = None
    # The ladder's next step should the pod stay over ("term" | "kill" | "evict"; None: none left), and when
    # it is due: in audit mode what it would do, and when, were the processes to ignore the would-be signals
    next_step: str | None = None
    next_step_at_unix: float | None = None


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """An annotation that could not be used: the pod falls back to the node default, and we say so."""

    pod: str
    namespace: str | None
    annotation: str
    value: str
    message: str


@dataclass(frozen=True, slots=True)
class LimitsDecision:
    """One workload's limits as the enforcer decided them at the last poll, and why (``/v1/state``).

    ``sources``: where each value came from, by field: ``annotation``, ``policies[i]`` or ``the node
    default``, and where ``pod_annotations`` (what a pod's annotations may do: ignore, lower-only, any) came
    from. ``refused``: each of the pod's ``gpuagent.io/*`` annotations that did not count, and why (also in
    ``EnforcementState.problems``)."""

    owner: str  # "ns/pod", or "kind:name" for a workload off Kubernetes
    namespace: str | None
    name: str
    share_ratio: float | None
    memory_bytes: int | None
    priority: int
    exempt: bool
    pod_annotations: str | None  # None: not a pod
    sources: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)  # annotation -> why
    latency_sensitive: bool = False  # the latency class (docs/isolation.md); its source under sources


@dataclass(frozen=True, slots=True)
class EnforcementState:
    """What the enforcer decided at the last poll; in audit mode, what it would have done."""

    mode: str  # "off" | "audit" | "enforce"
    shares: tuple[ShareState, ...] = ()
    memory: tuple[MemoryState, ...] = ()
    actions_total: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (action, outcome) -> count
    problems: tuple[PolicyProblem, ...] = ()
    frozen_cgroups: int = 0
    share_scheme: str | None = None  # "rotation" | "duty"; None: no cycler (no shares applied)
    share_period_seconds: float | None = None  # the mean period of the rotation or duty cycle
    limits: tuple[LimitsDecision, ...] = ()  # every workload with processes on a GPU, by owner
    # the latency class's sensing while it watches a GPU: the scheduler's ticks "calibrated" (a request's
    # end read at the tick), "pending" or "off" (the still time), and the tick; None: nothing watched
    latency_ticks: str | None = None
    tick_seconds: float | None = None


# Every frozen dataclass above builds through its slots directly: the same objects, ~45 % faster to make
# (gpuagent/frozen.py), and a poll of a pod-dense node makes several per pod.
faster_inits(globals(), __name__)
