"""Catalogue of the GPU models the simulated NVML can play.

Each model carries what NVML reports about it (the name string exactly as ``nvmlDeviceGetName`` returns
it, memory, power limit, clocks, PCI device ID), what it can do (MIG profiles, NVLink links, GPM, ECC,
row remapping or page retirement, memory temperature) and the physics the simulator derives values from
(idle power, idle and loaded temperature, slowdown thresholds). Figures are close to the real parts;
they are a test double's figures, not a datasheet.

``unsupported`` lists what NVML answers ``NVML_ERROR_NOT_SUPPORTED`` for on that model: pynvml function
names (the whole call) and ``NVML_FI_*`` field names (that field inside ``nvmlDeviceGetFieldValues``).
Capabilities a flag already describes (no ECC, no NVLink, no MIG, no GPM...) are added by
:func:`unsupported_names`, so the lists stay short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The MIG profile tables are shared with what reasons about MIG without a GPU (gpuagent recommend).
from gpuagent.migprofiles import A100_40GB_PROFILES as _A100_40GB_PROFILES
from gpuagent.migprofiles import A100_80GB_PROFILES as _A100_80GB_PROFILES
from gpuagent.migprofiles import H100_80GB_PROFILES as _H100_80GB_PROFILES
from gpuagent.migprofiles import MIB, MigProfile

GIB = 1024 * MIB


@dataclass(frozen=True)
class GpuModel:
    key: str  # the scenario's name for it: ``H100-SXM5-80GB``
    name: str  # nvmlDeviceGetName
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int  # total, as nvmlDeviceGetMemoryInfo reports it
    reserved_bytes: int  # nvmlMemory_v2 "reserved" (driver and firmware)
    power_limit_w: float
    power_min_limit_w: float
    idle_power_w: float
    sm_count: int
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    max_mem_clock_mhz: int
    idle_mem_clock_mhz: int
    idle_temp_c: float
    load_temp_c: float
    sw_slowdown_temp_c: float
    hw_slowdown_temp_c: float
    pci_device_id: int
    pci_subsystem_id: int
    pcie_mibps: float  # one direction, x16 at the model's generation
    nvlink_links: int = 0
    nvlink_mibps: float = 0.0  # all links, one direction
    gpm: bool = False
    ecc: bool = True
    row_remapping: bool = False
    page_retirement: bool = False
    memory_temperature: bool = False
    fan: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_slices: int = 7
    mig_memory_slices: int = 8
    max_mig_devices: int = 7
    unsupported: frozenset[str] = field(default_factory=frozenset)

    @property
    def mig(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="H100-SXM5-80GB", name="NVIDIA H100 80GB HBM3", architecture="Hopper",
            compute_capability=(9, 0), memory_bytes=81559 * MIB, reserved_bytes=580 * MIB,
            power_limit_w=700, power_min_limit_w=200, idle_power_w=72, sm_count=132,
            max_sm_clock_mhz=1980, idle_sm_clock_mhz=345, max_mem_clock_mhz=2619, idle_mem_clock_mhz=2619,
            idle_temp_c=31, load_temp_c=72, sw_slowdown_temp_c=87, hw_slowdown_temp_c=92,
            pci_device_id=0x233010DE, pci_subsystem_id=0x16C110DE, pcie_mibps=60000,
            nvlink_links=18, nvlink_mibps=429000, gpm=True, row_remapping=True, memory_temperature=True,
            mig_profiles=_H100_80GB_PROFILES,
        ),
        GpuModel(
            key="A100-SXM4-40GB", name="NVIDIA A100-SXM4-40GB", architecture="Ampere",
            compute_capability=(8, 0), memory_bytes=40960 * MIB, reserved_bytes=431 * MIB,
            power_limit_w=400, power_min_limit_w=100, idle_power_w=54, sm_count=108,
            max_sm_clock_mhz=1410, idle_sm_clock_mhz=210, max_mem_clock_mhz=1215, idle_mem_clock_mhz=1215,
            idle_temp_c=29, load_temp_c=68, sw_slowdown_temp_c=85, hw_slowdown_temp_c=92,
            pci_device_id=0x20B010DE, pci_subsystem_id=0x134F10DE, pcie_mibps=30000,
            nvlink_links=12, nvlink_mibps=286000, row_remapping=True, memory_temperature=True,
            mig_profiles=_A100_40GB_PROFILES,
        ),
        GpuModel(
            key="A100-SXM4-80GB", name="NVIDIA A100-SXM4-80GB", architecture="Ampere",
            compute_capability=(8, 0), memory_bytes=81920 * MIB, reserved_bytes=525 * MIB,
            power_limit_w=400, power_min_limit_w=100, idle_power_w=61, sm_count=108,
            max_sm_clock_mhz=1410, idle_sm_clock_mhz=210, max_mem_clock_mhz=1593, idle_mem_clock_mhz=1593,
            idle_temp_c=30, load_temp_c=69, sw_slowdown_temp_c=85, hw_slowdown_temp_c=92,
            pci_device_id=0x20B210DE, pci_subsystem_id=0x147F10DE, pcie_mibps=30000,
            nvlink_links=12, nvlink_mibps=286000, row_remapping=True, memory_temperature=True,
            mig_profiles=_A100_80GB_PROFILES,
        ),
        GpuModel(
            key="L4", name="NVIDIA L4", architecture="Ada Lovelace",
            compute_capability=(8, 9), memory_bytes=23034 * MIB, reserved_bytes=342 * MIB,
            power_limit_w=72, power_min_limit_w=40, idle_power_w=16, sm_count=58,
            max_sm_clock_mhz=2040, idle_sm_clock_mhz=210, max_mem_clock_mhz=6251, idle_mem_clock_mhz=405,
            idle_temp_c=34, load_temp_c=75, sw_slowdown_temp_c=87, hw_slowdown_temp_c=92,
            pci_device_id=0x27B810DE, pci_subsystem_id=0x16CA10DE, pcie_mibps=30000,
            row_remapping=True,
        ),
        GpuModel(
            key="T4", name="Tesla T4", architecture="Turing",
            compute_capability=(7, 5), memory_bytes=15360 * MIB, reserved_bytes=264 * MIB,
            power_limit_w=70, power_min_limit_w=60, idle_power_w=10, sm_count=40,
            max_sm_clock_mhz=1590, idle_sm_clock_mhz=300, max_mem_clock_mhz=5001, idle_mem_clock_mhz=405,
            idle_temp_c=33, load_temp_c=74, sw_slowdown_temp_c=85, hw_slowdown_temp_c=90,
            pci_device_id=0x1EB810DE, pci_subsystem_id=0x12A210DE, pcie_mibps=15000,
            page_retirement=True,
        ),
        GpuModel(
            key="RTX-4090-Laptop", name="NVIDIA GeForce RTX 4090 Laptop GPU", architecture="Ada Lovelace",
            compute_capability=(8, 9), memory_bytes=16376 * MIB, reserved_bytes=290 * MIB,
            power_limit_w=150, power_min_limit_w=5, idle_power_w=4, sm_count=76,
            max_sm_clock_mhz=2040, idle_sm_clock_mhz=210, max_mem_clock_mhz=9001, idle_mem_clock_mhz=405,
            idle_temp_c=45, load_temp_c=82, sw_slowdown_temp_c=87, hw_slowdown_temp_c=93,
            pci_device_id=0x275710DE, pci_subsystem_id=0x0B8C1028, pcie_mibps=15000,
            ecc=False, fan=True,
            unsupported=frozenset({
                "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
                "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetSerial",
            }),
        ),
    )
}

_ECC_FUNCTIONS = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMemoryErrorCounter", "nvmlDeviceGetEccMode")
_ECC_FIELDS = (
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
)
_RETIRED_FIELDS = ("NVML_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_DBE", "NVML_FI_DEV_RETIRED_PENDING")
_REMAP_FIELDS = (
    "NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING", "NVML_FI_DEV_REMAPPED_FAILURE",
)
_NVLINK_FUNCTIONS = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo")
_NVLINK_FIELDS = (
    "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL", "NVML_FI_DEV_NVLINK_BANDWIDTH_C1_TOTAL",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX",
    "NVML_FI_DEV_NVLINK_LINK_COUNT",
)
_MIG_FUNCTIONS = (
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstanceRemainingCapacity",
)
_GPM_FUNCTIONS = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet")


def unsupported_names(model: GpuModel) -> frozenset[str]:
    """Every function and field name NVML answers NOT_SUPPORTED for on ``model``."""
    names = set(model.unsupported)
    if not model.ecc:
        names.update(_ECC_FUNCTIONS + _ECC_FIELDS)
    if not model.page_retirement:
        names.update(_RETIRED_FIELDS)
    if not model.row_remapping:
        names.update((*_REMAP_FIELDS, "nvmlDeviceGetRemappedRows"))
    if not model.nvlink_links:
        names.update(_NVLINK_FUNCTIONS + _NVLINK_FIELDS)
    if not model.mig:
        names.update(_MIG_FUNCTIONS)
    if not model.gpm:
        names.update(_GPM_FUNCTIONS)
    if not model.memory_temperature:
        names.add("NVML_FI_DEV_MEMORY_TEMP")
    if not model.fan:
        names.add("nvmlDeviceGetFanSpeed")
    return frozenset(names)
