"""Who the enforcer acts on, and with which limits: each snapshot's processes grouped by owner.

An owner is what limits apply to: a pod (``ns/pod``), or another workload a config rule can name
(``kind:name``: a systemd service, a Docker container, a Slurm job). Per poll, each owner gets its figures
(SM use per GPU, GPU memory, PIDs, the cgroups to freeze) and its limits: the config's rules and the node's
defaults, and what those let its pod's annotations change (``policy``); ``decisions`` says, per owner, where
every value came from and which annotations were refused. Limits change only with annotations or rules, so
the last poll's answer is kept while everything it was worked out from is the same (every pod's limits are
asked for on every poll); an annotation's problem is logged once. The shares and the memory ladder
(``enforcer``) decide from these owners; nothing here acts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuagent.enforce.actions import Actions, FreezeTarget
from gpuagent.enforce.memory import pod_key
from gpuagent.enforce.policy import Limits, limits_for_pod, limits_for_workload
from gpuagent.enforce.rules import NodeDefaults, PolicyRule
from gpuagent.snapshot.enforcement import LimitsDecision, PolicyProblem
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import MPS_CLIENT, MPS_SERVER, ProcessSample, Workload, sm_share_ratio

log = logging.getLogger(__name__)

_Answer = tuple[Limits, tuple[PolicyProblem, ...]]  # a workload's limits and its annotations' problems


def owner_key(workload: Workload) -> str:
    """One key per thing limits apply to: ``ns/pod`` for a pod, ``kind:name`` otherwise."""
    if workload.kind == "pod":
        return pod_key(workload.name, workload.namespace)  # the ladder's key: its steps name owners by it
    return f"{workload.kind}:{workload.name}"


def decisions(owners: Mapping[str, Owner]) -> tuple[LimitsDecision, ...]:
    """Each owner's limits, where every value came from and which annotations were refused, by owner key."""
    return tuple(
        LimitsDecision(
            owner=key, namespace=o.namespace, name=o.name, share_ratio=o.limits.share_ratio,
            memory_bytes=o.limits.memory_bytes, priority=o.limits.priority, exempt=o.limits.exempt,
            pod_annotations=o.limits.pod_annotations, sources=dict(o.limits.origins),
            refused={p.annotation: p.message for p in o.problems},
            latency_sensitive=o.limits.latency_sensitive,
        )
        for key, o in sorted(owners.items())
    )


@dataclass(slots=True)
class Owner:
    """A workload's figures in one snapshot."""

    namespace: str | None
    name: str
    limits: Limits
    util_by_gpu: dict[str, float] = field(default_factory=dict)
    memory_bytes: int = 0
    pids: list[int] = field(default_factory=list)
    gpus: set[str] = field(default_factory=set)  # UUIDs of the GPUs it has processes on
    targets: set[FreezeTarget] = field(default_factory=set)
    processes: list[ProcessSample] = field(default_factory=list)
    mps_client: bool = False  # one of its processes is an MPS client
    problems: tuple[PolicyProblem, ...] = ()  # its pod's annotations that did not count, and why


class Owners:
    """Groups each snapshot's processes by owner and works out every owner's limits, keeping the last
    poll's answers (see the module)."""

    def __init__(self, actions: Actions, defaults: NodeDefaults | None = None,
                 rules: Sequence[PolicyRule] = ()) -> None:
        self._actions = actions  # which cgroups freezing a workload means (``target_for``)
        self._defaults = defaults or NodeDefaults()
        self._rules = tuple(rules)
        self._reported: set[tuple[str, str, str]] = set()  # policy problems logged once each
        # Each workload's limits and problems by what they are worked out from: this poll's and the last's.
        self._limits_now: dict[tuple[object, ...], tuple[Limits, tuple[PolicyProblem, ...]]] = {}
        self._limits_before: dict[tuple[object, ...], tuple[Limits, tuple[PolicyProblem, ...]]] = {}
        # The same by the identity of what they come from: id(workload) -> (workload, its pod's annotations
        # object, the key above, the answer).
        self._by_workload_now: dict[int, tuple[Workload, object, tuple[object, ...], _Answer]] = {}
        self._by_workload_before: dict[int, tuple[Workload, object, tuple[object, ...], _Answer]] = {}

    @property
    def rules(self) -> tuple[PolicyRule, ...]:
        return self._rules

    def set_rules(self, rules: Sequence[PolicyRule]) -> None:
        """New config policies (an admin reload), used from the next poll on."""
        self._rules = tuple(rules)
        self._limits_now, self._limits_before = {}, {}
        self._by_workload_now, self._by_workload_before = {}, {}

    def group(self, snapshot: NodeSnapshot) -> tuple[dict[str, Owner], tuple[PolicyProblem, ...]]:
        """The snapshot's processes by owner (MPS servers left out), each owner with its limits, and the
        problems of the pods' annotations."""
        pods = {(p.namespace, p.name): p for p in snapshot.pods}
        self._limits_before, self._limits_now = self._limits_now, {}  # kept: what this poll asks for
        self._by_workload_before, self._by_workload_now = self._by_workload_now, {}
        owners: dict[str, Owner] = {}
        problems: list[PolicyProblem] = []
        target_for = self._actions.target_for
        for gpu in snapshot.gpus:
            uuid, shared = gpu.info.uuid, not gpu.info.mig_enabled  # MIG: hard isolation, no shares
            for process in gpu.processes:
                w = process.workload
                if w is None or process.kind == MPS_SERVER:
                    continue  # the MPS server serves every tenant: never throttled, never killed
                key = owner_key(w)
                owner = owners.get(key)
                if owner is None:
                    limits, found = self._limits(w, pods.get((w.namespace, w.name)))
                    problems.extend(found)
                    owner = owners[key] = Owner(w.namespace, w.name, limits, problems=found)
                if shared:
                    share = sm_share_ratio(process)
                    if share is not None:
                        owner.util_by_gpu[uuid] = owner.util_by_gpu.get(uuid, 0.0) + share
                    owner.gpus.add(uuid)
                owner.memory_bytes += process.used_memory_bytes or 0
                owner.pids.append(process.pid)
                owner.processes.append(process)
                if process.kind == MPS_CLIENT:
                    owner.mps_client = True
                target = target_for(w.cgroup_v2, w.cgroup_freezer)
                if target is not None:
                    owner.targets.add(target)
        return owners, tuple(problems)

    def _limits(self, workload: Workload, pod: PodUse | None) -> tuple[Limits, tuple[PolicyProblem, ...]]:
        """A workload's limits and its annotations' problems; the last poll's answer while everything they
        are worked out from is the same (limits change only with annotations or rules, and every pod's
        are asked for on every poll)."""
        annotations = pod.annotations if pod is not None else None
        # First by identity: the same Workload object (the attribution passes an unchanged one on) with
        # the same annotations object (likewise, while the pod's names are the same) asks the same.
        same = self._by_workload_now.get(id(workload)) or self._by_workload_before.get(id(workload))
        if same is not None and same[0] is workload and same[1] is annotations:
            self._by_workload_now[id(workload)] = same
            self._limits_now[same[2]] = same[3]
            return same[3]
        if workload.kind != "pod":
            key: tuple[object, ...] = (workload.kind, workload.name, workload.namespace, workload.cgroup,
                                       workload.cgroup_v2, workload.cgroup_freezer)
        else:
            key = ("pod", workload.name, workload.namespace, tuple((annotations or {}).items()))
        known = self._limits_now.get(key) or self._limits_before.get(key)
        if known is None:
            known = self._work_out_limits(workload, pod)
        self._limits_now[key] = known
        self._by_workload_now[id(workload)] = (workload, annotations, key, known)
        return known

    def _work_out_limits(self, workload: Workload, pod: PodUse | None
                         ) -> tuple[Limits, tuple[PolicyProblem, ...]]:
        if workload.kind != "pod":
            return limits_for_workload(workload, self._defaults, self._rules), ()
        if pod is None:  # a pod only known from its cgroup: no annotations to read
            pod = PodUse(name=workload.name, namespace=workload.namespace, uid=workload.pod_uid)
        limits, problems = limits_for_pod(pod, self._defaults, self._rules)
        for problem in problems:
            seen = (f"{problem.namespace}/{problem.pod}", problem.annotation, problem.value)
            if seen not in self._reported:
                self._reported.add(seen)
                log.warning("pod %s: annotation %s=%r: %s", seen[0], problem.annotation, problem.value,
                            problem.message)
        return limits, problems
