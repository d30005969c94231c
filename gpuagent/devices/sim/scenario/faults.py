"""The ``faults:`` section: what goes wrong, on which GPU, and when (seconds of scenario time).

Each entry is one kind (the schema allows exactly one key): ``gpu_lost``, ``xid`` and ``xid_storm``
(optionally on a MIG GPU instance), ``ecc_sbe``/``ecc_dbe`` (only on a model with ECC memory),
``pcie_replay``, ``row_remap_failure`` (a model with row remapping), ``nvlink_down`` (links of a GPU, from a
time), ``hang`` (one pynvml function or ``any``, for some seconds) and ``init_failure``
(``nvmlInit`` fails with an NVML error until a time; one per scenario). The checks need the GPUs: an index
the scenario has, a GPU instance the GPU has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pynvml

from gpuagent.devices.sim.scenario.checks import Problems, did_you_mean, pynvml_functions
from gpuagent.devices.sim.scenario.gpus import instance_ids, missing_gpu
from gpuagent.devices.sim.scenario.spec import (
    EccFault,
    Fault,
    GpuLost,
    GpuSpec,
    HangFault,
    InitFailure,
    NvlinkDownFault,
    PcieReplayFault,
    RowRemapFailure,
    XidFault,
)


def read_faults(problems: Problems, entries: list[Mapping[str, Any]], gpus: list[GpuSpec]) -> list[Fault]:
    """The faults of the ``faults:`` entries, in order; an entry that does not fit the GPUs is left out."""
    out: list[Fault] = []
    functions = pynvml_functions()
    for i, entry in enumerate(entries):
        ((kind, f),) = entry.items()
        where = f"faults[{i}].{kind}"
        gpu = f.get("gpu")
        if gpu is not None and gpu >= len(gpus):
            problems.error(f"{where}.gpu", missing_gpu(gpu, gpus))
            continue
        at = float(f.get("at", 0.0))
        gi = f.get("gpu_instance")
        if gi is not None:
            spec = gpus[gpu]
            if not spec.mig_enabled:
                problems.error(f"{where}.gpu_instance", f"GPU {gpu} is not in MIG mode")
                continue
            if spec.instance(gi) is None:
                problems.error(f"{where}.gpu_instance",
                               f"GPU {gpu} has no GPU instance {gi} (it has: {instance_ids(spec)})")
                continue
        if kind == "gpu_lost":
            out.append(GpuLost(gpu, at))
        elif kind == "xid":
            out.append(XidFault(gpu, at, f["code"], gi))
        elif kind == "xid_storm":
            out.append(XidFault(gpu, at, f["code"], gi, f["count"], float(f.get("interval", 0.0))))
        elif kind in ("ecc_dbe", "ecc_sbe"):
            if not gpus[gpu].model.ecc:
                problems.error(where, f"GPU {gpu} ({gpus[gpu].model.key}) has no ECC memory")
                continue
            out.append(EccFault(gpu, at, f.get("count", 1), double_bit=kind == "ecc_dbe"))
        elif kind == "row_remap_failure":
            if not gpus[gpu].model.row_remapping:
                problems.error(where, f"GPU {gpu} ({gpus[gpu].model.key}) has no row remapping")
                continue
            out.append(RowRemapFailure(gpu, at))
        elif kind == "nvlink_down":
            links = tuple(f["links"])
            bad = [link for link in links if link >= gpus[gpu].model.nvlink_links]
            if bad:
                problems.error(f"{where}.links", f"GPU {gpu} ({gpus[gpu].model.key}) has "
                               f"{gpus[gpu].model.nvlink_links} NVLink links (0-based): no link {bad[0]}")
                continue
            out.append(NvlinkDownFault(gpu, at, links))
        elif kind == "pcie_replay":
            out.append(PcieReplayFault(gpu, at, f.get("count", 1)))
        elif kind == "hang":
            fn = f.get("function", "any")
            if fn != "any" and fn not in functions:
                problems.error(f"{where}.function",
                               f"{fn!r} is not a pynvml function (or 'any'){did_you_mean(fn, functions)}")
                continue
            out.append(HangFault(None if fn == "any" else fn, gpu, at, float(f["seconds"])))
        elif kind == "init_failure":
            name = f.get("error", "DRIVER_NOT_LOADED")
            code = getattr(pynvml, name if name.startswith("NVML_ERROR_") else f"NVML_ERROR_{name}", None)
            if not isinstance(code, int):
                problems.error(f"{where}.error", f"unknown NVML error {name!r} (e.g. DRIVER_NOT_LOADED)")
                continue
            if any(isinstance(x, InitFailure) for x in out):
                problems.error(where, "only one init_failure per scenario")
                continue
            out.append(InitFailure(float(f["until"]), code))
    return out
