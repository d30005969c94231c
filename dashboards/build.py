#!/usr/bin/env python3
"""Writes the Grafana dashboards of this directory: ``python dashboards/build.py`` rewrites them.

The panels are built with Grafana's own typed builders, the Foundation SDK (``grafana-foundation-sdk``, the
``dashboards`` extra: ``pip install -e '.[dashboards]'``; ``make test`` installs it), pinned to its Grafana
10.4 types, so the JSON is the model Grafana 10.4 and later read (schemaVersion 39). Only what differs from
Grafana's defaults is written: Grafana fills in the rest when it loads a dashboard. The committed
``dashboards/*.json`` are this script's output, byte for byte (``tests/test_dashboards.py`` checks it, and
checks them against Grafana's published JSON schema): edit the panels here, run the script, commit both.
``--check`` exits 1, naming the files, when the committed JSON is not what the script writes.

Conventions every query follows (the query tests rely on them, see ``dashboards/README.md``):

- a template variable appears only as the value of a regex label matcher: ``{gpu=~"$gpu"}``;
- ``$__rate_interval`` and ``$__range`` appear only as range durations: ``[$__rate_interval]``;
- every query returns data on an 8-GPU node with tenants; a series that exists only in a rare state (an XID,
  an NVML error, an enforcement action, MIG) is read with ``or on() vector(0)`` or an explicit "none" series.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeAlias, TypeVar

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, statetimeline, timeseries
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39  # the SDK writes the schemaVersion of its CUE kind (36) and has no setter for it
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["gpuagent", "gpu", "nvidia"]

Query: TypeAlias = prometheus.Dataquery
Panel: TypeAlias = timeseries.Panel | stat_panel.Panel | statetimeline.Panel | table_panel.Panel
Steps: TypeAlias = db.ThresholdsConfig
Override: TypeAlias = tuple[dm.MatcherConfig, list[dm.DynamicConfigValue]]
P = TypeVar("P", timeseries.Panel, stat_panel.Panel, statetimeline.Panel, table_panel.Panel)

# -- PromQL -----------------------------------------------------------------------------------------------

# Label matchers of each scope; variables only ever inside `=~` matchers.
NODE = 'cluster=~"$cluster", instance=~"$node"'
GPU = NODE + ', gpu=~"$gpu"'
POD = NODE + ', namespace=~"$namespace", pod=~"$pod"'
POD_GPU = POD + ', gpu=~"$gpu"'
SCRAPE = NODE + ', job=~"$job"'

# Groupings: with `cluster` (where there is none it changes nothing), as instances may repeat across clusters.
PER_AGENT = "cluster, instance"
PER_GPU = PER_AGENT + ", gpu"
PER_POD = PER_AGENT + ", namespace, pod"
PER_FUNCTION = PER_AGENT + ", function"

# Clock-event reasons that hold the clocks down (the others: idle, application settings, sync boost, display).
SLOWDOWN_REASONS = "power_cap|hw_slowdown|sw_thermal|hw_thermal|hw_power_brake"


def lbl(name: str, op: str, value: str) -> str:
    """A label matcher with a literal value: ``lbl("state", "!=", "ok")`` is ``state!="ok"``."""
    return f'{name}{op}"{value}"'


def sel(metric: str, scope: str, *extra: str) -> str:
    """A selector: ``metric{<scope>, <extra>...}``."""
    return f"{metric}{{{', '.join((scope, *extra))}}}"


def by(op: str, labels: str, expr: str) -> str:
    """``op by (labels) (expr)``."""
    return f"{op} by ({labels}) ({expr})"


def rate(expr: str, fn: str = "rate", window: str = "$__rate_interval") -> str:
    return f"{fn}({expr}[{window}])"


def increase(expr: str, window: str = "$__rate_interval") -> str:
    return rate(expr, "increase", window)


def or_zero(expr: str) -> str:
    """``expr``, or 0 when it has no series (only where "nothing" truly means 0)."""
    return f"{expr} or on() vector(0)"


def or_none(expr: str, label: str, text: str) -> str:
    """``expr``, or one 0 series whose ``label`` says ``text`` when it has none (a legend reads it)."""
    return f'{expr} or on() label_replace(vector(0), "{label}", "{text}", "", "")'


def state_code(metric: str, scope: str, label: str, states: Sequence[str], labels: str) -> str:
    """One number per series of a state-set family (1 for the current state): 0 for a state not listed,
    i for ``states[i - 1]``."""
    parts = [f"{sel(metric, scope, lbl(label, '=', state))} * {i}" for i, state in enumerate(states, 1)]
    return by("sum", labels, " or ".join(parts))


# -- panels -----------------------------------------------------------------------------------------------

GPU_LEGEND = "GPU {{gpu}} · {{instance}}"
INSTANCE_LEGEND = "GPU {{gpu}} {{GPU_I_PROFILE}} · {{instance}}"  # a MIG instance's series has a profile
POD_LEGEND = "{{namespace}}/{{pod}}"
POD_GPU_LEGEND = "{{namespace}}/{{pod}} · GPU {{gpu}}"


def q(expr: str, legend: str = "") -> Query:
    """A range query; its refId is given by the panel."""
    return (prometheus.Dataquery().datasource(DATASOURCE).editor_mode(QueryEditorMode.CODE).expr(expr)
            .legend_format(legend or "__auto").range())


def thresholds(*steps: tuple[float | None, str]) -> Steps:
    """Absolute thresholds: (value, color), the first value None (-Infinity, as Grafana writes it)."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=value, color=color) for value, color in steps])


GREEN = thresholds((None, "green"))
RED_FROM_1 = thresholds((None, "green"), (1, "red"))
ORANGE_FROM_1 = thresholds((None, "green"), (1, "orange"))


def states(*entries: tuple[int, str, str]) -> list[dm.ValueMapping]:
    """Value mappings: (value, text, color)."""
    return [dm.ValueMap(options={str(value): dm.ValueMappingResult(color=color, index=i, text=text)
                                 for i, (value, text, color) in enumerate(entries)})]


def override(matcher: str, target: str, properties: dict[str, object]) -> Override:
    """Field properties (``{"custom.lineWidth": 2}``) for the fields a matcher (``byName``, ``byRegexp``)
    picks."""
    return (dm.MatcherConfig(id_val=matcher, options=target),
            [dm.DynamicConfigValue(id_val=key, value=value) for key, value in properties.items()])


def dashed(regex: str) -> Override:
    """The series whose name matches ``regex`` drawn dashed (a limit next to the use)."""
    return override("byRegexp", regex, {"custom.lineStyle": {"dash": [10, 10], "fill": "dash"},
                                        "custom.lineWidth": 2})


LIMIT_DASHED = dashed("/ limit$/")
TOOLTIP = cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)


def _panel(panel: P, title: str, description: str, targets: Sequence[Query], unit: str,
           color: dm.FieldColorModeId, steps: Steps | None, *, minimum: float | None = None,
           maximum: float | None = None, decimals: int | None = None,
           mappings: list[dm.ValueMapping] | None = None, overrides: Sequence[Override] = ()) -> P:
    """What every panel has: title, description, the data source, its queries (refIds A, B, ...) and the
    field defaults."""
    panel = (panel.title(title).description(description).datasource(DATASOURCE).unit(unit)
             .color_scheme(db.FieldColor().mode(color)).thresholds(steps or GREEN))
    for i, target in enumerate(targets):
        panel = panel.with_target(target.ref_id(chr(ord("A") + i)))
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    if decimals is not None:
        panel = panel.decimals(decimals)
    if mappings:
        panel = panel.mappings(mappings)
    for matcher, properties in overrides:
        panel = panel.with_override(matcher, properties)
    return panel


def ts(title: str, description: str, targets: Sequence[Query], unit: str, *, minimum: float | None = 0,
       maximum: float | None = None, stack: bool = False, bars: bool = False, steps: Steps | None = None,
       threshold_line: bool = False, overrides: Sequence[Override] = (), decimals: int | None = None
       ) -> timeseries.Panel:
    """A time series panel with its legend as a table on the right; ``threshold_line`` draws ``steps`` as
    dashed lines."""
    panel = (timeseries.Panel().fill_opacity(60 if bars else (25 if stack else 8)).show_points(
        cm.VisibilityMode.NEVER).point_size(4).tooltip(TOOLTIP).legend(
        cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE).placement(cm.LegendPlacement.RIGHT)
        .show_legend(True).calcs(["mean", "max", "lastNotNull"]).sort_by("Max").sort_desc(True)))
    if bars:
        panel = panel.draw_style(cm.GraphDrawStyle.BARS)
    if stack:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if threshold_line:
        panel = panel.thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return _panel(panel, title, description, targets, unit, dm.FieldColorModeId.PALETTE_CLASSIC, steps,
                  minimum=minimum, maximum=maximum, decimals=decimals, overrides=overrides)


def stat(title: str, description: str, expr: str, unit: str = "none", *, steps: Steps | None = None,
         legend: str = "", decimals: int | None = None,
         text_mode: cm.BigValueTextMode = cm.BigValueTextMode.AUTO,
         color_mode: cm.BigValueColorMode = cm.BigValueColorMode.VALUE) -> stat_panel.Panel:
    """The last value of one query, with its sparkline."""
    panel = (stat_panel.Panel().text_mode(text_mode).color_mode(color_mode)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _panel(panel, title, description, [q(expr, legend)], unit, dm.FieldColorModeId.THRESHOLDS, steps,
                  decimals=decimals)


def count(title: str, description: str, expr: str, steps: Steps | None = None) -> stat_panel.Panel:
    """A stat of a whole number."""
    return stat(title, description, expr, steps=steps, decimals=0)


def timeline(title: str, description: str, targets: Sequence[Query], mappings: list[dm.ValueMapping], *,
             steps: Steps | None = None) -> statetimeline.Panel:
    """A state timeline: one row per series, colored by the value mappings."""
    panel = (statetimeline.Panel().fill_opacity(80).legend(cb.VizLegendOptions().show_legend(False))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE)))
    return _panel(panel, title, description, targets, "none", dm.FieldColorModeId.THRESHOLDS, steps,
                  mappings=mappings)


def table(title: str, description: str, exprs: Sequence[str], *, hide: Iterable[str] = (),
          rename: dict[str, str] | None = None, units: dict[str, str] | None = None,
          sort_by: str | None = None) -> table_panel.Panel:
    """An instant table, one row per series. Several queries are merged into one row per label set, so they
    must have the same labels; ``rename`` maps a column (``Value #A`` is query A's value) to its title,
    ``units`` a column (by its new title) to its unit."""
    hidden = {name: True for name in ("Time", "__name__", "job", "Hostname", "UUID", *hide)}
    panel = table_panel.Panel().filterable(True)
    if len(exprs) > 1:
        panel = panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    panel = panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": hidden, "indexByName": {}, "renameByName": rename or {}}))
    if sort_by:
        panel = panel.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(True)])
    targets = [q(expr).format(PromQueryFormat.TABLE).instant() for expr in exprs]
    return _panel(panel, title, description, targets, "none", dm.FieldColorModeId.THRESHOLDS, None,
                  overrides=[override("byName", column, {"unit": unit})
                             for column, unit in (units or {}).items()])


SIMULATED_TEXT = "SIMULATED: figures made up by gpuagent's simulator, not read from real GPUs"


def simulated_banner() -> stat_panel.Panel:
    """The first panel of every dashboard: red, saying SIMULATED, while any selected agent serves the
    simulator (``gpuagent_simulated 1``); a thin green line saying the GPUs are real otherwise."""
    expr = or_zero(f"count({sel('gpuagent_simulated', NODE)} == 1)")
    mappings: list[dm.ValueMapping] = [
        dm.ValueMap(options={"0": dm.ValueMappingResult(text="Real GPUs: every selected agent reads NVML",
                                                        color="green", index=0)}),
        dm.RangeMap(options=dm.DashboardRangeMapOptions(
            from_val=1, to=1e9, result=dm.ValueMappingResult(text=SIMULATED_TEXT, color="red", index=1))),
    ]
    panel = (stat_panel.Panel().text_mode(cm.BigValueTextMode.VALUE)
             .color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _panel(panel, "Simulated nodes",
                  "Agents serving the simulator (`gpuagent_simulated 1`: backend sim, or auto on a node "
                  "without NVML) among those selected. Their figures are not real GPUs'.",
                  [q(expr)], "none", dm.FieldColorModeId.THRESHOLDS, RED_FROM_1, decimals=0,
                  mappings=mappings)


class Board:
    """A dashboard's panels, left to right in rows of 24 columns under row headers, numbered in order, under
    the simulated banner (:func:`simulated_banner`). The
    SDK lays them out: it starts a new line once a line is full, so the widths of a line must add up to 24
    (``tests/test_dashboards.py`` fails on a panel past the grid's edge)."""

    def __init__(self) -> None:
        self.dashboard = db.Dashboard("")
        self._ids = 0
        self.add(24, 2, simulated_banner())  # first, above every row: simulated figures never pass for real

    def _id(self) -> int:
        self._ids += 1
        return self._ids

    def row(self, title: str) -> None:
        self.dashboard.with_row(db.Row(title).id(self._id()))

    def add(self, w: int, h: int, panel: Panel) -> None:
        self.dashboard.with_panel(panel.span(w).height(h).id(self._id()))


# -- variables --------------------------------------------------------------------------------------------

DATASOURCE_VAR = db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def variable(name: str, label: str, query: str, description: str, *, all_value: str | None = ".*",
             sort: dm.VariableSort = dm.VariableSort.ALPHABETICAL_ASC) -> db.QueryVariable:
    """A multi-value ``label_values`` variable with All selected. ``all_value`` ``.*`` (the default) also
    matches a series without the label; None makes All the list of values found (for short lists)."""
    v = (db.QueryVariable(name).label(label).description(description).datasource(DATASOURCE).query(query)
         .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
         .include_all(True).multi(True)
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(sort))
    return v if all_value is None else v.all_value(all_value)


CLUSTER_VAR = variable(
    "cluster", "Cluster", "label_values(gpuagent_up, cluster)",
    "The `cluster` label where Prometheus adds one (external or target labels); without it only All is "
    "offered, and All matches series without the label.")
NODE_VAR = variable("node", "Node", 'label_values(gpuagent_up{cluster=~"$cluster"}, instance)',
                    "The agents' scrape targets (`instance`).")
GPU_VAR = variable("gpu", "GPU", f"label_values(gpuagent_gpu_info{{{NODE}}}, gpu)",
                   "GPU index (the `gpu` label of dcgm-exporter's series).",
                   sort=dm.VariableSort.NUMERICAL_ASC)
NAMESPACE_VAR = variable("namespace", "Namespace", f"label_values(gpuagent_pod_info{{{NODE}}}, namespace)",
                         "Namespaces of the pods holding or using GPUs.")
POD_VAR = variable("pod", "Pod", f'label_values(gpuagent_pod_info{{{NODE}, namespace=~"$namespace"}}, pod)',
                   "Pods holding or using GPUs.")
JOB_VAR = variable("job", "Job", 'label_values(gpuagent_up{cluster=~"$cluster"}, job)',
                   "The agents' scrape job(s): picks their `up` and `scrape_*` series out of every target's.",
                   all_value=None)


def dashboard(uid: str, title: str, description: str, board: Board, variables: Sequence[db.QueryVariable],
              tags: Sequence[str]) -> dm.Dashboard:
    built = (board.dashboard.title(title).uid(uid).description(description).tags([*TAGS, *tags])
             .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-1h", "now")
             .annotation(db.AnnotationQuery().name("Annotations & Alerts").built_in(1).enable(True).hide(True)
                         .icon_color("rgba(0, 211, 255, 1)").type("dashboard")
                         .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --")))
             .link(db.DashboardLink("gpuagent").type(dm.DashboardLinkType.DASHBOARDS).icon("external link")
                   .tags(["gpuagent"]).include_vars(True).keep_time(True))
             .with_variable(DATASOURCE_VAR))
    for v in variables:
        built = built.with_variable(v)
    model = built.build()
    model.schema_version = SCHEMA_VERSION
    return model


# -- 1. GPU nodes -----------------------------------------------------------------------------------------

def g(metric: str, *extra: str) -> str:
    return sel(metric, GPU, *extra)


def node_overview() -> dm.Dashboard:
    b = Board()
    used, free = g("DCGM_FI_DEV_FB_USED"), g("DCGM_FI_DEV_FB_FREE")
    power, energy = g("DCGM_FI_DEV_POWER_USAGE"), g("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")

    b.row("Overview")
    b.add(3, 4, count("GPUs", "GPUs the agents see, lost ones included (`gpuagent_gpu_info`).",
                      f"count({g('gpuagent_gpu_info')})"))
    b.add(3, 4, count("Unhealthy GPUs", "GPUs whose `gpuagent_gpu_health` is not ok: lost, unresponsive "
                      "(an NVML call hung) or error.",
                      f"sum({g('gpuagent_gpu_health', lbl('state', '!=', 'ok'))})", RED_FROM_1))
    b.add(3, 4, count("Stale GPUs", "GPUs served with values from an earlier poll (`gpuagent_gpu_stale`).",
                      f"sum({g('gpuagent_gpu_stale')})", ORANGE_FROM_1))
    b.add(3, 4, stat("Mean GPU utilization", "Mean `DCGM_FI_DEV_GPU_UTIL` of the selected GPUs.",
                     f"avg({g('DCGM_FI_DEV_GPU_UTIL')})", "percent",
                     steps=thresholds((None, "blue"), (50, "green"), (90, "orange"))))
    b.add(3, 4, stat("Framebuffer used", "Used share of the selected GPUs' framebuffer: used/(used + free).",
                     f"sum({used}) / (sum({used}) + sum({free}))", "percentunit",
                     steps=thresholds((None, "green"), (0.8, "orange"), (0.95, "red"))))
    b.add(3, 4, stat("Power draw", "Sum of `DCGM_FI_DEV_POWER_USAGE`.", f"sum({power})", "watt"))
    b.add(3, 4, stat("Hottest GPU", "Highest `DCGM_FI_DEV_GPU_TEMP` (thresholds of dcgm-exporter's "
                     "dashboard: 83 and 87 °C).", f"max({g('DCGM_FI_DEV_GPU_TEMP')})", "celsius",
                     steps=thresholds((None, "green"), (83, "orange"), (87, "red"))))
    b.add(3, 4, count("XID errors in range", "XIDs the agents counted over the time range "
                      "(`gpuagent_gpu_xid_errors_total`, from NVML events); 0 when there were none.",
                      or_zero(f"sum({increase(g('gpuagent_gpu_xid_errors_total'), '$__range')})"),
                      RED_FROM_1))

    b.row("Utilization")
    b.add(12, 8, ts("GPU utilization", "`DCGM_FI_DEV_GPU_UTIL`: share of time a kernel ran (NVML).",
                    [q(g("DCGM_FI_DEV_GPU_UTIL"), GPU_LEGEND)], "percent", maximum=100))
    b.add(12, 8, ts("SM active", "`DCGM_FI_PROF_SM_ACTIVE`: ratio of cycles an SM has a warp assigned (NVML "
                    "GPM: Hopper and later, per MIG instance on MIG GPUs; empty where unsupported).",
                    [q(g("DCGM_FI_PROF_SM_ACTIVE"), INSTANCE_LEGEND)], "percentunit", maximum=1))
    b.add(12, 8, ts("Tensor core utilization", "`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE` (GPM).",
                    [q(g("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), INSTANCE_LEGEND)], "percentunit", maximum=1))
    b.add(12, 8, ts("SM occupancy", "`DCGM_FI_PROF_SM_OCCUPANCY`: resident warps per SM over the most (GPM).",
                    [q(g("DCGM_FI_PROF_SM_OCCUPANCY"), INSTANCE_LEGEND)], "percentunit", maximum=1))
    pipes = [("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "graphics engine"),
             ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor"), ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64"),
             ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32"), ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16"),
             ("DCGM_FI_PROF_DRAM_ACTIVE", "DRAM")]
    percents = [("DCGM_FI_DEV_MEM_COPY_UTIL", "memory copy"), ("DCGM_FI_DEV_ENC_UTIL", "encoder"),
                ("DCGM_FI_DEV_DEC_UTIL", "decoder")]
    b.add(12, 8, ts("Engines and pipes, mean of the selected GPUs",
                    "Profiling ratios (GPM) averaged over the selected GPUs and MIG instances, with the "
                    "memory copy, encoder and decoder utilization (NVML percent, here 0-1).",
                    [q(f"avg({g(m)})", name) for m, name in pipes]
                    + [q(f"avg({g(m)}) / 100", name) for m, name in percents], "percentunit", maximum=1))
    b.add(12, 8, ts("Memory bandwidth utilization",
                    "`DCGM_FI_DEV_MEM_COPY_UTIL`: share of time device memory was read or written (NVML).",
                    [q(g("DCGM_FI_DEV_MEM_COPY_UTIL"), GPU_LEGEND)], "percent", maximum=100))

    b.row("Framebuffer memory")
    b.add(8, 8, ts("Framebuffer used", "`DCGM_FI_DEV_FB_USED` (MiB), per GPU, or per MIG instance.",
                   [q(used, INSTANCE_LEGEND)], "mbytes"))
    b.add(8, 8, ts("Framebuffer free", "`DCGM_FI_DEV_FB_FREE` (MiB), per GPU, or per MIG instance.",
                   [q(free, INSTANCE_LEGEND)], "mbytes"))
    b.add(8, 8, ts("Framebuffer used share", "used / (used + free), per GPU, or per MIG instance.",
                   [q(f"{used} / ({used} + {free})", INSTANCE_LEGEND)], "percentunit", maximum=1,
                   steps=thresholds((None, "green"), (0.95, "red")), threshold_line=True))

    b.row("Power and temperature")
    b.add(8, 8, ts("Power draw", "`DCGM_FI_DEV_POWER_USAGE`.", [q(power, GPU_LEGEND)], "watt"))
    b.add(8, 8, ts("Power draw / power limit",
                   "`DCGM_FI_DEV_POWER_USAGE` over the power management limit "
                   "(`gpuagent_gpu_power_limit_watts`).",
                   [q(f"{power} / on(cluster, instance, gpu, UUID) {g('gpuagent_gpu_power_limit_watts')}",
                      GPU_LEGEND)],
                   "percentunit", maximum=1, steps=thresholds((None, "green"), (0.95, "orange")),
                   threshold_line=True))
    b.add(8, 8, ts("Power from the energy counter",
                   "Mean power between samples from `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ since boot): "
                   "it catches the peaks the power gauge misses.",
                   [q(f"{rate(energy)} / 1000", GPU_LEGEND)], "watt"))
    b.add(4, 8, stat("Energy in range", "Energy the selected GPUs used over the time range.",
                     f"sum({increase(energy, '$__range')}) / 3600000000", "kwatth", decimals=2))
    b.add(10, 8, ts("GPU temperature", "`DCGM_FI_DEV_GPU_TEMP`.", [q(g("DCGM_FI_DEV_GPU_TEMP"), GPU_LEGEND)],
                    "celsius", minimum=None, steps=thresholds((None, "green"), (83, "orange"), (87, "red")),
                    threshold_line=True))
    b.add(10, 8, ts("Memory temperature", "`DCGM_FI_DEV_MEMORY_TEMP` (HBM).",
                    [q(g("DCGM_FI_DEV_MEMORY_TEMP"), GPU_LEGEND)], "celsius", minimum=None))

    b.row("Clocks and throttling")
    b.add(12, 8, ts("SM clock", "`DCGM_FI_DEV_SM_CLOCK` (MHz, shown in Hz).",
                    [q(f"{g('DCGM_FI_DEV_SM_CLOCK')} * 1000000", GPU_LEGEND)], "hertz"))
    b.add(12, 8, ts("Memory clock", "`DCGM_FI_DEV_MEM_CLOCK` (MHz, shown in Hz).",
                    [q(f"{g('DCGM_FI_DEV_MEM_CLOCK')} * 1000000", GPU_LEGEND)], "hertz"))
    b.add(12, 8, ts("GPUs per clock event reason",
                    "How many of the selected GPUs have each clock event (throttle) reason active: "
                    "`gpuagent_gpu_clock_event_active`, NVML's reason bits under dcgm-exporter's names.",
                    [q(by("sum", "reason", g("gpuagent_gpu_clock_event_active")), "{{reason}}")], "none",
                    decimals=0))
    slowdown = g("gpuagent_gpu_clock_event_active", lbl("reason", "=~", SLOWDOWN_REASONS))
    b.add(12, 8, timeline("Clocks held down", "Whether a reason among "
                          f"{SLOWDOWN_REASONS.replace('|', ', ')} holds a GPU's clocks down.",
                          [q(by("max", PER_GPU, slowdown), GPU_LEGEND)],
                          states((0, "full speed", "green"), (1, "held down", "red"))))

    b.row("Errors: XID, ECC, PCIe")
    b.add(12, 8, timeline("Last XID", "`DCGM_FI_DEV_XID_ERRORS`: each GPU's last XID within the agent's XID "
                          "window (unlike dcgm-exporter's, it returns to 0 once the window has passed).",
                          [q(by("max", PER_GPU, g("DCGM_FI_DEV_XID_ERRORS")), GPU_LEGEND)],
                          states((0, "none", "green")), steps=thresholds((None, "red"))))
    xids = by("sum", PER_GPU + ", xid", g("DCGM_EXP_XID_ERRORS_COUNT"))
    b.add(12, 8, ts("XIDs in the agent's window, by code",
                    "`DCGM_EXP_XID_ERRORS_COUNT`: XIDs per GPU and code within the agent's window "
                    "(`window_size_in_ms`, 5 min by default); `none` where there were none.",
                    [q(f'label_replace({xids}, "xid", "none", "xid", "")', "GPU {{gpu}} · XID {{xid}}")],
                    "none", decimals=0))
    b.add(8, 8, ts("ECC errors (volatile)",
                   "New single-bit (corrected) and double-bit (uncorrected) ECC errors per interval "
                   "(`DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`, `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`).",
                   [q(by("sum", PER_GPU, increase(g(f"DCGM_FI_DEV_ECC_{kind}_VOL_TOTAL"))),
                      f"{kind} · {GPU_LEGEND}") for kind in ("SBE", "DBE")], "none", bars=True))
    b.add(8, 8, ts("PCIe replays", "New PCIe replays per interval (`DCGM_FI_DEV_PCIE_REPLAY_COUNTER`).",
                   [q(by("sum", PER_GPU, increase(g("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"))),
                      GPU_LEGEND)],
                   "none", bars=True))
    memory_errors = {
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "SBE (aggregate)",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "DBE (aggregate)",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "rows remapped (corrected)",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "rows remapped (uncorrected)",
        "gpuagent_gpu_remapped_rows_pending": "remap pending",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remap failed",
    }
    b.add(8, 8, table("Memory errors and row remapping",
                      "Lifetime ECC counts and row remapping per GPU (Ampere and later remap rows; older "
                      "GPUs retire pages instead: `DCGM_FI_DEV_RETIRED_*`).",
                      [by("max", PER_GPU, g(m)) for m in memory_errors],
                      rename={f"Value #{chr(ord('A') + i)}": title
                              for i, title in enumerate(memory_errors.values())},
                      sort_by="DBE (aggregate)"))

    b.row("Health and inventory")
    b.add(12, 8, timeline("GPU health", "`gpuagent_gpu_health`: ok; unresponsive (an NVML call hung past its "
                          "timeout: last values kept); lost (off the bus: its device series are gone); error "
                          "(its read failed).",
                          [q(state_code("gpuagent_gpu_health", GPU, "state",
                                        ("unresponsive", "lost", "error"), "instance, gpu"), GPU_LEGEND)],
                          states((0, "ok", "green"), (1, "unresponsive", "orange"), (2, "lost", "red"),
                                 (3, "error", "red"))))
    b.add(12, 8, timeline("Stale values", "`gpuagent_gpu_stale`: 1 while a GPU's values are from an earlier "
                          "poll.",
                          [q(by("max", PER_GPU, g("gpuagent_gpu_stale")), GPU_LEGEND)],
                          states((0, "fresh", "green"), (1, "stale", "orange"))))
    b.add(24, 7, table("GPU inventory", "`gpuagent_gpu_info`: model, PCI bus, driver, MIG mode, GPM support.",
                       [g("gpuagent_gpu_info")], hide=("Value",)))

    b.row("MIG, tenants and processes")
    b.add(4, 8, count("MIG instances", "MIG GPU instances on the selected GPUs (`gpuagent_mig_info`); 0 "
                      "without MIG.", or_zero(f"count({g('gpuagent_mig_info')})")))
    b.add(10, 8, ts("MIG instances per GPU", "GPU instances per GPU (`gpuagent_mig_info`); 0 on the others.",
                    [q(f"{by('count', PER_GPU, g('gpuagent_mig_info'))} "
                       f"or {by('count', PER_GPU, g('gpuagent_gpu_info'))} * 0", GPU_LEGEND)],
                    "none", decimals=0))
    b.add(10, 8, table("Framebuffer per GPU and MIG instance", "`DCGM_FI_DEV_FB_USED` and `FB_FREE` per GPU, "
                       "or per MIG instance (profile, GPU instance id).",
                       [by("sum", PER_GPU + ", GPU_I_PROFILE, GPU_I_ID", used),
                        by("sum", PER_GPU + ", GPU_I_PROFILE, GPU_I_ID", free)],
                       rename={"Value #A": "used", "Value #B": "free", "GPU_I_PROFILE": "MIG profile",
                               "GPU_I_ID": "GPU instance"}, units={"used": "mbytes", "free": "mbytes"}))
    b.add(12, 8, ts("Tenants per GPU", "`gpuagent_gpu_tenants`: pods allocated to or using each GPU (more "
                    "than 1: a shared GPU).", [q(g("gpuagent_gpu_tenants"), GPU_LEGEND)], "none", decimals=0))
    b.add(12, 8, ts("Processes per GPU", "`gpuagent_gpu_processes`: processes with a context on each GPU.",
                    [q(g("gpuagent_gpu_processes"), GPU_LEGEND)], "none", decimals=0))

    b.row("Interconnect")
    for link in ("PCIe", "NVLink"):
        tx, rx = (f"DCGM_FI_PROF_{link.upper()}_{way}_BYTES" for way in ("TX", "RX"))
        b.add(12, 8, ts(f"{link} throughput", f"`{tx}` above the axis, `{rx}` below (GPM).",
                        [q(g(tx), "tx · " + INSTANCE_LEGEND), q(f"-{g(rx)}", "rx · " + INSTANCE_LEGEND)],
                        "Bps", minimum=None))

    return dashboard("gpuagent-node-overview", "gpuagent / GPU nodes",
                     "The GPUs of the nodes running gpuagent: utilization, memory, power, clocks, errors, "
                     "health, MIG and tenants, from its dcgm-exporter compatible and gpuagent_* series.",
                     b, [CLUSTER_VAR, NODE_VAR, GPU_VAR], ["dcgm"])


# -- 2. pods ----------------------------------------------------------------------------------------------

def p(metric: str, *extra: str) -> str:
    return sel(metric, POD, *extra)


def pg(metric: str, *extra: str) -> str:
    return sel(metric, POD_GPU, *extra)


def pods() -> dm.Dashboard:
    b = Board()

    b.row("Overview")
    b.add(3, 4, count("Pods on GPUs", "Pods with processes on the selected GPUs.",
                      or_zero(f"count({by('count', PER_POD, pg('gpuagent_pod_gpu_processes'))})")))
    b.add(3, 4, count("GPUs allocated", "Devices the kubelet allocated to the selected pods "
                      "(`gpuagent_pod_allocated_gpus`).", f"sum({p('gpuagent_pod_allocated_gpus')})"))
    b.add(3, 4, count("Shared GPUs", "GPUs with more than one tenant pod (`gpuagent_gpu_tenants`).",
                      or_zero(f"count({sel('gpuagent_gpu_tenants', GPU)} > 1)")))
    b.add(3, 4, count("Pods throttled", "Pods in a freeze duty cycle on some GPU now "
                      "(`gpuagent_pod_gpu_frozen_ratio` > 0; in audit mode: would be).",
                      or_zero(f"count({by('count', PER_POD, pg('gpuagent_pod_gpu_frozen_ratio') + ' > 0')})"),
                      ORANGE_FROM_1))
    b.add(3, 4, count("Pods over memory limit", "Pods past `ok` on the memory ladder "
                      "(`gpuagent_pod_gpu_memory_limit_stage`).",
                      or_zero(f"count({p('gpuagent_pod_gpu_memory_limit_stage', lbl('stage', '!=', 'ok'))}"
                              " == 1)"), RED_FROM_1))
    b.add(3, 4, count("Policy problems", "`gpuagent_pod_policy_problem`: annotations that could not be used "
                      "(the pod gets the node default).",
                      or_zero(f"count({p('gpuagent_pod_policy_problem')})"), ORANGE_FROM_1))
    b.add(3, 4, count("Unallocated GPU use", "`gpuagent_pod_gpu_unallocated_use`: pods running on a GPU the "
                      "kubelet did not allocate to them.",
                      or_zero(f"count({pg('gpuagent_pod_gpu_unallocated_use')})"), RED_FROM_1))
    modes = sel("gpuagent_enforcement_mode", NODE)
    off = f"count({sel('gpuagent_up', NODE)} unless on(cluster, instance) {modes})"  # off: no mode series
    b.add(3, 4, stat("Enforcement mode", "Agents per enforcement mode (`gpuagent_enforcement_mode`; an agent "
                     "with enforcement off exports none).",
                     f'{by("count", "mode", modes + " == 1")} or label_replace({off}, "mode", "off", "", "")',
                     legend="{{mode}}", text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
                     color_mode=cm.BigValueColorMode.NONE))

    b.row("GPU memory")
    memory = p("gpuagent_pod_gpu_memory_used_bytes")  # every GPU of the pod: its limit covers them all
    limit = by("max", PER_POD, p("gpuagent_pod_gpu_memory_limit_bytes"))
    b.add(12, 9, ts("GPU memory per pod, and limits",
                    "`gpuagent_pod_gpu_memory_used_bytes` over the selected GPUs; dashed: the pod's limit "
                    "(`gpuagent.io/gpu-memory` or the node default).",
                    [q(by("sum", PER_POD, pg("gpuagent_pod_gpu_memory_used_bytes")),
                       POD_LEGEND), q(limit, POD_LEGEND + " limit")], "bytes", overrides=[LIMIT_DASHED]))
    b.add(12, 9, ts("GPU memory per container", "`gpuagent_container_gpu_memory_used_bytes`.",
                    [q(by("sum", PER_POD + ", container",
                          pg("gpuagent_container_gpu_memory_used_bytes")), POD_LEGEND + "/{{container}}")],
                    "bytes"))
    b.add(12, 8, ts("GPU memory used / limit", "A pod's GPU memory (all its GPUs) over its limit: above 1 "
                    "the memory ladder starts (warn, then SIGTERM and SIGKILL, or an eviction).",
                    [q(f"{by('sum', PER_POD, memory)} / {limit}", POD_LEGEND)],
                    "percentunit",
                    steps=thresholds((None, "green"), (0.9, "orange"), (1, "red")), threshold_line=True))
    ladder = ("warned", "terminating", "killed", "evicted")
    b.add(12, 8, timeline("Memory ladder stage", "`gpuagent_pod_gpu_memory_limit_stage`: ok, warned, "
                          "terminating (SIGTERM sent), killed (SIGKILL sent), evicted; in audit mode, where "
                          "the ladder would be.",
                          [q(state_code("gpuagent_pod_gpu_memory_limit_stage", POD, "stage", ladder,
                                        "instance, namespace, pod"), POD_LEGEND)],
                          states((0, "ok", "green"), (1, "warned", "yellow"), (2, "terminating", "orange"),
                                 (3, "killed", "red"), (4, "evicted", "purple"))))

    b.row("SM time and shares")
    b.add(12, 8, ts("SM use per pod", "`gpuagent_pod_gpu_sm_utilization_ratio`: share of each GPU's SM time "
                    "the pod's processes used (NVML per-process samples; absent on MIG).",
                    [q(by("sum", PER_POD + ", gpu",
                          pg("gpuagent_pod_gpu_sm_utilization_ratio")), POD_GPU_LEGEND)],
                    "percentunit", maximum=1))
    b.add(12, 8, ts("SM use per container", "`gpuagent_container_gpu_sm_utilization_ratio`.",
                    [q(by("sum", PER_POD + ", container, gpu",
                          pg("gpuagent_container_gpu_sm_utilization_ratio")),
                       POD_LEGEND + "/{{container}} · GPU {{gpu}}")], "percentunit", maximum=1))
    achieved, share = pg("gpuagent_pod_gpu_share_achieved_ratio"), pg("gpuagent_pod_gpu_share_limit_ratio")
    b.add(12, 8, ts("Share achieved, and limits", "`gpuagent_pod_gpu_share_achieved_ratio`: the pod's "
                    "measured share of the GPU's SM time over the controller's window; dashed: its share "
                    "limit (`gpuagent.io/gpu-share`).",
                    [q(achieved, POD_GPU_LEGEND), q(share, POD_GPU_LEGEND + " limit")], "percentunit",
                    maximum=1, overrides=[LIMIT_DASHED]))
    b.add(12, 8, ts("Share achieved / limit", "Above 1 the pod uses more than its share: it is the one "
                    "throttled.", [q(f"{achieved} / {share}", POD_GPU_LEGEND)], "percentunit",
                    steps=thresholds((None, "green"), (1.05, "orange")), threshold_line=True))
    b.add(12, 8, ts("Frozen ratio", "`gpuagent_pod_gpu_frozen_ratio`: part of each period the pod's cgroups "
                    "are frozen (in audit mode: would be).",
                    [q(pg("gpuagent_pod_gpu_frozen_ratio"), POD_GPU_LEGEND)], "percentunit", maximum=1))
    b.add(12, 8, ts("Throttled time", "Share of wall time the pod spent frozen: "
                    "rate(`gpuagent_pod_gpu_throttled_seconds_total`); 0 in audit mode.",
                    [q(by("sum", PER_POD + ", gpu",
                          rate(pg("gpuagent_pod_gpu_throttled_seconds_total"))), POD_GPU_LEGEND)],
                    "percentunit", maximum=1))
    b.add(12, 8, timeline("Latency class standing", "`gpuagent_pod_gpu_latency_standing` of each "
                          "latency-sensitive pod on its GPU: exempt (never frozen, its requests preempt the "
                          "batch pods), over (over its share: it preempts no one), capped (it takes turns at "
                          "its share); `(no latency class)` when no pod is in it.",
                          [q(state_code("gpuagent_pod_gpu_latency_standing", POD_GPU, "standing",
                                        ("over", "capped"), "instance, namespace, pod, gpu")
                             + ' or on() label_replace(vector(-1), "pod", "(no latency class)", "", "")',
                             POD_GPU_LEGEND)],
                          states((-1, "no pod in the class", "text"), (0, "exempt", "green"),
                                 (1, "over", "orange"), (2, "capped", "red"))))
    b.add(12, 8, ts("Latency class preemptions", "rate(`gpuagent_pod_gpu_preemptions_total`): a "
                    "latency-sensitive pod's requests a second that held its GPU's batch pods frozen (what "
                    "it costs them is in their throttled time); `(no latency class)` when no pod is in it.",
                    [q(or_none(by("sum", PER_POD + ", gpu", rate(pg("gpuagent_pod_gpu_preemptions_total"))),
                               "pod", "(no latency class)"), POD_GPU_LEGEND)], "reqps"))

    b.row("Enforcement")
    actions = sel("gpuagent_enforcement_actions_total", NODE)
    b.add(12, 8, ts("Enforcement actions by outcome",
                    "`gpuagent_enforcement_actions_total` per interval. Outcomes: done, audit (decided, not "
                    "carried out), refused, failed, gone, blocked, rate_limited; `(no actions)` when none.",
                    [q(or_none(by("sum", "action, outcome", increase(actions)), "outcome", "(no actions)"),
                       "{{outcome}} {{action}}")], "none", bars=True, stack=True))
    b.add(4, 8, count("Enforcement actions in range", "Actions of any outcome over the time range.",
                      or_zero(f"sum({increase(actions, '$__range')})")))
    b.add(8, 8, ts("Frozen cgroups", "`gpuagent_enforcement_frozen_cgroups`: cgroups in a freeze duty cycle.",
                   [q(by("sum", PER_AGENT, sel("gpuagent_enforcement_frozen_cgroups", NODE)),
                      "{{instance}}")],
                   "none", decimals=0))

    b.row("Allocations and processes")
    # A merged table's queries have the same labels: the pod's info labels are joined onto the others.
    info = by("max", PER_POD + ", uid, qos, names_from", p("gpuagent_pod_info"))
    with_info = "* on(cluster, instance, namespace, pod) group_left(uid, qos, names_from)"
    b.add(24, 8, table("Pods", "Pods holding or using GPUs: `gpuagent_pod_info` (`names from`: kubelet, API "
                       "server, or cgroup when known by UID only), GPUs allocated, GPU memory and SM time "
                       "used.",
                       [info] + [f"{by('sum', PER_POD, m)} {with_info} {info}" for m in (
                           p("gpuagent_pod_allocated_gpus"), memory,
                           p("gpuagent_pod_gpu_sm_utilization_ratio"))],
                       hide=("Value #A",),
                       rename={"Value #B": "GPUs allocated", "Value #C": "GPU memory", "Value #D": "SM time",
                               "names_from": "names from"},
                       units={"GPU memory": "bytes", "SM time": "percentunit"}, sort_by="GPU memory"))
    b.add(24, 7, table("Allocated devices", "`gpuagent_pod_gpu_allocated`: the devices the kubelet allocated "
                       "to each container (`GPU-…::n`: a time-slicing or MPS replica; `MIG-…`: a MIG "
                       "device).",
                       [by("max", PER_POD + ", container, device_id",
                           p("gpuagent_pod_gpu_allocated"))],
                       hide=("Value",)))
    process = ("gpuagent_process_gpu_memory_used_bytes", "gpuagent_process_sm_utilization_ratio",
               "gpuagent_process_memory_utilization_ratio")
    b.add(24, 10, table("Processes", "GPU processes of the selected pods (with All: every GPU process, of "
                        "other workloads too): GPU memory, and the share of the last NVML sample period it "
                        "ran kernels or used memory bandwidth (absent on MIG).",
                        [f"max without (UUID, Hostname) ({pg(m)})" for m in process],
                        rename={"Value #A": "GPU memory", "Value #B": "SM", "Value #C": "memory bandwidth"},
                        units={"GPU memory": "bytes", "SM": "percentunit", "memory bandwidth": "percentunit"},
                        sort_by="GPU memory"))

    return dashboard("gpuagent-pods", "gpuagent / Pods",
                     "GPU use per pod and container against their limits, shares and throttling, the memory "
                     "ladder, enforcement actions, allocations and processes.",
                     b, [CLUSTER_VAR, NODE_VAR, NAMESPACE_VAR, POD_VAR, GPU_VAR], ["kubernetes"])


# -- 3. the agent -----------------------------------------------------------------------------------------

def n(metric: str, *extra: str) -> str:
    return sel(metric, NODE, *extra)


def agent() -> dm.Dashboard:
    b = Board()
    buckets = n("gpuagent_poll_duration_seconds_bucket")
    nvml_seconds = n("gpuagent_nvml_call_duration_seconds_sum")
    nvml_calls = n("gpuagent_nvml_call_duration_seconds_count")
    per_agent = "{{instance}}"
    per_function = "{{function}} · {{instance}}"

    b.row("Overview")
    b.add(4, 4, count("Agents with NVML up", "`gpuagent_up`: agents whose last poll of NVML succeeded.",
                      f"sum({n('gpuagent_up')})"))
    b.add(4, 4, count("Agents with NVML down", "Agents whose last poll of NVML failed (driver not loaded, "
                      "version mismatch): they serve the last snapshot, stale.",
                      or_zero(f"count({n('gpuagent_up')} == 0)"), RED_FROM_1))
    b.add(4, 4, stat("Oldest snapshot", "Highest `gpuagent_snapshot_age_seconds`: time since the snapshot "
                     "being served was taken.", f"max({n('gpuagent_snapshot_age_seconds')})", "s",
                     steps=thresholds((None, "green"), (5, "orange"), (30, "red"))))
    b.add(4, 4, count("Stale snapshots", "Agents whose snapshot has a GPU read that did not finish in time "
                      "(`gpuagent_snapshot_stale`).", f"sum({n('gpuagent_snapshot_stale')})", ORANGE_FROM_1))
    b.add(4, 4, stat("Poll duration p99", "99th percentile of `gpuagent_poll_duration_seconds`, all agents.",
                     f"histogram_quantile(0.99, {by('sum', 'le', rate(buckets))})", "s"))
    b.add(4, 4, stat("NVML time, busiest agent", "Share of wall time the busiest agent spends in NVML calls "
                     "(they hold the driver's lock); the budget is 1 %.",
                     f"max({by('sum', PER_AGENT, rate(nvml_seconds))})", "percentunit",
                     steps=thresholds((None, "green"), (0.01, "orange"), (0.05, "red"))))

    b.row("Polling")
    b.add(8, 8, ts("Snapshot age", "`gpuagent_snapshot_age_seconds`.",
                   [q(n("gpuagent_snapshot_age_seconds"), per_agent)], "s"))
    mean = (f"{by('sum', PER_AGENT, rate(n('gpuagent_poll_duration_seconds_sum')))} / "
            f"{by('sum', PER_AGENT, rate(n('gpuagent_poll_duration_seconds_count')))}")
    b.add(8, 8, ts("Poll duration", "Quantiles of `gpuagent_poll_duration_seconds` (a histogram), and its "
                   "mean.",
                   [q(f"histogram_quantile({quantile}, {by('sum', PER_AGENT + ', le', rate(buckets))})",
                      f"p{round(quantile * 100)} · {per_agent}") for quantile in (0.5, 0.9, 0.99)]
                   + [q(mean, f"mean · {per_agent}")], "s"))
    b.add(8, 8, ts("Polls per second", "rate(`gpuagent_polls_total`); dashed: the configured rate, "
                   "1 / `gpuagent_poll_interval_seconds`.",
                   [q(rate(n("gpuagent_polls_total")), per_agent),
                    q(f"1 / {n('gpuagent_poll_interval_seconds')}", f"{per_agent} configured")], "hertz",
                   overrides=[dashed("/ configured$/")]))

    b.row("Sources and collectors")
    ok_or_failing = states((0, "failing", "red"), (1, "ok", "green"))
    b.add(12, 8, timeline("Source success", "`gpuagent_source_success`: whether each source's last run "
                          "succeeded (nvml, xid_events, pod_resources, ...).",
                          [q(n("gpuagent_source_success"), f"{{{{source}}}} · {per_agent}")], ok_or_failing))
    b.add(12, 8, ts("Source duration", "`gpuagent_source_duration_seconds`: each source's last run.",
                    [q(n("gpuagent_source_duration_seconds"), f"{{{{source}}}} · {per_agent}")], "s"))
    b.add(12, 8, timeline("Collector success", "`gpuagent_collector_success`: a failing collector's families "
                          "are left out of the scrape; the rest is served.",
                          [q(n("gpuagent_collector_success"), f"{{{{collector}}}} · {per_agent}")],
                          ok_or_failing))
    b.add(12, 8, ts("Collector duration", "`gpuagent_collector_duration_seconds`: time each collector took "
                    "to render the snapshot in a scrape.",
                    [q(n("gpuagent_collector_duration_seconds"), f"{{{{collector}}}} · {per_agent}")], "s"))

    b.row("NVML")
    b.add(12, 8, ts("NVML time per function", "Share of wall time spent in each NVML function: "
                    "rate(`gpuagent_nvml_call_duration_seconds_sum`). NVML calls hold the driver's lock; "
                    "dashed: the 1 % budget.",
                    [q(by("sum", PER_FUNCTION, rate(nvml_seconds)), per_function)], "percentunit",
                    stack=True, steps=thresholds((None, "green"), (0.01, "red")), threshold_line=True))
    b.add(12, 8, ts("NVML calls per second", "rate(`gpuagent_nvml_call_duration_seconds_count`), per "
                    "function.",
                    [q(by("sum", PER_FUNCTION, rate(nvml_calls)), per_function)], "ops"))
    b.add(12, 8, ts("NVML mean call duration", "Mean time of one call of each NVML function.",
                    [q(f"{by('sum', PER_FUNCTION, rate(nvml_seconds))} / "
                       f"{by('sum', PER_FUNCTION, rate(nvml_calls))}", per_function)], "s"))
    errors = by("sum", PER_FUNCTION + ", code", increase(n("gpuagent_nvml_errors_total")))
    b.add(12, 8, ts("NVML errors", "`gpuagent_nvml_errors_total` per interval, by function and error; "
                    "`(no errors)` when none. NOT_SUPPORTED is no error: the field is just absent.",
                    [q(or_none(errors, "function", "(no errors)"), "{{function}} {{code}} {{instance}}")],
                    "none", bars=True))

    b.row("Scrapes")
    b.add(8, 8, timeline("Scrape target up", "`up` of the agents' targets: down means Prometheus could not "
                         "scrape the agent at all (then `gpuagent_up` has no data).",
                         [q(sel("up", SCRAPE), per_agent)], states((0, "down", "red"), (1, "up", "green"))))
    b.add(8, 8, ts("Scrape duration", "`scrape_duration_seconds`: a scrape renders the last snapshot, it "
                   "never calls NVML.", [q(sel("scrape_duration_seconds", SCRAPE), per_agent)], "s"))
    b.add(8, 8, ts("Samples per scrape", "`scrape_samples_scraped`: the agent's series.",
                   [q(sel("scrape_samples_scraped", SCRAPE), per_agent)], "none", decimals=0))
    version = by("max", PER_AGENT + ", version", n("gpuagent_build_info"))
    b.add(24, 6, table("Agents", "Version (`gpuagent_build_info`) and poll interval of each agent.",
                       [version, f"{by('max', PER_AGENT, n('gpuagent_poll_interval_seconds'))} "
                                 f"* on(cluster, instance) group_left(version) {version}"],
                       hide=("Value #A",), rename={"Value #B": "poll interval"},
                       units={"poll interval": "s"}))

    return dashboard("gpuagent-agent", "gpuagent / Agent health",
                     "The agent itself: NVML up, snapshot age, polls, sources, collectors, time spent in "
                     "NVML and its errors, scrapes.",
                     b, [CLUSTER_VAR, NODE_VAR, JOB_VAR], ["monitoring"])


# -- 4. GPU accounting ------------------------------------------------------------------------------------

ACCT = NODE + ', namespace=~"$namespace"'
PER_NAMESPACE = "cluster, namespace"
PER_ACCT_POD = "cluster, namespace, pod"
HOURS = "suffix: GPU-h"

ACCT_NAMESPACE_VAR = variable(
    "namespace", "Namespace", f"label_values(gpuagent_pod_gpu_allocated_seconds_total{{{NODE}}}, namespace)",
    "Namespaces with accounting series in the time range (ended pods' too).")


def acct(quantity: str) -> str:
    """A per-pod accounting counter, ``gpuagent_pod_gpu_<quantity>_total``, of the selected namespaces."""
    return sel(f"gpuagent_pod_gpu_{quantity}_total", ACCT)


def acct_sum(quantity: str, labels: str, window: str, divisor: str = "", fn: str = "increase") -> str:
    """``sum by (labels) (fn(counter[window]))``, divided by ``divisor`` (``3600``: seconds to hours)."""
    expr = f"sum by ({labels}) ({rate(acct(quantity), fn, window)})" if labels else \
        f"sum({rate(acct(quantity), fn, window)})"
    return f"{expr} / {divisor}" if divisor else expr


def efficiency(labels: str, window: str, fn: str = "increase") -> str:
    """Busy over allocated GPU-time, counting only GPUs whose busy time is known (MIG without GPM has none),
    as ``gpuagent report`` and GpuClusterEfficiencyLow do."""
    busy, allocated = rate(acct("busy_seconds"), fn, window), rate(acct("allocated_seconds"), fn, window)
    group = f" by ({labels})" if labels else ""
    return f"sum{group} ({busy}) / sum{group} ({allocated} and {busy})"


def accounting() -> dm.Dashboard:
    b = Board()
    whole = "$__range"
    flagged = (f"{sel('gpuagent_pod_gpu_idle_seconds', ACCT)} >= on (instance, job) group_left () "
               f"{sel('gpuagent_accounting_idle_window_seconds', NODE)}")

    b.row("Over the time range")
    b.add(4, 4, stat("GPU-hours allocated", "GPU-time the selected namespaces' pods held "
                     "(`gpuagent_pod_gpu_allocated_seconds_total`; a MIG slice counts as its fraction, a "
                     "time-slicing replica as 1/N).", acct_sum("allocated_seconds", "", whole, "3600"), HOURS,
                     decimals=1))
    b.add(4, 4, stat("GPU-hours busy", "GPU-time their processes kept the SMs busy "
                     "(`gpuagent_pod_gpu_busy_seconds_total`).", acct_sum("busy_seconds", "", whole, "3600"),
                     HOURS, decimals=1))
    b.add(4, 4, stat("Efficiency", "Busy over allocated GPU-time (GPUs whose busy time is unknown left out).",
                     efficiency("", whole), "percentunit",
                     steps=thresholds((None, "red"), (0.3, "orange"), (0.6, "green"))))
    b.add(4, 4, stat("Idle GPU-hours", "Allocated GPU-time under the agent's idle threshold "
                     "(`gpuagent_pod_gpu_idle_allocated_seconds_total`).",
                     acct_sum("idle_allocated_seconds", "", whole, "3600"), HOURS, decimals=1,
                     steps=thresholds((None, "green"), (1, "orange"))))
    b.add(4, 4, stat("Energy", "GPU energy attributed to the pods (`gpuagent_pod_gpu_energy_joules_total`).",
                     acct_sum("energy_joules", "", whole, "3600000"), "kwatth", decimals=2))
    b.add(4, 4, count("Pods flagged idle now", "Pods with a GPU idle for the agent's idle window "
                      "(`gpuagent_pod_gpu_idle_seconds` >= `gpuagent_accounting_idle_window_seconds`): "
                      "what GpuAllocatedButIdle alerts on.",
                      or_zero(f"count(count by ({PER_ACCT_POD}) ({flagged}))"), ORANGE_FROM_1))

    b.row("Per namespace")
    b.add(12, 8, ts("GPUs allocated per namespace", "Mean GPUs held: rate(`gpuagent_pod_gpu_allocated_"
                    "seconds_total`) (GPU-seconds per second).",
                    [q(acct_sum("allocated_seconds", PER_NAMESPACE, "$__rate_interval", fn="rate"),
                       "{{namespace}}")], "none", stack=True))
    b.add(12, 8, ts("GPUs busy per namespace", "Mean GPUs kept busy: rate(`gpuagent_pod_gpu_busy_seconds_"
                    "total`).",
                    [q(acct_sum("busy_seconds", PER_NAMESPACE, "$__rate_interval", fn="rate"),
                       "{{namespace}}")], "none", stack=True))
    columns = [("allocated_seconds", "3600", "GPU-h allocated"), ("busy_seconds", "3600", "GPU-h busy"),
               ("idle_allocated_seconds", "3600", "GPU-h idle"),
               ("memory_byte_seconds", "3865470566400", "memory GiB-h"), ("energy_joules", "3600000", "kWh")]
    b.add(24, 8, table("Namespaces over the time range", "GPU-hours allocated, busy and idle, efficiency, "
                       "GPU memory GiB-hours and energy of each namespace's pods over the dashboard's time "
                       "range: the figures of `gpuagent report` for the same range.",
                       [acct_sum(m, PER_NAMESPACE, whole, d) for m, d, _ in columns]
                       + [efficiency(PER_NAMESPACE, whole)],
                       rename={**{f"Value #{chr(ord('A') + i)}": t for i, (_, _, t) in enumerate(columns)},
                               "Value #F": "efficiency"},
                       units={"GPU-h allocated": HOURS, "GPU-h busy": HOURS, "GPU-h idle": HOURS,
                              "memory GiB-h": "suffix: GiB-h", "kWh": "kwatth", "efficiency": "percentunit"},
                       sort_by="GPU-h allocated"))
    b.add(12, 8, ts("Power per namespace", "rate(`gpuagent_pod_gpu_energy_joules_total`): the namespaces' "
                    "share of the GPUs' power.",
                    [q(acct_sum("energy_joules", PER_NAMESPACE, "$__rate_interval", fn="rate"),
                       "{{namespace}}")],
                    "watt", stack=True))
    b.add(12, 8, ts("Efficiency over time", "Busy over allocated GPU-time per interval, all selected pods "
                    "(thick) and per namespace.",
                    [q(efficiency("cluster", "$__rate_interval", "rate"), "all"),
                     q(efficiency(PER_NAMESPACE, "$__rate_interval", "rate"), "{{namespace}}")],
                    "percentunit", maximum=1,
                    overrides=[override("byName", "all", {"custom.lineWidth": 3})]))

    b.row("Idle pods")
    idle_top = f"topk(10, {acct_sum('idle_allocated_seconds', PER_ACCT_POD, whole, '3600')})"
    b.add(12, 9, table("Top idle pods", "The ten pods with the most idle GPU-hours over the time range, with "
                       "the GPU-hours they held.",
                       [idle_top, f"{acct_sum('allocated_seconds', PER_ACCT_POD, whole, '3600')} "
                                  f"and on ({PER_ACCT_POD}) {idle_top}"],
                       rename={"Value #A": "GPU-h idle", "Value #B": "GPU-h allocated"},
                       units={"GPU-h idle": HOURS, "GPU-h allocated": HOURS}, sort_by="GPU-h idle"))
    b.add(12, 9, ts("Current idle episodes", "`gpuagent_pod_gpu_idle_seconds`: how long each pod's GPU has "
                    "been idle, the ten longest; dashed: the agent's idle window, where the pod is flagged.",
                    [q(f"topk(10, max by ({PER_ACCT_POD}) ({sel('gpuagent_pod_gpu_idle_seconds', ACCT)}))",
                       POD_LEGEND),
                     q(f"max by (cluster) ({sel('gpuagent_accounting_idle_window_seconds', NODE)})",
                       "idle window")], "s", overrides=[dashed("/^idle window$/")]))

    b.row("Pods")
    b.add(24, 10, table("Pods over the time range", "Every pod with accounting series in the time range "
                        "(ended ones too).",
                        [acct_sum(m, PER_ACCT_POD, whole, d) for m, d, _ in columns]
                        + [efficiency(PER_ACCT_POD, whole)],
                        rename={**{f"Value #{chr(ord('A') + i)}": t for i, (_, _, t) in enumerate(columns)},
                                "Value #F": "efficiency"},
                        units={"GPU-h allocated": HOURS, "GPU-h busy": HOURS, "GPU-h idle": HOURS,
                               "memory GiB-h": "suffix: GiB-h", "kWh": "kwatth", "efficiency": "percentunit"},
                        sort_by="GPU-h allocated"))

    return dashboard("gpuagent-accounting", "gpuagent / GPU accounting",
                     "GPU chargeback: GPU-hours allocated against busy per namespace and pod, efficiency "
                     "over time, idle pods and energy, from the agents' accounting counters (what "
                     "`gpuagent report` prints).",
                     b, [CLUSTER_VAR, NODE_VAR, ACCT_NAMESPACE_VAR], ["accounting"])


DASHBOARDS = {
    "gpuagent-node-overview.json": node_overview,
    "gpuagent-pods.json": pods,
    "gpuagent-agent.json": agent,
    "gpuagent-accounting.json": accounting,
}


def render() -> dict[str, str]:
    """File name -> the exact text the script writes."""
    return {name: json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
            for name, build in DASHBOARDS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write gpuagent's Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is not current")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write to (default: this one)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if not args.check:
            path.write_text(text, encoding="utf-8")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    if stale:
        print(f"not current, run `python dashboards/build.py`: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
