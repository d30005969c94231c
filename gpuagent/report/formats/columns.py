"""The figures' column titles and the tables' footnotes, shared by the table and the HTML page."""

from __future__ import annotations

from collections.abc import Iterable

from gpuagent.report.model import FIGURES, NOTES, Report, Usage

TITLES = {
    "allocated_gpu_hours": "GPU-h allocated",
    "busy_gpu_hours": "GPU-h busy",
    "busy_elsewhere_gpu_hours": "GPU-h busy elsewhere",
    "efficiency_ratio": "efficiency",
    "idle_gpu_hours": "GPU-h idle",
    "memory_gib_hours": "memory GiB-h",
    "energy_kwh": "energy kWh",
    "cost": "cost",
}


def figure_names(report: Report) -> tuple[str, ...]:
    """The figures shown: all but cost when no price was given, and busy elsewhere when no row has any."""
    hidden = {name for name, shown in (("cost", report.has_cost),
                                       ("busy_elsewhere_gpu_hours", report.has_busy_elsewhere)) if not shown}
    return tuple(f for f in FIGURES if f not in hidden)


NOTE_NUMBERS = {code: number for number, code in enumerate(NOTES, start=1)}


def note_marks(usage: Usage) -> str:
    """The footnote marks of a row's efficiency (``[1,3]``), or "" when its figures add up."""
    codes = usage.notes()
    return f"[{','.join(str(NOTE_NUMBERS[c]) for c in codes)}]" if codes else ""


def footnotes(usages: Iterable[Usage]) -> list[tuple[str, str]]:
    """(mark, sentence) of each reason the rows give, in number order: what goes under their table."""
    found = {code for usage in usages for code in usage.notes()}
    return [(f"[{NOTE_NUMBERS[code]}]", text) for code, text in NOTES.items() if code in found]


def title(name: str, report: Report) -> str:
    if name == "cost" and report.prices.currency:
        return f"cost {report.prices.currency}"
    return TITLES[name]


def describe_prices(report: Report) -> str:
    """``2.50 per GPU-hour; NVIDIA H100*: 4.10 per GPU-hour; 0.12 per kWh`` or ``no prices``."""
    prices = report.prices
    unit = f" {prices.currency}" if prices.currency else ""
    parts = [f"{model}: {price:g}{unit}/GPU-hour" for model, price in prices.gpu_hour_by_model]
    if prices.gpu_hour_default is not None:
        parts.append(f"{'other GPUs: ' if parts else ''}{prices.gpu_hour_default:g}{unit}/GPU-hour")
    if prices.kwh is not None:
        parts.append(f"{prices.kwh:g}{unit}/kWh")
    return "; ".join(parts) or "no prices"
