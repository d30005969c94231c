"""``Actions``, the one object the enforcer, the agent and the admin endpoints act through.

It builds the gate's parts from one configuration and answers for all of them: the freezer
(:mod:`~gpuagent.enforce.actions.freezer`), the signaller (:mod:`~gpuagent.enforce.actions.signals`) and the
evictions (:mod:`~gpuagent.enforce.actions.evictions`), which share the workload rules
(:mod:`~gpuagent.enforce.actions.rules`) and one record of outcomes
(:mod:`~gpuagent.enforce.actions.outcomes`). Callers see one mode, one set of counts and one log, as they
did when the gate was one class; each part keeps its own state and lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpuagent.enforce.actions.evictions import EvictionClient, Evictions
from gpuagent.enforce.actions.freezer import Freezer
from gpuagent.enforce.actions.mounts import Hierarchies
from gpuagent.enforce.actions.outcomes import MODES, Outcomes
from gpuagent.enforce.actions.rules import WorkloadRules
from gpuagent.enforce.actions.signals import Signaller
from gpuagent.enforce.journal import FreezeTarget, Journal


class Actions:
    """The one gate for every write to cgroupfs, every signal and every Eviction.

    ``mode`` "off" | "audit" | "enforce". ``journal`` the freeze journal (see :mod:`.freezer`).
    ``cgroup_root`` where the hierarchies are mounted: v2 at ``<root>`` (pure v2) or ``<root>/unified``
    (hybrid), the v1 freezer at ``<root>/freezer``, as ``<proc_root>/self/mountinfo`` says.
    ``allowed_outside_kubepods`` globs of cgroup paths that may be acted on outside kubepods (a Slurm
    job's, a systemd unit's). ``protected_pids`` are never signalled. ``clock`` (seconds) drives the
    eviction limits: at most one eviction per pod per ``eviction_min_interval`` seconds, and a node-wide
    token bucket of ``eviction_burst`` tokens refilled one per ``eviction_refill_interval`` seconds.
    ``eviction_client`` is made from the environment's Kubernetes configuration on first use when None.
    ``proc_root`` is where the agent reads its own process (``self/mountinfo``, ``self/cgroup``, its
    ancestors) and, in enforce mode, a process's cgroup before its signal (the PID namespace its pidfd is
    opened in); ``workload_proc_root`` where audit mode reads it (the config's ``proc_root``, as the pods
    source reads it: the demo's simulated PIDs are there alone; ``proc_root`` when None).
    """

    def __init__(
        self,
        *,
        mode: str,
        journal: Journal,
        cgroup_root: str | Path = "/sys/fs/cgroup",
        allowed_outside_kubepods: Sequence[str] = (),
        protected_pids: Iterable[int] = (),
        clock: Callable[[], float] = time.time,
        eviction_client: EvictionClient | None = None,
        eviction_min_interval: float = 60.0,
        eviction_burst: int = 5,
        eviction_refill_interval: float = 30.0,
        proc_root: str | Path = "/proc",
        workload_proc_root: str | Path | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self._outcomes = Outcomes()
        self._evictions = Evictions(mode=mode, outcomes=self._outcomes, clock=clock, client=eviction_client,
                                    min_interval=eviction_min_interval, burst=eviction_burst,
                                    refill_interval=eviction_refill_interval)
        self._hierarchies = Hierarchies(cgroup_root, proc_root=proc_root)
        self._workloads = WorkloadRules(allowed_outside_kubepods, proc_root=proc_root)
        self._freezer = Freezer(mode=mode, journal=journal, hierarchies=self._hierarchies,
                                workloads=self._workloads, outcomes=self._outcomes)
        self._signaller = Signaller(mode=mode, workloads=self._workloads, outcomes=self._outcomes,
                                    protected_pids=protected_pids, proc_root=proc_root,
                                    workload_proc_root=workload_proc_root)

    # -- what it was made with ----------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._freezer.mode

    @property
    def journal(self) -> Journal:
        return self._freezer.journal

    @property
    def cgroup_root(self) -> str:
        return self._hierarchies.cgroup_root

    @property
    def allowed_outside_kubepods(self) -> tuple[str, ...]:
        return self._workloads.allowed_outside_kubepods

    @property
    def protected_pids(self) -> frozenset[int]:
        return self._signaller.protected_pids

    # -- what is where ------------------------------------------------------------------------------------
    @property
    def hierarchies(self) -> Mapping[str, str]:
        """Mounted hierarchies usable here: "v2" and/or "v1" -> mount point."""
        return self._hierarchies.mountpoints

    @property
    def frozen(self) -> frozenset[FreezeTarget]:
        """What this gate froze and has not thawed since."""
        return self._freezer.frozen

    @property
    def throttling(self) -> frozenset[FreezeTarget]:
        """What the journal names: frozen now, or thawed inside a duty cycle until :meth:`release`."""
        return self.journal.targets()

    def counts(self) -> Mapping[tuple[str, str], int]:
        """(action, outcome) -> count, e.g. ("freeze", "done"); a copy."""
        return self._outcomes.counts()

    def target_for(self, cgroup_v2: str | None, cgroup_freezer: str | None) -> FreezeTarget | None:
        """Where a workload can be frozen (its v2 cgroup first), or None: :meth:`Freezer.target_for`."""
        return self._freezer.target_for(cgroup_v2, cgroup_freezer)

    def check(self, target: FreezeTarget) -> None:
        """Raise :class:`ActionRefused` unless every safety rule allows freezing ``target``."""
        self._freezer.check(target)

    def is_frozen(self, target: FreezeTarget) -> bool:
        """What the kernel says of ``target`` now: :meth:`Freezer.is_frozen`."""
        return self._freezer.is_frozen(target)

    # -- the actions --------------------------------------------------------------------------------------
    def freeze(self, target: FreezeTarget, *, reason: str) -> bool:
        """Freeze ``target``, journaled first; True when it is (now) frozen: :meth:`Freezer.freeze`."""
        return self._freezer.freeze(target, reason=reason)

    def thaw(self, target: FreezeTarget) -> bool:
        """Thaw ``target``, keeping its journal entry; True unless the write failed: :meth:`Freezer.thaw`."""
        return self._freezer.thaw(target)

    def release(self, target: FreezeTarget) -> bool:
        """End throttling of ``target``: thaw, then un-journal: :meth:`Freezer.release`."""
        return self._freezer.release(target)

    def thaw_all(self) -> int:
        """Thaw all this gate or the journal holds frozen (shutdown); how many: :meth:`Freezer.thaw_all`."""
        return self._freezer.thaw_all()

    def recover(self) -> int:
        """At start-up, thaw what the journal names; how many: :meth:`Freezer.recover`."""
        return self._freezer.recover()

    def signal(self, pid: int, sig: int, *, reason: str) -> bool:
        """SIGTERM or SIGKILL to ``pid`` through a pidfd; True if sent: :meth:`Signaller.signal`."""
        return self._signaller.signal(pid, sig, reason=reason)

    async def evict(self, namespace: str, pod: str, *, reason: str) -> str:
        """A policy/v1 Eviction of a pod, within the limits; the outcome's word: :meth:`Evictions.evict`."""
        return await self._evictions.evict(namespace, pod, reason=reason)
