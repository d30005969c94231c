"""SIGTERM and SIGKILL to a workload's GPU processes, through pidfds, never to the wrong process.

A PID is a number the kernel reuses: between deciding and acting, the process may exit and another take
its PID. So a signal goes through a pidfd (``pidfd_open``, ``pidfd_send_signal``), which pins the process:
if it is still alive after its ``/proc/PID/cgroup`` was read, that cgroup was its own, and the signal
reaches it or no one. The rules, checked in every mode (each refusal an
:class:`~gpuagent.enforce.actions.rules.ActionRefused` naming its rule): never PID 1 (``pid-1``), the
agent's own PID (``own-pid``) or an ancestor of it (``ancestor-pid``), a PID in ``protected_pids``
(``protected-pid``), a process in the agent's own cgroup (``own-cgroup``), or one whose cgroup is neither
in a kubepods pod nor allowed by ``allowed_outside_kubepods`` (``outside-kubepods``).

Audit mode checks the same rules on the process's cgroup, read where the agent read which pod the PID is
(the config's ``proc_root``), and counts the decision (outcome "audit") without opening a pidfd: nothing
will be sent, so there is no process to pin, and the PIDs the agent reads need not be the kernel's (the
demo's simulated processes exist only in its own ``/proc`` tree, and once read as "gone" through a pidfd: a
decision counted as if the process had died of it). Enforce reads the cgroup in the PID namespace the
pidfd pins the process in (``proc_root`` of the gate), so that what is checked is what is signalled.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gpuagent.enforce.actions.outcomes import Outcomes
from gpuagent.enforce.actions.rules import ActionRefused, WorkloadRules, parse_cgroups

_SIGNAL_ACTIONS = {signal.SIGTERM: "signal_term", signal.SIGKILL: "signal_kill"}


class Signaller:
    """Sends SIGTERM or SIGKILL to processes ``workloads`` allows; ``protected_pids`` are never signalled.
    Enforce reads a process's cgroup under ``proc_root``, in the PID namespace its pidfd pins it in; audit,
    which opens no pidfd, under ``workload_proc_root`` (where the agent read which pod the PID is;
    ``proc_root`` when None). Holds no state of its own between calls: thread-safe."""

    def __init__(self, *, mode: str, workloads: WorkloadRules, outcomes: Outcomes,
                 protected_pids: Iterable[int] = (), proc_root: str | Path = "/proc",
                 workload_proc_root: str | Path | None = None) -> None:
        self.mode = mode
        self.protected_pids = frozenset(protected_pids)
        self._workloads = workloads
        self._outcomes = outcomes
        self._proc = Path(proc_root)  # the agent's PID namespace: its ancestors, a pinned process's cgroup
        self._workload_proc = Path(workload_proc_root) if workload_proc_root is not None else self._proc

    def signal(self, pid: int, sig: int, *, reason: str) -> bool:
        """Send SIGTERM or SIGKILL to ``pid`` through a pidfd (a reused PID is never hit); True if sent.
        A PID that exited is outcome "gone"."""
        action = _SIGNAL_ACTIONS.get(sig)
        if action is None:
            raise ValueError(f"only SIGTERM and SIGKILL are sent, not {sig!r}")
        what = f"PID {pid}"
        note = self._outcomes.note
        if self.mode == "off":
            self._outcomes.say_off(action, what)
            return False
        try:
            self.check_pid(pid)
        except ActionRefused as refused:
            note(action, "refused", what, str(refused))
            return False
        if self.mode == "audit":
            return self._audit(pid, sig, action, reason)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            note(action, "gone", what, f"{what} has exited")
            return False
        except OSError as exc:
            note(action, "failed", what, f"cannot open a pidfd for {what}: {exc}")
            return False
        def send() -> None:
            # The pidfd pins the process: if it is still alive after its cgroup was read, the PID was not
            # reused in between, so what was read is its own.
            cgroups = self.cgroups_of(pid)
            signal.pidfd_send_signal(pidfd, 0)
            self.check_cgroups(pid, cgroups)
            signal.pidfd_send_signal(pidfd, sig)

        try:
            if not self._checked(send, action, what, f"cannot signal {what}"):
                return False
        finally:
            os.close(pidfd)
        note(action, "done", what, f"sent {signal.Signals(sig).name} to {what} ({reason})")
        return True

    def _checked(self, step: Callable[[], None], action: str, what: str, failing: str) -> bool:
        """Run ``step`` (the rules on where the process is, and the send in enforce); a refusal, a process
        gone or an error is noted as its outcome and False."""
        note = self._outcomes.note
        try:
            step()
        except ActionRefused as refused:
            note(action, "refused", what, str(refused))
            return False
        except (ProcessLookupError, FileNotFoundError):
            note(action, "gone", what, f"{what} has exited")
            return False
        except OSError as exc:
            note(action, "failed", what, f"{failing}: {exc}")
            return False
        return True

    def _audit(self, pid: int, sig: int, action: str, reason: str) -> bool:
        """Audit: the rules on where the process is, as enforce checks them, and the decision counted; no
        pidfd, since nothing is sent (a PID whose ``/proc`` entry is gone has exited: outcome "gone")."""
        what = f"PID {pid}"
        if self._checked(lambda: self.check_cgroups(pid, self.cgroups_of(pid, self._workload_proc)),
                         action, what, f"cannot read the cgroup of {what}"):
            self._outcomes.note(action, "audit", what,
                                f"audit: would send {signal.Signals(sig).name} to {what} ({reason})")
        return False

    def check_pid(self, pid: int) -> None:
        """The rules on the number alone: raise :class:`ActionRefused` for PID 1, the agent, its
        ancestors and ``protected_pids``."""
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

    def cgroups_of(self, pid: int, proc: Path | None = None) -> dict[str, str]:
        """``<proc>/PID/cgroup`` as {"v2" or the v1 controllers field: path}; ``proc`` is ``proc_root`` when
        None, the PID namespace a pidfd is opened in, so that the cgroup read is the pinned process's."""
        root = self._proc if proc is None else proc
        text = (root / str(pid) / "cgroup").read_bytes().decode("utf-8", "surrogateescape")
        return parse_cgroups(text)

    def check_cgroups(self, pid: int, cgroups: Mapping[str, str]) -> None:
        """The rules on where the process is: raise :class:`ActionRefused` for one in the agent's own
        cgroup, or in no kubepods pod and allowed by no glob."""
        what = f"PID {pid}"
        own_cgroups = self._workloads.own
        for key, path in cgroups.items():
            hierarchy = "v2" if key == "v2" else "v1" if "freezer" in key.split(",") else None
            own = own_cgroups.get(hierarchy) if hierarchy else None
            if own is not None and own != "/" and path == own:
                raise ActionRefused("own-cgroup", what, f"in the agent's own cgroup {path}")
        if not any(self._workloads.allows(path) for path in cgroups.values()):
            shown = cgroups.get("v2") or next(iter(cgroups.values()), "no cgroup")
            raise ActionRefused("outside-kubepods", what, f"its cgroup {shown} is in no kubepods pod and "
                                "allowed by no allowed_outside_kubepods glob")

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
