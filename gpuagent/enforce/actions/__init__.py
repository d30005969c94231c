"""The one gate for every write to cgroupfs, every signal and every Eviction the agent makes.

Nothing else in the agent freezes, thaws, signals or evicts: every action goes through :class:`Actions`.
Each passes the safety rules first (a refusal names its rule and target, is counted as outcome "refused"
and logged once); then the node's mode decides: ``off`` acts on nothing (and says so once in the log),
``audit`` counts what it would have done (outcome "audit") and touches nothing, ``enforce`` acts. Thaws
(``thaw``, ``release``, ``thaw_all``, ``recover``) undo the agent's own freezes: they act in every mode.
All of it is short system calls, callable from the event loop and thread-safe; ``evict`` is a coroutine.

One module per job, behind the one facade (``gate.py``): ``freezer.py`` freezes and thaws (v2
``cgroup.freeze``, the v1 freezer) and keeps the journal ahead of the first freeze; ``mounts.py`` finds the
hierarchies and holds the path rules; ``rules.py`` which workloads may be acted on at all (shared by freezes
and signals); ``signals.py`` SIGTERM and SIGKILL through pidfds; ``evictions.py`` policy/v1 Evictions
and their rate limits; ``outcomes.py`` the counts and the log. Each module's docstring lists its rules.
"""

from gpuagent.enforce.actions.evictions import EvictionClient
from gpuagent.enforce.actions.gate import Actions
from gpuagent.enforce.actions.outcomes import ACTIONS, MODES, OUTCOMES
from gpuagent.enforce.actions.rules import ActionRefused
from gpuagent.enforce.journal import FreezeTarget, Journal, JournalEntry, JournalError

__all__ = ["ACTIONS", "MODES", "OUTCOMES", "ActionRefused", "Actions", "EvictionClient", "FreezeTarget",
           "Journal", "JournalEntry", "JournalError"]
