"""What every section's checks share: the list of problems found, and the names pynvml knows.

A scenario names pynvml functions (``driver.latency_ms``, ``not_supported``, a ``hang`` fault) and NVML
field IDs (``not_supported``); a name pynvml does not have is an error with the nearest one it has, since a
misspelt name would otherwise inject nothing and the test built on it would pass for the wrong reason.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Iterable

import pynvml


class Problems:
    """The problems a build finds, as (path in the file, message), in the order it finds them."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append((path, message))


@functools.cache
def pynvml_functions() -> frozenset[str]:
    """The ``nvml*`` functions of pynvml (what the simulated NVML answers)."""
    return frozenset(n for n, v in vars(pynvml).items() if n.startswith("nvml") and inspect.isfunction(v))


@functools.cache
def pynvml_fields() -> frozenset[str]:
    """The ``NVML_FI_*`` field IDs of pynvml."""
    return frozenset(n for n in vars(pynvml) if n.startswith("NVML_FI_"))


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` with the known name nearest to ``name``, or "" when none is near."""
    hint = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean '{hint[0]}'?" if hint else ""
