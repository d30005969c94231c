"""The extender's metrics: its counters and histograms, and the agents it knows by state.

``ExtenderMetrics`` holds what the extender counts as it answers (scheduler calls by verb and outcome and
their time, candidate nodes by verdict, unknown names, pods whose claims could not be judged, nodes whose
judging raised, the fetches of agents' ``/v1/hints``), on the registry it is given; ``AgentsCollector``
counts the known agents by state at scrape time, from the node source, without I/O. They are apart from
the ``Extender`` (``hints.extender``), which only increments them, and from the HTTP app
(``hints.extender_app``), whose ``build_registry`` puts them on the registry ``/metrics`` serves: what is
measured is one job, answering and serving are others. The metric names and help texts are what
docs/scheduling.md and docs/dra.md describe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuagent.hints.agents import STATES, AgentCache
from gpuagent.hints.cluster_view import ClusterView

# The extender's log lines keep the one logger name they had when it was one module (operators filter on it).
log = logging.getLogger("gpuagent.hints.extender")

REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ExtenderMetrics:
    """The extender's own metrics, on its own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gpuagent_extender_requests_total",
            "Scheduler calls by verb and outcome (ok, bad_request, error).",
            ["verb", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "gpuagent_extender_request_duration_seconds",
            "Time to answer a scheduler call, by verb.",
            ["verb"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.nodes = Counter(
            "gpuagent_extender_nodes_total",
            "Candidate nodes judged, by verb and verdict.",
            ["verb", "verdict"],
            registry=registry,
        )
        self.fetches = Counter(
            "gpuagent_extender_agent_fetches_total",
            "Requests for an agent's /v1/hints by result (modified, not_modified, error).",
            ["result"],
            registry=registry,
        )
        self.unknown = Counter(
            "gpuagent_extender_unknown_nodes_total",
            "Candidate names that are not nodes the extender knows (filtered, never fetched), by verb.",
            ["verb"],
            registry=registry,
        )
        self.unjudged = Counter(
            "gpuagent_extender_pods_unjudged_total",
            "Calls for pods whose GPU ResourceClaims could not be judged (passed on every node), by verb and "
            "reason (no_api, unreadable, allocated, all_devices, first_available, mig_profile).",
            ["verb", "reason"],
            registry=registry,
        )
        self.judge_errors = Counter(
            "gpuagent_extender_judge_errors_total",
            "Nodes whose judging raised (failed, unresolvable, with the exception's type as the reason), by "
            "verb; counted once per node state and pod request.",
            ["verb"],
            registry=registry,
        )
        self.fetch_duration = Histogram(
            "gpuagent_extender_agent_fetch_duration_seconds",
            "Time of one /v1/hints request to an agent.",
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )

    def observe_fetch(self, outcome: str, seconds: float) -> None:
        self.fetches.labels(outcome).inc()
        self.fetch_duration.observe(seconds)


class AgentsCollector(Collector):
    """Agents known by state, computed at scrape time from the cache (no I/O)."""

    def __init__(self, cache: AgentCache | ClusterView, max_age_seconds: float) -> None:
        self._cache = cache
        self._max_age = max_age_seconds

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpuagent_extender_agents",
            "Node agents the extender knows, by state (fresh, stale, unreachable).",
            labels=["state"],
        )
        try:
            counts = self._cache.counts(self._max_age)
        except Exception:  # a failing collector must not fail the scrape
            log.exception("counting the agents failed")
            return
        for state in STATES:
            family.add_metric([state], counts[state])
        yield family

