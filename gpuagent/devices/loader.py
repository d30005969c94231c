"""Choose the NVML module: the real ``pynvml`` when the driver answers, else the simulated node."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def load_nvml(backend: str, scenario: str | None) -> tuple[Any, str]:
    """``(module, backend name)`` for ``backend`` ``auto|nvml|sim``.

    ``nvml`` returns pynvml even when the driver does not load: the poller then reports NVML as down
    (``gpuagent_up 0``) and keeps retrying, which is what a GPU node whose driver is being reinstalled needs.
    ``auto`` is for development: it falls back to the simulator, loudly, and says at start that it is no
    production setting (the Dockerfile, the systemd unit and the manifests run ``nvml``). A simulated node
    also says so on every scrape (``gpuagent_simulated 1``), so nobody mistakes its figures for real ones.
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
            "These are not real GPUs (/metrics says gpuagent_simulated 1). Backend auto is for development: "
            "use --backend nvml to require the driver.",
            exc, scenario or "(built-in demo)",
        )
        return _simulated(scenario), "sim"
    pynvml.nvmlShutdown()
    log.warning("backend auto (for development): NVML loaded, serving the real GPUs; had it not, this would "
                "serve a simulated node. Run production with --backend nvml.")
    return pynvml, "nvml"


def _simulated(scenario: str | None) -> Any:
    from gpuagent.devices.sim import SimulatedNvml, default_scenario_path, load_scenario

    return SimulatedNvml(load_scenario(scenario or default_scenario_path()))
