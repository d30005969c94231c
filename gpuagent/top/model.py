"""The node as ``gpuagent top`` shows it: GPUs (and MIG instances), their tenants and the tenants' processes.

Built from one ``/v1/state`` body (JSON, as the agent serves it: this package never imports the agent's
model) by :func:`node_view`. Every figure the agent did not give (an older agent, enforcement off,
accounting off, MIG without per-process use) is ``None`` and shown as "-", never as 0. A tenant of a GPU is
what the agent's hints call one (a pod allocated it, or any workload with processes on it); the enforcer's
shares and memory ladder, the accounting's efficiency, idle time and GPU-hours today, and the processes
are joined to it by its name ("namespace/pod", or the workload's name) and the GPU.

The body is another party's (a node's agent, or whatever answers at its address): every figure the view
uses is checked where it is read (a finite number within a range any GPU can have, a time the clock can
show), and whatever still goes wrong while building one node's view is a :class:`TopError` for that node:
never the end of ``top``, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuagent.boundedjson import Unreadable, in_range
from gpuagent.top.errors import TopError
from gpuagent.untrusted import shown

T = TypeVar("T")
FIGURE_MAX = 1e15  # watts, hertz, seconds, percents: no GPU's figure comes near (an 80 GiB card is 8.6e10 B)
UNIX_MAX = 253402300799.0  # 9999-12-31: the last second the clock functions show


@dataclass(frozen=True)
class ProcessView:
    pid: int
    comm: str
    container: str | None
    sm_ratio: float | None  # None on MIG (NVML has no per-process figure there)
    memory_bytes: int | None


@dataclass(frozen=True)
class TenantView:
    """One tenant of one GPU (or MIG instance of it)."""

    name: str  # "namespace/pod", or the workload's name ("unattributed": processes of no known workload)
    kind: str  # "pod", or a workload kind ("systemd_service", "slurm_job", ..., "unknown")
    namespace: str | None
    allocated: bool  # the kubelet gave it this GPU (else it only runs processes on it)
    processes: tuple[ProcessView, ...]
    sm_ratio: float | None  # now, 0-1 of the GPU
    efficiency_ratio: float | None  # busy / held over the accounting's efficiency window
    memory_used_bytes: int | None
    memory_limit_bytes: int | None
    share_limit_ratio: float | None
    share_achieved_ratio: float | None
    frozen_ratio: float | None
    throttled_seconds: float | None
    ladder_stage: str | None  # the memory ladder: ok, warned, terminating, killed, evicted
    idle_seconds: float | None  # the current idle episode; None: not known (no accounting)
    idle_flagged: bool  # idle for the agent's idle window: in accounting.idle
    gpu_hours_today: float | None
    mig_instance: str | None = None  # the MIG device UUID it holds or runs in
    # the enforcer is in audit mode: its frozen ratio and ladder stage are what it would do, nothing it did
    audit: bool = False

    @property
    def containers(self) -> tuple[str, ...]:
        return tuple(sorted({p.container for p in self.processes if p.container}))


@dataclass(frozen=True)
class MigView:
    uuid: str
    gpu_instance_id: int
    profile: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    activity_ratio: float | None  # GPM graphics-engine activity of the instance (Hopper and later)
    tenants: tuple[TenantView, ...]


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    model: str
    health: str  # ok, lost, unresponsive, error
    health_detail: str
    stale: bool  # its last read did not finish in time: the figures are older
    xid_last: int | None  # the last XID within the agent's window
    xid_recent: int  # XIDs within the window
    util_ratio: float | None
    sm_short_ratio: float | None
    sm_long_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    power_limit_watts: float | None
    temperature_celsius: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None
    sharing_mode: str | None
    schedulable_share_ratio: float | None
    mig_enabled: bool
    migs: tuple[MigView, ...]
    tenants: tuple[TenantView, ...]  # outside MIG instances
    # Where the tenants' (and processes') SM figures differ from the GPU's own, which is this poll's: NVML's
    # per-process means over this many seconds (None: one poll, as the GPU's), read this long before the
    # snapshot (None: at it). Per-process use is read every process_utilization_interval (10 s) where the
    # share controller does not act, so a tenant's SM can exceed its GPU's SM now.
    tenant_sm_window_seconds: float | None = None
    tenant_sm_age_seconds: float | None = None
    fault: str | None = None  # its worst fault: "RowRemapFailure (fatal, replace)"

    def all_tenants(self) -> tuple[TenantView, ...]:
        return self.tenants + tuple(t for m in self.migs for t in m.tenants)


@dataclass(frozen=True)
class NodeView:
    hostname: str
    backend: str | None
    driver_version: str | None
    cuda_version: str | None
    mode: str  # the enforcer's: off, audit, enforce
    poll_interval_seconds: float | None
    taken_at_unix: float | None
    gpus: tuple[GpuView, ...]
    failing_sources: tuple[str, ...]  # sources whose last run failed ("pod_resources: ...")
    efficiency_window_seconds: float | None
    idle_window_seconds: float | None
    day_started_at_unix: float | None
    idle_gpus_held: float | None  # GPU-equivalents held by workloads flagged idle; None: no accounting
    # the node's GPU health (gpuagent.health): failing conditions ("GpuHardwareHealthy: RowRemapFailure") and
    # what is done about them ("cordoned, tainted, drain blocked"; "would cordon" in audit); () / "": none
    failing_conditions: tuple[str, ...] = ()
    quarantine: str = ""

    def namespaces(self) -> tuple[str, ...]:
        return tuple(sorted({t.namespace for g in self.gpus for t in g.all_tenants() if t.namespace}))


def node_view(state: Mapping[str, Any]) -> NodeView:
    """The view of one ``/v1/state`` body; :class:`TopError` when it is not one, or when anything in it
    cannot be shown (a figure out of range; any other failure, named by :func:`unshowable`)."""
    return guarded(lambda: _node_view(state))


def guarded(build: Callable[[], T]) -> T:
    """``build()`` (the view of one node, or its frame); any failure in it a :class:`TopError` for that node
    (:func:`unshowable`). The body is another party's: whatever it breaks is that node's error, not top's
    end."""
    try:
        return build()
    except TopError:
        raise
    except Exception as exc:
        raise unshowable(exc) from None


def unshowable(exc: BaseException) -> TopError:
    """The one line that says a node's ``/v1/state`` could not be shown and why: the error's type and text,
    controls shown, no traceback and no local variables (a node's pod names stay out of the output)."""
    return TopError(f"/v1/state cannot be shown: {error_line(exc)}")


def error_line(exc: BaseException) -> str:
    """An error as one line for a terminal: its type (where its text alone does not say what it is) and its
    text, controls shown, cut at 300 characters."""
    return shown(str(exc) if isinstance(exc, Unreadable) else f"{type(exc).__name__}: {exc}")[:300]


def _node_view(state: Mapping[str, Any]) -> NodeView:
    gpus = state.get("gpus")
    if not isinstance(gpus, list) or not isinstance(state.get("hostname"), str):
        raise TopError("not a gpuagent /v1/state body (no hostname or gpus in it)")
    hints = {g.get("uuid"): g for g in _dicts(_get(state, "hints", dict, {}).get("gpus"))}
    joins = _Joins.of(state)
    accounting = _get(state, "accounting", dict, None)
    enforcement = _get(state, "enforcement", dict, None)
    health = _get(state, "health", dict, None)
    faults = _worst_faults(health)
    return NodeView(
        hostname=state["hostname"],
        backend=_get(state, "backend", str),
        driver_version=_get(state, "driver_version", str),
        cuda_version=_get(state, "cuda_driver_version", str),
        mode=_get(enforcement, "mode", str, "off") if enforcement else "off",
        poll_interval_seconds=_number(state, "poll_interval_seconds"),
        taken_at_unix=_unix(state, "taken_at_unix"),
        gpus=tuple(_gpu(g, hints.get(_info(g).get("uuid"), {}), joins, _unix(state, "taken_at_unix"),
                        _number(state, "poll_interval_seconds"), faults) for g in _dicts(gpus)),
        failing_sources=tuple(
            f"{s.get('name')}: {s.get('error') or 'failed'}" for s in _dicts(state.get("sources"))
            if s.get("ok") is False
        ),
        efficiency_window_seconds=_number(accounting, "efficiency_window_seconds"),
        idle_window_seconds=_number(accounting, "idle_window_seconds"),
        day_started_at_unix=_unix(accounting, "day_started_at_unix"),
        idle_gpus_held=(sum(_number(i, "allocated_gpus") or 0.0 for i in _dicts(accounting.get("idle")))
                        if accounting is not None else None),
        failing_conditions=tuple(f"{c.get('type')}: {c.get('reason')}" for c in _dicts((health or {}).get(
            "conditions")) if c.get("status") == "False"),
        quarantine=_quarantine(health),
    )


_SEVERITY = {"info": 1, "degraded": 2, "fatal": 3}


def _worst_faults(health: Mapping[str, Any] | None) -> dict[str, str]:
    """GPU UUID -> its worst fault, as top shows it: a degraded or fatal one (a node condition's, or a DRA
    driver's device taint, which is the GPU's alone); a workload's own error (info) is not the GPU's."""
    worst: dict[str, tuple[int, str]] = {}
    for f in _dicts((health or {}).get("faults")):
        uuid, severity = f.get("gpu_uuid"), f.get("severity")
        if not isinstance(uuid, str) or _SEVERITY.get(severity, 0) < _SEVERITY["degraded"]:
            continue
        rank = _SEVERITY[severity]
        if uuid not in worst or rank > worst[uuid][0]:
            worst[uuid] = (rank, f"{f.get('reason')} ({severity}, {f.get('action')})")
    return {uuid: text for uuid, (_, text) in worst.items()}


def _quarantine(health: Mapping[str, Any] | None) -> str:
    """What the agent does (or, in audit, would do) to the node about its GPU faults."""
    if not health:
        return ""
    flags = (("cordoned", health.get("cordoned") is True), ("tainted", bool(health.get("taints"))))
    words = [word for word, on in flags if on]
    drain = health.get("drain")
    if isinstance(drain, str) and drain not in ("none", "audit"):
        words.append(f"drain {drain}")
    if health.get("budget_deferred") is True:
        words.append("waiting for the cluster budget")
    if health.get("manual_override") is True:
        words.append("undone by a person")
    if health.get("mode") == "audit" and words:
        return "would be " + ", ".join(words)
    return ", ".join(words)


@dataclass(frozen=True)
class _Joins:
    """The per-tenant figures of the enforcer and the accounting, by tenant name (and GPU)."""

    shares: Mapping[tuple[str, str], Mapping[str, Any]]  # (tenant, GPU UUID) -> ShareState
    memory: Mapping[str, Mapping[str, Any]]  # tenant -> MemoryState
    usage: Mapping[tuple[str, str, int | None], Mapping[str, Any]]  # (tenant, GPU, MIG id) -> usage
    idle: frozenset[tuple[str, str, int | None]]
    audit: bool = False  # the enforcer's decisions are not carried out (mode audit)

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> _Joins:
        enforcement = _get(state, "enforcement", dict, None)
        accounting = _get(state, "accounting", dict, None)
        shares, memory, usage = {}, {}, {}
        for share in _dicts((enforcement or {}).get("shares")):
            shares[(_tenant_name(share.get("pod"), share.get("namespace")), share.get("gpu_uuid"))] = share
        for entry in _dicts((enforcement or {}).get("memory")):
            memory[_tenant_name(entry.get("pod"), entry.get("namespace"))] = entry
        for entry in _dicts((accounting or {}).get("usage")):
            if entry.get("level") in ("pod", "workload") and entry.get("ended_at_unix") is None:
                usage[_usage_key(entry)] = entry
        idle = frozenset(_usage_key(e) for e in _dicts((accounting or {}).get("idle")))
        return cls(shares, memory, usage, idle, audit=_get(enforcement, "mode", str) == "audit")


def _usage_key(entry: Mapping[str, Any]) -> tuple[str, str, int | None]:
    instance = entry.get("gpu_instance_id")
    return (_tenant_name(entry.get("name"), entry.get("namespace")), str(entry.get("gpu_uuid")),
            instance if isinstance(instance, int) else None)


def _tenant_name(name: Any, namespace: Any) -> str:
    """As the agent names a tenant: "namespace/name" for a pod, the name alone otherwise."""
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else str(name)


def _gpu(gpu: Mapping[str, Any], hint: Mapping[str, Any], joins: _Joins, taken_at: float | None,
         poll_interval: float | None, faults: Mapping[str, str] | None = None) -> GpuView:
    info = _info(gpu)
    uuid = str(info.get("uuid", ""))
    xid = _get(gpu, "xid", dict, {})
    migs = _dicts(gpu.get("migs"))
    mig_ids = {m.get("uuid"): m.get("gpu_instance_id") for m in migs}
    processes = _processes_by_tenant(gpu)
    tenants: list[TenantView] = []
    entries = _dicts(hint.get("tenants")) if hint else _tenants_of_processes(processes, migs)
    for entry in entries:
        mig_uuid = _get(entry, "mig_instance", str)
        instance = mig_ids.get(mig_uuid) if mig_uuid else None
        instance = instance if isinstance(instance, int) else None
        tenants.append(_tenant(entry, uuid, instance, processes, joins))
    util = _number(gpu, "gpu_util_percent")
    return GpuView(
        index=_get(info, "index", int, 0),
        uuid=uuid,
        model=_get(info, "name", str, "?"),
        health=_get(gpu, "health", str, "?"),
        health_detail=_get(gpu, "health_detail", str, ""),
        stale=gpu.get("stale") is True,
        xid_last=_get(xid, "last_code", int),
        xid_recent=sum(v for v in _get(xid, "recent", dict, {}).values() if isinstance(v, int)),
        util_ratio=util / 100 if util is not None else _number(hint, "sm_util_ratio"),
        sm_short_ratio=_number(hint, "sm_util_short_ratio"),
        sm_long_ratio=_number(hint, "sm_util_long_ratio"),
        memory_used_bytes=_get(gpu, "memory_used_bytes", int),
        memory_total_bytes=_get(info, "memory_total_bytes", int),
        power_watts=_number(gpu, "power_watts"),
        power_limit_watts=_number(info, "power_limit_watts"),
        temperature_celsius=_number(gpu, "temperature_celsius"),
        sm_clock_mhz=_mhz(gpu, "sm_clock_hz"),
        memory_clock_mhz=_mhz(gpu, "memory_clock_hz"),
        sharing_mode=_get(hint, "sharing_mode", str),
        schedulable_share_ratio=_number(hint, "schedulable_share_ratio"),
        mig_enabled=info.get("mig_enabled") is True,
        migs=tuple(_mig(m, [t for t in tenants if t.mig_instance == m.get("uuid")]) for m in migs),
        tenants=tuple(t for t in tenants if t.mig_instance is None or t.mig_instance not in mig_ids),
        **_tenant_sm_timing(gpu, taken_at, poll_interval),
        fault=(faults or {}).get(uuid),
    )


def _tenant_sm_timing(gpu: Mapping[str, Any], taken_at: float | None,
                      poll_interval: float | None) -> dict[str, float | None]:
    """The per-process figures' window and age, each None where it is the GPU's own (one poll, read at
    the snapshot) or not known (an older agent, MIG)."""
    poll = poll_interval or 1.0
    window = _number(gpu, "process_util_window_seconds")
    read_at = _unix(gpu, "process_util_read_at_unix")
    age = taken_at - read_at if taken_at is not None and read_at is not None else None
    return {"tenant_sm_window_seconds": window if window is not None and window > 1.5 * poll else None,
            "tenant_sm_age_seconds": age if age is not None and age >= poll / 2 else None}


def _mig(mig: Mapping[str, Any], tenants: Sequence[TenantView]) -> MigView:
    profiling = _get(mig, "profiling", dict, {})
    return MigView(
        uuid=str(mig.get("uuid", "")),
        gpu_instance_id=_get(mig, "gpu_instance_id", int, 0),
        profile=_get(mig, "profile", str, "?"),
        memory_used_bytes=_get(mig, "memory_used_bytes", int),
        memory_total_bytes=_get(mig, "memory_total_bytes", int),
        activity_ratio=_number(profiling, "graphics_active_ratio"),
        tenants=tuple(tenants),
    )


def _processes_by_tenant(gpu: Mapping[str, Any]) -> dict[tuple[str, int | None], list[ProcessView]]:
    """The GPU's processes by (tenant name, MIG instance id), named as the hints name tenants."""
    out: dict[tuple[str, int | None], list[ProcessView]] = {}
    for process in _dicts(gpu.get("processes")):
        workload = _get(process, "workload", dict, None)
        if workload is None:
            name = "unattributed"
        elif workload.get("kind") == "pod":
            name = _tenant_name(workload.get("name"), workload.get("namespace"))
        else:
            name = str(workload.get("name"))
        sm = _number(process, "sm_util_percent")
        instance = process.get("gpu_instance_id")
        out.setdefault((name, instance if isinstance(instance, int) else None), []).append(ProcessView(
            pid=_get(process, "pid", int, 0),
            comm=_get(process, "comm", str, ""),
            container=_get(workload, "container", str) if workload else None,
            sm_ratio=sm / 100 if sm is not None else None,
            memory_bytes=_get(process, "used_memory_bytes", int),
        ))
    return out


def _tenants_of_processes(processes: Mapping[tuple[str, int | None], list[ProcessView]],
                          migs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Without the agent's hints (computing them failed): a tenant per workload with processes on the GPU,
    its use summed; what only the hints know (allocations, limits) stays unknown."""
    uuids = {m.get("gpu_instance_id"): m.get("uuid") for m in migs}
    out = []
    for (name, instance), members in processes.items():
        sm = [p.sm_ratio for p in members if p.sm_ratio is not None]
        out.append({"name": name, "kind": "pod" if "/" in name else "unknown",
                    "sm_util_ratio": sum(sm) if sm else None,
                    "memory_used_bytes": sum(p.memory_bytes or 0 for p in members),
                    "mig_instance": uuids.get(instance)})
    return out


def _tenant(
    hint: Mapping[str, Any], gpu_uuid: str, instance: int | None,
    processes: Mapping[tuple[str, int | None], list[ProcessView]], joins: _Joins,
) -> TenantView:
    name = _get(hint, "name", str, "?")
    kind = _get(hint, "kind", str, "unknown")
    share = joins.shares.get((name, gpu_uuid), {})
    memory = joins.memory.get(name, {})
    usage = joins.usage.get((name, gpu_uuid, instance))
    key = (name, gpu_uuid, instance)
    today = _number(usage, "allocated_gpu_seconds_today") if usage else None
    namespace = name.split("/", 1)[0] if kind == "pod" and "/" in name else None
    return TenantView(
        name=name,
        kind=kind,
        namespace=namespace,
        allocated=hint.get("allocated") is True,
        processes=tuple(sorted(processes.get((name, instance), ()), key=lambda p: p.pid)),
        sm_ratio=_number(hint, "sm_util_ratio"),
        efficiency_ratio=_number(usage, "efficiency_ratio") if usage else None,
        memory_used_bytes=_get(hint, "memory_used_bytes", int),
        memory_limit_bytes=_get(hint, "memory_limit_bytes", int),
        share_limit_ratio=_number(share, "limit_ratio") if share else _number(hint, "share_ratio"),
        share_achieved_ratio=_number(share, "achieved_ratio"),
        frozen_ratio=_number(share, "frozen_ratio"),
        throttled_seconds=_number(share, "throttled_seconds_total"),
        ladder_stage=_get(memory, "stage", str),
        idle_seconds=_number(usage, "idle_seconds") if usage else None,
        idle_flagged=key in joins.idle,
        gpu_hours_today=today / 3600 if today is not None else None,
        mig_instance=_get(hint, "mig_instance", str),
        audit=joins.audit,
    )


# -- reading JSON without trusting it ----------------------------------------------------------------------

def _get(mapping: Mapping[str, Any] | None, key: str, kind: type, default: Any = None) -> Any:
    """``mapping[key]`` when it is a ``kind`` (a bool is no int here), else ``default``."""
    if not isinstance(mapping, Mapping):
        return default
    value = mapping.get(key)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    return default


def _number(mapping: Mapping[str, Any] | None, key: str, low: float = -FIGURE_MAX,
            high: float = FIGURE_MAX) -> float | None:
    """``mapping[key]`` as a float; ``None`` when it is no number (an older agent: shown "-"); a number out
    of ``[low, high]`` is :class:`~gpuagent.boundedjson.Unreadable` naming the key (no agent sends one)."""
    value = mapping.get(key) if isinstance(mapping, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(in_range(value, low, high, shown(key)))
    return None


def _unix(mapping: Mapping[str, Any] | None, key: str) -> float | None:
    """A time as seconds since the epoch, one the clock functions can show."""
    return _number(mapping, key, 0.0, UNIX_MAX)


def _mhz(mapping: Mapping[str, Any], key: str) -> float | None:
    hz = _number(mapping, key)
    return hz / 1e6 if hz is not None else None


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _info(gpu: Mapping[str, Any]) -> Mapping[str, Any]:
    return _get(gpu, "info", dict, {})
