"""The DRA part of the pods source: keeps the node's CDI specs and slices read, maps each poll's DRA devices.

:meth:`DraResolver.refresh` runs at the pod-resources cadence, only while the kubelet reports DRA GPU
devices: it re-reads the CDI spec directories and the MIG capability table on a worker thread and asks the
ResourceSlice watcher to start. :meth:`DraResolver.allocations` runs every poll and is cheap: the mapping
is redone only when the kubelet's devices, the slices, the specs or the GPUs' places changed, and the
allocations it returns are the same object while nothing did (attribution re-indexes on a new object).

What cannot be mapped is reported three ways: each :class:`~gpuagent.snapshot.pods.DraDevice` carries its
problem (``/v1/state``, ``gpuagent_pod_dra_unmapped_devices``), the ``dra`` source status names the first
few, and one log line is written per change of the unmapped set or of a reason. A malformed CDI spec file
is the ``cdi`` source's error and one log line per change of the set of such files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from gpuagent.pods.dra.cdi import CdiIndex, CdiSpecs
from gpuagent.pods.dra.mapper import DraMapping, Places, cap_minors, map_devices
from gpuagent.pods.dra.nvcaps import MigMinors
from gpuagent.pods.dra.slices import SOURCE as SLICES_SOURCE
from gpuagent.pods.dra.slices import ResourceSlices
from gpuagent.pods.dra.taints import tainted_gpus
from gpuagent.pods.podresources import DeviceAllocation, DynamicAllocation
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.node import SourceStatus
from gpuagent.snapshot.pods import DraDevice, DraTaint

log = logging.getLogger(__name__)

SOURCE = "dra"  # every DRA GPU device mapped to a GPU
TAINTS_SOURCE = "dra_device_taints"  # every device taint in the slices well-formed and on a GPU of this node
CDI_SOURCE = "cdi"  # every CDI spec file readable
MAX_ERROR_CHARS = 1000
_NAMED_IN_STATUS = 3


def _device_text(d: DraDevice) -> str:
    return f"{d.namespace}/{d.pod} claim {d.claim} device {d.driver}/{d.pool}/{d.device}: {d.problem}"


class DraResolver:
    """One per agent; ``cdi`` None: no spec directory, ``slices`` None: the API server is not used."""

    def __init__(
        self, *, cdi: CdiSpecs | None = None, mig_minors: MigMinors | None = None,
        slices: ResourceSlices | None = None,
    ) -> None:
        self.cdi = cdi
        self.slices = slices
        self._mig_minors = mig_minors
        self._index: CdiIndex | None = None
        self._caps: Any = None  # the MIG capability table (a mapping), read with the specs
        self._cdi_duration = 0.0
        self._logged_cdi_errors: tuple[str, ...] = ()
        self._mapping_key: tuple[Any, ...] | None = None
        self._mapping = DraMapping()
        self._combined_key: tuple[Any, ...] | None = None
        self._combined: tuple[DeviceAllocation, ...] = ()
        self._logged_unmapped: frozenset[tuple[str, ...]] = frozenset()
        self._taints_key: tuple[Any, ...] | None = None
        self._taints: tuple[tuple[DraTaint, ...], SourceStatus | None] = ((), None)
        self._logged_taint_problems: tuple[str, ...] = ()
        # a bug of this module, as the dra source's error (it never costs the rest of attribution)
        self._failures = {"refresh": "", "map": ""}

    async def refresh(self, dynamic: Sequence[DynamicAllocation], monotonic: Any) -> None:
        """Re-read what the node holds for ``dynamic`` (nothing when it is empty); start the slice watch."""
        try:
            await self._refresh(dynamic, monotonic)
        except Exception as exc:
            self._failed("refresh", "reading the CDI specs", exc)
        else:
            self._recovered("refresh")

    async def _refresh(self, dynamic: Sequence[DynamicAllocation], monotonic: Any) -> None:
        if not dynamic:
            return
        if self.slices is not None and not self.slices.wanted:
            log.info("DRA GPU devices on this node: watching the %s", self.slices.what)
            self.slices.want()
        if self.cdi is None and self._mig_minors is None:
            return
        started = monotonic()
        index, caps = await asyncio.to_thread(self._read, dynamic)
        self._cdi_duration = monotonic() - started
        self._index, self._caps = index, caps
        errors = index.errors if index is not None else ()
        self._logged_cdi_errors = _log_change(
            self._logged_cdi_errors, errors, "CDI specs: %d file(s) cannot be used: %s",
            "CDI specs: every file is readable again")

    def _read(self, dynamic: Sequence[DynamicAllocation]) -> tuple[CdiIndex | None, Any]:
        index = self.cdi.refresh() if self.cdi is not None else None
        caps = None
        if self._mig_minors is not None and index is not None:
            needed = cap_minors(dynamic, index)
            caps = self._mig_minors.table(needed) if needed else None
        return index, caps

    def allocations(
        self, plugin: Sequence[DeviceAllocation] | None, dynamic: Sequence[DynamicAllocation],
        gpus: Sequence[GpuSample],
    ) -> tuple[Sequence[DeviceAllocation] | None, DraMapping]:
        """The device plugin's allocations with the mapped DRA devices added, and the mapping. A failure here
        costs the DRA devices (reported as the dra source's error), never the device plugin's."""
        try:
            out = self._allocations(plugin, dynamic, gpus)
        except Exception as exc:
            self._failed("map", "mapping the DRA devices", exc)
            return plugin, DraMapping()
        self._recovered("map")
        return out

    def _failed(self, step: str, what: str, exc: Exception) -> None:
        message = f"{what} failed: {exc!r}"
        if message != self._failures[step]:
            log.exception("DRA: %s", message)
        self._failures[step] = message

    def _recovered(self, step: str) -> None:
        if self._failures[step]:
            log.info("DRA: %s works again", step)
            self._failures[step] = ""

    def _allocations(
        self, plugin: Sequence[DeviceAllocation] | None, dynamic: Sequence[DynamicAllocation],
        gpus: Sequence[GpuSample],
    ) -> tuple[Sequence[DeviceAllocation] | None, DraMapping]:
        if not dynamic:
            self._note_unmapped(())
            return plugin, DraMapping()
        places = Places(gpus)
        slices = self.slices.devices() if self.slices is not None and self.slices.synced else None
        key = (dynamic, slices, self._index, self._caps, places.signature())  # equal objects: `is` first
        if key != self._mapping_key:
            caps_error = self._mig_minors.error if self._mig_minors is not None else ""
            self._mapping = map_devices(dynamic, places, slices=slices, cdi=self._index, caps=self._caps,
                                        caps_error=caps_error)
            self._mapping_key = key
            self._note_unmapped(self._mapping.unmapped)
        mapping = self._mapping
        combined_key = (plugin, mapping.allocations)
        if combined_key != self._combined_key:
            combined = (*(plugin or ()), *mapping.allocations)
            if combined != self._combined:
                self._combined = combined
            self._combined_key = combined_key
        return self._combined, mapping

    def taints(self, gpus: Sequence[GpuSample]) -> tuple[tuple[DraTaint, ...], SourceStatus | None]:
        """The drivers' device taints on this node's GPUs, and the ``dra_device_taints`` status (None until
        the slices are watched and listed). Redone only when the slices or the GPUs change; a taint of a bad
        shape, or on a device naming no GPU here, is left out, named in the status and logged once."""
        if self.slices is None or not self.slices.wanted or not self.slices.synced:
            return (), None
        devices = self.slices.devices()
        key = (devices, tuple(g.info.uuid for g in gpus))
        if key == self._taints_key:
            return self._taints
        taints, unplaced = tainted_gpus(devices.items(), key[1])
        malformed = tuple(f"{driver}/{pool}/{name} (slice {d.slice}): {e}"
                          for (driver, pool, name), d in devices.items() for e in d.taint_errors)
        problems = (*malformed, *unplaced)
        self._logged_taint_problems = _log_change(
            self._logged_taint_problems, problems, "DRA device taints: %d left out: %s",
            "DRA device taints: every one is readable and on a GPU of this node again")
        error = _cut(f"{len(problems)} device taint(s) left out: " + "; ".join(problems)) if problems else ""
        self._taints = (taints, SourceStatus(TAINTS_SOURCE, not problems, 0.0, error))
        self._taints_key = key
        return self._taints

    def statuses(self, mapping: DraMapping) -> tuple[SourceStatus, ...]:
        """``dra`` (and ``cdi``, ``dra_resource_slices`` when in use) while there are DRA GPU devices."""
        failure = "; ".join(f for f in self._failures.values() if f)
        if failure:
            return (SourceStatus(SOURCE, False, 0.0, _cut(failure)),)
        if not mapping.devices:
            return ()
        out: list[SourceStatus] = []
        unmapped = mapping.unmapped
        error = ""
        if unmapped:
            named = "; ".join(_device_text(d) for d in unmapped[:_NAMED_IN_STATUS])
            rest = len(unmapped) - _NAMED_IN_STATUS
            more = f"; and {rest} more" if rest > 0 else ""
            count = f"{len(unmapped)} of {len(mapping.devices)}"
            error = _cut(f"{count} DRA devices not mapped to a GPU: {named}{more}")
        out.append(SourceStatus(SOURCE, not unmapped, 0.0, error))
        if self._index is not None:
            out.append(SourceStatus(CDI_SOURCE, not self._index.errors, self._cdi_duration,
                                    _cut("; ".join(self._index.errors))))
        if self.slices is not None and self.slices.wanted:
            ok, slices_error = self.slices.status
            out.append(SourceStatus(SLICES_SOURCE, ok, 0.0, slices_error))
        return tuple(out)

    def _note_unmapped(self, unmapped: Sequence[DraDevice]) -> None:
        """One log line per change of the set of devices that cannot be mapped (or of their reasons)."""
        now = frozenset((d.namespace, d.pod, d.claim, d.driver, d.pool, d.device, d.problem)
                        for d in unmapped)
        if now == self._logged_unmapped:
            return
        if unmapped:
            log.warning("DRA: %d device(s) cannot be mapped to a GPU (no allocation, not attributed): %s",
                        len(unmapped), "; ".join(_device_text(d) for d in unmapped))
        else:
            log.info("DRA: no device left unmapped")
        self._logged_unmapped = now


def _log_change(before: tuple[str, ...], now: tuple[str, ...], bad: str, good: str) -> tuple[str, ...]:
    """One log line per change of a set of problems: ``bad`` (with their count and list) or ``good``."""
    if now != before:
        if now:
            log.warning(bad, len(now), "; ".join(now))
        else:
            log.info(good)
    return now


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
