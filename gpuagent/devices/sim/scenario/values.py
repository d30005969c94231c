"""Values as a scenario file writes them: sizes read (``"512Mi"``, ``"80GB"``), values shown in messages.

A size is bytes, binary with ``i`` and decimal without, as Kubernetes quantities are; a value shown in an
error message is the operator's own (``true``, ``nothing (null)``, ``'H100'``), cut at 60 characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]i?B?|B)?\s*$")
_UNITS = {"": 1, "B": 1}
for _i, _p in enumerate("KMGTP", start=1):
    _UNITS[_p] = _UNITS[_p + "B"] = 1000**_i
    _UNITS[_p + "i"] = _UNITS[_p + "iB"] = 1024**_i


def parse_size(value: int | float | str) -> int:
    """Bytes from ``4096``, ``"4Gi"``, ``"512Mi"``, ``"80GB"`` (binary with ``i``, decimal without)."""
    if isinstance(value, (int, float)):
        return int(value)
    m = _SIZE.match(value)
    if m is None:
        raise ValueError(f"not a size: {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def show(value: Any) -> str:
    """``value`` as a message about the file shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nothing (null)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def gib(n: float) -> str:
    """Bytes as GiB, one decimal."""
    return f"{n / 1024**3:.1f} GiB"
