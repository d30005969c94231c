"""The keys of the network reads (``gpuagent.network``): whether they run, how often, which links are
reported, and where sysfs is.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import boolean, link_globs, number, required_path

# Network links left out by default: the loopback and what a node has one of per pod or per CNI.
NETWORK_LINK_EXCLUDE = (
    "lo", "veth*", "cali*", "cni*", "flannel*", "docker*", "br-*", "lxc*", "cilium_*", "weave*", "vxlan*",
    "tunl*", "kube-ipvs*", "nodelocaldns", "genev_sys_*", "virbr*", "ifb*", "tap*", "nerdctl*", "podman*",
)


@dataclass(frozen=True)
class NetworkConfig:
    """Which network links and pods' traffic are read, and how often (``config.network``)."""

    enabled: bool = key(
        "network", True, boolean,
        "read node links, RDMA ports and the traffic of GPU pods' network namespaces", "BOOL",
    )
    interval: float = key(
        "network_interval", 5.0, number(0, high=300),
        "seconds between reads of the network (links, RDMA, pods' traffic)", "SECONDS",
    )
    links: tuple[str, ...] = key(
        "network_links", ("*",), link_globs,
        "network links reported: interface name globs (see network_links_exclude)", "GLOBS",
    )
    links_exclude: tuple[str, ...] = key(
        "network_links_exclude", NETWORK_LINK_EXCLUDE, link_globs,
        "network links left out even when matched by network_links (none: report every link)",
        "GLOBS", default_doc="lo, veth*, cali*, cni*, flannel*, docker*, br-*, and other per-pod/CNI links",
    )
    sysfs_root: str = key(
        "sysfs_root", "/sys", required_path,
        "where sysfs is (link speeds, /sys/class/infiniband)", "PATH",
    )
