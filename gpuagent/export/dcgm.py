"""dcgm-exporter compatible families: its names, help strings, units and labels.

The default counter list of dcgm-exporter (4.x ``etc/default-counters.csv``, less the vGPU license status),
the profiling (``DCGM_FI_PROF_*``) fields, the commented-but-popular ECC, retired-page and clock-reason rows,
and ``DCGM_EXP_XID_ERRORS_COUNT``. Units are dcgm's: MHz, MiB, mJ, percent; ``None`` gives no series.

**Counter names.** dcgm-exporter's counters carry no ``_total`` suffix (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION
12345``) and its text output types them ``counter``, which the 0.0.4 text format allows but OpenMetrics does
not. A client_python ``counter`` family cannot say that: its HELP/TYPE lines get ``_total`` in the 0.0.4 text
format while the bare-named samples do not (promtool rejects the output), and a counter sample without
``_total`` fails OpenMetrics parsers ("Clashing name"). So these families are typed ``unknown``: the samples
keep dcgm's exact names in both formats (``# TYPE X untyped`` in text 0.0.4, ``# TYPE X unknown`` in
OpenMetrics), nothing claims they are gauges, and ``rate()``/``increase()`` work on them as before. Only the
TYPE line differs from dcgm-exporter's.

**MIG.** On a GPU with MIG instances, the fields NVML reports per instance (framebuffer used/free and the
profiling ratios) are emitted per instance, with the parent's labels plus ``GPU_I_PROFILE``/``GPU_I_ID``;
when no instance reports a field, the GPU-wide value is emitted instead. Physical fields (clocks,
temperatures, power, energy, ECC, XIDs) stay on the GPU series. A GPU whose health is LOST has no series here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter

from prometheus_client.metrics_core import Metric

from gpuagent.export import xid
from gpuagent.export.families import (
    Kept,
    TextCache,
    add_known,
    extend,
    family,
    flag,
    non_empty,
    put_known,
    with_label,
)
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, GpuLabels, GpuRenderer
from gpuagent.snapshot.gpu import GpuSample, Health, MigSample, ProfilingSample
from gpuagent.snapshot.node import NodeSnapshot

MIB = 1024 * 1024

Value = float | int | None


class Scope(Enum):
    GPU = "gpu"  # physical, GPU-wide: always on the GPU series
    INSTANCE = "instance"  # per MIG instance on a MIG GPU (memory figures of GpuSample / MigSample)
    PROFILING = "profiling"  # per MIG instance on a MIG GPU (ProfilingSample of GpuSample / MigSample)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    csv_type: str  # dcgm-exporter's CSV type; "counter" renders as untyped (see the module docstring)
    help: str
    scope: Scope
    value: Callable[..., Value]  # of a GpuSample (GPU), GpuSample|MigSample (INSTANCE), ProfilingSample


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB  # dcgm reports whole MiB


def _mj(joules: float | None) -> int | None:
    return None if joules is None else round(joules * 1000)  # dcgm reports whole mJ


def _ecc(attr: str) -> Callable[[GpuSample], Value]:
    def get(gpu: GpuSample) -> Value:
        return None if gpu.ecc is None else getattr(gpu.ecc, attr)

    return get


def _remap(get: Callable[..., Value]) -> Callable[[GpuSample], Value]:
    return lambda gpu: None if gpu.remapped_rows is None else get(gpu.remapped_rows)


def _prof(attr: str) -> Callable[[ProfilingSample], Value]:
    return lambda p: getattr(p, attr)


GPU, INST, PROF = Scope.GPU, Scope.INSTANCE, Scope.PROFILING
GAUGE, COUNTER = "gauge", "counter"
_PCIE_HELP = (
    "The rate of data {} over the PCIe bus - including both protocol headers and data payloads - "
    "in bytes per second."
)
_NVLINK_HELP = "The rate of data {} over NVLink - including both headers and payloads - in bytes per second."

# In the order of dcgm-exporter's CSV (help strings verbatim). XID families are built apart: extra labels.
FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", GAUGE, "SM clock frequency (in MHz).", GPU,
          lambda g: _mhz(g.sm_clock_hz)),
    Field("DCGM_FI_DEV_MEM_CLOCK", GAUGE, "Memory clock frequency (in MHz).", GPU,
          lambda g: _mhz(g.memory_clock_hz)),
    Field("DCGM_FI_DEV_MEMORY_TEMP", GAUGE, "Memory temperature (in C).", GPU,
          lambda g: g.memory_temperature_celsius),
    Field("DCGM_FI_DEV_GPU_TEMP", GAUGE, "GPU temperature (in C).", GPU,
          lambda g: g.temperature_celsius),
    Field("DCGM_FI_DEV_POWER_USAGE", GAUGE, "Power draw (in W).", GPU,
          lambda g: g.power_watts),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", COUNTER,
          "Total energy consumption since boot (in mJ).", GPU,
          lambda g: _mj(g.energy_joules_total)),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER, "Total number of PCIe retries.", GPU,
          lambda g: g.pcie_replay_total),
    Field("DCGM_FI_DEV_GPU_UTIL", GAUGE, "GPU utilization (in %).", GPU,
          lambda g: g.gpu_util_percent),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", GAUGE, "Memory utilization (in %).", GPU,
          lambda g: g.memory_copy_util_percent),
    Field("DCGM_FI_DEV_ENC_UTIL", GAUGE, "Encoder utilization (in %).", GPU,
          lambda g: g.encoder_util_percent),
    Field("DCGM_FI_DEV_DEC_UTIL", GAUGE, "Decoder utilization (in %).", GPU,
          lambda g: g.decoder_util_percent),
    Field("DCGM_FI_DEV_FB_FREE", GAUGE, "Framebuffer memory free (in MiB).", INST,
          lambda s: _mib(s.memory_free_bytes)),
    Field("DCGM_FI_DEV_FB_USED", GAUGE, "Framebuffer memory used (in MiB).", INST,
          lambda s: _mib(s.memory_used_bytes)),
    Field("DCGM_FI_DEV_FB_RESERVED", GAUGE, "Framebuffer memory reserved (in MiB).", GPU,
          lambda g: _mib(g.memory_reserved_bytes)),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", COUNTER,
          "Total number of NVLink bandwidth counters for all lanes.", GPU,
          lambda g: g.nvlink_bandwidth_total),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER,
          "Number of remapped rows for uncorrectable errors", GPU,
          _remap(lambda r: r.uncorrectable)),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", COUNTER,
          "Number of remapped rows for correctable errors", GPU,
          _remap(lambda r: r.correctable)),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "Whether remapping of rows has failed", GPU,
          _remap(lambda r: flag(r.failed))),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", GAUGE, "Ratio of time the graphics engine is active.", PROF,
          _prof("graphics_active_ratio")),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", GAUGE, "Ratio of cycles the tensor (HMMA) pipe is active.", PROF,
          _prof("tensor_active_ratio")),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", GAUGE,
          "Ratio of cycles the device memory interface is active sending or receiving data.", PROF,
          _prof("dram_active_ratio")),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", GAUGE, _PCIE_HELP.format("transmitted"), PROF,
          _prof("pcie_tx_bytes_per_second")),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", GAUGE, _PCIE_HELP.format("received"), PROF,
          _prof("pcie_rx_bytes_per_second")),
    Field("DCGM_FI_PROF_SM_ACTIVE", GAUGE, "The ratio of cycles an SM has at least 1 warp assigned.", PROF,
          _prof("sm_active_ratio")),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", GAUGE, "The ratio of number of warps resident on an SM.", PROF,
          _prof("sm_occupancy_ratio")),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", GAUGE, "Ratio of cycles the fp64 pipes are active.", PROF,
          _prof("fp64_active_ratio")),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", GAUGE, "Ratio of cycles the fp32 pipes are active.", PROF,
          _prof("fp32_active_ratio")),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", GAUGE, "Ratio of cycles the fp16 pipes are active.", PROF,
          _prof("fp16_active_ratio")),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", GAUGE, _NVLINK_HELP.format("transmitted"), PROF,
          _prof("nvlink_tx_bytes_per_second")),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", GAUGE, _NVLINK_HELP.format("received"), PROF,
          _prof("nvlink_rx_bytes_per_second")),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", COUNTER, "Total number of single-bit volatile ECC errors.", GPU,
          _ecc("sbe_volatile_total")),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", COUNTER, "Total number of double-bit volatile ECC errors.", GPU,
          _ecc("dbe_volatile_total")),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", COUNTER, "Total number of single-bit persistent ECC errors.", GPU,
          _ecc("sbe_aggregate_total")),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", COUNTER, "Total number of double-bit persistent ECC errors.", GPU,
          _ecc("dbe_aggregate_total")),
    Field("DCGM_FI_DEV_RETIRED_SBE", COUNTER, "Total number of retired pages due to single-bit errors.", GPU,
          _ecc("retired_pages_sbe")),
    Field("DCGM_FI_DEV_RETIRED_DBE", COUNTER, "Total number of retired pages due to double-bit errors.", GPU,
          _ecc("retired_pages_dbe")),
    Field("DCGM_FI_DEV_RETIRED_PENDING", COUNTER, "Total number of pages pending retirement.", GPU,
          _ecc("retired_pages_pending")),
    Field("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", GAUGE, "Current clock throttle reasons.", GPU,
          lambda g: g.clock_event_reasons),
)

XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
XID_ERRORS_HELP = "Value of the last XID error encountered."
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_COUNT_HELP = "reported XIDs during last window"
# The last-XID gauge sits where dcgm's CSV has it: right after the decoder utilization.
_XID_POSITION = next(i for i, f in enumerate(FIELDS) if f.name == "DCGM_FI_DEV_DEC_UTIL") + 1


def _dcgm_family(name: str, csv_type: str, documentation: str) -> Metric:
    return family(name, documentation, _type(csv_type))


def _type(csv_type: str) -> str:
    return "unknown" if csv_type == COUNTER else csv_type


class DcgmCollector(GpuRenderer):
    """Renders a snapshot as dcgm-exporter's families."""

    name = "dcgm"

    def __init__(
        self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL, xid_window_seconds: float = 300.0
    ) -> None:
        super().__init__(hostname_label=hostname_label)
        # dcgm's window_size_in_ms label; the snapshot's XidRecord.recent is counted over the same window.
        self._window_ms = str(round(xid_window_seconds * 1000))
        self._kept = Kept()
        self._texts = TextCache(_xid_text)  # the XID families' label texts
        # The label texts and source columns the fields were last made from (None: make them all anew).
        self._made_from: tuple[list[str], dict[str, tuple]] | None = None

    def families(self, snapshot: NodeSnapshot, labels: GpuLabels) -> list[Metric]:
        gpus = [g for g in snapshot.gpus if g.health is not Health.LOST]
        texts = [labels.dcgm(gpu) for gpu in gpus]
        made_from, self._made_from = self._made_from, None  # kept only once every field is made
        if not any(gpu.migs for gpu in gpus):  # one row per GPU and field (the common case)
            metrics = self._fields(gpus, texts, made_from)
        else:
            metrics = [self._field(f, gpus, texts, labels) for f in FIELDS]
        self._texts.rotate()
        metrics.insert(_XID_POSITION, self._xid_last(gpus, texts))
        metrics.append(self._xid_count(gpus, texts))
        return non_empty(metrics)

    def _fields(
        self, gpus: list[GpuSample], texts: list[str], made_from: tuple[list[str], dict[str, tuple]] | None
    ) -> list[Metric]:
        """Each field as one row per GPU. The GpuSample attributes every field reads (``_SOURCES``) are read
        for all GPUs at once; a field none of whose attributes changed since the last snapshot (nor the
        label texts) is the family made then, without calling its value function for each GPU."""
        columns: dict[str, tuple] = dict.fromkeys(_SOURCE_NAMES, ())
        if gpus:
            columns = dict(zip(_SOURCE_NAMES, zip(*map(_READ_SOURCES, gpus), strict=True), strict=True))
        changed: set[str] | None = None  # None: everything
        if made_from is not None and made_from[0] == texts:
            changed = {name for name in _SOURCE_NAMES if columns[name] != made_from[1][name]}
        kept = self._kept
        profiling = columns["profiling"]
        metrics = []
        for field, sources in zip(FIELDS, _SOURCES, strict=True):
            same = changed is not None and sources and changed.isdisjoint(sources)
            last = kept.last(field.name) if same else None
            if last is None:
                last = kept.known(field.name, field.help, _type(field.csv_type), texts,
                                  _column(field, gpus, profiling))
            metrics.append(last)
        self._made_from = (texts, columns)
        return metrics

    @staticmethod
    def _field(field: Field, gpus: list[GpuSample], texts: list[str], labels: GpuLabels) -> Metric:
        metric = _dcgm_family(field.name, field.csv_type, field.help)
        if field.scope is Scope.GPU:
            put_known(metric, texts, _column(field, gpus, []))
            return metric
        for gpu, text in zip(gpus, texts, strict=True):
            per_instance = [(mig, _read(field, mig)) for mig in gpu.migs]
            if any(value is not None for _, value in per_instance):
                for mig, value in per_instance:
                    add_known(metric, labels.dcgm(gpu, mig), value)
            else:  # not a MIG GPU, or no instance reports it: the GPU-wide value
                add_known(metric, text, _read(field, gpu))
        return metric

    def _xid_last(self, gpus: list[GpuSample], texts: list[str]) -> Metric:
        # Unlike dcgm's sticky gauge, the last XID clears once it leaves the snapshot's recent window.
        codes = [gpu.xid.last_code or 0 for gpu in gpus]
        rows = [self._texts[("last", text, code)] for text, code in zip(texts, codes, strict=True)]
        return self._kept.family(XID_ERRORS, XID_ERRORS_HELP, GAUGE, rows, codes)

    def _xid_count(self, gpus: list[GpuSample], texts: list[str]) -> Metric:
        rows: list[str] = []
        counts: list[int] = []
        for gpu, text in zip(gpus, texts, strict=True):
            recent = {code: n for code, n in gpu.xid.recent.items() if n}
            if not recent:
                rows.append(self._texts[("window", text, self._window_ms)])
                counts.append(0)
            for code, count in sorted(recent.items()):
                rows.append(self._texts[("xid", text, self._window_ms, code)])
                counts.append(count)
        return self._kept.family(XID_COUNT, XID_COUNT_HELP, _type(COUNTER), rows, counts)


def _xid_text(key: tuple) -> str:
    """The label text of an XID row: a GPU's dcgm labels and its last XID (``last``), or the window's
    (``window``), or the window's and one XID's (``xid``)."""
    kind, text = key[:2]
    if kind == "last":
        code = key[2]
        return extend(text, (("err_code", str(code)), ("err_msg", xid.message(code))))
    window = with_label(text, "window_size_in_ms", key[2])
    return window if kind == "window" else with_label(window, "xid", str(key[3]))


class _Reads:
    """Stands for a GpuSample and records the attributes read from it (each reads None: absent)."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: list[str] = []

    def __getattr__(self, name: str) -> None:
        self.names.append(name)


def _sources(field: Field) -> tuple[str, ...]:
    """The GpuSample attributes a field's value is made from (found by reading a ``_Reads``), or () when
    that cannot be told: the field is then made anew for every snapshot."""
    if field.scope is Scope.PROFILING:
        return ("profiling",)
    reads = _Reads()
    try:
        field.value(reads)
    except Exception:
        return ()
    return tuple(dict.fromkeys(reads.names))


_SOURCES = tuple(_sources(field) for field in FIELDS)
_SOURCE_NAMES = tuple(sorted({"profiling", *(name for names in _SOURCES for name in names)}))
_READ_SOURCES = attrgetter(*_SOURCE_NAMES)  # a tuple of those attributes of a GpuSample


def _column(field: Field, gpus: list[GpuSample], profiling: Sequence[ProfilingSample | None]) -> list[Value]:
    """A field of every GPU (``profiling``: their ``ProfilingSample``, for a PROFILING field)."""
    if field.scope is Scope.PROFILING:
        read = field.value
        return [None if p is None else read(p) for p in profiling]
    return list(map(field.value, gpus))


def _read(field: Field, sample: GpuSample | MigSample) -> Value:
    """An INSTANCE or PROFILING field of a GPU or of one of its MIG instances."""
    if field.scope is Scope.PROFILING:
        return None if sample.profiling is None else field.value(sample.profiling)
    return field.value(sample)

