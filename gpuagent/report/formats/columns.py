"""The figures' column titles, shared by the table and the HTML page."""

from __future__ import annotations

from gpuagent.report.model import FIGURES, Report

TITLES = {
    "allocated_gpu_hours": "GPU-h allocated",
    "busy_gpu_hours": "GPU-h busy",
    "efficiency_ratio": "efficiency",
    "idle_gpu_hours": "GPU-h idle",
    "memory_gib_hours": "memory GiB-h",
    "energy_kwh": "energy kWh",
    "cost": "cost",
}


def figure_names(report: Report) -> tuple[str, ...]:
    """The figures shown: all but cost when no price was given."""
    return FIGURES if report.has_cost else tuple(f for f in FIGURES if f != "cost")


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
