"""The PromQL of ``gpuagent recommend``, built from the agents' family names (one place to read them all).

Range queries, every step over the range, per pod (``namespace, pod``) or other workload
(``workload_kind, workload``):

- SM use and GPU memory at the instant (the distributions' samples), and their peak over the step before
  (``max_over_time``: every scrape counts for the peak), of the pod's busiest or fullest device. Pods have
  their own families, read on the GPUs allocated to them only: a GPU the agent flags as used without
  being allocated (``gpuagent_pod_gpu_unallocated_use``, a stray) is left out, since a pod's size is what
  it holds, not where it wandered; other workloads are summed from their processes' series per device;
- GPUs and devices held over the step: the rate of the accounting counter of allocated GPU-seconds (a MIG
  slice counts its fraction), summed, and counted where it rose.

Instant queries at the end of each chunk, over the chunk: the accounting totals (``gpuagent report``'s),
time frozen by the time-slice controller, the memory and share limits, the memory ladder's terminations
and evictions (rises of a 0/1 stage series: ``changes - resets``), the pods' owners and containers, the
MIG profiles they ran on, and each GPU's model and memory. Two more per chunk, as subqueries at the step:
each pod's GPU memory on every GPU it used, strays included, added up (what the memory ladder holds to
its ``gpuagent.io/gpu-memory`` limit), and each stray's SM and memory peaks (shown apart).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuagent.prom import queries as rq
from gpuagent.prom.timerange import promql_duration

THROTTLED = "throttled_seconds"  # gpuagent_pod_gpu_throttled_seconds_total: pods only
TOTALS = (rq.ALLOCATED, rq.BUSY, rq.IDLE)

POD_SM = "gpuagent_pod_gpu_sm_utilization_ratio"
POD_MEMORY = "gpuagent_pod_gpu_memory_used_bytes"
PROCESS_SM = "gpuagent_process_sm_utilization_ratio"
PROCESS_MEMORY = "gpuagent_process_gpu_memory_used_bytes"
POD_INFO = "gpuagent_pod_info"
POD_ALLOCATED_DEVICE = "gpuagent_pod_gpu_allocated"
POD_UNALLOCATED = "gpuagent_pod_gpu_unallocated_use"  # 1: the pod used a GPU not allocated to it (a stray)
STRAY_JOIN = f"on (namespace, pod, {rq.UUID_LABEL})"  # the stray flag is per GPU (a MIG instance's GPU too)
CONTAINER_MEMORY = "gpuagent_container_gpu_memory_used_bytes"
MEMORY_LIMIT = "gpuagent_pod_gpu_memory_limit_bytes"
SHARE_LIMIT = "gpuagent_pod_gpu_share_limit_ratio"
LADDER_STAGE = "gpuagent_pod_gpu_memory_limit_stage"
GPU_MEMORY = "gpuagent_gpu_memory_total_bytes"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
OWNER_KIND_LABEL = "owner_kind"
OWNER_NAME_LABEL = "owner_name"
CONTAINER_LABEL = "container"
# the stages a memory-ladder episode ends in when it stops the workload (killed follows terminating)
STOPPED_STAGES = ("terminating", "evicted")
SM, MEMORY = "sm", "memory"


def _by(subject: rq.Subject, *extra: str) -> str:
    return ", ".join((subject.group_label, subject.name_label, *extra))


def _who(subject: rq.Subject, matchers: Sequence[str]) -> tuple[str, ...]:
    """The matchers, and for other workloads the one that leaves out pods' processes."""
    return (*matchers, f'{subject.name_label}!=""') if subject is rq.WORKLOADS else tuple(matchers)


def use_query(subject: rq.Subject, what: str, matchers: Sequence[str],
              peak_seconds: float | None = None) -> str:
    """SM use (0-1) or memory (bytes) of each pod's busiest / fullest device: at the instant, or its peak
    over ``peak_seconds`` before. Other workloads' devices add up their processes (their peaks too:
    never less than the true peak)."""
    if subject is rq.PODS:
        inner = f"{POD_SM if what == SM else POD_MEMORY}{rq.selector(matchers)}"
        if peak_seconds is not None:
            inner = f"max_over_time({inner}[{promql_duration(peak_seconds)}])"
        strays = f"{POD_UNALLOCATED}{rq.selector(matchers)}"
        return f"max by ({_by(subject)}) ({inner} unless {STRAY_JOIN} {strays})"
    series = f"{PROCESS_SM if what == SM else PROCESS_MEMORY}{rq.selector(_who(subject, matchers))}"
    if peak_seconds is not None:
        series = f"max_over_time({series}[{promql_duration(peak_seconds)}])"
    per_device = f"sum by ({_by(subject, rq.UUID_LABEL, 'GPU_I_ID')}) ({series})"
    return f"max by ({_by(subject)}) ({per_device})"


def stray_query(what: str, range_seconds: float, step_seconds: float, matchers: Sequence[str]) -> str:
    """The SM use (0-1) or memory (bytes) peak of each pod on each GPU it used without being allocated it,
    over ``range_seconds``, step by step (a GPU allocated to it at other times of the range does not
    count then)."""
    step = promql_duration(step_seconds)
    series = f"max_over_time({POD_SM if what == SM else POD_MEMORY}{rq.selector(matchers)}[{step}])"
    flagged = f"{series} and {STRAY_JOIN} {POD_UNALLOCATED}{rq.selector(matchers)}"
    return (f"max by (namespace, pod, {rq.UUID_LABEL}) "
            f"(max_over_time(({flagged})[{promql_duration(range_seconds)}:{step}]))")


def all_gpus_memory_query(range_seconds: float, step_seconds: float, matchers: Sequence[str]) -> str:
    """The peak of each pod's GPU memory on every GPU it used, strays included, added up: what the memory
    ladder compares with its limit. Each step adds the GPUs' peaks over the step, so it is never below the
    true peak."""
    step = promql_duration(step_seconds)
    per_step = f"sum by (namespace, pod) (max_over_time({POD_MEMORY}{rq.selector(matchers)}[{step}]))"
    return f"max by (namespace, pod) (max_over_time(({per_step})[{promql_duration(range_seconds)}:{step}]))"


def held_query(subject: rq.Subject, matchers: Sequence[str], window_seconds: float, devices: bool) -> str:
    """GPUs held (MIG slices as fractions) over the window before each step, or the devices held."""
    rate = f"rate({subject.counter(rq.ALLOCATED)}{rq.selector(matchers)}[{promql_duration(window_seconds)}])"
    if devices:
        return f"count by ({_by(subject)}) ({rate} > 0)"
    return f"sum by ({_by(subject)}) ({rate})"


def pod_info_query(range_seconds: float, matchers: Sequence[str]) -> str:
    """The owners the agents gave each pod in the range."""
    return (f"max by (namespace, pod, {OWNER_KIND_LABEL}, {OWNER_NAME_LABEL}) "
            f"(last_over_time({POD_INFO}{rq.selector(matchers)}[{promql_duration(range_seconds)}]))")


def containers_query(range_seconds: float, matchers: Sequence[str]) -> str:
    """Each pod's containers given or using GPUs."""
    window = promql_duration(range_seconds)
    by = f"namespace, pod, {CONTAINER_LABEL}"
    return (f"max by ({by}) (last_over_time({POD_ALLOCATED_DEVICE}{rq.selector(matchers)}[{window}])) or "
            f"max by ({by}) (last_over_time({CONTAINER_MEMORY}{rq.selector(matchers)}[{window}]))")


def mig_profiles_query(subject: rq.Subject, range_seconds: float, matchers: Sequence[str]) -> str:
    """The MIG profiles each pod or workload ran on."""
    family = POD_MEMORY if subject is rq.PODS else PROCESS_MEMORY
    selected = rq.selector((*_who(subject, matchers), f'{MIG_PROFILE_LABEL}!=""'))
    return (f"max by ({_by(subject, MIG_PROFILE_LABEL)}) "
            f"(last_over_time({family}{selected}[{promql_duration(range_seconds)}]))")


def limit_query(family: str, range_seconds: float, matchers: Sequence[str]) -> str:
    """The largest value of a pod's limit gauge in the range."""
    return (f"max by (namespace, pod) "
            f"(max_over_time({family}{rq.selector(matchers)}[{promql_duration(range_seconds)}]))")


def ladder_query(range_seconds: float, matchers: Sequence[str]) -> str:
    """Times each pod entered a stage that stops it (a 0/1 series rises: its changes less its falls)."""
    selected = rq.selector((*matchers, f'stage=~"{"|".join(STOPPED_STAGES)}"'))
    window = promql_duration(range_seconds)
    return (f"sum by (namespace, pod) (changes({LADDER_STAGE}{selected}[{window}]) - "
            f"resets({LADDER_STAGE}{selected}[{window}]))")


def gpu_memory_query(range_seconds: float, matchers: Sequence[str]) -> str:
    """The memory of every GPU seen in the range, by UUID."""
    return (f"max by ({rq.UUID_LABEL}) "
            f"(max_over_time({GPU_MEMORY}{rq.selector(matchers)}[{promql_duration(range_seconds)}]))")
