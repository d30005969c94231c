"""What the gate did, counted and said: one count per (action, outcome), and a log that does not flood.

Every part of the gate (the freezer, the signaller, the evictions) reports each action here with its
outcome, so that ``gpuagent_enforcement_actions_total`` and the log tell the same story whichever part
acted. The duty cycle freezes and thaws every 100 ms, and a refusal repeats every poll for as long as its
cause lasts: so a refusal or a failure is a warning the first time for its (action, outcome, target) and
debug after that, and the duty cycle's own freezes and thaws are debug. The agent's log names the logger,
so every part logs as ``gpuagent.enforce.actions``, the gate's one name.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping

log = logging.getLogger(__package__)  # "gpuagent.enforce.actions", shared by the gate's parts

MODES = ("off", "audit", "enforce")
ACTIONS = ("freeze", "thaw", "signal_term", "signal_kill", "evict")
OUTCOMES = ("done", "audit", "refused", "failed", "gone", "blocked", "rate_limited")
MAX_REMEMBERED = 4096  # bounded caches: verdicts per target, refusals already logged, last evictions


class Outcomes:
    """The counts of (action, outcome) and what has been logged once; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged: set[tuple[str, str, str]] = set()
        self._said_off = False

    def counts(self) -> Mapping[tuple[str, str], int]:
        """(action, outcome) -> count, e.g. ("freeze", "done"); a copy."""
        with self._lock:
            return dict(self._counts)

    def count(self, action: str, outcome: str) -> None:
        with self._lock:
            self._counts[(action, outcome)] += 1

    def note(self, action: str, outcome: str, what: str, message: str) -> None:
        """Count, and log: failures and refusals at warning once per (action, outcome, target), then at
        debug; evictions at info; the duty cycle's freezes and thaws at debug; the rest at info once."""
        self.count(action, outcome)
        if outcome in ("done", "gone") and action in ("freeze", "thaw"):
            log.debug("%s", message)
            return
        key = (action, outcome, what)
        with self._lock:
            first = key not in self._logged
            if first:
                if len(self._logged) >= MAX_REMEMBERED:
                    self._logged.clear()
                self._logged.add(key)
        if outcome in ("refused", "failed"):
            log.log(logging.WARNING if first else logging.DEBUG, "%s", message)
        elif action == "evict" and outcome != "rate_limited":
            log.info("%s", message)  # rare by construction: at most one per pod per interval
        else:
            log.log(logging.INFO if first else logging.DEBUG, "%s", message)

    def say_off(self, action: str, what: str) -> None:
        """In mode off: say once, for the whole gate, that nothing will be done."""
        with self._lock:
            if self._said_off:
                return
            self._said_off = True
        log.info("enforcement mode is off: not acting (first asked: %s %s); nothing will be frozen, "
                 "signalled or evicted", action, what)
