"""The cluster view's rows: one per node, from its agent (``--agents FILE``) or from Prometheus.

A row says how many GPUs the node has, how many are free (no tenant), busy (a tenant) and how much of them
is held by workloads flagged idle (in GPU-equivalents: a time-slicing replica counts its 1/N), the worst GPU
health, the mean SM use and how fresh the figures are. A node whose agent does not answer, or whose figures
are stale, says so and shows "-" where it has no figure: never zeros.

- :class:`AgentsSource` reads the agents file as the extender reads it (node name -> agent URL) and keeps
  an :class:`~gpuagent.top.client.AgentWatch` per node, refreshed concurrently.
- :class:`PrometheusSource` asks a Prometheus that scrapes the agents (through ``gpuagent.prom``'s client),
  a few instant queries a refresh; a target Prometheus cannot scrape (``up == 0``) reads "no answer".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuagent.config import ConfigError, read_yaml_mapping
from gpuagent.hints.extender_config import AgentDirectoryError, check_node_urls
from gpuagent.prom.client import Auth, PrometheusClient, Sample
from gpuagent.prom.errors import ReportError
from gpuagent.top.client import NO_ANSWER, OK, STALE, AgentWatch
from gpuagent.top.errors import TopError
from gpuagent.top.model import NodeView, node_view

HEALTH_ORDER = ("ok", "stale", "error", "unresponsive", "lost")  # worst last
STALE_AFTER_SECONDS = 30.0  # the agent's own bound for a stuck poller (max(30, 5 x poll interval))


@dataclass(frozen=True)
class NodeRow:
    node: str
    url: str | None  # the agent's base URL (Enter opens its view); None: not known
    state: str  # client.OK, STARTING, STALE or NO_ANSWER
    message: str
    gpus: int | None = None
    free: int | None = None
    busy: int | None = None
    idle_held: float | None = None
    health: str | None = None  # the worst GPU health and how many GPUs are in it ("lost 1"), or "ok"
    sm_ratio: float | None = None
    age_seconds: float | None = None


@dataclass(frozen=True)
class ClusterColumn:
    key: str
    title: str
    width: int  # 0: the flexible node column
    value: Callable[[NodeRow], Any]
    descending: bool = True


def _health_rank(row: NodeRow) -> int | None:
    return None if row.health is None else HEALTH_ORDER.index(row.health.split()[0])


CLUSTER_COLUMNS: tuple[ClusterColumn, ...] = (
    ClusterColumn("node", "NODE", 0, lambda r: r.node, descending=False),
    ClusterColumn("gpus", "GPUS", 5, lambda r: r.gpus),
    ClusterColumn("free", "FREE", 5, lambda r: r.free),
    ClusterColumn("busy", "BUSY", 5, lambda r: r.busy),
    ClusterColumn("idle", "IDLE-HELD", 9, lambda r: r.idle_held),
    ClusterColumn("health", "HEALTH", 16, _health_rank),
    ClusterColumn("sm", "SM", 5, lambda r: r.sm_ratio),
    ClusterColumn("age", "AGE", 7, lambda r: r.age_seconds),
    ClusterColumn("state", "STATE", 10, lambda r: (r.state != OK, r.state)),
)


def worst_health(healths: Sequence[str], stale: int) -> str:
    """"ok", or the worst state and how many GPUs are in it: "lost 1", "stale 2"."""
    counts = {h: healths.count(h) for h in set(healths)}
    if stale:
        counts["stale"] = counts.get("stale", 0) + stale
    for state in reversed(HEALTH_ORDER[1:]):
        if counts.get(state):
            return f"{state} {counts[state]}"
    return "ok"


def row_of(node: str, watch: AgentWatch) -> NodeRow:
    """The node's row; one whose agent does not answer now, or whose figures are stale, has none but their
    age (its last figures would count in the cluster's totals as if they were true now)."""
    status = watch.status()
    if watch.state is None or status.state != OK:
        return NodeRow(node, watch.url, status.state, watch.error or status.message,
                       age_seconds=status.snapshot_age_seconds)
    try:
        view = node_view(watch.state)
    except TopError as err:
        return NodeRow(node, watch.url, NO_ANSWER, str(err))
    return _row_of_view(node, watch.url, view, status.state, status.message, status.snapshot_age_seconds)


def _row_of_view(node: str, url: str | None, view: NodeView, state: str, message: str,
                 age: float | None) -> NodeRow:
    utils = [g.util_ratio for g in view.gpus if g.util_ratio is not None and not g.stale]
    return NodeRow(
        node=node, url=url, state=state, message=message, gpus=len(view.gpus),
        free=sum(1 for g in view.gpus if g.health == "ok" and not g.mig_enabled and not g.all_tenants()),
        busy=sum(1 for g in view.gpus if g.all_tenants()),
        idle_held=view.idle_gpus_held,
        health=worst_health([g.health for g in view.gpus], sum(1 for g in view.gpus if g.stale)),
        sm_ratio=sum(utils) / len(utils) if utils else None,
        age_seconds=age,
    )


def read_agents_file(path: str) -> dict[str, str]:
    """The agents file (node -> agent URL), as the extender reads it; :class:`TopError` naming the problem."""
    try:
        return check_node_urls(read_yaml_mapping(path))
    except ConfigError as err:
        raise TopError(f"--agents: {err}") from None
    except AgentDirectoryError as err:
        raise TopError(f"--agents: {path}: {err}") from None


class AgentsSource:
    """Every node of the agents file, each through its own watch."""

    description = "agents file"

    def __init__(self, urls: Mapping[str, str], session: aiohttp.ClientSession, *,
                 timeout_seconds: float = 3.0, max_concurrent: int = 64) -> None:
        if not urls:
            raise TopError("--agents: the file names no node")
        self.watches = {node: AgentWatch(url, session, timeout_seconds=timeout_seconds)
                        for node, url in sorted(urls.items())}
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self.error: str | None = None  # the source itself never fails: each node says what it has

    async def refresh(self) -> None:
        async def one(watch: AgentWatch) -> None:
            async with self._semaphore:
                await watch.refresh()

        await asyncio.gather(*(one(w) for w in self.watches.values()))

    def rows(self) -> list[NodeRow]:
        return [row_of(node, watch) for node, watch in self.watches.items()]


class PrometheusSource:
    """The nodes Prometheus knows from the agents' series; ``agent_url`` (``http://{node}:9402``, the
    extender's template) says where each agent listens, else its scrape target (``instance``) does."""

    description = "Prometheus"

    def __init__(self, client: PrometheusClient, *, selector: str = "", agent_url: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.selector = selector
        self.agent_url = agent_url
        self._clock = clock
        self._rows: list[NodeRow] = []
        self.error: str | None = None

    async def refresh(self) -> None:
        try:
            self._rows = await asyncio.to_thread(self._query, self._clock())
            self.error = None
        except ReportError as err:
            self.error = str(err)

    def rows(self) -> list[NodeRow]:
        return list(self._rows)

    def _query(self, now: float) -> list[NodeRow]:
        sel = self.selector
        by = "by (Hostname, instance)"
        seen = self.client.query(
            f"{now:.3f} - max {by} (last_over_time(gpuagent_hints_timestamp_seconds{{{sel}}}[1h]))", now)
        nodes = {_key(s): s.value for s in seen}
        up = {s.labels.get("instance"): s.value for s in self.client.query("max by (instance) (up)", now)}
        figures = {name: _values(self.client.query(expr, now)) for name, expr in {
            "gpus": f'count {by} (gpuagent_gpu_health{{state="ok",{sel}}})',
            "free": f"max {by} (gpuagent_node_free_gpus{{{sel}}})",
            "busy": f"count {by} (gpuagent_gpu_workloads{{{sel}}} > 0)",
            "stale": f"count {by} (gpuagent_gpu_stale{{{sel}}} == 1)",
            "sm": f"avg {by} (DCGM_FI_DEV_GPU_UTIL{{{sel}}}) / 100",
            "idle": f"sum {by} ({_idle_held('pod', sel)} or {_idle_held('workload', sel)})",
        }.items()}
        health: dict[tuple[str, str], list[str]] = {}
        health_query = f"count by (Hostname, instance, state) (gpuagent_gpu_health{{{sel}}} == 1)"
        for sample in self.client.query(health_query, now):
            health.setdefault(_key(sample), []).extend([sample.labels.get("state", "?")] * int(sample.value))
        rows = []
        for (hostname, instance), age in sorted(nodes.items()):
            url = (self.agent_url.replace("{node}", hostname) if self.agent_url
                   else f"http://{instance}" if instance else None)
            key = (hostname, instance)
            if up.get(instance) != 1:
                rows.append(NodeRow(hostname, url, NO_ANSWER, f"Prometheus cannot scrape {instance} (up=0)",
                                    age_seconds=age))
                continue
            stale = int(figures["stale"].get(key, 0))
            state, message = OK, ""
            if age > STALE_AFTER_SECONDS:
                state, message = STALE, f"no new figures for {age:.0f} s"
            rows.append(NodeRow(
                hostname, url, state, message,
                gpus=_int(figures["gpus"].get(key)), free=_int(figures["free"].get(key)),
                busy=int(figures["busy"].get(key, 0)), idle_held=figures["idle"].get(key, 0.0),
                health=worst_health(health.get(key, []), stale), sm_ratio=figures["sm"].get(key),
                age_seconds=age,
            ))
        return rows


def _idle_held(level: str, sel: str) -> str:
    """GPU-equivalents held by the ``level``'s (pod or workload) series flagged idle: what each holds now
    (the rate of its allocated GPU-seconds) where its idle episode is at least the agent's idle window."""
    ident = "namespace, pod" if level == "pod" else "workload_kind, workload"
    return (f"(rate(gpuagent_{level}_gpu_allocated_seconds_total{{{sel}}}[1m]) and on ({ident}, UUID, "
            f"GPU_I_ID, instance) (gpuagent_{level}_gpu_idle_seconds{{{sel}}} >= on (instance, job) "
            f"group_left gpuagent_accounting_idle_window_seconds))")


def _key(sample: Sample) -> tuple[str, str]:
    return sample.labels.get("Hostname", "?"), sample.labels.get("instance", "")


def _values(samples: list[Sample]) -> dict[tuple[str, str], float]:
    return {_key(s): s.value for s in samples}


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def prometheus_source(url: str, *, selector: str | None, agent_url: str | None, headers: Mapping[str, str],
                      timeout_seconds: float) -> PrometheusSource:
    """The source for ``--prometheus URL``; a bad URL or selector is a :class:`TopError`."""
    from gpuagent.prom.queries import check_matchers

    try:
        client = PrometheusClient(url, timeout_seconds=timeout_seconds, auth=Auth(headers=dict(headers)))
        matchers = check_matchers(selector) if selector else ""
    except ReportError as err:
        raise TopError(str(err)) from None
    return PrometheusSource(client, selector=matchers, agent_url=agent_url)
