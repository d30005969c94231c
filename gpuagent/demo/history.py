"""A week of the demo node's past, as OpenMetrics for ``promtool tsdb create-blocks-from openmetrics``.

``gpuagent recommend`` sizes workloads from days of history (``--min-history`` 1 day) and ``gpuagent
report`` bills ranges of them: a demo that starts now has minutes. This writes the past the demo node would
have had, made by the agent itself rather than by a second model of its series: the demo node (its kubelet,
API server and ``/proc``, :mod:`.run`) and an :class:`~gpuagent.agent.Agent` on the simulated NVML, both on
a hand-moved clock, polled once a ``step`` (5 minutes, the agent's ``poll_interval`` then, so accounting
integrates each step as it integrates a poll) from ``days`` ago to ``end``; after each poll the families
``report``, ``recommend`` and the dashboards read (:data:`KEPT`) are taken from the agent's registry, with
the ``instance`` and ``job`` labels the live scrape will add. The result is the same series the live demo
then continues (``scripts/demo.sh``, ``make demo``).

``python -m gpuagent.demo.history --out FILE [--days 7] [--step 300] [--instance HOST:PORT] [--job NAME]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
import tempfile
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from prometheus_client.utils import floatToGoString

from gpuagent.demo.node import demo_node
from gpuagent.demo.proc import write_proc
from gpuagent.demo.run import demo_config, serving
from gpuagent.devices.sim import SimulatedNvml, kubernetes_demo_path, load_scenario

log = logging.getLogger(__name__)

# The families kept (by name prefix): what report and recommend read, and the accounting dashboard.
KEPT = ("gpuagent_pod_", "gpuagent_container_gpu_memory_used_bytes", "gpuagent_gpu_info", "gpuagent_mig_info",
        "gpuagent_gpu_memory_total_bytes", "gpuagent_accounting_idle_", "gpuagent_up", "gpuagent_simulated",
        "gpuagent_build_info")
# Of those, what no reader of the past needs (the live view has them): a week of it would only slow promtool.
SKIPPED = ("gpuagent_pod_gpu_memory_limit_stage", "gpuagent_pod_gpu_processes",
           "gpuagent_pod_gpu_frozen_ratio", "gpuagent_pod_gpu_share_achieved_ratio")
OWNERS_TIMEOUT_S = 30.0


class Clock:
    """The agent's and the simulator's time, moved by hand: wall time and a monotonic time in step."""

    def __init__(self, start_unix: float) -> None:
        self.unix = start_unix
        self.mono = 1000.0

    def wall(self) -> float:
        return self.unix

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.unix += seconds
        self.mono += seconds


@dataclass
class _Series:
    steps: array = field(default_factory=lambda: array("d"))  # timestamps, seconds
    values: array = field(default_factory=lambda: array("d"))


@dataclass
class _Family:
    type: str
    help: str
    series: dict[tuple[str, str], _Series] = field(default_factory=dict)  # (sample name, label text)


class Recorder:
    """The kept families of each poll, as series of (timestamp, value), with ``instance`` and ``job``."""

    def __init__(self, instance: str, job: str) -> None:
        self.families: dict[str, _Family] = {}
        self._extra = f'instance="{_escape(instance)}",job="{_escape(job)}"'

    def record(self, metrics: Iterable[Any], at_unix: float) -> None:
        for metric in metrics:
            if metric.type not in ("gauge", "counter", "info"):
                continue
            name = metric.name + "_info" if metric.type == "info" else metric.name  # its name on the wire
            if not name.startswith(KEPT) or name.startswith(SKIPPED):
                continue
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = _Family("counter" if metric.type == "counter" else "gauge",
                                                       metric.documentation)
            for sample_name, labels, value in _rows(metric):
                if sample_name.endswith("_created"):
                    continue
                text = labels[:-1] + "," + self._extra + "}" if labels else "{" + self._extra + "}"
                series = family.series.get((sample_name, text))
                if series is None:
                    series = family.series[(sample_name, text)] = _Series()
                series.steps.append(at_unix)
                series.values.append(float(value))

    def write(self, out: TextIO) -> int:
        """The OpenMetrics text (``# EOF`` ended); returns the samples written."""
        written = 0
        for name, family in self.families.items():
            out.write(f"# TYPE {name} {family.type}\n# HELP {name} {_escape(family.help)}\n")
            for (sample, text), series in family.series.items():
                for at, value in zip(series.steps, series.values, strict=True):
                    out.write(f"{sample}{text} {floatToGoString(value)} {at:.3f}\n")
                written += len(series.values)
        out.write("# EOF\n")
        return written


def _rows(metric: Any) -> Iterator[tuple[str, str, float]]:
    """(sample name, label text ``{...}`` or "", value) of each sample: the exporter's families hold their
    label texts formatted already (``gpuagent.export.families.Family``), others are formatted here."""
    texts = getattr(metric, "texts", None)
    if texts is not None:
        names = metric.names or itertools.repeat(metric.sample_name)
        yield from zip(names, texts, metric.values, strict=False)  # names: a list as long, or repeated
        return
    for sample in metric.samples:
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
        yield sample.name, "{" + labels + "}" if labels else "", sample.value


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


async def _record(scenario_path: str, *, days: float, step: float, end_unix: float, recorder: Recorder,
                  workdir: Path) -> int:
    """Poll the demo node's agent once a ``step`` over ``days`` to ``end_unix``; returns the polls."""
    from gpuagent.agent import Agent

    scenario = load_scenario(scenario_path)
    node = demo_node(scenario)
    clock = Clock(end_unix - days * 86400)
    write_proc(workdir / "proc", node, SimulatedNvml(scenario).process_environ)
    with serving(node, workdir) as (socket, kubeconfig):
        flags = {"scenario": scenario_path, "poll_interval": step, "idle_events": "off",
                 "log_level": "warning"}
        config = demo_config(None, flags, scenario=scenario_path, hostname=scenario.hostname,
                             workdir=workdir, socket=socket, kubeconfig=kubeconfig, env={})
        nvml = SimulatedNvml(scenario, clock=clock.monotonic)
        agent = Agent(config, nvml=nvml, backend="sim", clock=clock.wall, monotonic=clock.monotonic)
        assert agent.pods.metadata is not None
        watcher = asyncio.create_task(agent.pods.metadata.run(), name="pod-metadata")
        try:
            deadline = time.monotonic() + OWNERS_TIMEOUT_S  # the owners are walked in the background
            while True:
                snapshot = await agent.poll_once()
                if len(snapshot.pods) == len(node.pods) and all(p.owner_kind for p in snapshot.pods):
                    break
                if time.monotonic() > deadline:
                    log.warning("history: not every pod's owner is known after %gs; going on",
                                OWNERS_TIMEOUT_S)
                    break
                await asyncio.sleep(0.1)
            polls = 0
            while clock.unix <= end_unix:
                snapshot = await agent.poll_once()
                recorder.record(agent.registry.collect(), snapshot.taken_at_unix)
                polls += 1
                clock.advance(step)
            return polls
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await agent.aclose()


def write_history(out: TextIO, *, scenario: str | None = None, days: float = 7.0, step: float = 300.0,
                  end_unix: float | None = None, instance: str = "127.0.0.1:9402",
                  job: str = "gpuagent") -> int:
    """Write the demo node's past (``days`` to ``end_unix``, default now less a step) to ``out``; returns
    the samples written."""
    end = (time.time() if end_unix is None else end_unix) // step * step - step
    recorder = Recorder(instance, job)
    with tempfile.TemporaryDirectory(prefix="gpuagent-history-") as work:
        polls = asyncio.run(_record(str(scenario or kubernetes_demo_path()), days=days, step=step,
                                    end_unix=end, recorder=recorder, workdir=Path(work)))
    written = recorder.write(out)
    log.info("history: %d polls, %d samples of %d families", polls, written, len(recorder.families))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuagent.demo.history",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the OpenMetrics file to write ('-': stdout)")
    parser.add_argument("--scenario", help="the demo scenario (default: the packaged demo-k8s-node.yaml)")
    parser.add_argument("--days", type=float, default=7.0, help="how far back (default 7)")
    parser.add_argument("--step", type=float, default=300.0, help="seconds between samples (default 300)")
    parser.add_argument("--instance", default="127.0.0.1:9402",
                        help="the instance label (the agent's address)")
    parser.add_argument("--job", default="gpuagent", help="the job label (the scrape job's name)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    log.setLevel(logging.INFO)
    kwargs = {"scenario": args.scenario, "days": args.days, "step": args.step, "instance": args.instance,
              "job": args.job}
    if args.out == "-":
        write_history(sys.stdout, **kwargs)
    else:
        with open(args.out, "w", encoding="utf-8") as out:
            write_history(out, **kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
