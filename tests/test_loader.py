"""Choosing the NVML module: ``nvml`` never simulates; ``auto`` is for development and says so at start."""

from __future__ import annotations

import logging

import pynvml
import pytest

from gpuagent.devices.loader import load_nvml
from gpuagent.devices.sim import SimulatedNvml


def _no_driver() -> None:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_nvml_is_pynvml_even_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The poller then reports NVML down and retries; the backend is never swapped for the simulator."""
    calls: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init") or _no_driver())
    module, backend = load_nvml("nvml", None)
    assert module is pynvml and backend == "nvml" and calls == []  # not even tried here: the poller does


def test_auto_with_a_driver_serves_it_and_says_auto_is_for_development(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    with caplog.at_level(logging.WARNING, logger="gpuagent.devices.loader"):
        module, backend = load_nvml("auto", None)
    assert module is pynvml and backend == "nvml"
    (said,) = [r.getMessage() for r in caplog.records]
    assert "backend auto (for development)" in said and "--backend nvml" in said


def test_auto_without_a_driver_simulates_loudly(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", _no_driver)
    with caplog.at_level(logging.WARNING, logger="gpuagent.devices.loader"):
        module, backend = load_nvml("auto", None)
    assert isinstance(module, SimulatedNvml) and backend == "sim"
    (said,) = [r.getMessage() for r in caplog.records]
    assert "SIMULATED" in said and "gpuagent_simulated 1" in said and "auto is for development" in said
