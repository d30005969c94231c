"""The network source on real links: a network namespace and a veth pair made by the test, a real "pod"
process inside the namespace serving TCP, real traffic pushed over the pair; the host-side veth and the
pod's namespace must show it in ``NetworkSource.poll()`` and in ``/metrics`` of a real agent over HTTP.

Every namespace, link and process is made with a unique name and removed in the fixture's teardown, even
when the test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cgroups import CgroupSandbox, kubelet_container_path, new_container_id, new_pod_uid, sandbox_for_test
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from ports import free_port

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.network.podnet import PodRef
from gpuagent.network.source import network_source

pytestmark = pytest.mark.integration

PORT = 5201
CHUNK_BYTES = 256 * 1024
# The "pod": accepts connections and answers with half as many bytes as it received (counted cumulatively:
# a chunk may arrive in pieces of odd length).
POD_SERVER = """
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen()
def serve(conn):
    received = answered = 0
    with conn:
        while True:
            data = conn.recv(1 << 20)
            if not data:
                return
            received += len(data)
            conn.sendall(b"r" * (received // 2 - answered))
            answered = received // 2
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class VethNetns:
    """A network namespace with one end of a veth pair; the other end stays on the host."""

    netns: str
    host_link: str
    pod_link: str
    host_address: str
    pod_address: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def pod_argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, sys.executable, "-c", POD_SERVER, self.pod_address, str(PORT)]

    def start_pod(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.pod_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.processes.append(proc)
        return proc


@pytest.fixture
def veth_netns() -> Iterator[VethNetns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create a network namespace and a veth pair")
    suffix = secrets.token_hex(3)
    octet = 200 + secrets.randbelow(50)
    base = f"10.{octet}.{secrets.randbelow(256)}.{secrets.randbelow(64) * 4}"
    prefix, last = base.rsplit(".", 1)
    pair = VethNetns(f"gpuagent-test-{suffix}", f"gah{suffix}", f"gap{suffix}",
                     f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}")
    try:
        try:
            _ip("netns", "add", pair.netns)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
        _ip("link", "add", pair.host_link, "type", "veth", "peer", "name", pair.pod_link)
        _ip("link", "set", pair.pod_link, "netns", pair.netns)
        _ip("addr", "add", f"{pair.host_address}/30", "dev", pair.host_link)
        _ip("link", "set", pair.host_link, "up")
        _ip("netns", "exec", pair.netns, "ip", "addr", "add", f"{pair.pod_address}/30", "dev", pair.pod_link)
        _ip("netns", "exec", pair.netns, "ip", "link", "set", pair.pod_link, "up")
        _ip("netns", "exec", pair.netns, "ip", "link", "set", "lo", "up")
        yield pair
    finally:
        for proc in pair.processes:  # only what this fixture started, by PID
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", pair.netns], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "link", "del", pair.host_link], capture_output=True, timeout=30, check=False)
        leftovers = subprocess.run(["ip", "-o", "link", "show", pair.host_link], capture_output=True,
                                   timeout=30, check=False)
        assert leftovers.returncode != 0, f"link {pair.host_link} left behind"
        assert pair.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                timeout=30, check=False).stdout


class Traffic:
    """Sends chunks to the pod and reads its answers on a thread until stopped; counts payload bytes."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sent = 0
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        try:
            with self._connect() as conn:
                chunk = b"s" * CHUNK_BYTES
                while not self._stop.is_set():
                    conn.sendall(chunk)
                    self.sent += len(chunk)
                    want = len(chunk) // 2
                    while want:
                        data = conn.recv(want)
                        assert data, "the pod closed the connection"
                        want -= len(data)
                        self.received += len(data)
                    time.sleep(0.005)
        except BaseException as exc:  # reported by the test, not lost on the thread
            self.error = exc

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + 15
        while True:
            try:
                return socket.create_connection((self.address, PORT), timeout=10)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


async def test_source_sees_the_veth_and_the_pods_namespace(veth_netns: VethNetns) -> None:
    pod_proc = veth_netns.start_pod()
    config = load_config(None, env={}, overrides={"network_links": veth_netns.host_link,
                                                  "network_links_exclude": "none", "network_interval": "0.1"})
    source = network_source(config.network, proc_root=config.pods.proc_root)
    assert source is not None
    trainer = PodRef("trainer-0", "ml", "uid-trainer")
    node_agent = PodRef("node-agent", "kube-system", "uid-agent")  # hostNetwork: this process's namespace
    pids = {trainer: (pod_proc.pid,), node_agent: (os.getpid(),)}
    with Traffic(veth_netns.pod_address) as traffic:  # connected before the first poll: its counters start
        while traffic.sent == 0 and traffic.error is None:
            await asyncio.sleep(0.01)
        # The traffic goes on while each poll reads the counters: what the thread had sent and received just
        # before and just after each poll bounds what the kernel counted between the two reads, however long
        # a loaded machine takes over a poll (one chunk either side: counted on send, transmitted after).
        start = (traffic.sent, traffic.received)
        first = await source.poll(pids)
        after_first = (traffic.sent, traffic.received)
        await asyncio.sleep(1.0)
        before_second = (traffic.sent, traffic.received)
        second = await source.poll(pids)
        end = (traffic.sent, traffic.received)
        sent, received = before_second[0] - after_first[0], before_second[1] - after_first[1]
        most_sent, most_received = end[0] - start[0], end[1] - start[1]
    assert traffic.error is None, traffic.error
    assert not first.error and not second.error and source.status.ok
    assert first.window_seconds == 0.0 and 0.9 < second.window_seconds < 10
    assert sent > 1_000_000, f"only {sent} bytes pushed"

    (link,) = second.links
    (before,) = first.links
    assert (link.name, link.kind, link.oper_state, link.mtu) == (veth_netns.host_link, "veth", "up", 1500)
    assert link.speed_bits_per_second in (None, 10_000_000_000)  # veth says 10000 Mb/s on recent kernels
    tx, rx = link.tx_bytes_total - before.tx_bytes_total, link.rx_bytes_total - before.rx_bytes_total
    # Host -> pod is the host end's transmit; a poll and the traffic's own counters are not atomic: one chunk
    # each way of slack, plus headers.
    assert sent - CHUNK_BYTES <= tx <= 1.1 * (most_sent + CHUNK_BYTES)
    assert received - CHUNK_BYTES <= rx <= 1.1 * (most_received + CHUNK_BYTES)
    assert before.tx_bytes_per_second is None
    assert link.tx_bytes_per_second == pytest.approx(tx / second.window_seconds)
    assert link.rx_bytes_per_second == pytest.approx(rx / second.window_seconds)

    (pod,) = second.pods  # the hostNetwork pod is not given the node's traffic
    (pod_before,) = first.pods
    assert (pod.pod, pod.namespace, pod.uid, pod.interfaces) == ("trainer-0", "ml", "uid-trainer", 1)
    pod_rx = pod.rx_bytes_total - pod_before.rx_bytes_total
    pod_tx = pod.tx_bytes_total - pod_before.tx_bytes_total
    # What the host end sent, the pod's end received; a poll reads the pod's counters a moment after the
    # host's, so they differ by at most what flowed while the polls ran (and a chunk each way in flight).
    during_polls = [after_first[i] - start[i] + end[i] - before_second[i] for i in (0, 1)]
    assert abs(pod_rx - tx) <= 0.01 * tx + during_polls[0] + 2 * CHUNK_BYTES, (pod_rx, tx, during_polls)
    assert abs(pod_tx - rx) <= 0.01 * rx + during_polls[1] + 2 * CHUNK_BYTES, (pod_tx, rx, during_polls)
    assert pod_before.rx_bytes_per_second is None
    assert pod.rx_bytes_per_second == pytest.approx(pod_rx / second.window_seconds)
    assert pod.tx_bytes_per_second > 0

    pod_proc.kill()  # the pod's only process is gone: no counters, no failure
    pod_proc.wait()
    await asyncio.sleep(0.2)  # past network_interval
    third = await source.poll(pids)
    assert not third.error and third.pods == () and len(third.links) == 1


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def value(body: str, series: str) -> float:
    """The value of the one sample whose name and labels are exactly ``series``."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", body, re.MULTILINE)
    assert match, f"{series} not in /metrics"
    return float(match.group(1))


async def test_agent_serves_link_and_pod_throughput(
    veth_netns: VethNetns, cgroup_sandbox: CgroupSandbox, tmp_path: Path
) -> None:
    """A real agent: the pod's process is a GPU process of the simulated node, in a kubelet-shaped cgroup,
    allocated its GPU by a real pod-resources server; its network namespace is the test's."""
    uid, cid = new_pod_uid(), new_container_id()
    pod_proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd", cid),
                                    argv=veth_netns.pod_argv())
    scenario = tmp_path / "net.yaml"
    scenario.write_text(yaml.safe_dump({
        "version": 1, "name": "network", "gpus": [{"model": "H100-SXM5-80GB", "count": 1}],
        "processes": [{"pid": pod_proc.pid, "name": "trainer", "gpu": 0, "memory": "2Gi", "sm_util": 40}],
    }))
    nvml = SimulatedNvml(load_scenario(scenario))
    nvml.nvmlInit()
    gpu_uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    link = f'device="{veth_netns.host_link}",kind="veth",Hostname="test-node"'
    pod = 'namespace="ml",pod="trainer-0",Hostname="test-node"'
    with short_socket_dir() as directory:
        socket_path = directory / "kubelet.sock"
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(scenario), "pod_resources_socket": str(socket_path),
            "pod_resources_interval": "0.2", "listen": f"127.0.0.1:{port}", "poll_interval": "0.25",
            "hostname": "test-node", "kubernetes_api": "off",
            "network_links": veth_netns.host_link, "network_links_exclude": "none", "network_interval": "0.25",
        })
        served = [Pod("trainer-0", "ml", [Container("trainer", [gpus(gpu_uuid)])])]
        async with PodResourcesServer(socket_path, pods=served):
            agent = Agent(config, nvml=nvml, backend="sim")
            stop = asyncio.Event()
            serving = asyncio.create_task(agent.serve(stop))
            try:
                with Traffic(veth_netns.pod_address) as traffic:
                    body = ""
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:  # until a window with traffic has been published
                        await asyncio.sleep(0.3)
                        try:
                            body = await asyncio.to_thread(http_get, url + "/metrics")
                        except OSError:
                            continue
                        if f"gpuagent_pod_network_receive_bytes_per_second{{{pod}}}" in body and value(
                                body, f"gpuagent_pod_network_receive_bytes_per_second{{{pod}}}") > 0:
                            break
                    state = json.loads(await asyncio.to_thread(http_get, url + "/v1/state"))
                    hints = json.loads(await asyncio.to_thread(http_get, url + "/v1/hints"))
                assert traffic.error is None, traffic.error
            finally:
                stop.set()
                await asyncio.wait_for(serving, 30)
    assert value(body, 'gpuagent_source_success{source="network"}') == 1
    assert value(body, f"gpuagent_network_link_up{{{link}}}") == 1
    assert value(body, f"gpuagent_network_link_mtu_bytes{{{link}}}") == 1500
    assert value(body, f"gpuagent_network_transmit_bytes_total{{{link}}}") > 500_000
    assert value(body, f"gpuagent_network_transmit_bytes_per_second{{{link}}}") > 0
    assert value(body, f"gpuagent_network_receive_bytes_per_second{{{link}}}") > 0
    assert value(body, f"gpuagent_pod_network_receive_bytes_total{{{pod}}}") > 500_000
    assert value(body, f"gpuagent_pod_network_transmit_bytes_total{{{pod}}}") > 250_000
    assert value(body, f"gpuagent_pod_network_receive_bytes_per_second{{{pod}}}") > 0
    assert value(body, f"gpuagent_pod_network_interfaces{{{pod}}}") == 1
    assert value(body, 'gpuagent_pod_gpu_processes{namespace="ml",pod="trainer-0",gpu="0",'
                       f'UUID="{gpu_uuid}",Hostname="test-node"}}') == 1
    network = state["network"]
    assert [x["name"] for x in network["links"]] == [veth_netns.host_link]
    assert [(p["pod"], p["namespace"], p["uid"]) for p in network["pods"]] == [("trainer-0", "ml", uid)]
    # The hints summarise the node's own links (physical, bond, InfiniBand): the source reached them, and a
    # pod's veth is not counted as node bandwidth.
    assert hints["network"] is not None and hints["network"]["links_up"] == 0
    # ... but every reported link, and each pod's traffic, is there for a scheduler to read.
    (veth,) = hints["network"]["links"]
    assert (veth["name"], veth["kind"], veth["oper_state"]) == (veth_netns.host_link, "veth", "up")
    assert veth["tx_bytes_per_second"] > 0 and veth["rx_bytes_per_second"] > 0
    (pod_hint,) = hints["network"]["pods"]
    assert (pod_hint["pod"], pod_hint["namespace"]) == ("trainer-0", "ml")
    assert pod_hint["rx_bytes_per_second"] > 0
