"""GPU faults as Kubernetes facts: node conditions, Events, taints, cordon, drain and a remediation hand-off.

A consumer beside ``enforce`` and ``accounting``: it reads the snapshot model, never a source. ``table`` the
one classification table (docs/health.md), ``classify`` a snapshot's faults, ``tracker`` hysteresis and the
hold until a reset, ``plan`` conditions and the quarantine a policy asks for, ``node`` the Node patches,
``budget`` the cluster-wide quarantine budget (a Lease), ``drain`` the Evictions, ``writer`` the task that
writes them, ``monitor`` the poll's entry point.
"""

from gpuagent.health.monitor import HealthMonitor
from gpuagent.health.plan import HealthSettings

__all__ = ["HealthMonitor", "HealthSettings"]
