"""The one collector in the registry: renders the latest snapshot, each renderer in isolation.

client_python's ``CollectorRegistry.collect()`` lets a collector's exception fail the whole scrape. Here a
renderer that raises (or yields a sample the encoders could not render) has its families left out of that
scrape, ``gpuagent_collector_success{collector}`` reads 0, and the error is logged once when it starts failing
and once when it recovers, not on every scrape (node_exporter's per-collector success and duration).

The snapshot is read once per scrape, so every family of a scrape comes from the same poll. The snapshot is
immutable, so what a renderer made of it is kept and served again until the next poll (the encoder keeps
each family's text too): a scrape between two polls renders only the ``volatile`` renderers (those that
read the clock, e.g. ``gpuagent_snapshot_age_seconds``). A renderer that failed is tried again next scrape.
A family of a new snapshot whose rows are those of the family of that name served last (limits, flags,
info, an idle GPU's figures: about half of them between two polls) is replaced by that one, whose text is
encoded already.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.metrics_core import Metric

from gpuagent.export.exposition import rotate_caches
from gpuagent.export.families import (
    GAUGE,
    Family,
    Kept,
    flag,
    gauge,
    label_pairs,
    put,
    rotate_label_texts,
    same_rows,
)
from gpuagent.export.held import Held, hold, nothing
from gpuagent.snapshot.node import NodeSnapshot

log = logging.getLogger(__name__)


class Renderer(Protocol):
    """Turns a snapshot (None before the first poll) into metric families; no I/O, no NVML.

    A renderer whose output depends on more than the snapshot (the clock) sets ``volatile = True``: it is
    rendered on every scrape, the others once per snapshot.
    """

    name: str

    def render(self, snapshot: NodeSnapshot | None) -> Iterable[Metric]: ...


class SnapshotCollector:
    def __init__(
        self,
        latest: Callable[[], NodeSnapshot | None],
        renderers: Sequence[Renderer],
        *,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        names = [r.name for r in renderers]
        if len(set(names)) != len(names):
            raise ValueError(f"renderer names must be unique: {names}")
        self._latest = latest
        self._renderers = tuple(renderers)
        self._timer = timer
        self._lock = threading.Lock()  # scrapes may run concurrently
        self._failing: set[str] = set()
        # The snapshot last rendered and what each renderer made of it (successes only).
        self._rendered: tuple[Held, dict[str, list[Metric]]] = (nothing, {})
        self._volatile = frozenset(r.name for r in renderers if getattr(r, "volatile", False))
        self._served: dict[str, Family] = {}  # the family of each name served last (one per name)
        self._texts = [label_pairs((("collector", name),)) for name in names]  # success and duration labels
        self._kept = Kept()

    def describe(self) -> list[Metric]:
        # Registration calls describe() (or, without it, collect()): nothing is rendered at register() time.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.families()

    def families(self) -> list[Metric]:
        """What one scrape serves: each renderer's families, then the collectors' success and duration."""
        snapshot = self._snapshot()
        seen: set[str] = {"gpuagent_collector_success", "gpuagent_collector_duration_seconds"}
        rendered = self._rendered_for(snapshot)
        succeeded: list[float] = []
        took: list[float] = []
        out: list[Metric] = []
        for renderer in self._renderers:
            start = self._timer()
            metrics = rendered.get(renderer.name)
            if metrics is not None:  # this snapshot's, rendered by an earlier scrape
                ok = True
                seen.update([m.name for m in metrics])
            else:
                metrics, ok = self._render(renderer, snapshot, seen)
                if ok and renderer.name not in self._volatile:
                    rendered[renderer.name] = metrics
                    self._serve_again(metrics, stable=True)
                else:
                    self._serve_again(metrics, stable=False)
            succeeded.append(flag(ok))
            took.append(self._timer() - start)
            out += metrics
        out.append(self._kept.family(
            "gpuagent_collector_success", "1 when the collector succeeded in this scrape.",
            GAUGE, self._texts, succeeded))
        duration = gauge("gpuagent_collector_duration_seconds", "Time the collector took in this scrape.")
        put(duration, self._texts, took)
        out.append(duration)
        return out

    def _render(
        self, renderer: Renderer, snapshot: NodeSnapshot | None, seen: set[str]
    ) -> tuple[list[Metric], bool]:
        try:
            metrics = list(renderer.render(snapshot))  # all or nothing: a failure halfway yields nothing
            names = [m.name for m in metrics]
            _check(names, seen)
        except Exception as error:
            self._note(renderer.name, error)
            return [], False
        self._note(renderer.name, None)
        seen.update(names)
        return metrics, True

    def _serve_again(self, metrics: list[Metric], *, stable: bool) -> None:
        """Each family whose rows are those of the family of its name served last becomes that one; the
        others are marked ``stable`` when they are served again, unchanged, until the next snapshot."""
        served = self._served
        for index, metric in enumerate(metrics):
            if not isinstance(metric, Family):
                continue
            last = served.get(metric.name)
            if last is not None and last is not metric and not metric.compared and same_rows(last, metric):
                metrics[index] = last
            else:
                served[metric.name] = metric
                if stable:
                    metric.stable = True

    def _rendered_for(self, snapshot: NodeSnapshot | None) -> dict[str, list[Metric]]:
        """The families already rendered from ``snapshot`` (by identity: a new poll is a new object)."""
        with self._lock:
            held, rendered = self._rendered
            last = held()
            if last is not snapshot or snapshot is None:
                if last is not snapshot:
                    # Caches keep what the previous snapshot formatted, and nothing older.
                    rotate_caches()
                    rotate_label_texts()
                rendered = {}
                self._rendered = (nothing if snapshot is None else hold(snapshot), rendered)
            return rendered

    def _snapshot(self) -> NodeSnapshot | None:
        try:
            snapshot = self._latest()
        except Exception as error:
            self._note("latest", error)
            return None
        self._note("latest", None)
        return snapshot

    def _note(self, name: str, error: Exception | None) -> None:
        """Log a change of state only: the first failure (with its traceback) and the recovery."""
        if error is None and name not in self._failing:  # the common case, without the lock
            return
        with self._lock:
            was_failing = name in self._failing
            if error is not None and not was_failing:
                self._failing.add(name)
            elif error is None and was_failing:
                self._failing.discard(name)
            else:
                return
        if error is not None:
            log.error("collector %s failed; its metrics are left out until it recovers", name, exc_info=error)
        else:
            log.info("collector %s recovered", name)


def _check(names: list[str], seen: set[str]) -> None:
    """Raise when a renderer repeats a family another one (or itself) already rendered, inside the guarded
    section.

    Samples themselves are not checked here (that cost a millisecond a scrape): the encoder leaves out a
    family whose labels or values it cannot encode.
    """
    if len(set(names)) != len(names) or not seen.isdisjoint(names):
        repeated = next(n for i, n in enumerate(names) if n in seen or n in names[:i])
        raise ValueError(f"family {repeated} is rendered twice")
