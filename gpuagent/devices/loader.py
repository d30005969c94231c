"""Choose the NVML module: the real ``pynvml`` when the driver answers, else the simulated node."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def load_nvml(backend: str, scenario: str | None) -> tuple[Any, str]:
    """``(module, backend name)`` for ``backend`` ``auto|nvml|sim``.

    ``nvml`` returns pynvml even when the driver does not load: the poller then reports NVML as down
    (``gpuagent_up 0``) and keeps retrying, which is what a GPU node whose driver is being reinstalled needs.
    ``auto`` falls back to the simulator, loudly, so nobody mistakes simulated figures for real ones.
    """
    if backend == "sim":
        return _simulated(scenario), "sim"
    import pynvml

    if backend == "nvml":
        return pynvml, "nvml"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.warning(
            "NO NVIDIA DRIVER: NVML did not load (%s). Serving a SIMULATED node from scenario %s. "
            "These are not real GPUs; use --backend nvml to require the driver.",
            exc, scenario or "(built-in demo)",
        )
        return _simulated(scenario), "sim"
    pynvml.nvmlShutdown()
    return pynvml, "nvml"


def _simulated(scenario: str | None) -> Any:
    from gpuagent.devices.sim import SimulatedNvml, default_scenario_path, load_scenario

    return SimulatedNvml(load_scenario(scenario or default_scenario_path()))
