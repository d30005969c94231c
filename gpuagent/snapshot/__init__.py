"""The model: immutable, typed snapshots of a node's GPUs and of what the agent made of them.

Sources (``devices/``, ``pods/``, ``network/``) produce these; every consumer (exporter, API, enforcer,
accounting, health, hints) reads only these. Every class is a frozen, slotted dataclass, safe to share
between the loop and threads, built through :func:`gpuagent.frozen.faster_inits`' constructors. Field names
carry their unit (``memory_used_bytes``, ``power_watts``, ``sm_util_percent`` for NVML's percentages,
``_ratio`` for 0-1), and ``None`` always means "not supported or not known": it must never be rendered as 0.
One module per domain: :mod:`.processes` and :mod:`.gpu` (NVML's readings), :mod:`.pods`, :mod:`.network`,
:mod:`.enforcement`, :mod:`.accounting`, :mod:`.health`, :mod:`.hints`, then :mod:`.node` (the whole poll,
which imports them all) and :mod:`.views` (JSON and the allocation view); a name is imported from the module
that defines it, and this package re-exports nothing.
"""
