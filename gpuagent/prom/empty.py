"""Why a report or a recommendation found no GPU workload: the one hint ``report`` and ``recommend`` give
when Prometheus had no accounting series for the range and selection.

"Are the agents scraped there?" was the hint whatever the cause, and wrong where they were: an agent on a
node without pod sources (no kubelet socket, no API server) accounts every process as unattributed, so its
pod and workload counters never appear. One instant query (the agents' ``gpuagent_build_info`` series of the
selected job over the range) tells the two apart: no agent seen, or agents that saw no workload.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.prom.client import PrometheusClient
from gpuagent.prom.errors import ReportError
from gpuagent.prom.queries import selector
from gpuagent.prom.timerange import TimeRange, promql_duration

BUILD_INFO = "gpuagent_build_info"


def agents_query(range_seconds: float, job_matchers: Sequence[str]) -> str:
    """How many agents (series of ``gpuagent_build_info``) the job had over ``range_seconds``."""
    return f"count(count_over_time({BUILD_INFO}{selector(job_matchers)}[{promql_duration(range_seconds)}]))"


def only_job(matchers: Sequence[str]) -> tuple[str, ...]:
    """The job matchers among ``matchers`` (``--job``'s): a selector's other labels (a namespace, a pod)
    are not on ``gpuagent_build_info``."""
    return tuple(m for m in matchers if m.strip().startswith("job=~") and "," not in m)


def why_empty(client: PrometheusClient, time_range: TimeRange, matchers: Sequence[str],
              namespaces: Sequence[str], what: str, counter: str) -> str:
    """The hint for a result without ``what`` (``no GPU workloads``...) over ``matchers`` (``--job``'s and
    ``--selector``'s) and ``namespaces``: whether the job's agents were scraped in the range at all, and
    what to check in either case."""
    jobs = only_job(matchers)
    selected = bool(namespaces) or len(jobs) < len(matchers)
    where = f"({counter}, ...) in Prometheus for that range{' and selection' if selected else ''}"
    job = f" of job {jobs[0].split('=~', 1)[1]}" if jobs else ""
    try:
        found = client.query(agents_query(time_range.seconds, jobs), time_range.end_unix)
    except ReportError:  # the hint is a courtesy: without it, the question both cases ask
        return f"{what} {where}: are the agents scraped there, and do they export the accounting counters?"
    agents = int(found[0].value) if found else 0
    if not agents:
        return (f"{what} {where}: no agent{job} was scraped there in that range ({BUILD_INFO}); "
                f"is the scrape job named so (--job), and the range right (--since, --start/--end)?")
    narrowed = "; or the selection (--selector, --namespace) matches none of them" if selected else ""
    return (f"{what} {where}, though {agents} agent(s){job} were scraped there: they saw no workload, "
            f"every GPU process unattributed (no pods: a node without the kubelet's pod-resources socket or "
            f"the API server; `gpuagent snapshot` on a node names its sources){narrowed}")
