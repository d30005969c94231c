"""The keys of pod attribution (``gpuagent.pods``): the kubelet's pod-resources socket and which resources
are GPUs, DRA's drivers, CDI specs and ResourceSlices, and where the host's ``/proc`` is.
``proc_root`` is read by more than the pods package (process names, the enforcer's workload reads, pods'
network namespaces), but it is first the root the attribution reads cgroups and environments under.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import (
    KUBERNETES_API_MODES,
    choice,
    directories,
    driver_names,
    number,
    optional_path,
    required_path,
    resource_names,
)


@dataclass(frozen=True)
class PodsConfig:
    """How processes are attributed to pods and their GPU allocations (``config.pods``)."""

    pod_resources_socket: str | None = key(
        "pod_resources_socket", "/var/lib/kubelet/pod-resources/kubelet.sock", optional_path,
        "kubelet pod-resources socket (GPU allocations per pod); null turns it off", "PATH",
    )
    pod_resources_interval: float = key(
        "pod_resources_interval", 5.0, number(0, high=300),
        "seconds between reads of the kubelet's allocations", "SECONDS",
    )
    gpu_resource_names: tuple[str, ...] = key(
        "gpu_resource_names", ("nvidia.com/gpu",), resource_names,
        "resource names counted as GPUs besides nvidia.com/mig-* (add e.g. nvidia.com/gpu.shared)", "NAMES",
    )
    dra_drivers: tuple[str, ...] = key(
        "dra_drivers", ("gpu.nvidia.com",), driver_names,
        "DRA drivers whose ResourceClaim devices are GPUs (other drivers' claims are ignored); none: no DRA",
        "NAMES",
    )
    cdi_spec_dirs: tuple[str, ...] = key(
        "cdi_spec_dirs", ("/etc/cdi", "/var/run/cdi"), directories,
        "CDI spec directories (the host's) that map DRA devices to GPUs without the API server; none: unused",
        "DIRS",
    )
    dra_resource_slices: str = key(
        "dra_resource_slices", "auto", choice(*KUBERNETES_API_MODES),
        "map DRA devices through the drivers' ResourceSlices: auto (with the API server, once a DRA GPU "
        "device is on the node), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    proc_root: str = key(
        "proc_root", "/proc", required_path,
        "where /proc is (the host's, mounted elsewhere)", "PATH",
    )
