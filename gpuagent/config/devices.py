"""The keys of the GPU reads (``gpuagent.devices``): the backend and its scenario, the poll interval and the
slower tiers' intervals, NVML's timeout, and how long an XID counts as recent.
``xid_window`` is here, not with the health keys: the poller's XID book and the exposition of the last
XID read it; the health monitor classifies each XID event as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import choice, existing_file, number

BACKENDS = ("auto", "nvml", "sim")


@dataclass(frozen=True)
class DevicesConfig:
    """Where GPU data comes from and how often it is read (``config.devices``)."""

    poll_interval: float = key(
        "poll_interval", 1.0, number(0, high=300),
        "seconds between polls of utilization, memory and processes", "SECONDS",
    )
    slow_poll_interval: float = key(
        "slow_poll_interval", 30.0, number(0),
        "seconds between polls of ECC, remapped rows, static info and MIG layout; >= poll_interval",
        "SECONDS", default_doc="30, or poll_interval when that is longer",
    )
    energy_interval: float = key(
        "energy_interval", 30.0, number(0),
        "seconds between reads of each GPU's energy counter (about 3 ms a read on an H100); "
        "<= poll_interval: every poll",
        "SECONDS",
    )
    profiling_interval: float = key(
        "profiling_interval", 10.0, number(0),
        "seconds between GPM samples for the DCGM_FI_PROF_* figures, averaged over that interval (about "
        "1.7 ms of NVML a GPU on an H100); <= poll_interval: every poll",
        "SECONDS",
    )
    process_utilization_interval: float = key(
        "process_utilization_interval", 10.0, number(0),
        "seconds between reads of per-process utilization (about 2 ms a read on an H100) on GPUs where the "
        "share controller does not act (there: every poll); the figures average over the interval; "
        "<= poll_interval: every poll",
        "SECONDS",
    )
    detail_interval: float = key(
        "detail_interval", 10.0, number(0),
        "seconds between reads of the memory and graphics clocks, encoder/decoder utilization, PCIe and "
        "NVLink counters and memory temperature; <= poll_interval: every poll",
        "SECONDS",
    )
    nvml_timeout: float = key(
        "nvml_timeout", 5.0, number(0),
        "seconds one GPU's read may take before that GPU is marked stale", "SECONDS",
    )
    backend: str = key(
        "backend", "auto", choice(*BACKENDS),
        "where GPU data comes from: real NVML, the simulator, or auto", "{" + ",".join(BACKENDS) + "}",
    )
    scenario: str | None = key(
        "scenario", None, existing_file("scenario"),
        "simulator scenario file (backend sim or auto; sim without one runs the packaged demo)", "FILE",
    )
    xid_window: float = key(
        "xid_window", 300.0, number(0),
        "seconds an XID error counts as recent", "SECONDS",
    )
