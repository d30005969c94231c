"""The one classification table: every fault the agent sees, its node condition, severity and action.

Severity: ``info`` (the workload's own error: an Event on its pod, the node stays healthy), ``degraded``
(the GPU works but should not take new work: NoSchedule) and ``fatal`` (the GPU cannot be trusted: cordon,
drain, hand off remediation). Recommended action: ``none``, ``restart_workload``, ``reset_gpu``, ``reboot``,
``replace``. A fault whose action is a reset, a reboot or a replacement is *held* until the GPU is seen
healthy after a reset (``needs_reset``). docs/health.md renders this table; the sources, by name:

- XIDs: NVIDIA's "Xid Errors" catalogue (docs.nvidia.com/deploy/xid-errors, the Ampere-and-later table's
  "Resolution Bucket (Immediate Action)": RESTART_APP, RESET_GPU, RESTART_BM), and the NVIDIA device plugin's
  list of application XIDs it does not mark a device unhealthy for (13, 31, 43, 45, 68, 109).
- ECC, page retirement and row remapping: NVIDIA's "Dynamic Page Retirement" and "A100/H100 GPU Memory Error
  Management" (row remapping: a pending remap needs a GPU reset; a remapping failure means the GPU must be
  replaced), NVML's ``nvmlDeviceGetRemappedRows`` and ``nvmlDeviceGetRetiredPagesPendingStatus``.
- Clock slowdowns: NVML's ``nvmlClocksEventReasons`` bits (``nvml.h``): thermal slowdowns (software and
  hardware) and the power brake are faults; the software power cap, idle and application clocks are normal.
- NVLink: ``nvmlDeviceGetNvLinkState`` answering disabled for a link that was up at some read since the agent
  started, on a GPU whose other links are up (a link never up, e.g. a PCIe card's missing bridge, is not a
  fault).
- DRA device taints: KEP-5055 (``resource.k8s.io`` v1beta2/v1 ``ResourceSlice.spec.devices[].taints``) and
  NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, its DeviceHealthCheck taints).
- The agent's own view: a GPU NVML calls lost (``NVML_ERROR_GPU_IS_LOST``: off the bus), unresponsive (a call
  hung past its timeout), failing reads, and NVML itself failing.
"""

from __future__ import annotations

from dataclasses import dataclass

HARDWARE = "GpuHardwareHealthy"  # memory (ECC, retirement, remapping) and the GPU on its bus
DRIVER = "GpuDriverHealthy"  # the driver, GSP firmware, NVML and the agent's reads
INTERCONNECT = "GpuInterconnectHealthy"  # NVLink
THERMAL = "GpuThermalHealthy"  # thermal and power-brake slowdowns
CONDITIONS = (HARDWARE, DRIVER, INTERCONNECT, THERMAL)

INFO, DEGRADED, FATAL = "info", "degraded", "fatal"
SEVERITIES = ("ok", INFO, DEGRADED, FATAL)  # in order: the worst is the last
ACTIONS = ("none", "restart_workload", "reset_gpu", "reboot", "replace")
RESET_ACTIONS = frozenset({"reset_gpu", "reboot", "replace"})


@dataclass(frozen=True)
class Rule:
    """One row of the table."""

    reason: str
    condition: str | None  # None: an Event only (the workload's own error)
    severity: str
    action: str
    message: str
    source: str
    hysteresis: bool = True  # False: it clears the poll it is gone (a taint removed on purpose, not a flap)

    @property
    def needs_reset(self) -> bool:
        return self.action in RESET_ACTIONS


_XID_CATALOGUE = "NVIDIA Xid catalogue"
_APP = "NVIDIA Xid catalogue (RESTART_APP); NVIDIA device plugin's application XIDs"

XID_RULES: dict[int, Rule] = {
    13: Rule("XidGraphicsException", None, INFO, "restart_workload",
             "XID 13: graphics engine exception (usually the application)", _APP),
    31: Rule("XidMemoryPageFault", None, INFO, "restart_workload",
             "XID 31: GPU memory page fault (usually an illegal address in the application)", _APP),
    43: Rule("XidStoppedProcessing", None, INFO, "restart_workload",
             "XID 43: GPU stopped processing (the application's channel was reset)", _APP),
    45: Rule("XidPreemptiveCleanup", None, INFO, "none",
             "XID 45: preemptive cleanup after an earlier error or a killed process", _APP),
    48: Rule("XidDoubleBitEcc", HARDWARE, FATAL, "reset_gpu",
             "XID 48: uncorrectable double-bit ECC error",
             _XID_CATALOGUE + " (RESET_GPU); Dynamic Page Retirement"),
    63: Rule("XidRowRemapPending", HARDWARE, DEGRADED, "reset_gpu",
             "XID 63: a memory row marked for remapping (or page retired); a GPU reset activates it",
             _XID_CATALOGUE + "; GPU Memory Error Management"),
    64: Rule("XidRowRemapFailure", HARDWARE, FATAL, "replace",
             "XID 64: remapping a memory row (or retiring a page) failed",
             _XID_CATALOGUE + "; GPU Memory Error Management"),
    74: Rule("XidNvlinkError", INTERCONNECT, FATAL, "reset_gpu", "XID 74: NVLink error",
             _XID_CATALOGUE + " (RESET_GPU)"),
    79: Rule("XidFallenOffBus", HARDWARE, FATAL, "reboot", "XID 79: the GPU has fallen off the bus",
             _XID_CATALOGUE + " (RESTART_BM)"),
    92: Rule("XidHighSingleBitEccRate", HARDWARE, DEGRADED, "none",
             "XID 92: high rate of corrected single-bit ECC errors", _XID_CATALOGUE),
    94: Rule("XidContainedEcc", HARDWARE, DEGRADED, "restart_workload",
             "XID 94: contained uncorrectable ECC error (the application that touched it was stopped)",
             _XID_CATALOGUE + " (RESTART_APP)"),
    95: Rule("XidUncontainedEcc", HARDWARE, FATAL, "reset_gpu", "XID 95: uncontained uncorrectable ECC error",
             _XID_CATALOGUE + " (RESET_GPU)"),
    119: Rule("XidGspTimeout", DRIVER, FATAL, "reset_gpu", "XID 119: timeout waiting for the GSP firmware",
              _XID_CATALOGUE + " (RESET_GPU)"),
    120: Rule("XidGspError", DRIVER, FATAL, "reset_gpu", "XID 120: error in the GSP firmware",
              _XID_CATALOGUE + " (RESET_GPU)"),
}

XID_UNKNOWN = Rule("XidOther", None, INFO, "none",
                   "XID {code}: not in the agent's table (see NVIDIA's catalogue)", _XID_CATALOGUE)

# The other faults, by the reason each is reported with
ECC_UNCORRECTABLE = Rule("EccUncorrectable", HARDWARE, FATAL, "reset_gpu",
                         "uncorrectable (double-bit) ECC errors since the last reset",
                         "NVML nvmlDeviceGetTotalEccErrors (volatile); Dynamic Page Retirement")
PAGE_RETIREMENT_PENDING = Rule("PageRetirementPending", HARDWARE, DEGRADED, "reset_gpu",
                               "retired pages pending: a GPU reset (or driver reload) retires them",
                               "NVML nvmlDeviceGetRetiredPagesPendingStatus; Dynamic Page Retirement")
ROW_REMAP_PENDING = Rule("RowRemapPending", HARDWARE, DEGRADED, "reset_gpu",
                         "a memory row remap is pending: a GPU reset activates it",
                         "NVML nvmlDeviceGetRemappedRows; GPU Memory Error Management")
ROW_REMAP_FAILURE = Rule("RowRemapFailure", HARDWARE, FATAL, "replace",
                         "row remapping failed: the GPU's memory cannot be repaired",
                         "NVML nvmlDeviceGetRemappedRows; GPU Memory Error Management")
NVLINK_DOWN = Rule("NvlinkDown", INTERCONNECT, DEGRADED, "reset_gpu", "NVLink links down: {links}",
                   "NVML nvmlDeviceGetNvLinkState")
THERMAL_SLOWDOWN = Rule("ThermalSlowdown", THERMAL, DEGRADED, "none",
                        "clocks slowed down for temperature ({reasons})", "NVML nvmlClocksEventReasons")
POWER_BRAKE = Rule("PowerBrakeSlowdown", THERMAL, DEGRADED, "none",
                   "clocks slowed down by the power brake (external power supply signal)",
                   "NVML nvmlClocksEventReasons")
GPU_LOST = Rule("GpuLost", HARDWARE, FATAL, "reboot", "NVML says the GPU is lost (off the bus): {detail}",
                "NVML NVML_ERROR_GPU_IS_LOST")
GPU_UNRESPONSIVE = Rule("GpuUnresponsive", DRIVER, DEGRADED, "reset_gpu",
                        "an NVML call on the GPU hung past its timeout: {detail}", "the agent's NVML guard")
GPU_READ_ERROR = Rule("GpuReadError", DRIVER, DEGRADED, "none", "reading the GPU failed: {detail}",
                      "the agent's NVML guard")
GPU_STALE = Rule("GpuStale", DRIVER, DEGRADED, "none", "the GPU's last read did not finish in time",
                 "the agent's poller")
NVML_FAILING = Rule("NvmlFailing", DRIVER, FATAL, "reboot", "NVML fails on this node: {detail}",
                    "the agent's NVML guard (nvmlInit, the driver)")

# A DRA driver's device taints (KEP-5055), by effect: the driver's own verdict on its device. No node
# condition unless ``health_dra_taints: classify`` (then the one the taint names, :func:`dra_condition`); a
# "None" effect, or one the agent does not know, is informational and no fault (KEP-5055: unknown = None).
_DRA = "KEP-5055 device taints (ResourceSlice spec.devices[].taints); the DRA driver's own health check"
DRA_TAINTED = Rule("DraDeviceTainted", None, DEGRADED, "none",
                   "the DRA driver tainted the device NoSchedule: {taints}", _DRA, hysteresis=False)
DRA_TAINTED_NO_EXECUTE = Rule("DraDeviceTaintedNoExecute", None, FATAL, "none",
                              "the DRA driver tainted the device NoExecute (its pods are evicted): {taints}",
                              _DRA, hysteresis=False)
DRA_RULES = {"NoSchedule": DRA_TAINTED, "NoExecute": DRA_TAINTED_NO_EXECUTE}
DRA_TAINT_MODES = ("off", "report", "classify")

OTHER_RULES = (ECC_UNCORRECTABLE, PAGE_RETIREMENT_PENDING, ROW_REMAP_PENDING, ROW_REMAP_FAILURE, NVLINK_DOWN,
               THERMAL_SLOWDOWN, POWER_BRAKE, GPU_LOST, GPU_UNRESPONSIVE, GPU_READ_ERROR, GPU_STALE,
               NVML_FAILING)

# nvmlClocksEventReasons bits (nvml.h); the health package never imports pynvml
CLOCKS_EVENT_HW_SLOWDOWN = 0x8
CLOCKS_EVENT_SW_THERMAL = 0x20
CLOCKS_EVENT_HW_THERMAL = 0x40
CLOCKS_EVENT_HW_POWER_BRAKE = 0x80
THERMAL_BITS = {CLOCKS_EVENT_SW_THERMAL: "software thermal slowdown", CLOCKS_EVENT_HW_THERMAL:
                "hardware thermal slowdown"}


def rule_for_xid(code: int) -> Rule:
    return XID_RULES.get(code, XID_UNKNOWN)


def worst(severities: object) -> str:
    """The worst of some severities ("ok" for none)."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return max((s for s in severities if s in rank), key=rank.__getitem__, default="ok")  # type: ignore[union-attr]


def rules_by_reason() -> dict[str, Rule]:
    """Every rule by its reason (XID rules, the others and the DRA taints)."""
    return {r.reason: r for r in (*XID_RULES.values(), *OTHER_RULES, *DRA_RULES.values())}


def dra_condition(key: str, value: str) -> str:
    """The node condition a DRA device taint bears on (``health_dra_taints: classify``): an XID taint
    (NVIDIA's ``gpu.nvidia.com/xid=<code>``) that of the XID's row when it has one, any other the hardware's
    (the device, as its driver judges it)."""
    if key.rpartition("/")[2] == "xid" and value.isdigit():
        condition = rule_for_xid(int(value)).condition
        if condition is not None:
            return condition
    return HARDWARE
