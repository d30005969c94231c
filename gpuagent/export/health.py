"""The agent's own health: polls, sources, NVML time and errors, and each GPU's health as the agent sees it.

Unlike the device series, the per-GPU families here (``gpuagent_gpu_health``, ``_stale``, ``_info``,
``_xid_errors_total``) are emitted for a LOST GPU too: they are what the agent knows about it, not values read
from it.
Before the first poll there is no snapshot: only ``gpuagent_up 0``, the build info and the simulated marker.

A simulated node says so on every scrape: ``gpuagent_build_info`` carries the backend (``backend="sim"``)
and ``gpuagent_simulated`` is 1 (0 on NVML), so neither a dashboard nor an alert can take the simulator's
figures for a real GPU's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from gpuagent import __version__
from gpuagent.export.families import (
    COUNTER,
    GAUGE,
    INFO,
    Kept,
    TextCache,
    add,
    counter,
    extend,
    family,
    flag,
    gauge,
    label_pairs,
    non_empty,
    with_label,
)
from gpuagent.export.held import Held, hold
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, describe
from gpuagent.export.node_health import node_health_families
from gpuagent.export.published import publish_families
from gpuagent.snapshot.gpu import Health
from gpuagent.snapshot.node import NodeSnapshot, PollHistogram

NVML_SOURCE = "nvml"
SIMULATED_BACKEND = "sim"


class HealthCollector:
    """Renders the agent's health families."""

    name = "health"
    volatile = True  # gpuagent_snapshot_age_seconds reads the clock: rendered on every scrape

    def __init__(
        self, *, clock: Callable[[], float] = time.time, hostname_label: str = DEFAULT_HOSTNAME_LABEL,
        backend: str | None = None,
    ) -> None:
        self._clock = clock
        self._backend = backend  # before the first poll; each snapshot names its own
        self._hostname_label = hostname_label
        self._texts = TextCache(_label_text)  # label texts kept across snapshots, by what they are made of
        self._kept = Kept()
        # The last snapshot and its families but the age: every scrape of it serves them again (their text
        # is cached with them), so only the age is rendered and encoded on each scrape.
        self._last: tuple[Held, list[Metric], list[Metric]] | None = None

    def render(self, snapshot: NodeSnapshot | None) -> list[Metric]:
        if snapshot is None:
            up = gauge("gpuagent_up", "1 when the last poll of NVML succeeded, else 0.")
            add(up, {}, 0)
            return [up, *_build_info(self._backend)]
        last = self._last
        if last is None or last[0]() is not snapshot:
            self._texts.rotate()
            last = self._last = (hold(snapshot), *self._of_snapshot(snapshot))
        age = gauge("gpuagent_snapshot_age_seconds", "Time since the snapshot being served was taken.")
        add(age, "", self._clock() - snapshot.taken_at_unix)
        return non_empty([*last[1], age, *last[2]])

    def _of_snapshot(self, snapshot: NodeSnapshot) -> tuple[list[Metric], list[Metric]]:
        """The families before the age and those after it, which depend on the snapshot alone."""
        up = self._kept.family("gpuagent_up", "1 when the last poll of NVML succeeded, else 0.", GAUGE, [""],
                               [flag(any(s.name == NVML_SOURCE and s.ok for s in snapshot.sources))])
        labels = GpuLabels.of(snapshot, self._hostname_label)
        faults = node_health_families(snapshot, labels)
        after = [*self._poll(snapshot), *self._nvml(snapshot), *self._gpus(snapshot), *faults,
                 *publish_families(snapshot, labels)]
        return [up, *_build_info(snapshot.backend)], after

    def _poll(self, snapshot: NodeSnapshot) -> list[Metric]:
        kept = self._kept
        stale = kept.family(
            "gpuagent_snapshot_stale", "1 when a GPU's last read did not finish in time, else 0.",
            GAUGE, [""], [flag(snapshot.stale)])
        polls = kept.family("gpuagent_polls_total", "Polls since the agent started.", COUNTER,
                            [""], [snapshot.polls_total])
        interval = kept.family("gpuagent_poll_interval_seconds", "Configured time between polls.", GAUGE,
                               [""], [snapshot.poll_interval_seconds])
        sources = snapshot.sources
        labels = [self._texts[("source", source.name)] for source in sources]
        success = kept.family("gpuagent_source_success", "1 when the source's last run succeeded, else 0.",
                              GAUGE, labels, [flag(source.ok) for source in sources])
        duration = kept.family("gpuagent_source_duration_seconds", "Duration of the source's last run.",
                               GAUGE, labels, [source.duration_seconds for source in sources])
        return [stale, self._histogram(snapshot.poll_histogram), polls, interval, success, duration]

    def _histogram(self, histogram: PollHistogram) -> Metric:
        name = "gpuagent_poll_duration_seconds"
        # +Inf is the total count, the last bucket, then the count and the sum
        finite = [i for i, bound in enumerate(histogram.upper_bounds) if not math.isinf(bound)]
        bounds = tuple(histogram.upper_bounds[i] for i in finite)
        counts = [histogram.cumulative_counts[i] for i in finite]
        texts, names = self._texts[("histogram", name, bounds)]
        values = [*counts, histogram.count, histogram.count, histogram.sum_seconds]
        return self._kept.family(name, "Duration of the agent's polls.", "histogram", texts, values, names)

    def _nvml(self, snapshot: NodeSnapshot) -> list[Metric]:
        name = "gpuagent_nvml_call_duration_seconds"
        texts: list[str] = []
        values: list[float] = []
        for stats in snapshot.nvml_calls:
            text = self._texts[("function", stats.function)]
            texts += (text, text)
            values += (stats.calls_total, stats.seconds_total)
        names = self._texts[("summary", name, len(snapshot.nvml_calls))]
        calls = self._kept.family(name, "Time spent in each NVML function.", "summary", texts, values, names)
        errors = counter("gpuagent_nvml_errors_total", "NVML calls that failed, by function and error.")
        for error in snapshot.nvml_errors:
            add(errors, label_pairs((("function", error.function), ("code", error.code))), error.count)
        return [calls, errors]

    def _gpus(self, snapshot: NodeSnapshot) -> list[Metric]:
        labels = GpuLabels.of(snapshot, self._hostname_label)
        kept = self._kept
        gpus = snapshot.gpus
        series = [labels.gpu(gpu) for gpu in gpus]
        states: list[str] = []
        for text in series:
            states += self._texts[("states", text)]
        health = kept.family(
            "gpuagent_gpu_health",
            "1 for the GPU's current health state (ok, lost, unresponsive, error), 0 for the others.",
            GAUGE, states, [flag(gpu.health is state) for gpu in gpus for state in _STATES])
        stale = kept.family("gpuagent_gpu_stale", "1 when the GPU's values are from an earlier poll, else 0.",
                            GAUGE, series, [flag(gpu.stale) for gpu in gpus])
        xids = counter("gpuagent_gpu_xid_errors_total", "XID errors seen since the agent started.")
        for gpu, text in zip(gpus, series, strict=True):
            for code, count in sorted(gpu.xid.totals.items()):
                add(xids, with_label(text, "xid", str(code)), count)
        versions = (snapshot.driver_version, snapshot.cuda_driver_version, snapshot.nvml_version)
        facts = [self._texts[("info", text, g.info, *versions)] for g, text in zip(gpus, series, strict=True)]
        info = kept.family("gpuagent_gpu_info", "Static facts of the GPU and its driver.", INFO,
                           facts, [1] * len(facts))
        return [health, stale, xids, info]


def _build_info(backend: str | None) -> list[Metric]:
    """The version and backend, and the simulated marker (no backend known yet: the version alone)."""
    build = family("gpuagent_build_info", "The agent's version and NVML backend (nvml, or sim: simulated).",
                   "info")
    if backend is None:
        add(build, label_pairs((("version", __version__),)), 1)
        return [build]
    add(build, label_pairs((("version", __version__), ("backend", backend))), 1)
    simulated = gauge("gpuagent_simulated",
                      "1 when the GPUs served are the simulator's (backend sim), not real ones; else 0.")
    add(simulated, "", flag(backend == SIMULATED_BACKEND))
    return [build, simulated]


_STATES = tuple(Health)


def _label_text(key: tuple) -> Any:
    """The label texts of the health families, by what they are made of (the first item says which)."""
    kind = key[0]
    if kind == "source":
        return label_pairs((("source", key[1]),))
    if kind == "function":
        return label_pairs((("function", key[1]),))
    if kind == "states":  # one per health state, in the enum's order
        return tuple(with_label(key[1], "state", state.value) for state in _STATES)
    if kind == "summary":  # the sample names of its rows: count and sum of each of ``n``
        _, name, n = key
        return [name + "_count", name + "_sum"] * n
    if kind == "histogram":  # the label texts and sample names of its rows (buckets, +Inf, count, sum)
        _, name, bounds = key
        texts = [label_pairs((("le", floatToGoString(bound)),)) for bound in bounds]
        texts += [label_pairs((("le", "+Inf"),)), "", ""]
        return texts, [name + "_bucket"] * (len(bounds) + 1) + [name + "_count", name + "_sum"]
    _, series, info, driver_version, cuda_driver_version, nvml_version = key  # info
    facts: dict[str, str | None] = {
        **describe(info),
        "driver_version": driver_version,
        "cuda_driver_version": cuda_driver_version,
        "nvml_version": nvml_version,
        "serial": info.serial,
        "minor_number": None if info.minor_number is None else str(info.minor_number),
        "mig_mode": "enabled" if info.mig_enabled else "disabled",
        "gpm_supported": "true" if info.gpm_supported else "false",
    }
    return extend(series, tuple((k, v) for k, v in facts.items() if v))
