"""Builds each part of the agent from its group of the config: the enforcer (with its freezer, ladder and
the latency class's ``cpu.stat`` reader), the accountant, the GPUNodeState publisher, the health monitor and
the pods source, and the API server connection they share. Apart from :mod:`gpuagent.agent`, which runs the
parts on one event loop, so that what decides whether a part exists (``mode: off``, ``auto`` where the API
server is reachable) is read in one place and a test can build one part without an agent.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from socket import gethostname
from typing import TYPE_CHECKING

from gpuagent import preflight
from gpuagent.accounting import Accountant, AccountingSettings
from gpuagent.accounting.events import IdleEventPoster
from gpuagent.config import Config, EnforceConfig, KubeApiConfig, PodsConfig
from gpuagent.enforce.actions import Actions, EvictionClient
from gpuagent.enforce.cpustat import CpuStat
from gpuagent.enforce.enforcer import Enforcer
from gpuagent.enforce.journal import Journal
from gpuagent.enforce.memory import LadderSettings, MemoryLadder
from gpuagent.enforce.timeslice import Cycler, RotationController, ShareController, make_plan
from gpuagent.health import HealthMonitor, HealthSettings
from gpuagent.hints.publisher import StatePublisher
from gpuagent.pods.cgroup import CgroupReader
from gpuagent.pods.environ import EnvironReader
from gpuagent.pods.podresources import PodResourcesClient
from gpuagent.pods.source import PodsSource

if TYPE_CHECKING:
    from gpuagent.kubeapi import ApiConnection
    from gpuagent.pods.dra.resolver import DraResolver
    from gpuagent.pods.metadata import PodMetadata

log = logging.getLogger(__name__)


def build_accountant(config: Config) -> Accountant:
    """Accounting, always; idle Events on pods when asked, or (auto) where the API server is reachable: in
    a cluster with a service account, or with a kubeconfig configured."""
    accounting, kubeconfig = config.accounting, config.kubeapi.kubeconfig
    events = None
    if accounting.idle_events != "off":
        from gpuagent.pods.metadata import api_server_available

        if accounting.idle_events == "on" or kubeconfig or api_server_available():
            events = IdleEventPoster(config.agent.hostname, kubeconfig_path=kubeconfig)
    settings = AccountingSettings(
        retention_seconds=accounting.retention, efficiency_window_seconds=accounting.efficiency_window,
        idle_threshold_ratio=accounting.idle_threshold, idle_window_seconds=accounting.idle_window,
    )
    return Accountant(settings, events=events)


def build_publisher(config: Config, *, monotonic: Callable[[], float] = time.monotonic,
                    wall_clock: Callable[[], float] = time.time) -> StatePublisher | None:
    """The GPUNodeState publisher for the extender's cluster view: when asked, or (auto) where the API
    server is reachable (in a cluster with a service account, or with a kubeconfig configured)."""
    publish, kubeconfig, hostname = config.publish, config.kubeapi.kubeconfig, config.agent.hostname
    if publish.state == "off":
        return None
    from gpuagent.kubeapi import ApiConnection, api_server_available

    if publish.state == "auto" and not (kubeconfig or api_server_available()):
        return None
    log.info("publishing this node's GPU state as GPUNodeState %s (on change, at most every %gs; "
             "heartbeat %gs)", hostname, publish.min_interval, publish.heartbeat)
    return StatePublisher(hostname, ApiConnection(kubeconfig_path=kubeconfig),
                          min_interval=publish.min_interval, heartbeat=publish.heartbeat,
                          monotonic=monotonic, wall_clock=wall_clock)


def build_health(config: Config) -> HealthMonitor | None:
    """GPU faults classified every poll (``health_mode`` audit or enforce); in enforce, written to this Node
    where the API server is used (``kubernetes_api``), within the cluster-wide quarantine budget."""
    health = config.health
    if health.mode == "off":
        return None
    modes = dict(item.split("=", 1) for item in health.drain_namespaces)
    settings = HealthSettings(
        mode=health.mode, taint_at=health.taint, no_execute=health.no_execute,
        cordon_at=health.cordon, drain_at=health.drain, namespace_modes=modes,
        default_namespace_mode=health.drain_default, quarantine_budget=health.quarantine_budget,
        budget_namespace=health.budget_namespace, clear_after=health.clear_after,
        events=health.events, dra_taints=health.dra_taints,
    )
    writer = None
    if health.mode == "enforce":
        connection = api_connection(config.kubeapi)
        if connection is None:
            log.warning("health_mode is enforce but the API server is not used (kubernetes_api): GPU faults "
                        "are classified and reported, nothing is written to the Node")
        else:
            from gpuagent.health.budget import QuarantineBudget
            from gpuagent.health.writer import NodeWriter

            budget = QuarantineBudget(connection, config.agent.hostname, namespace=settings.budget_namespace,
                                      limit=settings.quarantine_budget)
            writer = NodeWriter(config.agent.hostname, connection,
                                settings_namespace_mode=settings.namespace_mode, budget=budget,
                                events=settings.events)
    return HealthMonitor(settings, writer)


def build_enforcer(config: Config, *, monotonic: Callable[[], float] = time.monotonic) -> Enforcer | None:
    """The enforcer for ``mode: audit|enforce``; None when off. Bad policies are config errors."""
    enforce = config.enforce
    if enforce.mode == "off":
        return None
    rules, defaults = preflight.policies(config)
    eviction = None
    if enforce.memory_action == "evict":
        eviction = EvictionClient(kubeconfig_path=config.kubeapi.kubeconfig)
    actions = Actions(
        mode=enforce.mode, journal=Journal(enforce.journal_path), cgroup_root=enforce.cgroup_root,
        allowed_outside_kubepods=enforce.freezable_outside_kubepods, protected_pids=(os.getpid(),),
        eviction_client=eviction, workload_proc_root=config.pods.proc_root,
    )
    plan = make_plan(enforce.share_scheme, enforce.share_period)
    cycler = Cycler(lambda target: actions.freeze(target, reason="over its GPU share"), actions.thaw,
                    plan=plan)
    cpu = None
    if enforce.share_scheme == "rotation":
        # the latency class's "has work" signal: the latency workloads' cpu.stat (enforce/cpustat.py)
        cpu = CpuStat(enforce.cgroup_root, v2_mount=actions.hierarchies.get("v2")).open

        def controller() -> RotationController | ShareController:
            return RotationController(work_conserving=enforce.work_conserving)
    else:
        def controller() -> RotationController | ShareController:
            return ShareController(work_conserving=enforce.work_conserving)
    ladder = MemoryLadder(LadderSettings(action=enforce.memory_action, term_after=enforce.memory_term_after,
                                         kill_grace=enforce.memory_kill_grace))
    log.warning("enforcement is %s: %s", enforce.mode.upper(),
                "decisions are exported, nothing is frozen or signalled" if enforce.mode == "audit"
                else f"over-share pods are frozen ({enforce.share_scheme}), over-memory pods signalled")
    return Enforcer(
        mode=enforce.mode, actions=actions, ladder=ladder, defaults=defaults, rules=rules, cycler=cycler,
        controller=controller, clock=monotonic, work_conserving=enforce.work_conserving, cpu=cpu,
    )


def recover_frozen(enforce: EnforceConfig) -> int:
    """Thaw what a previous run's journal names (it crashed or was killed while throttling), whatever the
    mode now: undoing our own freezes is never enforcement."""
    if not enforce.journal_path or not os.path.exists(enforce.journal_path):
        return 0
    actions = Actions(mode="off", journal=Journal(enforce.journal_path), cgroup_root=enforce.cgroup_root,
                      allowed_outside_kubepods=enforce.freezable_outside_kubepods)
    return actions.recover()


def pods_source(config: Config, environ_fallback: Callable[[int], bytes | None] | None = None, *,
                monotonic: Callable[[], float] = time.monotonic) -> PodsSource:
    """Cgroup attribution always; the kubelet's allocations when this is a kubelet node (its pod-resources
    directory exists) or the socket was configured explicitly, with its DRA devices mapped to GPUs.
    ``environ_fallback``: the simulator's environments of its made-up PIDs."""
    pods = config.pods
    socket = pods.pod_resources_socket
    explicit = config.sources.get("pod_resources_socket", "default") != "default"
    client = None
    if socket and (explicit or os.path.isdir(os.path.dirname(socket))):
        client = PodResourcesClient(socket, resource_names=pods.gpu_resource_names,
                                    dra_drivers=pods.dra_drivers)
    connection = api_connection(config.kubeapi)
    return PodsSource(
        cgroups=CgroupReader(pods.proc_root), podresources=client,
        metadata=pod_metadata(config.agent.hostname, connection),
        environs=EnvironReader(pods.proc_root, fallback=environ_fallback),
        node_names=frozenset({config.agent.hostname, gethostname()}),
        dra=dra_resolver(pods, config.agent.hostname, connection) if client is not None else None,
        connection=connection, interval=pods.pod_resources_interval, monotonic=monotonic,
    )


def api_connection(kubeapi: KubeApiConfig) -> ApiConnection | None:
    """The API server, shared by the pods watcher and the ResourceSlice watcher: when asked, or (auto) inside
    a cluster with a service account or with a kubeconfig configured. lightkube is imported on first use."""
    from gpuagent.kubeapi import ApiConnection, api_server_available

    if kubeapi.kubernetes_api == "off":
        return None
    if kubeapi.kubernetes_api == "auto" and not (kubeapi.kubeconfig or api_server_available()):
        return None
    return ApiConnection(kubeconfig_path=kubeapi.kubeconfig)


def pod_metadata(hostname: str, connection: ApiConnection | None) -> PodMetadata | None:
    """The API-server watcher of this node's pods, where the API server is used (lightkube costs about
    14 MiB, imported only then)."""
    if connection is None:
        return None
    from gpuagent.pods.metadata import PodMetadata

    log.info("naming pods through the API server (pods of node %s)", hostname)
    return PodMetadata(hostname, connection=connection)


def dra_resolver(pods: PodsConfig, hostname: str, connection: ApiConnection | None) -> DraResolver | None:
    """DRA devices mapped to GPUs (``dra_drivers`` none: off): through the node's CDI specs, and the drivers'
    ResourceSlices where the API server is used (``dra_resource_slices``)."""
    if not pods.dra_drivers:
        return None
    from gpuagent.pods.dra.cdi import CdiSpecs
    from gpuagent.pods.dra.nvcaps import MigMinors
    from gpuagent.pods.dra.resolver import DraResolver
    from gpuagent.pods.dra.slices import ResourceSlices

    slices = None
    if pods.dra_resource_slices != "off" and connection is not None:
        slices = ResourceSlices(hostname, drivers=pods.dra_drivers, connection=connection,
                                wanted=pods.dra_resource_slices == "on")
    cdi = CdiSpecs(pods.cdi_spec_dirs) if pods.cdi_spec_dirs else None
    return DraResolver(cdi=cdi, mig_minors=MigMinors(pods.proc_root), slices=slices)
