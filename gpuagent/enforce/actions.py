"""The one gate for every write to cgroupfs, every signal and every Eviction the agent makes.

Nothing else in the agent freezes, thaws, signals or evicts. Every action passes the safety rules first;
then the node's mode decides: ``off`` acts on nothing (and says so once in the log), ``audit`` counts what
it would have done (outcome "audit") and touches nothing, ``enforce`` acts.

Safety rules (each refusal names its rule and the target, is counted as outcome "refused" and logged once):

- ``hierarchy``/``not-mounted``: a target is "v2" (``cgroup.freeze``) or "v1" (``freezer.state``), in a
  hierarchy mounted under ``cgroup_root`` (found in ``/proc/self/mountinfo``).
- ``path``, ``dotdot``, ``outside-root``: a path is absolute, has no ``..`` component, and once joined to
  the hierarchy's mount it resolves (symlinks too) strictly inside ``cgroup_root``.
- ``root``: never a hierarchy's root cgroup.
- ``not-kubepods``: only a path with a kubepods component (``kubepods``, ``kubepods.slice``,
  ``kubepods-*.slice``, ``<root>-kubepods[-*].slice``), or one matching a glob of
  ``allowed_outside_kubepods`` (``fnmatch``: ``*`` also matches ``/``).
- ``not-a-pod``: inside kubepods, only a pod's cgroup or one below it: never the whole of kubepods or a QoS
  class (freezing ``kubepods-burstable.slice`` would stop every Burstable pod).
- ``own-cgroup``: never the agent's own cgroup (read once from ``/proc/self/cgroup``) or an ancestor of it,
  nor one whose own cgroup cannot be read.
- signals: never PID 1, the agent's own PID or an ancestor of it, a PID in ``protected_pids``, a process
  in the agent's own cgroup, or one whose cgroup (``/proc/PID/cgroup`` read at that moment) is neither in
  a kubepods pod nor allowed by ``allowed_outside_kubepods`` (``outside-kubepods``).
- evictions: namespace and pod must be valid Kubernetes names (``name``).

Thaws (``thaw``, ``release``, ``thaw_all``, ``recover``) undo the agent's own freezes: they act in every mode
and check only the path rules (a changed ``allowed_outside_kubepods`` must not leave a cgroup frozen).

The journal (:mod:`gpuagent.enforce.journal`) keeps the invariant *whenever a cgroup may be frozen by us,
the journal names it*: the first :meth:`Actions.freeze` of a target journals it, durably, before writing;
a journal that cannot be written means no freeze (outcome "failed"). The duty cycle's ``thaw()`` keeps
the entry (the next ``freeze()`` rewrites nothing); :meth:`Actions.release` thaws and then removes it.

Freezing is asynchronous in the kernel: after ``1`` is written to ``cgroup.freeze`` the tasks stop within
a few milliseconds (``cgroup.events`` then reads ``frozen 1``), and after ``FROZEN`` is written to
``freezer.state`` it reads ``FREEZING`` until they have. Nothing here waits for that (the duty cycle is
100 ms); :meth:`Actions.is_frozen` reads the state, for tests. Writes are skipped when they would change
nothing (a target this gate already froze is not written again), as koordinator's resource executor does.

All of this is synchronous, short system calls, callable from the event loop (a thaw of a v2 cgroup
holding tasks measured about 4 ms here; a journal write costs an fsync, once per throttling episode),
and thread-safe. :meth:`Actions.evict` is a coroutine.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import posixpath
import re
import signal as signals
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpuagent.enforce.journal import FreezeTarget, Journal, JournalEntry, JournalError
from gpuagent.kubeapi import ApiConnection

if TYPE_CHECKING:
    import lightkube

__all__ = ["ActionRefused", "Actions", "EvictionClient", "FreezeTarget", "Journal", "JournalEntry",
           "JournalError"]

log = logging.getLogger(__name__)

MODES = ("off", "audit", "enforce")
ACTIONS = ("freeze", "thaw", "signal_term", "signal_kill", "evict")
OUTCOMES = ("done", "audit", "refused", "failed", "gone", "blocked", "rate_limited")

_CONTROL = {"v2": ("cgroup.freeze", b"1", b"0"), "v1": ("freezer.state", b"FROZEN", b"THAWED")}
_SIGNAL_ACTIONS = {signals.SIGTERM: "signal_term", signals.SIGKILL: "signal_kill"}
# Kubelet's kubepods components: cgroupfs "kubepods"; systemd "kubepods.slice", "kubepods-<qos>.slice",
# "kubepods-<qos>-pod<uid>.slice", each maybe prefixed by --cgroup-root's ("kubelet-kubepods.slice" in kind).
_KUBEPODS = re.compile(r"kubepods|(?:.+-)?kubepods(?:-.+)?\.slice")
# A pod's own level: cgroupfs "pod<uid>"; systemd "[<root>-]kubepods[-<qos>]-pod<uid_>.slice". UIDs are
# UUIDs (36 chars) or, for static pods, a 32-hex config hash; systemd writes each "-" as "_".
_POD = re.compile(r"pod[0-9A-Fa-f_-]{32,36}"
                  r"|(?:.+-)?kubepods(?:-burstable|-besteffort)?-pod[0-9A-Fa-f_]{32,36}\.slice")
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
_MAX_REMEMBERED = 4096  # bounded caches: verdicts per target, refusals already logged, last evictions


class ActionRefused(Exception):
    """A safety rule said no. ``rule`` names the rule (see the module's docstring), ``target`` what was
    refused; the message says both."""

    def __init__(self, rule: str, target: str, detail: str = "") -> None:
        self.rule = rule
        self.target = target
        super().__init__(f"refused by rule {rule!r}: {target}" + (f" ({detail})" if detail else ""))


class _Mount:
    __slots__ = ("mountpoint", "real", "root")

    def __init__(self, mountpoint: str, root: str) -> None:
        self.mountpoint = mountpoint  # where the hierarchy is mounted
        self.root = root  # the cgroup mounted there (mountinfo's 4th field), "/" on a host
        self.real = os.path.realpath(mountpoint)


class Actions:
    """The one gate for every write to cgroupfs, every signal and every Eviction.

    ``mode`` "off" | "audit" | "enforce". ``journal`` the freeze journal (see the module's docstring).
    ``cgroup_root`` where the hierarchies are mounted: v2 at ``<root>`` (pure v2) or ``<root>/unified``
    (hybrid), the v1 freezer at ``<root>/freezer``, as ``<proc_root>/self/mountinfo`` says.
    ``allowed_outside_kubepods`` globs of cgroup paths that may be acted on outside kubepods (a Slurm
    job's, a systemd unit's). ``protected_pids`` are never signalled. ``clock`` (seconds) drives the
    eviction limits: at most one eviction per pod per ``eviction_min_interval`` seconds, and a node-wide
    token bucket of ``eviction_burst`` tokens refilled one per ``eviction_refill_interval`` seconds.
    ``eviction_client`` is made from the environment's Kubernetes configuration on first use when None.
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
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if eviction_burst < 1 or eviction_refill_interval <= 0 or eviction_min_interval < 0:
            raise ValueError("eviction limits: burst >= 1, refill interval > 0, min interval >= 0")
        self.mode = mode
        self.journal = journal
        self.cgroup_root = os.path.normpath(os.fspath(cgroup_root))
        self.allowed_outside_kubepods = tuple(allowed_outside_kubepods)
        self.protected_pids = frozenset(protected_pids)
        self._clock = clock
        self._proc = Path(proc_root)
        self._lock = threading.RLock()
        self._mounts = self._find_mounts()
        self._own = self._own_cgroups()
        self._verdicts: dict[FreezeTarget, str | ActionRefused] = {}  # cgroup directory, or why not
        self._frozen: set[FreezeTarget] = set()  # our last write to it froze it
        # Journaled by an earlier run and not written by this one since: state unknown, maybe frozen.
        self._inherited: set[FreezeTarget] = set(journal.targets())
        self._audit_frozen: set[FreezeTarget] = set()  # audit mode: what would be frozen now
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged: set[tuple[str, str, str]] = set()
        self._said_off = False
        self._eviction_client = eviction_client
        self._eviction_min_interval = eviction_min_interval
        self._eviction_burst = eviction_burst
        self._eviction_refill = eviction_refill_interval
        self._tokens = float(eviction_burst)
        self._tokens_at: float | None = None
        self._last_eviction: dict[tuple[str, str], float] = {}
        if self._inherited:
            log.warning("freeze journal %s names %d cgroup(s) an earlier run may have left frozen; "
                        "recover() thaws them", journal.path, len(self._inherited))

    # -- what is where ------------------------------------------------------------------------------------
    @property
    def hierarchies(self) -> Mapping[str, str]:
        """Mounted hierarchies usable here: "v2" and/or "v1" -> mount point."""
        return {key: mount.mountpoint for key, mount in self._mounts.items()}

    @property
    def frozen(self) -> frozenset[FreezeTarget]:
        """What this gate froze and has not thawed since."""
        with self._lock:
            return frozenset(self._frozen)

    @property
    def throttling(self) -> frozenset[FreezeTarget]:
        """What the journal names: frozen now, or thawed inside a duty cycle until :meth:`release`."""
        return self.journal.targets()

    def counts(self) -> Mapping[tuple[str, str], int]:
        """(action, outcome) -> count, e.g. ("freeze", "done"); a copy."""
        with self._lock:
            return dict(self._counts)

    def target_for(self, cgroup_v2: str | None, cgroup_freezer: str | None) -> FreezeTarget | None:
        """Where a workload can be frozen: its v2 cgroup if the unified hierarchy is mounted and the path
        passes the safety rules, else its v1 freezer cgroup likewise; None if neither does."""
        for hierarchy, path in (("v2", cgroup_v2), ("v1", cgroup_freezer)):
            if path and hierarchy in self._mounts:
                target = FreezeTarget(hierarchy, path)
                if not isinstance(self._verdict(target), ActionRefused):
                    return target
        return None

    def check(self, target: FreezeTarget) -> None:
        """Raise :class:`ActionRefused` unless every safety rule allows freezing ``target``."""
        verdict = self._verdict(target)
        if isinstance(verdict, ActionRefused):
            raise verdict

    def is_frozen(self, target: FreezeTarget) -> bool:
        """What the kernel says now: ``frozen 1`` in ``cgroup.events`` (v2), ``FROZEN`` in
        ``freezer.state`` (v1; ``FREEZING`` is not yet). False for a cgroup that is gone."""
        directory = self._directory(target)
        try:
            if target.hierarchy == "v2":
                return "frozen 1" in Path(directory, "cgroup.events").read_text().splitlines()
            return Path(directory, "freezer.state").read_text().strip() == "FROZEN"
        except FileNotFoundError:
            return False

    # -- freeze and thaw ----------------------------------------------------------------------------------
    def freeze(self, target: FreezeTarget, *, reason: str) -> bool:
        """Freeze ``target``; True when it is (now) frozen by this gate. The first freeze journals it (a
        journal that cannot be written refuses the freeze: outcome "failed"); a target already frozen by
        this gate is neither written nor journaled again. A cgroup that vanished is outcome "gone"."""
        with self._lock:
            if self.mode == "off":
                self._say_off("freeze", target.path)
                return False
            try:
                directory = self._checked(target)
            except ActionRefused as refused:
                self._note("freeze", "refused", target.path, str(refused))
                return False
            if self.mode == "audit":
                if target not in self._audit_frozen:
                    self._audit_frozen.add(target)
                    self._note("freeze", "audit", target.path,
                               f"audit: would freeze {target.path} ({reason})")
                return False
            if target in self._frozen:
                return True  # a no-op write: skipped
            try:
                journaled = self.journal.add(target, reason)
            except JournalError as exc:
                self._note("freeze", "failed", target.path, f"not freezing {target.path}: {exc}")
                return False
            try:
                self._write(directory, target.hierarchy, frozen=True)
            except FileNotFoundError:
                self._forget(target)
                self._note("freeze", "gone", target.path, f"cgroup {target.path} is gone")
                return False
            except OSError as exc:
                if journaled:  # as it was before this call: the cgroup was not frozen
                    self.journal.remove(target)
                self._note("freeze", "failed", target.path, f"cannot freeze {target.path}: {exc}")
                return False
            self._frozen.add(target)
            self._inherited.discard(target)
            self._note("freeze", "done", target.path, f"froze {target.path} ({reason})")
            return True

    def thaw(self, target: FreezeTarget) -> bool:
        """Thaw ``target`` if this gate (or an earlier run's journal) may have frozen it; the journal entry
        stays (the duty cycle will freeze it again; :meth:`release` ends that). Idempotent: True unless
        the write failed. Acts in every mode."""
        with self._lock:
            if target in self._frozen or target in self._inherited:
                return self._thaw(target, unjournal=False) != "failed"
            if target in self._audit_frozen:
                self._audit_frozen.discard(target)
                self._note("thaw", "audit", target.path, f"audit: would thaw {target.path}")
            return True

    def release(self, target: FreezeTarget) -> bool:
        """End throttling of ``target``: thaw it (if frozen), then remove it from the journal. True unless
        the thaw failed (the entry then stays, and :meth:`thaw_all` or the next start retries)."""
        with self._lock:
            if target in self._frozen or target in self._inherited:
                return self._thaw(target, unjournal=True) != "failed"
            self._audit_frozen.discard(target)
            self.journal.remove(target)
            return True

    def thaw_all(self) -> int:
        """Thaw everything this gate or the journal holds frozen and empty the journal of it (for
        shutdown); how many cgroups were thawed. Acts in every mode."""
        with self._lock:
            self._audit_frozen.clear()
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
        try:
            directory = self._directory(target)
        except ActionRefused as refused:
            if refused.rule == "not-mounted":
                self._note("thaw", "failed", target.path, f"cannot thaw {target.path}: {refused}")
                return "failed"
            self._forget(target)
            log.error("freeze journal %s names %s, which no freeze could have used: %s; dropped",
                      self.journal.path, target.path, refused)
            self._count("thaw", "refused")
            return "refused"
        try:
            self._write(directory, target.hierarchy, frozen=False)
        except FileNotFoundError:
            self._forget(target)
            self._note("thaw", "gone", target.path, f"cgroup {target.path} is gone")
            return "gone"
        except OSError as exc:
            self._note("thaw", "failed", target.path, f"cannot thaw {target.path}: {exc}")
            return "failed"
        self._frozen.discard(target)
        self._inherited.discard(target)
        if unjournal:
            self.journal.remove(target)
        self._note("thaw", "done", target.path, f"thawed {target.path}")
        return "done"

    def _forget(self, target: FreezeTarget) -> None:
        self._frozen.discard(target)
        self._inherited.discard(target)
        self.journal.remove(target)

    @staticmethod
    def _write(directory: str, hierarchy: str, *, frozen: bool) -> None:
        name, freeze, thaw = _CONTROL[hierarchy]
        # No O_CREAT: a missing control file is a vanished cgroup (ENOENT), never a file we make.
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(fd, freeze if frozen else thaw)
        finally:
            os.close(fd)

    # -- signals ------------------------------------------------------------------------------------------
    def signal(self, pid: int, sig: int, *, reason: str) -> bool:
        """Send SIGTERM or SIGKILL to ``pid`` through a pidfd (a reused PID is never hit); True if sent.
        A PID that exited is outcome "gone"."""
        action = _SIGNAL_ACTIONS.get(sig)
        if action is None:
            raise ValueError(f"only SIGTERM and SIGKILL are sent, not {sig!r}")
        what = f"PID {pid}"
        if self.mode == "off":
            self._say_off(action, what)
            return False
        try:
            self._check_pid(pid)
        except ActionRefused as refused:
            self._note(action, "refused", what, str(refused))
            return False
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._note(action, "gone", what, f"{what} has exited")
            return False
        except OSError as exc:
            self._note(action, "failed", what, f"cannot open a pidfd for {what}: {exc}")
            return False
        try:
            # The pidfd pins the process: if it is still alive after its cgroup was read, the PID was not
            # reused in between, so what was read is its own.
            cgroups = self._pid_cgroups(pid)
            signals.pidfd_send_signal(pidfd, 0)
            self._check_pid_cgroups(pid, cgroups)
            if self.mode == "audit":
                self._note(action, "audit", what, f"audit: would send {signals.Signals(sig).name} to {what} "
                           f"({reason})")
                return False
            signals.pidfd_send_signal(pidfd, sig)
        except ActionRefused as refused:
            self._note(action, "refused", what, str(refused))
            return False
        except (ProcessLookupError, FileNotFoundError):
            self._note(action, "gone", what, f"{what} has exited")
            return False
        except OSError as exc:
            self._note(action, "failed", what, f"cannot signal {what}: {exc}")
            return False
        finally:
            os.close(pidfd)
        self._note(action, "done", what, f"sent {signals.Signals(sig).name} to {what} ({reason})")
        return True

    def _check_pid(self, pid: int) -> None:
        what = f"PID {pid}"
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ActionRefused("pid", what, "not a PID")
        if pid == 1:
            raise ActionRefused("pid-1", what, "init")
        if pid == os.getpid():
            raise ActionRefused("own-pid", what, "the agent itself")
        if pid in self.protected_pids:
            raise ActionRefused("protected-pid", what)
        if pid in self._ancestors():
            raise ActionRefused("ancestor-pid", what, "an ancestor of the agent")

    def _ancestors(self) -> set[int]:
        found: set[int] = set()
        pid = os.getpid()
        while pid > 1 and pid not in found:
            try:
                status = (self._proc / str(pid) / "status").read_text()
            except OSError:
                break
            ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
            if ppid <= 0:
                break
            found.add(ppid)
            pid = ppid
        return found

    def _pid_cgroups(self, pid: int) -> dict[str, str]:
        """/proc/PID/cgroup as {"v2" or the v1 controllers field: path}."""
        text = (self._proc / str(pid) / "cgroup").read_bytes().decode("utf-8", "surrogateescape")
        return _parse_cgroups(text)

    def _check_pid_cgroups(self, pid: int, cgroups: Mapping[str, str]) -> None:
        what = f"PID {pid}"
        for key, path in cgroups.items():
            hierarchy = "v2" if key == "v2" else "v1" if "freezer" in key.split(",") else None
            own = self._own.get(hierarchy) if hierarchy else None
            if own is not None and own != "/" and path == own:
                raise ActionRefused("own-cgroup", what, f"in the agent's own cgroup {path}")
        if not any(self._workload_allowed(path) for path in cgroups.values()):
            shown = cgroups.get("v2") or next(iter(cgroups.values()), "no cgroup")
            raise ActionRefused("outside-kubepods", what, f"its cgroup {shown} is in no kubepods pod and "
                                "allowed by no allowed_outside_kubepods glob")

    # -- evictions ----------------------------------------------------------------------------------------
    async def evict(self, namespace: str, pod: str, *, reason: str) -> str:
        """Ask the API server to evict a pod (policy/v1 Eviction: it honours PodDisruptionBudgets and the
        grace period). Returns "evicted", "blocked" (429: a PodDisruptionBudget, or the server's own
        limits), "gone" (404), "rate_limited" (ours), "audit", "off", "refused: ..." or "failed: ..."."""
        what = f"pod {namespace}/{pod}"
        if self.mode == "off":
            self._say_off("evict", what)
            return "off"
        if not (isinstance(namespace, str) and _NAMESPACE.fullmatch(namespace)
                and isinstance(pod, str) and _POD_NAME.fullmatch(pod)):
            refused = ActionRefused("name", repr(what), "not a Kubernetes namespace and pod name")
            self._note("evict", "refused", what, str(refused))
            return f"refused: {refused}"
        now = self._clock()
        last = self._last_eviction.get((namespace, pod))
        if last is not None and 0 <= now - last < self._eviction_min_interval:
            self._note("evict", "rate_limited", what, f"not evicting {what}: evicted {now - last:.0f} s ago")
            return "rate_limited"
        if not self._take_token(now):
            self._note("evict", "rate_limited", what, f"not evicting {what}: the node's eviction budget "
                       f"({self._eviction_burst} per {self._eviction_refill:.0f} s) is spent")
            return "rate_limited"
        self._remember_eviction((namespace, pod), now)
        if self.mode == "audit":
            self._note("evict", "audit", what, f"audit: would evict {what} ({reason})")
            return "audit"
        client = self._eviction_client
        try:
            if client is None:
                client = self._eviction_client = EvictionClient()
            status = await client.evict(namespace, pod)
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            self._note("evict", "failed", what, f"cannot evict {what}: {detail}")
            return f"failed: {detail}"
        message = getattr(client, "last_message", "") or ""
        if 200 <= status < 300:
            self._note("evict", "done", what, f"evicted {what} ({reason})")
            return "evicted"
        if status == 429:
            self._note("evict", "blocked", what, f"eviction of {what} refused by the API server (429): "
                       f"{message or 'a PodDisruptionBudget'}")
            return "blocked"
        if status == 404:
            self._note("evict", "gone", what, f"{what} no longer exists")
            return "gone"
        detail = f"HTTP {status}" + (f": {message}" if message else "")
        self._note("evict", "failed", what, f"cannot evict {what}: {detail}")
        return f"failed: {detail}"

    def _take_token(self, now: float) -> bool:
        if self._tokens_at is not None and now > self._tokens_at:
            self._tokens = min(float(self._eviction_burst),
                               self._tokens + (now - self._tokens_at) / self._eviction_refill)
        self._tokens_at = now if self._tokens_at is None else max(now, self._tokens_at)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _remember_eviction(self, key: tuple[str, str], now: float) -> None:
        if len(self._last_eviction) >= _MAX_REMEMBERED:
            self._last_eviction = {k: t for k, t in self._last_eviction.items()
                                   if 0 <= now - t < self._eviction_min_interval}
        self._last_eviction[key] = now

    # -- the rules ----------------------------------------------------------------------------------------
    def _verdict(self, target: FreezeTarget) -> str | ActionRefused:
        """The cgroup directory of ``target`` if every rule allows freezing it, else the refusal (cached:
        the rules depend only on the path, the mounts and the configuration)."""
        verdict = self._verdicts.get(target)
        if verdict is None:
            try:
                directory = self._directory(target)
                self._check_workload(target)
                verdict = directory
            except ActionRefused as refused:
                verdict = refused
            if len(self._verdicts) >= _MAX_REMEMBERED:
                self._verdicts.clear()
            self._verdicts[target] = verdict
        return verdict

    def _checked(self, target: FreezeTarget) -> str:
        verdict = self._verdict(target)
        if isinstance(verdict, ActionRefused):
            raise verdict
        return verdict

    def _directory(self, target: FreezeTarget) -> str:
        """The path rules: the cgroup's directory, strictly inside its mount under ``cgroup_root``."""
        if target.hierarchy not in _CONTROL:
            raise ActionRefused("hierarchy", f"{target.hierarchy}:{target.path}", 'not "v2" or "v1"')
        mount = self._mounts.get(target.hierarchy)
        if mount is None:
            raise ActionRefused("not-mounted", target.path,
                                f"no {target.hierarchy} freezer is mounted under {self.cgroup_root}")
        path = target.path
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise ActionRefused("path", repr(path), "not an absolute cgroup path")
        if ".." in path.split("/"):
            raise ActionRefused("dotdot", path, "a '..' component")
        normal = posixpath.normpath(path)
        relative = posixpath.relpath(normal, mount.root)
        if relative.startswith(".."):
            raise ActionRefused("outside-root", path, f"outside the cgroup {mount.root} mounted at "
                                f"{mount.mountpoint}")
        if relative == ".":
            raise ActionRefused("root", path, f"the root cgroup of {mount.mountpoint}")
        directory = os.path.join(mount.mountpoint, relative)
        real = os.path.realpath(directory)
        if os.path.commonpath([real, mount.real]) != mount.real or real == mount.real:
            raise ActionRefused("outside-root", path, f"{directory} resolves to {real}, outside {mount.real}")
        return directory

    def _check_workload(self, target: FreezeTarget) -> None:
        """The workload rules: a kubepods pod or an allowed path, and never the agent's own cgroup."""
        path = posixpath.normpath(target.path)
        own = self._own.get(target.hierarchy)
        if own is None:
            raise ActionRefused("own-cgroup", target.path, f"the agent's own {target.hierarchy} cgroup is "
                                f"unknown ({self._proc / 'self' / 'cgroup'} unreadable)")
        if own == path or own.startswith(path.rstrip("/") + "/"):
            raise ActionRefused("own-cgroup", target.path, f"the agent's own cgroup is {own}")
        if any(fnmatch.fnmatchcase(path, glob) for glob in self.allowed_outside_kubepods):
            return
        parts = path.split("/")
        first = next((i for i, part in enumerate(parts) if _KUBEPODS.fullmatch(part)), None)
        if first is None:
            raise ActionRefused("not-kubepods", target.path, "no kubepods component and no "
                                "allowed_outside_kubepods glob matches")
        if not any(_POD.fullmatch(part) for part in parts[first:]):
            raise ActionRefused("not-a-pod", target.path, "names no pod: all of kubepods or a QoS class")

    def _workload_allowed(self, path: str) -> bool:
        path = posixpath.normpath(path.removesuffix(" (deleted)"))
        if ".." in path.split("/"):
            return False
        if any(fnmatch.fnmatchcase(path, glob) for glob in self.allowed_outside_kubepods):
            return True
        parts = path.split("/")
        first = next((i for i, part in enumerate(parts) if _KUBEPODS.fullmatch(part)), None)
        return first is not None and any(_POD.fullmatch(part) for part in parts[first:])

    def _find_mounts(self) -> dict[str, _Mount]:
        """v2 mounted at ``cgroup_root`` (pure v2) or ``<root>/unified`` (hybrid); the v1 freezer under it."""
        source = self._proc / "self" / "mountinfo"
        try:
            text = source.read_text()
        except OSError as exc:
            log.error("cannot read %s: %s; no cgroup can be frozen", source, exc)
            return {}
        v2_places = (self.cgroup_root, os.path.join(self.cgroup_root, "unified"))
        v2: dict[str, _Mount] = {}
        found: dict[str, _Mount] = {}
        for line in text.splitlines():
            fields = line.split()
            if "-" not in fields:
                continue
            separator = fields.index("-")
            if separator < 5 or len(fields) < separator + 4:
                continue
            fstype, options = fields[separator + 1], fields[separator + 3].split(",")
            mountpoint = os.path.normpath(_unescape_mountinfo(fields[4]))
            root = _unescape_mountinfo(fields[3])
            if fstype == "cgroup2" and mountpoint in v2_places:
                v2.setdefault(mountpoint, _Mount(mountpoint, root))
            elif (fstype == "cgroup" and "freezer" in options and "v1" not in found
                  and os.path.dirname(mountpoint) == self.cgroup_root):
                found["v1"] = _Mount(mountpoint, root)
        for place in v2_places:  # pure v2 first
            if place in v2:
                found["v2"] = v2[place]
                break
        if not found:
            log.warning("no cgroup freezer is mounted under %s (per %s): nothing can be frozen",
                        self.cgroup_root, source)
        return found

    def _own_cgroups(self) -> dict[str, str]:
        source = self._proc / "self" / "cgroup"
        try:
            cgroups = _parse_cgroups(source.read_bytes().decode("utf-8", "surrogateescape"))
        except OSError as exc:
            log.error("cannot read the agent's own cgroup from %s: %s; no cgroup will be frozen", source, exc)
            return {}
        own: dict[str, str] = {}
        if "v2" in cgroups:
            own["v2"] = posixpath.normpath(cgroups["v2"])
        freezer = next((path for key, path in cgroups.items() if "freezer" in key.split(",")), None)
        if freezer is not None:
            own["v1"] = posixpath.normpath(freezer)
        return own

    # -- counting and saying ------------------------------------------------------------------------------
    def _count(self, action: str, outcome: str) -> None:
        with self._lock:
            self._counts[(action, outcome)] += 1

    def _note(self, action: str, outcome: str, what: str, message: str) -> None:
        """Count, and log: failures and refusals at warning once per (action, outcome, target), then at
        debug; evictions at info; the duty cycle's freezes and thaws at debug; the rest at info once."""
        self._count(action, outcome)
        if outcome in ("done", "gone") and action in ("freeze", "thaw"):
            log.debug("%s", message)
            return
        key = (action, outcome, what)
        with self._lock:
            first = key not in self._logged
            if first:
                if len(self._logged) >= _MAX_REMEMBERED:
                    self._logged.clear()
                self._logged.add(key)
        if outcome in ("refused", "failed"):
            log.log(logging.WARNING if first else logging.DEBUG, "%s", message)
        elif action == "evict" and outcome != "rate_limited":
            log.info("%s", message)  # rare by construction: at most one per pod per interval
        else:
            log.log(logging.INFO if first else logging.DEBUG, "%s", message)

    def _say_off(self, action: str, what: str) -> None:
        if not self._said_off:
            self._said_off = True
            log.info("enforcement mode is off: not acting (first asked: %s %s); nothing will be frozen, "
                     "signalled or evicted", action, what)


class EvictionClient:
    """Posts policy/v1 Evictions to the API server: ``await evict(namespace, pod)`` -> the HTTP status.

    Where the API server is and how to authenticate come from lightkube, as for the pods watcher: ``config``
    (a lightkube ``KubeConfig`` or ``SingleConfig``), else ``kubeconfig_path``, else ``KubeConfig.from_env()``
    (the in-cluster service account, ``$KUBECONFIG``, ``~/.kube/config``); the connection is
    :class:`gpuagent.kubeapi.ApiConnection`, shared with the Event poster. Nothing of lightkube is imported
    before the first eviction. ``last_message`` is the API server's message of the last answer (a
    PodDisruptionBudget's, an RBAC refusal's). RBAC: ``create`` on ``pods/eviction``.
    """

    def __init__(
        self,
        *,
        config: lightkube.KubeConfig | lightkube.SingleConfig | None = None,
        kubeconfig_path: str | None = None,
        grace_period_seconds: int | None = None,
        request_timeout: float = 10.0,
    ) -> None:
        self._api = ApiConnection(config=config, kubeconfig_path=kubeconfig_path,
                                  request_timeout=request_timeout)
        self._grace = grace_period_seconds
        self.last_message = ""

    async def evict(self, namespace: str, pod: str) -> int:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": pod, "namespace": namespace}}
        if self._grace is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": self._grace}
        url = f"api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/eviction"
        status, self.last_message = await self._api.post_json(url, body)
        return status

    async def aclose(self) -> None:
        await self._api.aclose()


def _parse_cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup lines "id:controllers:path" (paths may hold ':') -> {"v2" | controllers: path}."""
    cgroups: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy_id, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not sep or not sep2:
            continue
        cgroups["v2" if hierarchy_id == "0" and not controllers else controllers] = path
    return cgroups


def _unescape_mountinfo(text: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as octal escapes: \040, \011, \012, \134."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)

