"""The ``err_msg`` of an XID code, as dcgm-exporter labels ``DCGM_FI_DEV_XID_ERRORS``.

Descriptions follow NVIDIA's public XID catalogue (docs.nvidia.com/deploy/xid-errors). Only the codes an
operator meets in practice are listed; any other code reads "Unknown Error", as in dcgm-exporter.
"""

from __future__ import annotations

NO_ERROR = "No Error"
UNKNOWN = "Unknown Error"

_MESSAGES: dict[int, str] = {
    0: NO_ERROR,
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    44: "Graphics Engine fault during context switch",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    54: "Auxiliary power is not connected to the GPU board",
    56: "Display Engine error",
    57: "Error programming video memory interface",
    58: "Unstable video memory interface detected",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    80: "Corrupted data sent to GPU",
    81: "VGA Subsystem Error",
    92: "High single-bit ECC error rate",
    93: "Non-fatal violation of provisioned InfoROM wear limit",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    110: "Security Fault Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    136: "ALI Training Fail",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    154: "GPU Recovery Action Changed",
}


def message(code: int) -> str:
    return _MESSAGES.get(code, UNKNOWN)
