"""The items of the real-GPU check: what each needs, how long it may take, what it found.

An item is a function ``run(ctx) -> ItemResult``. It names what it needs in each backend (``needs``: for
``"nvml"``, the real driver, and for ``"sim"``, the simulator; an item without a ``"sim"`` entry needs a
GPU) and its time budget (``budget_s(ctx)``, seconds; ``fixed(...)`` for the usual case), which the runner
enforces. Adding an item is one line::

    ITEMS.add(Item("mps", "MPS", legacy(mps, seconds=30), needs={"nvml": ("torch",)}, budget_s=fixed(60)))

an item with ``on_request=True`` runs only when ``--only`` names it, and ``legacy(fn)`` wraps a function of
the older subcommands' shape (``fn(args) -> dict``) into an item whose figures are recorded without a bar.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, ERROR, RECORDED, SKIPPED = "pass", "fail", "error", "recorded", "skipped"


@dataclass
class Check:
    """One figure against its bar. ``passed`` None: recorded only (no bar, or nothing to compare)."""

    name: str
    value: Any
    bar: str = ""
    passed: bool | None = None
    expected: Any = None
    note: str = ""


@dataclass
class ItemResult:
    status: str = RECORDED  # pass | fail | error | recorded | skipped
    reason: str = ""  # why skipped or what failed
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    text: str = ""  # markdown the report prints after the checks (a table of the item's own)

    def check(self, name: str, value: Any, passed: bool | None, bar: str = "", expected: Any = None,
              note: str = "") -> Check:
        made = Check(name, value, bar, passed, expected, note)
        self.checks.append(made)
        return made

    def settle(self) -> ItemResult:
        """pass when every check with a bar passed, fail when one did; recorded without bars."""
        if self.status in (ERROR, SKIPPED):
            return self
        judged = [c.passed for c in self.checks if c.passed is not None]
        self.status = RECORDED if not judged else PASS if all(judged) else FAIL
        if self.status == FAIL and not self.reason:
            self.reason = "; ".join(c.name for c in self.checks if c.passed is False)
        return self

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


Run = Callable[[Any], ItemResult]


@dataclass(frozen=True)
class Item:
    name: str
    title: str
    run: Run
    needs: Mapping[str, tuple[str, ...]]  # backend -> what it needs there; a backend absent: not there
    budget_s: Callable[[Any], float]  # seconds it may take, given the context (backend, quick, options)
    on_request: bool = False  # runs only when ``--only`` names it (an experiment, not a check of ``all``)


def fixed(seconds: float, *, sim: float | None = None, quick: float | None = None) -> Callable[[Any], float]:
    """A budget of ``seconds`` (``sim`` on the simulator, ``quick`` in a quick run)."""

    def budget(ctx: Any) -> float:
        if ctx.quick and quick is not None:
            return quick
        return sim if ctx.sim and sim is not None else seconds

    return budget


class Registry:
    """Items in the order they run."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> Item:
        if item.name in self._items:
            raise ValueError(f"item {item.name!r} registered twice")
        self._items[item.name] = item
        return item

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items.values())

    def names(self) -> list[str]:
        return list(self._items)

    def get(self, name: str) -> Item:
        return self._items[name]


ITEMS = Registry()


def legacy(fn: Callable[[argparse.Namespace], dict[str, Any]], **defaults: Any) -> Run:
    """An item from a function of the subcommands' shape: its JSON is recorded as the item's figures."""

    def run(ctx: Any) -> ItemResult:
        started = time.monotonic()
        try:
            figures = fn(argparse.Namespace(**defaults))
        except SystemExit as exc:  # such functions give up with SystemExit("why"): the item's error
            return ItemResult(status=ERROR, reason=str(exc), seconds=time.monotonic() - started)
        return ItemResult(status=RECORDED, figures=figures, seconds=time.monotonic() - started)

    return run
