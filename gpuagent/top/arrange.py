"""What the node view lists, in which order: the tenant columns, sorting, filtering, expanding.

``arrange`` turns a :class:`NodeView` and the person's :class:`ViewOptions` into rows: each GPU (in index
order) followed by its tenants sorted by the chosen column, a MIG-enabled GPU by its instances and theirs,
an expanded tenant by its processes. A filter (a namespace, a text matched against tenant, container,
process names and PIDs) keeps the tenants that match and the GPUs that have one; a text that matches a
tenant through some of its processes (their name, PID or container) keeps those processes only, one that
matches the tenant's own name or kind keeps all of them. Rows carry stable keys, so the cursor and the
expanded set survive refreshes and re-sorting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from gpuagent.top.model import GpuView, MigView, NodeView, ProcessView, TenantView

LADDER = ("ok", "warned", "terminating", "killed", "evicted")
T = TypeVar("T")


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    width: int  # 0: the flexible tenant-name column
    value: Callable[[TenantView], Any]  # what it sorts by; None sorts last either way
    descending: bool = True  # the direction it starts in when chosen


def _ladder(tenant: TenantView) -> int | None:
    stage = tenant.ladder_stage
    return LADDER.index(stage) if stage in LADDER else None


def _idle(tenant: TenantView) -> tuple[bool, float] | None:
    return None if tenant.idle_seconds is None else (tenant.idle_flagged, tenant.idle_seconds)


COLUMNS: tuple[Column, ...] = (
    Column("name", "TENANT", 0, lambda t: t.name, descending=False),
    Column("procs", "PROC", 4, lambda t: len(t.processes)),
    Column("sm", "SM", 5, lambda t: t.sm_ratio),
    Column("eff", "EFF", 5, lambda t: t.efficiency_ratio),
    Column("memory", "MEM USED/LIMIT", 15, lambda t: t.memory_used_bytes),
    Column("share", "SHARE LIM/GOT", 13, lambda t: t.share_limit_ratio),
    Column("frozen", "FROZEN", 9, lambda t: t.frozen_ratio),  # "would 80%" in audit mode
    Column("throttled", "THROTTLED", 9, lambda t: t.throttled_seconds),
    Column("ladder", "MEM LADDER", 11, _ladder),
    Column("idle", "IDLE", 10, _idle),
    Column("today", "GPU-h", 6, lambda t: t.gpu_hours_today),
)
_BY_KEY = {c.key: c for c in COLUMNS}


@dataclass(frozen=True)
class ViewOptions:
    sort: str = "sm"
    descending: bool = True
    namespace: str | None = None
    text: str = ""
    expanded: frozenset[str] = field(default_factory=frozenset)  # tenant row keys showing their processes
    collapsed: frozenset[str] = field(default_factory=frozenset)  # GPU row keys hiding their tenants

    @property
    def filtering(self) -> bool:
        return self.namespace is not None or bool(self.text.strip())

    def sorted_by(self, key: str) -> ViewOptions:
        sort, descending = sorted_by(COLUMNS, self.sort, self.descending, key)
        return replace(self, sort=sort, descending=descending)

    def next_sort(self, step: int = 1) -> ViewOptions:
        sort, descending = next_sort(COLUMNS, self.sort, step)
        return replace(self, sort=sort, descending=descending)

    def toggled(self, row_key: str) -> ViewOptions:
        """Expand or fold a tenant (its processes), or fold or unfold a GPU (its tenants)."""
        if row_key.startswith("gpu:"):
            return replace(self, collapsed=self.collapsed ^ {row_key})
        return replace(self, expanded=self.expanded ^ {row_key})


@dataclass(frozen=True)
class Row:
    kind: str  # "gpu", "mig", "tenant", "process"
    key: str  # stable across refreshes
    gpu: GpuView
    mig: MigView | None = None
    tenant: TenantView | None = None
    process: ProcessView | None = None


def tenant_key(gpu: GpuView, tenant: TenantView) -> str:
    return f"tenant:{gpu.uuid}:{tenant.mig_instance or ''}:{tenant.name}"


def arrange(node: NodeView, options: ViewOptions) -> list[Row]:
    rows: list[Row] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        if options.filtering and not any(matches(t, options) for t in gpu.all_tenants()):
            continue
        gpu_key = f"gpu:{gpu.uuid}"
        rows.append(Row("gpu", gpu_key, gpu))
        if gpu_key in options.collapsed:
            continue
        rows += _tenant_rows(gpu, None, gpu.tenants, options)
        for mig in gpu.migs:
            if options.filtering and not any(matches(t, options) for t in mig.tenants):
                continue
            rows.append(Row("mig", f"mig:{mig.uuid}", gpu, mig=mig))
            rows += _tenant_rows(gpu, mig, mig.tenants, options)
    return rows


def _tenant_rows(gpu: GpuView, mig: MigView | None, tenants: tuple[TenantView, ...],
                 options: ViewOptions) -> list[Row]:
    rows: list[Row] = []
    for tenant in sort_tenants([t for t in tenants if matches(t, options)], options):
        key = tenant_key(gpu, tenant)
        tenant = replace(tenant, processes=matching_processes(tenant, options))
        rows.append(Row("tenant", key, gpu, mig=mig, tenant=tenant))
        if key in options.expanded:
            rows += [Row("process", f"process:{key}:{p.pid}", gpu, mig=mig, tenant=tenant, process=p)
                     for p in tenant.processes]
    return rows


def sort_tenants(tenants: list[TenantView], options: ViewOptions) -> list[TenantView]:
    column = _BY_KEY.get(options.sort, _BY_KEY["name"])
    return sort_known_last(tenants, column.value, options.descending, lambda t: t.name)


# -- sorting, for the node and the cluster views ----------------------------------------------------------

class SortColumn(Protocol):
    key: str
    descending: bool


def sorted_by(columns: Sequence[SortColumn], sort: str, descending: bool, key: str) -> tuple[str, bool]:
    """Sort by ``key``: in its starting direction, or the other way when it is the sort already."""
    if key == sort:
        return sort, not descending
    return key, next(c.descending for c in columns if c.key == key)


def next_sort(columns: Sequence[SortColumn], sort: str, step: int = 1) -> tuple[str, bool]:
    """The column ``step`` places from ``sort`` (wrapping), in its starting direction."""
    keys = [c.key for c in columns]
    column = columns[(keys.index(sort) + step) % len(keys) if sort in keys else 0]
    return column.key, column.descending


def sort_known_last(items: Sequence[T], value: Callable[[T], Any], descending: bool,
                    name: Callable[[T], str]) -> list[T]:
    """By ``value``, the unknown (None) last whichever the direction; ties by ``name``."""
    by_name = sorted(items, key=name)
    known = [i for i in by_name if value(i) is not None]
    return sorted(known, key=value, reverse=descending) + [i for i in by_name if value(i) is None]


def matches(tenant: TenantView, options: ViewOptions) -> bool:
    if options.namespace is not None and tenant.namespace != options.namespace:
        return False
    text = options.text.strip().lower()
    return not text or _names_it(tenant, text) or any(_names_it(p, text) for p in tenant.processes)


def matching_processes(tenant: TenantView, options: ViewOptions) -> tuple[ProcessView, ...]:
    """The processes a kept tenant lists: all of them, unless the text found the tenant through some of
    its processes only (a process name, a PID, a container): then those."""
    text = options.text.strip().lower()
    if not text or _names_it(tenant, text):
        return tenant.processes
    return tuple(p for p in tenant.processes if _names_it(p, text))


def _names_it(item: TenantView | ProcessView, text: str) -> bool:
    """``text`` (lower case) is part of the tenant's own name or kind, or of the process's name, PID or
    container."""
    if isinstance(item, TenantView):
        words = (item.name, item.kind)
    else:
        words = (item.comm, str(item.pid), item.container or "")
    return any(text in word.lower() for word in words)
