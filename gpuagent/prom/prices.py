"""Prices: per GPU-hour (one default, or per GPU model) and per kWh, from flags or a YAML/JSON file::

    currency: USD          # printed next to costs (optional)
    kwh: 0.12              # per kWh of GPU energy (optional)
    gpu_hour:              # per allocated GPU-hour: a number, or a map of model -> price
      "NVIDIA H100 80GB HBM3": 4.10
      "NVIDIA A100*": 2.20  # shell-style patterns, matched in file order, case-insensitively
      default: 1.50         # any other model (optional)

Models are ``gpuagent_gpu_info``'s ``modelName``. ``--price-gpu-hour`` and ``--price-kwh`` override the
file's ``default`` and ``kwh``.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuagent.prom.errors import ReportError

_KEYS = ("currency", "kwh", "gpu_hour")


@dataclass(frozen=True)
class Prices:
    gpu_hour_default: float | None = None
    gpu_hour_by_model: tuple[tuple[str, float], ...] = ()  # (model or pattern, price), in file order
    kwh: float | None = None
    currency: str = ""

    @property
    def any(self) -> bool:
        return self.gpu_hour_default is not None or bool(self.gpu_hour_by_model) or self.kwh is not None

    @property
    def prices_gpu_hours(self) -> bool:
        return self.gpu_hour_default is not None or bool(self.gpu_hour_by_model)

    def gpu_hour(self, model: str | None) -> float | None:
        """The price of one GPU-hour of ``model`` (None: the model is unknown), or None when no price
        applies."""
        if model is not None:
            folded = model.casefold()
            for pattern, price in self.gpu_hour_by_model:
                if fnmatch.fnmatchcase(folded, pattern.casefold()):
                    return price
        return self.gpu_hour_default

    def as_dict(self) -> dict[str, Any]:
        return {"currency": self.currency or None, "kwh": self.kwh, "gpu_hour_default": self.gpu_hour_default,
                "gpu_hour_by_model": dict(self.gpu_hour_by_model)}


def load_prices(path: str | None, price_gpu_hour: float | None, price_kwh: float | None) -> Prices:
    """The prices of the file at ``path`` (if any) with the flags' prices over them."""
    prices = _load_file(Path(path)) if path else Prices()
    if price_gpu_hour is not None:
        prices = Prices(price_gpu_hour, prices.gpu_hour_by_model, prices.kwh, prices.currency)
    if price_kwh is not None:
        prices = Prices(prices.gpu_hour_default, prices.gpu_hour_by_model, price_kwh, prices.currency)
    return prices


def parse_price(text: str, what: str) -> float:
    try:
        return _price(float(text), what)
    except ValueError:
        raise ReportError(f"{what}: expected a price (a number >= 0), got {text!r}") from None


def _load_file(path: Path) -> Prices:
    where = f"--prices {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ReportError(f"{where}: cannot read it: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ReportError(f"{where}: not YAML or JSON: {err}") from None
    if not isinstance(document, Mapping):
        raise ReportError(f"{where}: expected a map with {', '.join(_KEYS)}, got {type(document).__name__}")
    unknown = sorted(str(k) for k in document if k not in _KEYS)
    if unknown:
        raise ReportError(f"{where}: {unknown[0]}: unknown key (expected one of {', '.join(_KEYS)})")
    currency = document.get("currency", "")
    if currency is None:
        currency = ""
    if not isinstance(currency, str):
        raise ReportError(f"{where}: currency: expected a string like USD, got {currency!r}")
    kwh = None if document.get("kwh") is None else _number(document["kwh"], f"{where}: kwh")
    default: float | None = None
    by_model: list[tuple[str, float]] = []
    gpu_hour = document.get("gpu_hour")
    if isinstance(gpu_hour, Mapping):
        for model, value in gpu_hour.items():
            if not isinstance(model, str) or not model.strip():
                raise ReportError(f"{where}: gpu_hour: expected GPU model names as keys, got {model!r}")
            price = _number(value, f"{where}: gpu_hour.{model}")
            if model == "default":
                default = price
            else:
                by_model.append((model, price))
    elif gpu_hour is not None:
        default = _number(gpu_hour, f"{where}: gpu_hour")
    return Prices(default, tuple(by_model), kwh, currency.strip())


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{what}: expected a price (a number >= 0), got {value!r}")
    return _price(float(value), what)


def _price(value: float, what: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise ReportError(f"{what}: expected a price (a number >= 0), got {value!r}")
    return value
