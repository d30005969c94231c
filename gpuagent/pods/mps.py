"""An MPS client's limits from its environment, resolved to the device it runs on.

NVIDIA's MPS documentation (the client environment variables of its "Tools and Interface Reference"):

- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30``: the client's contexts may use at most that share of the SMs
  of each device (a cap on space, not on time: it may run all the time on its 30 %).
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G,1=512MB"``: per device, the device memory the client may
  allocate through CUDA; an allocation past it fails in the client. Devices are named as
  ``CUDA_VISIBLE_DEVICES`` names them: CUDA ordinals (numbered as the client sees its devices, so ``0``
  in a one-GPU container is that GPU) or UUIDs. Sizes take K, M, G or T (B or iB optional), in powers of
  1024 as the NVIDIA device plugin writes them (``set_default_device_pinned_mem_limit 0 4606M``). A
  device the variable does not name is not limited.

A variable that is not set leaves the client unlimited by its environment (the control daemon's own
defaults, ``set_default_active_thread_percentage`` and ``set_default_device_pinned_mem_limit``, which the
NVIDIA device plugin uses for its MPS replicas, do not show in any environment). A value that does not
parse, or an ordinal that cannot be resolved (see :mod:`gpuagent.pods.visible`), makes the limits
unknown: :class:`MpsLimitError`. Limits hold per client process, not per container or pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpuagent.pods.environ import MPS_MEMORY, MPS_THREADS
from gpuagent.pods.matching import device_key
from gpuagent.pods.visible import cuda_devices
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.processes import MPS_CLIENT, MpsLimits, ProcessSample

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT])(?:i?B)?\s*$", re.IGNORECASE)
_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4}


class MpsLimitError(ValueError):
    """An MPS limit variable that does not parse, or names devices that cannot be resolved."""


def parse_thread_percentage(text: str) -> float:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a number in (0, 100]."""
    try:
        value = float(text.strip())
    except ValueError:
        raise MpsLimitError(f"{MPS_THREADS}={text!r} is not a percentage") from None
    if not 0 < value <= 100:
        raise MpsLimitError(f"{MPS_THREADS}={text!r} is not a percentage in (0, 100]")
    return value


def parse_size(text: str) -> int:
    """``1G``, ``512MB``, ``10240M``, ``2GiB`` in bytes (powers of 1024); a bare number is refused: its
    unit is not documented."""
    match = _SIZE.match(text)
    if match is None:
        raise MpsLimitError(f"{text!r} is not a size like 512M or 8G")
    return int(float(match.group(1)) * 1024 ** _POWERS[match.group(2).upper()])


def parse_memory_limits(text: str) -> tuple[tuple[int | str, int], ...]:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: (CUDA ordinal or UUID, bytes) per entry, in order."""
    out: list[tuple[int | str, int]] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        device, sep, size = entry.rpartition("=")
        device = device.strip()
        if not sep or not device:
            raise MpsLimitError(f"{MPS_MEMORY} entry {entry!r} is not DEVICE=SIZE (e.g. 0=8G)")
        if device.isascii() and device.isdigit():
            out.append((int(device), parse_size(size)))
        elif device.startswith(("GPU-", "MIG-")):
            out.append((device, parse_size(size)))
        else:
            raise MpsLimitError(f"{MPS_MEMORY} entry {entry!r} names no device (an ordinal or a UUID)")
    return tuple(out)


def client_limits(environ: Mapping[str, str], device: str, gpus: Sequence[GpuSample]) -> MpsLimits:
    """The limits of the MPS client with ``environ`` on ``device`` (a MIG device's UUID, or the GPU's)."""
    threads = environ.get(MPS_THREADS)
    memory = environ.get(MPS_MEMORY)
    percent = parse_thread_percentage(threads) if threads is not None and threads.strip() else None
    limit = None
    if memory is not None and memory.strip():
        ordinals: tuple[str, ...] | None = None
        for name, size in parse_memory_limits(memory):
            if isinstance(name, int):
                if ordinals is None:
                    ordinals = cuda_devices(environ, gpus)
                    if ordinals is None:
                        raise MpsLimitError(
                            f"{MPS_MEMORY}={memory!r} names CUDA ordinals, and how this process numbers its "
                            "devices is not known (give UUIDs, or CUDA_DEVICE_ORDER=PCI_BUS_ID)")
                hit = name < len(ordinals) and ordinals[name] == device
            else:
                hit = device.startswith(name)
            if hit:
                limit = size
                break
    return MpsLimits(active_thread_percent=percent, pinned_memory_limit_bytes=limit)


def with_client_limits(
    gpus: Sequence[GpuSample],
    environs: Mapping[int, Mapping[str, str] | None],
    failed: Callable[[int, MpsLimitError], None],
) -> tuple[GpuSample, ...]:
    """The GPUs with each MPS client's limits set from its environment (``environs``: PID -> the wanted
    variables, None when unknown). A client whose variables do not resolve keeps ``mps=None`` (unknown)
    and is reported to ``failed``. GPUs without an MPS client come back as they are."""
    out = []
    for gpu in gpus:
        if not any(p.kind == MPS_CLIENT for p in gpu.processes):
            out.append(gpu)
            continue
        done: dict[int, ProcessSample] = {}
        for process in gpu.processes:
            environ = environs.get(process.pid)
            if process.kind != MPS_CLIENT or environ is None:
                done[id(process)] = process
                continue
            try:
                limits = client_limits(environ, device_key(gpu, process), gpus)
            except MpsLimitError as exc:
                failed(process.pid, exc)
                limits = None
            done[id(process)] = replace(process, mps=limits)
        out.append(replace(
            gpu,
            processes=tuple(done[id(p)] for p in gpu.processes),
            migs=tuple(replace(m, processes=tuple(done.get(id(p), p) for p in m.processes))
                       for m in gpu.migs),
        ))
    return tuple(out)

