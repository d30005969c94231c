"""Per-workload GPU accounting: GPU-seconds allocated and busy, memory byte-seconds, energy, idle detection.

A consumer of the snapshot like ``enforce``: ``rates`` reads what each workload holds and uses at one poll,
``ledger`` integrates that between polls (with retention of ended workloads), ``idle`` tracks idle episodes
and efficiency windows, ``events`` posts a Kubernetes Event per idle episode, ``accountant`` ties them
together and produces the snapshot's :class:`~gpuagent.snapshot.accounting.AccountingState`.
"""

from gpuagent.accounting.accountant import Accountant, AccountingSettings

__all__ = ["Accountant", "AccountingSettings"]
