"""Prometheus exposition of the latest snapshot: dcgm-exporter's families and ``gpuagent_*`` ones.

Collectors do no I/O and no NVML: each renderer turns a ``NodeSnapshot`` into fresh metric families.
``dcgm`` dcgm-exporter's names, units and labels; ``gpu`` and ``mig`` what dcgm lacks, in base units;
``processes`` per-process use; ``health`` the agent's own health. ``guard`` runs them, one failure at a time.
Nothing is created at import time: ``build_registry`` is called by whoever serves ``/metrics``, which encodes
with ``scrape`` (``exposition``: client_python's formats, with dcgm-exporter's label order kept; the body
cached per snapshot, gzipped when asked) or with ``choose_encoder``'s encoder.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuagent.export.accounting import AccountingCollector
from gpuagent.export.dcgm import DcgmCollector
from gpuagent.export.enforcement import EnforcementCollector
from gpuagent.export.exposition import choose_encoder
from gpuagent.export.gpu import GpuCollector
from gpuagent.export.guard import SnapshotCollector
from gpuagent.export.health import HealthCollector
from gpuagent.export.hints import HintsCollector
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL
from gpuagent.export.mig import MigCollector
from gpuagent.export.network import NetworkCollector
from gpuagent.export.pods import PodCollector
from gpuagent.export.processes import ProcessCollector
from gpuagent.export.scrape import Response, SnapshotRegistry, scrape
from gpuagent.snapshot.node import NodeSnapshot

__all__ = ["Response", "SnapshotRegistry", "build_registry", "choose_encoder", "scrape"]


def build_registry(
    latest: Callable[[], NodeSnapshot | None],
    *,
    clock: Callable[[], float] = time.time,
    hostname_label: str = DEFAULT_HOSTNAME_LABEL,
    xid_window_seconds: float = 300.0,
    timer: Callable[[], float] = time.perf_counter,
    backend: str | None = None,
) -> SnapshotRegistry:
    """A registry rendering ``latest()`` on every scrape (once per snapshot: see ``guard`` and ``scrape``).

    ``clock`` is wall time (for ``gpuagent_snapshot_age_seconds``); ``hostname_label`` is ``"Hostname"``
    (dcgm-exporter up to 4.5.3-4.8.2), ``"hostname"`` (later releases) or ``""`` for none (``--no-hostname``);
    ``xid_window_seconds`` is the window the snapshot's recent XIDs are counted over (``window_size_in_ms``);
    ``timer`` times each collector (``gpuagent_collector_duration_seconds``); ``backend`` (``nvml``, ``sim``)
    marks a simulated node before its first snapshot does (``gpuagent_simulated``).
    """
    renderers = (
        DcgmCollector(hostname_label=hostname_label, xid_window_seconds=xid_window_seconds),
        GpuCollector(hostname_label=hostname_label),
        MigCollector(hostname_label=hostname_label),
        ProcessCollector(hostname_label=hostname_label),
        PodCollector(hostname_label=hostname_label),
        NetworkCollector(hostname_label=hostname_label),
        EnforcementCollector(hostname_label=hostname_label),
        AccountingCollector(hostname_label=hostname_label),
        HintsCollector(hostname_label=hostname_label),
        HealthCollector(clock=clock, hostname_label=hostname_label, backend=backend),
    )
    registry = SnapshotRegistry()
    registry.register(SnapshotCollector(latest, renderers, timer=timer))
    return registry
