"""The GPU memory-limit ladder: warn, then SIGTERM (or a Kubernetes Eviction), then SIGKILL.

It only decides. Each ``update`` takes every pod's (or non-Kubernetes workload's) limit, its GPU memory in
use and its GPU PIDs now, and returns the ``Step`` s to take now; ``enforce/actions/`` takes them (or, in
audit mode, only counts them). A pod is "over" when it uses more than its limit plus the tolerance.

One episode, from the first update over to the first update back under (or the pod leaving):

- over at once: stage "warned", one "warn" step;
- over for ``term_after`` seconds: "term" for every GPU PID it has, stage "terminating"; with action
  "evict", one "evict" step instead, stage "evicted" (repeated every ``kill_grace`` seconds while the pod
  stays over: the Eviction API may have refused it, e.g. for a PodDisruptionBudget). A workload without a
  namespace cannot be evicted: it takes the kill path, and the reasons say so;
- ``kill_grace`` seconds after its SIGTERM, a PID still on the GPU gets "kill", stage "killed". A PID gone
  from the list has exited and is never killed; one that appears later in the episode gets its own SIGTERM
  at once (the pod is already past ``term_after``) and its own grace. The stage never steps back down
  within an episode;
- back under (used <= limit + tolerance): stage "ok", everything forgotten: going over again is a new
  episode, warned again. A pod missing from an update has left and is forgotten; limit ``None``: no ladder.

Each state names the next step due should the pod stay over, and when (``next_step``, ``next_step_at_unix``).
The ladder does not know the mode: in audit mode nothing is signalled, so a process stays on the GPU as one
that ignored its SIGTERM would, and the ladder steps on to "kill" after ``kill_grace`` as enforce would for
such a process; every surface says "would" of these steps (the actions are counted as outcome "audit").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuagent.snapshot.enforcement import MemoryState

ACTIONS = ("warn", "kill", "evict")
STEP_KINDS = ("warn", "term", "kill", "evict")
STAGES = ("ok", "warned", "terminating", "killed", "evicted")

# (pod name, namespace or None, limit bytes or None, used bytes now, GPU pids now)
PodMemory = tuple[str, str | None, int | None, int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class LadderSettings:
    action: str = "kill"  # "kill" (SIGTERM, then SIGKILL) | "evict" (a Kubernetes Eviction) | "warn"
    term_after: float = 10.0  # seconds continuously over the limit before SIGTERM (or the eviction)
    kill_grace: float = 30.0  # seconds after SIGTERM before SIGKILL to PIDs still on the GPU
    tolerance_bytes: int = 0  # over means used > limit + tolerance

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action: expected one of {', '.join(ACTIONS)}, got {self.action!r}")
        for name in ("term_after", "kill_grace", "tolerance_bytes"):
            value = getattr(self, name)
            if not value >= 0:  # also refuses NaN
                raise ValueError(f"{name}: expected a number >= 0, got {value!r}")


class Step(NamedTuple):
    """One action to take now. ``pod_key`` is "namespace/name", or the name alone without a namespace."""

    kind: str  # "warn" | "term" | "kill" | "evict"
    pod_key: str
    pids: tuple[int, ...]
    reason: str


def pod_key(name: str, namespace: str | None) -> str:
    """How steps name a pod: "namespace/name" (as ``/v1/state`` does), or the workload name alone."""
    return f"{namespace}/{name}" if namespace else name


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(slots=True)
class _Episode:
    """One pod's time over its limit."""

    over_since: float
    stage: str = "warned"
    termed: dict[int, float] = field(default_factory=dict)  # pid -> when its SIGTERM was decided
    killed: set[int] = field(default_factory=set)
    evicted_at: float | None = None


class MemoryLadder:
    """Per-pod escalation over GPU memory limits; holds only the pods of the last update."""

    def __init__(self, settings: LadderSettings, *, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._episodes: dict[str, _Episode] = {}
        self._states: tuple[MemoryState, ...] = ()
        self._ok: dict[str, MemoryState] = {}  # the last update's "ok" states, passed on while they hold

    @property
    def settings(self) -> LadderSettings:
        return self._settings

    def update(self, pods: Sequence[PodMemory]) -> list[Step]:
        """The steps to take now, given every pod's (name, namespace, limit, used bytes, GPU pids) now.

        Keys (``pod_key``) must be unique within one update: a repeated one raises ``ValueError``.
        """
        now = self._clock()
        steps: list[Step] = []
        episodes: dict[str, _Episode] = {}
        states: list[MemoryState] = []
        seen: set[str] = set()
        ok_before, ok = self._ok, {}
        tolerance = self._settings.tolerance_bytes
        for name, namespace, limit, used, pids in pods:
            key = pod_key(name, namespace)
            if key in seen:
                raise ValueError(f"pod {key!r} twice in one update")
            seen.add(key)
            if limit is None or used <= limit + tolerance:
                # the last update's state when it says the same (a pod's memory rarely moves): one object
                state = ok_before.get(key)
                if state is None or state.limit_bytes != limit or state.used_bytes != used or (
                        state.pod != name or state.namespace != namespace):
                    state = MemoryState(name, namespace, limit, used, "ok")
                states.append(state)
                ok[key] = state
                continue
            episode = self._episodes.get(key)
            over = f"GPU memory {_size(used)} over its limit {_size(limit)}"
            if episode is None:
                episode = _Episode(over_since=now)
                steps.append(Step("warn", key, tuple(pids), over))
            episodes[key] = episode
            steps.extend(self._escalate(key, namespace, episode, tuple(pids), now, over))
            next_step, due = self._next(namespace, episode, tuple(pids))
            states.append(MemoryState(pod=name, namespace=namespace, limit_bytes=limit, used_bytes=used,
                                      stage=episode.stage, over_since_unix=episode.over_since,
                                      next_step=next_step, next_step_at_unix=due))
        self._episodes = episodes  # pods back under, without a limit, or gone: forgotten
        self._states, self._ok = tuple(states), ok
        return steps

    def _escalate(
        self, key: str, namespace: str | None, episode: _Episode, pids: tuple[int, ...], now: float, over: str
    ) -> list[Step]:
        settings = self._settings
        over_for = now - episode.over_since
        if settings.action == "warn" or over_for < settings.term_after:
            return []
        if settings.action == "evict" and namespace:
            if episode.evicted_at is None:
                episode.evicted_at, episode.stage = now, "evicted"
                return [Step("evict", key, pids, f"{over} for {over_for:.0f}s: evicting the pod")]
            if now - episode.evicted_at >= settings.kill_grace:
                since = now - episode.evicted_at
                episode.evicted_at = now
                return [Step("evict", key, pids, f"{over} {since:.0f}s after its eviction: evicting again")]
            return []
        fallback = ""
        if settings.action == "evict":
            fallback = " (a workload outside Kubernetes cannot be evicted: signalling its processes instead)"
        steps = []
        for pid in [p for p in episode.termed if p not in pids]:  # exited: a later same pid is a new process
            del episode.termed[pid]
            episode.killed.discard(pid)
        fresh = tuple(p for p in pids if p not in episode.termed)
        if fresh:
            for pid in fresh:
                episode.termed[pid] = now
            if episode.stage == "warned":
                episode.stage = "terminating"
            steps.append(Step("term", key, fresh, f"{over} for {over_for:.0f}s: SIGTERM, SIGKILL "
                              f"{settings.kill_grace:g}s later if still on the GPU{fallback}"))
        due = tuple(
            p for p in pids
            if p not in episode.killed and now - episode.termed[p] >= settings.kill_grace
        )
        if due:
            episode.killed.update(due)
            episode.stage = "killed"
            steps.append(Step(
                "kill", key, due,
                f"{over}, still on the GPU {settings.kill_grace:g}s after SIGTERM: SIGKILL{fallback}",
            ))
        return steps

    def _next(self, namespace: str | None, episode: _Episode, pids: tuple[int, ...]
              ) -> tuple[str | None, float | None]:
        """The step due next for a pod that stays over, and when (the clock's time): (None, None) when the
        ladder has nothing left to do (action "warn", or every PID on the GPU already killed)."""
        settings = self._settings
        if settings.action == "warn":
            return None, None
        if settings.action == "evict" and namespace:
            if episode.evicted_at is None:
                return "evict", episode.over_since + settings.term_after
            return "evict", episode.evicted_at + settings.kill_grace
        if episode.stage == "warned":
            return "term", episode.over_since + settings.term_after
        waiting = [episode.termed[p] for p in pids if p in episode.termed and p not in episode.killed]
        return ("kill", min(waiting) + settings.kill_grace) if waiting else (None, None)

    def states(self) -> tuple[MemoryState, ...]:
        """Every pod of the last update, in its order: limit, use, stage ("ok" without a limit)."""
        return self._states
