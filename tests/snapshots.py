"""Hand-built NodeSnapshots for consumer tests (exporter, API, hints): deterministic, no NVML.

- ``two_gpu_node()``: two H100s with processes, XIDs, ECC, remapped rows and GPM profiling.
- ``mig_node()``: one H100 in MIG mode with three GPU instances and their processes.
- ``lost_gpu_node()``: a GPU fallen off the bus (LOST) next to one whose last read hung (stale).
- ``laptop_node()``: a GeForce laptop GPU that supports little: many fields None.
"""

from __future__ import annotations

from gpuagent.snapshot.gpu import (
    EccCounts,
    GpuInfo,
    GpuSample,
    Health,
    MigSample,
    ProfilingSample,
    RemappedRows,
    XidRecord,
)
from gpuagent.snapshot.node import NodeSnapshot, NvmlCallStats, NvmlErrorCount, PollHistogram, SourceStatus
from gpuagent.snapshot.processes import ProcessSample

TAKEN_AT = 1_760_000_000.0  # the snapshot's wall time; tests pass clock=lambda: TAKEN_AT + 1.5
GIB = 1024**3
MIB = 1024**2

H100 = "NVIDIA H100 80GB HBM3"
# The reference's sample line (dcgm-exporter.md §2): this GPU, host and driver, at 31 C.
REF_UUID = "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
REF_BUS = "00000000:53:00.0"
REF_HOST = "ip-10-0-180-136.ec2.internal"
REF_DRIVER = "580.105.08"

ODD_COMM = 'py"th\\on\nwörker ✓'  # a quote, a backslash, a newline and non-ASCII: every escaping rule


def _h100_info(index: int, uuid: str, bus: str, *, mig: bool = False) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid,
        name=H100,
        serial=f"165322000{index:04d}",
        pci_bus_id=bus,
        minor_number=index,
        memory_total_bytes=80 * GIB,
        power_limit_watts=700.0,
        mig_enabled=mig,
        gpm_supported=True,
    )


def _sources(nvml_ok: bool = True) -> tuple[SourceStatus, ...]:
    return (
        SourceStatus("nvml", nvml_ok, 0.0125, "" if nvml_ok else "NVML_ERROR_UNKNOWN"),
        SourceStatus("xid", True, 0.0001),
    )


def _poll_histogram() -> PollHistogram:
    return PollHistogram(
        upper_bounds=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
        cumulative_counts=(10, 40, 98, 100, 100, 100),
        sum_seconds=1.25,
        count=100,
    )


def _nvml_calls() -> tuple[NvmlCallStats, ...]:
    return (
        NvmlCallStats("nvmlDeviceGetComputeRunningProcesses", 200, 0.9),
        NvmlCallStats("nvmlDeviceGetFieldValues", 200, 0.05),
        NvmlCallStats("nvmlDeviceGetUtilizationRates", 200, 0.0005),
    )


def two_gpu_node() -> NodeSnapshot:
    gpu0 = GpuSample(
        info=_h100_info(0, REF_UUID, REF_BUS),
        sampled_at_unix=TAKEN_AT,
        gpu_util_percent=87.0,
        memory_copy_util_percent=41.0,
        encoder_util_percent=0.0,
        decoder_util_percent=0.0,
        memory_used_bytes=40 * GIB + 512 * MIB + 123,
        memory_free_bytes=39 * GIB,
        memory_reserved_bytes=511 * MIB,
        sm_clock_hz=1_980_000_000.0,
        memory_clock_hz=2_619_000_000.0,
        graphics_clock_hz=1_980_000_000.0,
        temperature_celsius=31.0,
        memory_temperature_celsius=38.0,
        power_watts=412.5,
        energy_joules_total=123_456_789.012,
        pcie_replay_total=0,
        pcie_tx_bytes_total=9_876_543_210,
        pcie_rx_bytes_total=1_234_567_890,
        nvlink_bandwidth_total=5_000_000,
        clock_event_reasons=0x1,
        ecc=EccCounts(0, 0, 3, 0, 0, 0, False),
        remapped_rows=RemappedRows(correctable=2, uncorrectable=0, pending=False, failed=False),
        xid=XidRecord(last_code=31, last_seen_unix=TAKEN_AT - 60, totals={13: 2, 31: 1}, recent={31: 1}),
        profiling=ProfilingSample(
            graphics_active_ratio=0.91,
            sm_active_ratio=0.85,
            sm_occupancy_ratio=0.42,
            tensor_active_ratio=0.37,
            dram_active_ratio=0.55,
            fp64_active_ratio=0.0,
            fp32_active_ratio=0.12,
            fp16_active_ratio=0.3,
            pcie_tx_bytes_per_second=1.5e9,
            pcie_rx_bytes_per_second=2.5e8,
            nvlink_tx_bytes_per_second=4e10,
            nvlink_rx_bytes_per_second=3.9e10,
        ),
        processes=(
            ProcessSample(4242, "python3", "compute", 30 * GIB, 63.0, 20.0),
            ProcessSample(4343, ODD_COMM, "compute", 10 * GIB, 24.0, 21.0),
        ),
        process_util_read_at_unix=TAKEN_AT - 4.0,  # the GPU's per-process use is read every 10 s
        process_util_window_seconds=10.0,
    )
    gpu1 = GpuSample(
        info=_h100_info(1, "GPU-8a2c1f0e-33b1-4bd7-9e0a-5f6d7c8b9a01", "00000000:64:00.0"),
        sampled_at_unix=TAKEN_AT,
        gpu_util_percent=3.0,
        memory_copy_util_percent=1.0,
        encoder_util_percent=0.0,
        decoder_util_percent=12.0,
        memory_used_bytes=2 * GIB,
        memory_free_bytes=77 * GIB + 512 * MIB,
        memory_reserved_bytes=511 * MIB,
        sm_clock_hz=345_000_000.0,
        memory_clock_hz=2_619_000_000.0,
        graphics_clock_hz=345_000_000.0,
        temperature_celsius=27.0,
        memory_temperature_celsius=30.0,
        power_watts=71.25,
        energy_joules_total=98_765_432.1,
        pcie_replay_total=4,
        pcie_tx_bytes_total=1_000,
        pcie_rx_bytes_total=2_000,
        nvlink_bandwidth_total=0,
        clock_event_reasons=0x4 | 0x20,
        ecc=EccCounts(0, 0, 0, 0, 0, 0, False),
        remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failed=False),
        profiling=ProfilingSample(graphics_active_ratio=0.02, sm_active_ratio=0.01, dram_active_ratio=0.0),
        processes=(  # one process with a compute and a graphics context: NVML lists it twice
            ProcessSample(5151, "Xorg", "compute", 1 * GIB, 2.0, 1.0),
            ProcessSample(5151, "Xorg", "graphics", 1 * GIB, 2.0, 1.0),
        ),
    )
    return NodeSnapshot(
        hostname=REF_HOST,
        backend="sim",
        taken_at_unix=TAKEN_AT,
        taken_at_monotonic=1000.0,
        poll_duration_seconds=0.0126,
        driver_version=REF_DRIVER,
        nvml_version="12.580.105.08",
        cuda_driver_version="13.0",
        gpus=(gpu0, gpu1),
        sources=_sources(),
        nvml_calls=_nvml_calls(),
        nvml_errors=(NvmlErrorCount("nvmlDeviceGetMemoryInfo_v2", "FUNCTION_NOT_FOUND", 1),),
        polls_total=100,
        poll_histogram=_poll_histogram(),
        poll_interval_seconds=1.0,
    )


MIG_UUID = "GPU-3b1c9d7e-0f2a-4c5b-8e6d-7a8b9c0d1e2f"


def mig_node() -> NodeSnapshot:
    def instance(gi: int, profile: str, slices: int, used_gib: int, total_gib: int, **kw) -> MigSample:
        return MigSample(
            gpu_instance_id=gi,
            compute_instance_id=0,
            uuid=f"MIG-7f3e2d1c-0b9a-5c8d-{gi:04x}-000000000000",
            profile=profile,
            slice_fraction=slices / 7,
            memory_total_bytes=total_gib * GIB,
            memory_used_bytes=used_gib * GIB,
            memory_free_bytes=(total_gib - used_gib) * GIB,
            **kw,
        )

    train = ProcessSample(7001, "train", "compute", 30 * GIB, None, None, gpu_instance_id=1)
    serve = ProcessSample(7002, "serve", "compute", 8 * GIB, None, None, gpu_instance_id=5)
    migs = (
        instance(
            1, "3g.40gb", 3, 30, 40, processes=(train,),
            profiling=ProfilingSample(graphics_active_ratio=0.75, sm_active_ratio=0.7, dram_active_ratio=0.4),
        ),
        instance(
            5, "2g.20gb", 2, 8, 20, processes=(serve,), profiling=ProfilingSample(graphics_active_ratio=0.2)
        ),
        instance(13, "1g.10gb", 1, 0, 10),
    )
    gpu = GpuSample(
        info=_h100_info(0, MIG_UUID, "00000000:1B:00.0", mig=True),
        sampled_at_unix=TAKEN_AT,
        gpu_util_percent=None,  # NVML has no device utilization on a MIG GPU
        memory_copy_util_percent=None,
        encoder_util_percent=0.0,
        decoder_util_percent=0.0,
        memory_used_bytes=38 * GIB,  # the whole GPU: superseded by the instances' figures
        memory_free_bytes=41 * GIB,
        memory_reserved_bytes=511 * MIB,
        sm_clock_hz=1_755_000_000.0,
        memory_clock_hz=2_619_000_000.0,
        graphics_clock_hz=1_755_000_000.0,
        temperature_celsius=45.0,
        memory_temperature_celsius=52.0,
        power_watts=250.0,
        energy_joules_total=5_000.5,
        pcie_replay_total=0,
        clock_event_reasons=0,
        ecc=EccCounts(0, 0, 0, 0, 0, 0, False),
        remapped_rows=RemappedRows(0, 0, False, False),
        # GPU-wide GPM: PCIe is not per instance, so it stays on the GPU series; the ratios are per instance
        profiling=ProfilingSample(
            graphics_active_ratio=0.5, pcie_tx_bytes_per_second=1e8, pcie_rx_bytes_per_second=2e8
        ),
        processes=(train, serve),
        migs=migs,
    )
    return NodeSnapshot(
        hostname="mig-node",
        backend="sim",
        taken_at_unix=TAKEN_AT,
        taken_at_monotonic=2000.0,
        poll_duration_seconds=0.02,
        driver_version=REF_DRIVER,
        gpus=(gpu,),
        sources=_sources(),
        polls_total=10,
        poll_histogram=_poll_histogram(),
    )


LOST_UUID = "GPU-dead0000-0000-4000-8000-000000000000"
STALE_UUID = "GPU-5ta1e000-0000-4000-8000-000000000001"


def lost_gpu_node() -> NodeSnapshot:
    lost = GpuSample(
        info=_h100_info(0, LOST_UUID, "00000000:18:00.0"),
        sampled_at_unix=TAKEN_AT - 30,
        health=Health.LOST,
        health_detail="NVML_ERROR_GPU_IS_LOST",
        temperature_celsius=90.0,  # a value from before the loss: must not be exported
        xid=XidRecord(last_code=79, last_seen_unix=TAKEN_AT - 30, totals={79: 1}, recent={79: 1}),
    )
    stale = GpuSample(
        info=_h100_info(1, STALE_UUID, "00000000:2A:00.0"),
        sampled_at_unix=TAKEN_AT - 12,
        health=Health.UNRESPONSIVE,
        health_detail="nvmlDeviceGetComputeRunningProcesses timed out after 5s",
        stale=True,
        gpu_util_percent=55.0,
        temperature_celsius=60.0,
        power_watts=300.0,
        memory_used_bytes=10 * GIB,
        memory_free_bytes=69 * GIB,
    )
    return NodeSnapshot(
        hostname="gpu-node-7",
        backend="nvml",
        taken_at_unix=TAKEN_AT,
        taken_at_monotonic=3000.0,
        poll_duration_seconds=5.01,
        driver_version=REF_DRIVER,
        gpus=(lost, stale),
        sources=_sources(nvml_ok=False),
        nvml_calls=_nvml_calls(),
        nvml_errors=(
            NvmlErrorCount("nvmlDeviceGetTemperature", "GPU_IS_LOST", 3),
            NvmlErrorCount("nvmlDeviceGetComputeRunningProcesses", "TIMEOUT", 1),
        ),
        polls_total=42,
        poll_histogram=_poll_histogram(),
    )


def laptop_node() -> NodeSnapshot:
    gpu = GpuSample(
        info=GpuInfo(
            index=0,
            uuid="GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
            name="NVIDIA GeForce RTX 3060 Laptop GPU",
            serial=None,
            pci_bus_id="00000000:01:00.0",
            minor_number=0,
            memory_total_bytes=6 * GIB,
            power_limit_watts=None,
            mig_enabled=False,
        ),
        sampled_at_unix=TAKEN_AT,
        gpu_util_percent=12.0,
        memory_copy_util_percent=5.0,
        encoder_util_percent=0.0,
        decoder_util_percent=0.0,
        memory_used_bytes=1 * GIB,
        memory_free_bytes=5 * GIB - 256 * MIB,
        memory_reserved_bytes=256 * MIB,
        sm_clock_hz=210_000_000.0,
        memory_clock_hz=405_000_000.0,
        graphics_clock_hz=210_000_000.0,
        temperature_celsius=48.0,
        clock_event_reasons=0x1,
        processes=(
            ProcessSample(1200, "Xorg", "graphics", None, None, None),  # no per-process memory or utilization
            ProcessSample(2300, "", "compute", 300 * MIB, 4.0, None),  # exited before its name was read
        ),
    )
    return NodeSnapshot(
        hostname="laptop",
        backend="nvml",
        taken_at_unix=TAKEN_AT,
        taken_at_monotonic=4000.0,
        poll_duration_seconds=0.004,
        driver_version="550.120",
        gpus=(gpu,),
        sources=(SourceStatus("nvml", True, 0.004),),
        polls_total=1,
        poll_histogram=PollHistogram(
            upper_bounds=(0.01, 0.1), cumulative_counts=(1, 1), sum_seconds=0.004, count=1
        ),
    )


SCENARIOS = {
    "two_gpu": two_gpu_node,
    "mig": mig_node,
    "lost_gpu": lost_gpu_node,
    "laptop": laptop_node,
    "no_snapshot": lambda: None,
}
