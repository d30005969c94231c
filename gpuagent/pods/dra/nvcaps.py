"""The NVIDIA driver's MIG capability minors: which GPU and MIG instance a ``nvidia-cap<N>`` node opens.

A container given a MIG device gets its parent GPU's node (``/dev/nvidia<minor>``) and two capability nodes,
``/dev/nvidia-caps/nvidia-cap<N>`` for its GPU instance and its compute instance. The driver publishes the
minor of every possible capability in ``/proc/driver/nvidia-caps/mig-minors``, one per line::

    config 1
    monitor 2
    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

(``gpu<N>`` is the GPU's minor number.) The table is fixed while the driver is loaded: it is read once, and
again only when asked for a minor it does not list. Blocking file I/O: call :meth:`MigMinors.table` on a
worker thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

MIG_MINORS = "driver/nvidia-caps/mig-minors"  # under the proc root
CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap([0-9]+)$")
GPU_NODE = re.compile(r"^/dev/nvidia([0-9]+)$")
_LINE = re.compile(r"^gpu([0-9]+)/gi([0-9]+)(?:/ci([0-9]+))?/access ([0-9]+)$")


@dataclass(frozen=True, slots=True)
class MigCapability:
    """What one capability minor opens: a GPU instance (``compute_instance`` None) or a compute instance."""

    gpu_minor: int
    gpu_instance: int
    compute_instance: int | None


def parse_mig_minors(text: str) -> dict[int, MigCapability]:
    """Minor -> capability, from the table's text (``config``/``monitor`` and unknown lines are skipped)."""
    out: dict[int, MigCapability] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            gpu, gi, ci, minor = match.groups()
            out[int(minor)] = MigCapability(int(gpu), int(gi), int(ci) if ci is not None else None)
    return out


class MigMinors:
    """``<proc_root>/driver/nvidia-caps/mig-minors``, read on first use."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.path = os.path.join(proc_root, MIG_MINORS)
        self._table: Mapping[int, MigCapability] | None = None
        self.error = ""  # why the table could not be read, "" when it was

    def table(self, needed: Iterable[int] = ()) -> Mapping[int, MigCapability]:
        """Minor -> capability; read again when it does not list every ``needed`` minor. Empty (with
        :attr:`error` set) when the file cannot be read."""
        if self._table is None or any(m not in self._table for m in needed):
            try:
                with open(self.path, encoding="ascii", errors="replace") as stream:
                    self._table = MappingProxyType(parse_mig_minors(stream.read()))
                self.error = ""
            except OSError as exc:
                self._table = MappingProxyType({})
                self.error = f"{self.path}: {exc.strerror or exc}"
        return self._table
