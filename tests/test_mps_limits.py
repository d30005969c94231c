"""What a GPU process's environment says: /proc/PID/environ, the devices it was given and how CUDA numbers
them, and an MPS client's limits (pure, and against real processes' environments)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuagent.pods.environ import EnvironReader, parse_environ
from gpuagent.pods.mps import (
    MpsLimitError,
    client_limits,
    parse_memory_limits,
    parse_size,
    parse_thread_percentage,
    with_client_limits,
)
from gpuagent.pods.visible import cuda_devices, given_devices
from gpuagent.snapshot.gpu import GpuInfo, GpuSample, MigSample
from gpuagent.snapshot.processes import MPS_CLIENT, MpsLimits, ProcessSample

GIB, MIB = 1 << 30, 1 << 20


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", migs: tuple[int, ...] = (),
        processes: tuple[ProcessSample, ...] = ()) -> GpuSample:
    info = GpuInfo(index=index, uuid=f"GPU-{index}aaa", name=name, serial=None, pci_bus_id=f"0:{index}",
                   minor_number=index, memory_total_bytes=80 * GIB, power_limit_watts=700.0,
                   mig_enabled=bool(migs))
    mig_samples = tuple(
        MigSample(gpu_instance_id=gi, compute_instance_id=0, uuid=f"MIG-{index}-{gi}", profile="3g.40gb",
                  slice_fraction=3 / 7, memory_total_bytes=40 * GIB, memory_used_bytes=0, memory_free_bytes=0,
                  processes=tuple(p for p in processes if p.gpu_instance_id == gi))
        for gi in migs
    )
    return GpuSample(info=info, sampled_at_unix=0.0, processes=processes, migs=mig_samples)


NODE = [gpu(0), gpu(1), gpu(2), gpu(3)]


# -- /proc/PID/environ ---------------------------------------------------------------------------------------


def test_parse_keeps_only_the_wanted_variables() -> None:
    data = (b"PATH=/usr/bin\0HOSTNAME=train-0\0AWS_SECRET_ACCESS_KEY=hunter2\0NVIDIA_VISIBLE_DEVICES=GPU-1\0"
            b"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G,1=512MB\0BROKEN\0CUDA_VISIBLE_DEVICES=\xff\0")
    env = parse_environ(data)
    assert dict(env) == {"HOSTNAME": "train-0", "NVIDIA_VISIBLE_DEVICES": "GPU-1",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,1=512MB", "CUDA_VISIBLE_DEVICES": "\ufffd"}


def test_reads_a_real_process_environment() -> None:
    env = {**os.environ, "HOSTNAME": "pod-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # past exec: environ is there
        got = EnvironReader("/proc").read(proc.pid)
        assert got is not None
        assert got["HOSTNAME"] == "pod-a" and got["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert "PATH" not in got
    finally:
        proc.kill()
        proc.wait()
    assert EnvironReader("/proc").read(proc.pid) is None  # gone: unknown, and nothing logged


def test_simulated_pids_come_from_the_fallback(tmp_path: Path) -> None:
    reader = EnvironReader(tmp_path, fallback=lambda pid: b"HOSTNAME=sim\0" if pid == 4_200_000 else None)
    assert dict(reader.read(4_200_000) or {}) == {"HOSTNAME": "sim"}
    assert reader.read(4_200_001) is None


def test_an_unreadable_environment_is_unknown_and_said_once(tmp_path: Path, caplog) -> None:
    for pid in (10, 11):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").mkdir()  # reading a directory fails with EISDIR, not "gone"
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "environ").write_bytes(b"")  # an exiting process reads as empty
    reader = EnvironReader(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert reader.read(10) is None and reader.read(11) is None and reader.read(12) is None
    warnings = [r for r in caplog.records if "environ" in r.getMessage()]
    assert len(warnings) == 1 and "CAP_SYS_PTRACE" in warnings[0].getMessage()


# -- the devices a process was given --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("GPU-1aaa", {"GPU-1aaa"}),
    ("GPU-3aaa,GPU-1aaa", {"GPU-1aaa", "GPU-3aaa"}),
    ("2", {"GPU-2aaa"}),  # the device plugin's index strategy: host NVML indices
    ("all", None), ("none", None), ("void", None), ("", None),
    ("/var/run/nvidia-container-devices", None),  # the volume-mounts strategy
    ("GPU-9zzz", None),  # a device this node does not have: nothing can be read from it
])
def test_given_devices(value: str, expected: set[str] | None) -> None:
    got = given_devices({"NVIDIA_VISIBLE_DEVICES": value}, NODE)
    assert got == (frozenset(expected) if expected is not None else None)
    assert given_devices({}, NODE) is None


def test_given_mig_devices_and_their_pre_r470_names() -> None:
    node = [gpu(0, migs=(1, 2)), gpu(1)]
    assert given_devices({"NVIDIA_VISIBLE_DEVICES": "MIG-0-2"}, node) == {"MIG-0-2"}
    assert given_devices({"NVIDIA_VISIBLE_DEVICES": "MIG-GPU-0aaa/2/0"}, node) == {"GPU-0aaa"}


def test_cuda_numbers_a_containers_devices_in_pci_order() -> None:
    assert cuda_devices({"NVIDIA_VISIBLE_DEVICES": "GPU-3aaa,GPU-1aaa"}, NODE) == ("GPU-1aaa", "GPU-3aaa")
    assert cuda_devices({}, NODE) == ("GPU-0aaa", "GPU-1aaa", "GPU-2aaa", "GPU-3aaa")
    assert cuda_devices({"NVIDIA_VISIBLE_DEVICES": "all"}, NODE) == cuda_devices({}, NODE)


def test_cuda_visible_devices_selects_and_orders() -> None:
    base = {"NVIDIA_VISIBLE_DEVICES": "GPU-1aaa,GPU-2aaa,GPU-3aaa"}
    assert cuda_devices({**base, "CUDA_VISIBLE_DEVICES": "2,0"}, NODE) == ("GPU-3aaa", "GPU-1aaa")
    assert cuda_devices({**base, "CUDA_VISIBLE_DEVICES": "GPU-2"}, NODE) == ("GPU-2aaa",)  # a unique prefix
    assert cuda_devices({**base, "CUDA_VISIBLE_DEVICES": "1,7,0"}, NODE) == ("GPU-2aaa",)  # stops at 7
    assert cuda_devices({**base, "CUDA_VISIBLE_DEVICES": "GPU-,1"}, NODE) == ()  # an ambiguous prefix
    assert cuda_devices({**base, "CUDA_VISIBLE_DEVICES": ""}, NODE) == ()


def test_cuda_numbering_that_cannot_be_known() -> None:
    mixed = [gpu(0, "NVIDIA H100 80GB HBM3"), gpu(1, "NVIDIA L4")]
    assert cuda_devices({}, mixed) is None  # FASTEST_FIRST between two models
    assert cuda_devices({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, mixed) == ("GPU-0aaa", "GPU-1aaa")
    assert cuda_devices({}, [gpu(0, migs=(1,)), gpu(1)]) is None  # MIG devices nothing names
    assert cuda_devices({"NVIDIA_VISIBLE_DEVICES": "MIG-0-1"}, [gpu(0, migs=(1,))]) == ("MIG-0-1",)
    assert cuda_devices({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}, NODE) is None


# -- MPS limits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "size"), [
    ("1G", GIB), ("512MB", 512 * MIB), ("10240M", 10 * GIB), ("2GiB", 2 * GIB), (" 1.5g ", 3 * GIB // 2),
    ("64K", 64 << 10), ("1T", 1 << 40),
])
def test_sizes_are_in_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["1024", "G", "1X", "-1G", "one gig", ""])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(MpsLimitError):
        parse_size(text)


def test_thread_percentage() -> None:
    assert parse_thread_percentage(" 30 ") == 30.0 and parse_thread_percentage("12.5") == 12.5
    for bad in ("0", "101", "-5", "half", "nan"):
        with pytest.raises(MpsLimitError, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
            parse_thread_percentage(bad)


def test_memory_limit_lists() -> None:
    assert parse_memory_limits("0=1G,1=512MB") == ((0, GIB), (1, 512 * MIB))
    assert parse_memory_limits("GPU-1aaa=8G, MIG-0-2=2G,") == (("GPU-1aaa", 8 * GIB), ("MIG-0-2", 2 * GIB))
    for bad in ("1G", "x=1G", "=1G", "0=lots"):
        with pytest.raises(MpsLimitError):
            parse_memory_limits(bad)


def test_an_ordinal_is_relative_to_the_devices_the_client_sees() -> None:
    """``0=8G`` in a container given GPU 2 limits GPU 2; ordinals past what it sees limit nothing."""
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-2aaa", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G,1=4G",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    assert client_limits(env, "GPU-2aaa", NODE) == MpsLimits(30.0, 8 * GIB)
    # a client given GPUs 1 and 3 and selecting the second one: its device 0 is GPU 3
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1aaa,GPU-3aaa", "CUDA_VISIBLE_DEVICES": "1",
           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}
    assert client_limits(env, "GPU-3aaa", NODE) == MpsLimits(None, 2 * GIB)
    assert client_limits(env, "GPU-1aaa", NODE) == MpsLimits(None, None)  # not a device it sees
    # on the bare host, an ordinal is the GPU's index
    assert client_limits({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G,3=3G"}, "GPU-3aaa", NODE).pinned_memory_limit_bytes == 3 * GIB


def test_uuids_name_devices_directly_and_mig_devices_too() -> None:
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-1=4G,MIG-0-2=1G"}  # a prefix is enough, as for CUDA
    assert client_limits(env, "GPU-1aaa", NODE).pinned_memory_limit_bytes == 4 * GIB
    assert client_limits(env, "MIG-0-2", [gpu(0, migs=(1, 2))]).pinned_memory_limit_bytes == GIB
    assert client_limits({"NVIDIA_VISIBLE_DEVICES": "MIG-0-2", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3G"},
                         "MIG-0-2", [gpu(0, migs=(1, 2))]).pinned_memory_limit_bytes == 3 * GIB


def test_unset_means_unlimited_and_unresolvable_means_unknown() -> None:
    assert client_limits({}, "GPU-0aaa", NODE) == MpsLimits(None, None)
    assert client_limits({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": ""}, "GPU-0aaa", NODE) == MpsLimits(None, None)
    mixed = [gpu(0, "NVIDIA H100 80GB HBM3"), gpu(1, "NVIDIA L4")]
    with pytest.raises(MpsLimitError, match="ordinals"):
        client_limits({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"}, "GPU-0aaa", mixed)
    assert client_limits({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-1aaa=1G"}, "GPU-1aaa", mixed) == MpsLimits(
        None, GIB)  # UUIDs need no numbering


def client(pid: int, gi: int | None = None) -> ProcessSample:
    return ProcessSample(pid, f"p{pid}", MPS_CLIENT, GIB, 10.0, 5.0, gpu_instance_id=gi)


def test_limits_land_on_each_client_and_its_mig_instance_list() -> None:
    plain = ProcessSample(5, "other", "compute", GIB, 1.0, 1.0)
    node = [gpu(0, migs=(1, 2), processes=(client(10, 2), client(11, 1))), gpu(1, processes=(plain,))]
    environs = {10: {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "MIG-0-2=2G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
                11: {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "bogus"}, 5: {"HOSTNAME": "x"}}
    failures: list[tuple[int, str]] = []
    out = with_client_limits(node, environs, lambda pid, err: failures.append((pid, str(err))))
    assert out[1] is node[1]  # no MPS client: the same object
    by_pid = {p.pid: p for p in out[0].processes}
    assert by_pid[10].mps == MpsLimits(50.0, 2 * GIB)
    assert by_pid[11].mps is None and failures == [(11, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='bogus' is not a percentage")]
    assert out[0].migs[1].processes[0] is by_pid[10] and out[0].migs[0].processes[0] is by_pid[11]
