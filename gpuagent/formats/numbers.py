"""How figures are written for people (table, HTML): few digits, never a misleading 0, ``-`` for none."""

from __future__ import annotations

NONE = "-"


def quantity(value: float | None) -> str:
    """GPU-hours, GiB-hours, kWh: ``12,345.6``, ``12.35``, ``0.00833``, ``0``."""
    if value is None:
        return NONE
    size = abs(value)
    if size == 0:
        return "0"
    if size >= 100:
        return f"{value:,.1f}"
    if size >= 1:
        return f"{value:.2f}"
    if size >= 0.001:
        return f"{value:.3g}"
    return f"{value:.2e}"


def percent(ratio: float | None) -> str:
    return NONE if ratio is None else f"{ratio * 100:.1f}%"


def money(value: float | None) -> str:
    return NONE if value is None else f"{value:,.2f}"


def figure(name: str, value: float | None) -> str:
    """A figure of ``Usage.figures()`` by its name."""
    if name == "efficiency_ratio":
        return percent(value)
    if name == "cost":
        return money(value)
    return quantity(value)
