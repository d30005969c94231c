"""The node's network: links, RDMA ports and the traffic of GPU pods' network namespaces.

Counters are the kernel's cumulative ones (``rate()`` them); the ``_bytes_per_second`` gauges are the same
over the agent's last poll window, for consumers that want the figure hints use. Link series are labelled
``device`` (node_exporter's name for the interface) and ``kind``; RDMA ones ``device`` (the HCA, e.g.
``mlx5_0``) and ``port``; pod ones ``namespace, pod``. Every family carries the host label. Nothing is
rendered while the network source is off, or when its last poll failed (``gpuagent_source_success
{source="network"} 0`` says so): a failed read is not a link going down.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gpuagent.export.families import (
    add,
    add_known,
    counter,
    extend,
    family,
    flag,
    gauge,
    join,
    label_text,
    non_empty,
    with_label,
)
from gpuagent.export.labels import DEFAULT_HOSTNAME_LABEL, host_labels, pod_labels
from gpuagent.snapshot.network import LinkSample, NetworkState, PodNetwork, RdmaPort
from gpuagent.snapshot.node import NodeSnapshot

_BITS_PER_BYTE = 8


class NetworkCollector:
    """Renders ``snapshot.network``."""

    name = "network"

    def __init__(self, *, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        self._hostname_label = hostname_label

    def render(self, snapshot: NodeSnapshot | None) -> list[Metric]:
        if snapshot is None or snapshot.network is None or snapshot.network.error:
            return []
        host = host_labels(snapshot.hostname, self._hostname_label)
        network = snapshot.network
        return non_empty([*_links(network, host), *_rdma(network, host), *_pods(network, host)])


def _links(network: NetworkState, host: str) -> list[Metric]:
    info = family("gpuagent_network_link_info", "A network link of the node and its operational state.",
                  "info")
    up = gauge("gpuagent_network_link_up", "1 when the link's operational state is up, else 0.")
    speed = gauge("gpuagent_network_link_speed_bytes_per_second",
                  "The link's negotiated speed (absent when unknown: virtual links, links down).")
    mtu = gauge("gpuagent_network_link_mtu_bytes", "The link's MTU.")
    rx = counter("gpuagent_network_receive_bytes_total", "Bytes received on the link.")
    tx = counter("gpuagent_network_transmit_bytes_total", "Bytes transmitted on the link.")
    rx_errors = counter("gpuagent_network_receive_errors_total", "Receive errors on the link (packets).")
    tx_errors = counter("gpuagent_network_transmit_errors_total", "Transmit errors on the link (packets).")
    rx_drops = counter("gpuagent_network_receive_drops_total", "Received packets dropped on the link.")
    tx_drops = counter("gpuagent_network_transmit_drops_total", "Packets to transmit dropped on the link.")
    rx_rate = gauge("gpuagent_network_receive_bytes_per_second",
                    "Bytes received per second on the link over the agent's last poll window.")
    tx_rate = gauge("gpuagent_network_transmit_bytes_per_second",
                    "Bytes transmitted per second on the link over the agent's last poll window.")
    for link in network.links:
        series = _link_labels(link, host)
        add(info, with_label(series, "oper_state", link.oper_state), 1)
        add(up, series, flag(link.oper_state == "up"))
        if link.speed_bits_per_second is not None:
            add(speed, series, link.speed_bits_per_second / _BITS_PER_BYTE)
        add(mtu, series, link.mtu)
        add(rx, series, link.rx_bytes_total)
        add(tx, series, link.tx_bytes_total)
        add(rx_errors, series, link.rx_errors_total)
        add(tx_errors, series, link.tx_errors_total)
        add(rx_drops, series, link.rx_dropped_total)
        add(tx_drops, series, link.tx_dropped_total)
        add_known(rx_rate, series, link.rx_bytes_per_second)
        add_known(tx_rate, series, link.tx_bytes_per_second)
    return [info, up, speed, mtu, rx, tx, rx_errors, tx_errors, rx_drops, tx_drops, rx_rate, tx_rate]


def _link_labels(link: LinkSample, host: str) -> str:
    return join(label_text({"device": link.name, "kind": link.kind}), host)


def _rdma(network: NetworkState, host: str) -> list[Metric]:
    info = family("gpuagent_network_rdma_port_info",
                  "An RDMA (InfiniBand or RoCE) port: its state, link layer and network interface.", "info")
    active = gauge("gpuagent_network_rdma_port_active", "1 when the RDMA port's state is ACTIVE, else 0.")
    rate = gauge("gpuagent_network_rdma_port_rate_bytes_per_second", "The RDMA port's link rate.")
    rx = counter("gpuagent_network_rdma_port_receive_bytes_total",
                 "Data bytes received on the RDMA port (port_rcv_data x 4).")
    tx = counter("gpuagent_network_rdma_port_transmit_bytes_total",
                 "Data bytes transmitted on the RDMA port (port_xmit_data x 4).")
    rx_rate = gauge("gpuagent_network_rdma_port_receive_bytes_per_second",
                    "Data bytes received per second on the RDMA port over the agent's last poll window.")
    tx_rate = gauge("gpuagent_network_rdma_port_transmit_bytes_per_second",
                    "Data bytes transmitted per second on the RDMA port over the agent's last poll window.")
    for port in network.rdma:
        series = _port_labels(port, host)
        facts = (("state", port.state), ("link_layer", port.link_layer))
        add(info, extend(series, (*facts, ("netdev", port.netdev)) if port.netdev else facts), 1)
        add(active, series, flag(port.state == "active"))
        if port.rate_bits_per_second is not None:
            add(rate, series, port.rate_bits_per_second / _BITS_PER_BYTE)
        add_known(rx, series, port.rx_bytes_total)
        add_known(tx, series, port.tx_bytes_total)
        add_known(rx_rate, series, port.rx_bytes_per_second)
        add_known(tx_rate, series, port.tx_bytes_per_second)
    return [info, active, rate, rx, tx, rx_rate, tx_rate]


def _port_labels(port: RdmaPort, host: str) -> str:
    return join(label_text({"device": port.device, "port": str(port.port)}), host)


def _pods(network: NetworkState, host: str) -> list[Metric]:
    rx = counter("gpuagent_pod_network_receive_bytes_total",
                 "Bytes received by the pod's network namespace (every interface but lo).")
    tx = counter("gpuagent_pod_network_transmit_bytes_total",
                 "Bytes transmitted by the pod's network namespace (every interface but lo).")
    rx_rate = gauge("gpuagent_pod_network_receive_bytes_per_second",
                    "Bytes received per second by the pod over the agent's last poll window.")
    tx_rate = gauge("gpuagent_pod_network_transmit_bytes_per_second",
                    "Bytes transmitted per second by the pod over the agent's last poll window.")
    interfaces = gauge("gpuagent_pod_network_interfaces", "Interfaces in the pod's network namespace but lo.")
    for pod in network.pods:
        series = _pod_labels(pod, host)
        add(rx, series, pod.rx_bytes_total)
        add(tx, series, pod.tx_bytes_total)
        add_known(rx_rate, series, pod.rx_bytes_per_second)
        add_known(tx_rate, series, pod.tx_bytes_per_second)
        add(interfaces, series, pod.interfaces)
    return [rx, tx, rx_rate, tx_rate, interfaces]


def _pod_labels(pod: PodNetwork, host: str) -> str:
    return join(pod_labels(pod.namespace, pod.pod), host)
