"""Freeze and thaw: the only writes the agent makes to cgroupfs, journaled before the first freeze.

A freeze passes the path rules (:mod:`~gpuagent.enforce.actions.mounts`) and the workload rules
(:mod:`~gpuagent.enforce.actions.rules`) first, in every mode; then ``off`` does nothing, ``audit`` counts
what would change, ``enforce`` writes. The journal (:mod:`gpuagent.enforce.journal`) keeps the invariant
*whenever a cgroup may be frozen by us, the journal names it*: the first :meth:`Freezer.freeze` of a
target journals it, durably, before writing; a journal that cannot be written means no freeze (outcome
"failed"). The duty cycle's :meth:`~Freezer.thaw` keeps the entry (the next freeze rewrites nothing);
:meth:`~Freezer.release` thaws and then removes it. Thaws act in every mode and check only the path
rules, so that a changed ``allowed_outside_kubepods`` cannot leave a cgroup frozen.

Freezing is asynchronous in the kernel: after ``1`` is written to ``cgroup.freeze`` the tasks stop within
a few milliseconds (``cgroup.events`` then reads ``frozen 1``), and after ``FROZEN`` is written to
``freezer.state`` it reads ``FREEZING`` until they have. Nothing here waits for that (the duty cycle is
100 ms); :meth:`Freezer.is_frozen` reads the state, for tests. Writes are skipped when they would change
nothing (a target already frozen here is not written again), as koordinator's resource executor does. A
thaw of a v2 cgroup holding tasks measured about 4 ms here; a journal write costs an fsync, once per
throttling episode.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

from gpuagent.enforce.actions.mounts import CONTROL, Hierarchies
from gpuagent.enforce.actions.outcomes import MAX_REMEMBERED, Outcomes, log
from gpuagent.enforce.actions.rules import ActionRefused, WorkloadRules
from gpuagent.enforce.journal import FreezeTarget, Journal, JournalError


class Freezer:
    """Freezes and thaws cgroups in ``hierarchies`` that ``workloads`` allows, journaled in ``journal``;
    thread-safe (one lock around each action)."""

    def __init__(self, *, mode: str, journal: Journal, hierarchies: Hierarchies, workloads: WorkloadRules,
                 outcomes: Outcomes) -> None:
        self.mode = mode
        self.journal = journal
        self._hierarchies = hierarchies
        self._workloads = workloads
        self._outcomes = outcomes
        self._lock = threading.RLock()
        self._verdicts: dict[FreezeTarget, str | ActionRefused] = {}  # cgroup directory, or why not
        self._frozen: set[FreezeTarget] = set()  # our last write to it froze it
        # Journaled by an earlier run and not written by this one since: state unknown, maybe frozen.
        self._inherited: set[FreezeTarget] = set(journal.targets())
        self._audit_frozen: set[FreezeTarget] = set()  # audit mode: what would be frozen now
        if self._inherited:
            log.warning("freeze journal %s names %d cgroup(s) an earlier run may have left frozen; "
                        "recover() thaws them", journal.path, len(self._inherited))

    @property
    def frozen(self) -> frozenset[FreezeTarget]:
        """What this freezer froze and has not thawed since."""
        with self._lock:
            return frozenset(self._frozen)

    def target_for(self, cgroup_v2: str | None, cgroup_freezer: str | None) -> FreezeTarget | None:
        """Where a workload can be frozen: its v2 cgroup if the unified hierarchy is mounted and the path
        passes the safety rules, else its v1 freezer cgroup likewise; None if neither does."""
        for hierarchy, path in (("v2", cgroup_v2), ("v1", cgroup_freezer)):
            if path and hierarchy in self._hierarchies:
                target = FreezeTarget(hierarchy, path)
                if not isinstance(self._verdict(target), ActionRefused):
                    return target
        return None

    def check(self, target: FreezeTarget) -> str:
        """The cgroup directory of ``target``; :class:`ActionRefused` unless every rule allows freezing it."""
        verdict = self._verdict(target)
        if isinstance(verdict, ActionRefused):
            raise verdict
        return verdict

    def is_frozen(self, target: FreezeTarget) -> bool:
        """What the kernel says now: ``frozen 1`` in ``cgroup.events`` (v2), ``FROZEN`` in
        ``freezer.state`` (v1; ``FREEZING`` is not yet). False for a cgroup that is gone."""
        directory = self._hierarchies.directory(target)
        try:
            if target.hierarchy == "v2":
                return "frozen 1" in Path(directory, "cgroup.events").read_text().splitlines()
            return Path(directory, "freezer.state").read_text().strip() == "FROZEN"
        except FileNotFoundError:
            return False

    # -- freeze -------------------------------------------------------------------------------------------
    def freeze(self, target: FreezeTarget, *, reason: str) -> bool:
        """Freeze ``target``; True when it is (now) frozen here. The first freeze journals it (a journal
        that cannot be written refuses the freeze: outcome "failed"); a target already frozen here is
        neither written nor journaled again. A cgroup that vanished is outcome "gone"."""
        note = self._outcomes.note
        with self._lock:
            if self.mode == "off":
                self._outcomes.say_off("freeze", target.path)
                return False
            try:
                directory = self.check(target)
            except ActionRefused as refused:
                note("freeze", "refused", target.path, str(refused))
                return False
            if self.mode == "audit":
                if target not in self._audit_frozen:
                    self._audit_frozen.add(target)
                    note("freeze", "audit", target.path, f"audit: would freeze {target.path} ({reason})")
                return False
            if target in self._frozen:
                return True  # a no-op write: skipped
            try:
                journaled = self.journal.add(target, reason)
            except JournalError as exc:
                note("freeze", "failed", target.path, f"not freezing {target.path}: {exc}")
                return False
            try:
                self._write(directory, target.hierarchy, frozen=True)
            except FileNotFoundError:
                self._forget(target)
                note("freeze", "gone", target.path, f"cgroup {target.path} is gone")
                return False
            except OSError as exc:
                if journaled:  # as it was before this call: the cgroup was not frozen
                    self.journal.remove(target)
                note("freeze", "failed", target.path, f"cannot freeze {target.path}: {exc}")
                return False
            self._frozen.add(target)
            self._inherited.discard(target)
            note("freeze", "done", target.path, f"froze {target.path} ({reason})")
            return True

    # -- thaw ---------------------------------------------------------------------------------------------
    def thaw(self, target: FreezeTarget) -> bool:
        """Thaw ``target`` if this freezer (or an earlier run's journal) may have frozen it; the journal
        entry stays (the duty cycle will freeze it again; :meth:`release` ends that). Idempotent: True
        unless the write failed. Acts in every mode."""
        with self._lock:
            if target in self._frozen or target in self._inherited:
                return self._thaw(target, unjournal=False) != "failed"
            self._audit_thaw(target)
            return True

    def release(self, target: FreezeTarget) -> bool:
        """End throttling of ``target``: thaw it (if frozen), then remove it from the journal. True unless
        the thaw failed (the entry then stays, and :meth:`thaw_all` or the next start retries)."""
        with self._lock:
            if target in self._frozen or target in self._inherited:
                return self._thaw(target, unjournal=True) != "failed"
            self._audit_thaw(target)
            self.journal.remove(target)
            return True

    def thaw_all(self) -> int:
        """Thaw everything this freezer or the journal holds frozen and empty the journal of it (for
        shutdown); how many cgroups were thawed. Acts in every mode."""
        with self._lock:
            for target in sorted(self._audit_frozen, key=lambda t: (t.hierarchy, t.path)):
                self._audit_thaw(target)
            return self._thaw_many(self._frozen | self._inherited, self.journal.targets())

    def recover(self) -> int:
        """At start-up: thaw every cgroup the journal names (a crash left them frozen, or may have), then
        clear the journal of them; how many were thawed. Acts in every mode."""
        with self._lock:
            journaled = self.journal.targets()
            if journaled:
                log.warning("recovering from the freeze journal %s: thawing %d cgroup(s)",
                            self.journal.path, len(journaled))
            return self._thaw_many(journaled | self._frozen, journaled)

    def _audit_thaw(self, target: FreezeTarget) -> None:
        """Audit: a target that would be frozen now would be thawed: counted as enforce counts its thaw."""
        if target in self._audit_frozen:
            self._audit_frozen.discard(target)
            self._outcomes.note("thaw", "audit", target.path, f"audit: would thaw {target.path}")

    def _thaw_many(self, to_write: Iterable[FreezeTarget], journaled: frozenset[FreezeTarget]) -> int:
        """Thaw ``to_write``; un-journal, with one write, everything of ``journaled`` that is now thawed."""
        thawed, done = 0, set(journaled)
        for target in sorted(set(to_write), key=lambda t: (t.hierarchy, t.path)):
            outcome = self._thaw(target, unjournal=False)
            thawed += outcome == "done"
            if outcome == "failed":
                done.discard(target)
        self.journal.remove_all(done)
        self._inherited -= done
        return thawed

    def _thaw(self, target: FreezeTarget, *, unjournal: bool) -> str:
        """Write the thaw; "done", "gone" (the cgroup vanished: un-journaled whatever ``unjournal`` says),
        "refused" (a path no freeze could have used: dropped from the journal) or "failed" (kept, as when
        its hierarchy is no longer mounted where it was)."""
        note = self._outcomes.note
        try:
            directory = self._hierarchies.directory(target)
        except ActionRefused as refused:
            if refused.rule == "not-mounted":
                note("thaw", "failed", target.path, f"cannot thaw {target.path}: {refused}")
                return "failed"
            self._forget(target)
            log.error("freeze journal %s names %s, which no freeze could have used: %s; dropped",
                      self.journal.path, target.path, refused)
            self._outcomes.count("thaw", "refused")
            return "refused"
        try:
            self._write(directory, target.hierarchy, frozen=False)
        except FileNotFoundError:
            self._forget(target)
            note("thaw", "gone", target.path, f"cgroup {target.path} is gone")
            return "gone"
        except OSError as exc:
            note("thaw", "failed", target.path, f"cannot thaw {target.path}: {exc}")
            return "failed"
        self._frozen.discard(target)
        self._inherited.discard(target)
        if unjournal:
            self.journal.remove(target)
        note("thaw", "done", target.path, f"thawed {target.path}")
        return "done"

    # -- what may be frozen, and the write ----------------------------------------------------------------
    def _verdict(self, target: FreezeTarget) -> str | ActionRefused:
        """The cgroup directory of ``target`` if every rule allows freezing it, else the refusal (cached:
        the rules depend only on the path, the mounts and the configuration)."""
        verdict = self._verdicts.get(target)
        if verdict is None:
            try:
                directory = self._hierarchies.directory(target)
                self._workloads.check_target(target)
                verdict = directory
            except ActionRefused as refused:
                verdict = refused
            if len(self._verdicts) >= MAX_REMEMBERED:
                self._verdicts.clear()
            self._verdicts[target] = verdict
        return verdict

    def _forget(self, target: FreezeTarget) -> None:
        self._frozen.discard(target)
        self._inherited.discard(target)
        self.journal.remove(target)

    @staticmethod
    def _write(directory: str, hierarchy: str, *, frozen: bool) -> None:
        name, freeze, thaw = CONTROL[hierarchy]
        # No O_CREAT: a missing control file is a vanished cgroup (ENOENT), never a file we make.
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(fd, freeze if frozen else thaw)
        finally:
            os.close(fd)
