"""Catalogue of the NVML field values read in one batched ``nvmlDeviceGetFieldValues`` call per tier.

Each entry: the NVML field constant's name, the key the reader stores it under, and the factor from
NVML's unit to ours (the key's unit). Reading through field values costs one NVML call for many counters,
which keeps the driver lock short (see DESIGN.md, "Do no harm").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldSpec:
    nvml_name: str
    key: str
    scale: float = 1.0


# Every poll: the instant power alone (7 us on an H100), which also weighs accounting's energy split.
FAST_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("NVML_FI_DEV_POWER_INSTANT", "power_watts", 1e-3),  # mW
)

# Every ``detail_interval`` (default 10 s): cumulative counters, which Prometheus turns into rates over its
# scrape interval anyway, and the memory temperature. With the power they cost about 0.5 ms a batch on an
# H100, so they are not read every poll (docs/nvml-cost.md).
DETAIL_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("NVML_FI_DEV_MEMORY_TEMP", "memory_temperature_celsius"),
    FieldSpec("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_total"),
    FieldSpec("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "pcie_tx_bytes_total"),
    FieldSpec("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "pcie_rx_bytes_total"),
    FieldSpec("NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL", "nvlink_bandwidth_total"),
)

# Every ``energy_interval`` (default 10 s): the energy counter alone. On an H100 (driver 580) reading it
# costs about 3 ms, against 7 us for the instant power and 0.5 ms for the rest of the fast batch
# (``bench/real_gpu.py probe``): every poll it would be most of the agent's NVML time.
ENERGY_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_joules_total", 1e-3),  # mJ
)

# Every slow poll (default 30 s): counters that change rarely.
SLOW_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "sbe_volatile_total"),
    FieldSpec("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "dbe_volatile_total"),
    FieldSpec("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "sbe_aggregate_total"),
    FieldSpec("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", "dbe_aggregate_total"),
    FieldSpec("NVML_FI_DEV_RETIRED_SBE", "retired_pages_sbe"),
    FieldSpec("NVML_FI_DEV_RETIRED_DBE", "retired_pages_dbe"),
    FieldSpec("NVML_FI_DEV_RETIRED_PENDING", "retired_pages_pending"),
)

_UNION_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def field_ids(nvml: Any, specs: tuple[FieldSpec, ...]) -> list[int]:
    return [getattr(nvml, s.nvml_name) for s in specs]


class FieldBatch:
    """A set of fields read in one ``nvmlDeviceGetFieldValues`` call: their ids looked up once, each answer
    decoded (:func:`decode_field_values`). Every tier that batches fields (each poll, the slow poll, the
    detail and energy cadences) reads through one of these."""

    __slots__ = ("_ids", "_nvml", "_specs")

    def __init__(self, nvml: Any, specs: tuple[FieldSpec, ...]) -> None:
        self._nvml = nvml
        self._specs = specs
        self._ids = field_ids(nvml, specs)

    def read(self, guard: Any, handle: Any, scope: int) -> dict[str, float | int]:
        """The fields that answered, through ``guard`` (an ``NvmlGuard``: a failed call reads as none)."""
        answer = guard.call("nvmlDeviceGetFieldValues", handle, self._ids, scope=scope)
        return decode_field_values(self._nvml, self._specs, answer)


def decode_field_values(nvml: Any, specs: tuple[FieldSpec, ...], values: Any) -> dict[str, float | int]:
    """The fields that answered ``NVML_SUCCESS``, scaled; the others are absent (not 0)."""
    out: dict[str, float | int] = {}
    if values is None:
        return out
    for spec, value in zip(specs, values, strict=False):
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            continue
        member = _UNION_MEMBER.get(int(value.valueType))
        if member is None:
            continue
        raw = getattr(value.value, member)
        out[spec.key] = raw * spec.scale if spec.scale != 1.0 else raw
    return out
