"""The network source without real traffic: netlink messages, sysfs and /proc fixture trees, rates, the
source's failure handling, the config keys and the exported families. Real links: test_network_real.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from simclock import FakeClock

from gpuagent.config import ConfigError, load_config
from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.network.links import (
    LinkCounters,
    LinkFilter,
    NetlinkLinks,
    link_counters,
    link_kind,
    read_speed_bits_per_second,
)
from gpuagent.network.podnet import (
    NetDevParseError,
    NetnsCounters,
    PodNetReader,
    PodNetReading,
    PodRef,
    parse_net_dev,
    pod_pids,
)
from gpuagent.network.rates import RateTracker
from gpuagent.network.rdma import RdmaCounters, parse_rate_bits_per_second, parse_state, read_rdma
from gpuagent.network.source import NetworkSource, network_source
from gpuagent.snapshot.gpu import GpuInfo, GpuSample
from gpuagent.snapshot.network import LinkSample, NetworkState, PodNetwork, RdmaPort
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.processes import ProcessSample, Workload

FIXTURES = Path(__file__).parent / "fixtures" / "network"
SYSFS = str(FIXTURES / "sys")
ARPHRD_ETHER, ARPHRD_INFINIBAND, ARPHRD_LOOPBACK = 1, 32, 772


def netlink_message(name: str, *, arphrd: int = ARPHRD_ETHER, kind: str | None = None, state: str = "UP",
                    mtu: int = 1500, rx: int = 0, tx: int = 0, index: int = 2) -> ifinfmsg:
    """An RTM_NEWLINK message encoded to bytes and decoded back by pyroute2, as a dump returns it."""
    stats = dict.fromkeys(
        ("rx_packets", "tx_packets", "multicast", "collisions", "rx_length_errors", "rx_over_errors",
         "rx_crc_errors", "rx_frame_errors", "rx_fifo_errors", "rx_missed_errors", "tx_aborted_errors",
         "tx_carrier_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_window_errors", "rx_compressed",
         "tx_compressed"), 0)
    stats.update(rx_bytes=rx, tx_bytes=tx, rx_errors=3, tx_errors=4, rx_dropped=5, tx_dropped=6)
    msg = ifinfmsg()
    msg["family"], msg["ifi_type"], msg["index"], msg["flags"], msg["change"] = 0, arphrd, index, 0, 0
    attrs = [("IFLA_IFNAME", name), ("IFLA_OPERSTATE", state), ("IFLA_MTU", mtu), ("IFLA_STATS64", stats)]
    if kind is not None:
        attrs.append(("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", kind)]}))
    msg["attrs"] = attrs
    msg.encode()
    decoded = ifinfmsg(msg.data)
    decoded.decode()
    return decoded


# --- links ------------------------------------------------------------------------------------------------


def test_link_from_a_netlink_message():
    link = link_counters(netlink_message("bond0", kind="bond", mtu=9000, rx=2**40, tx=7, index=9), 50 * 10**9)
    assert link == LinkCounters(index=9, name="bond0", kind="bond", oper_state="up", mtu=9000,
                                speed_bits_per_second=50 * 10**9, rx_bytes_total=2**40, tx_bytes_total=7,
                                rx_errors_total=3, tx_errors_total=4, rx_dropped_total=5, tx_dropped_total=6)


@pytest.mark.parametrize(("info_kind", "arphrd", "expected"), [
    ("veth", ARPHRD_ETHER, "veth"),
    ("vlan", ARPHRD_ETHER, "vlan"),
    (None, ARPHRD_ETHER, "physical"),
    (None, ARPHRD_LOOPBACK, "loopback"),
    (None, ARPHRD_INFINIBAND, "infiniband"),
    ("ipoib", ARPHRD_INFINIBAND, "ipoib"),
    (None, 65534, "arphrd-65534"),  # ARPHRD_NONE: a tun device in IP mode reports kind "tun", this is rarer
])
def test_link_kind(info_kind, arphrd, expected):
    assert link_kind(info_kind, arphrd) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("eth0", 25 * 10**9),
    ("bond0", 50 * 10**9),
    ("eth1", None),  # -1: SPEED_UNKNOWN
    ("eth2", None),  # the same read as a u32
    ("eth3", None),  # not a number
    ("missing0", None),
])
def test_speed_from_sysfs(name, expected):
    assert read_speed_bits_per_second(SYSFS, name) == expected


def test_speed_einval_of_a_real_link_without_one():
    """A real sysfs ``speed`` that fails with EINVAL (a link that is down, or has no ethtool speed)."""
    names = [n for n in os.listdir("/sys/class/net") if _speed_errno(n) is not None]
    if not names:
        pytest.skip("no link here whose speed file fails")
    assert read_speed_bits_per_second("/sys", names[0]) is None


def _speed_errno(name: str) -> int | None:
    try:
        Path("/sys/class/net", name, "speed").read_text()
    except OSError as exc:
        return exc.errno
    return None


def test_default_filter_leaves_out_loopback_and_per_pod_links():
    default = LinkFilter()
    kept = [n for n in ("eth0", "ens1f0np0", "bond0", "ib0", "lo", "veth1a2b", "cali123", "cni0", "flannel.1",
                        "docker0", "br-3f2a", "lxc9", "cilium_host", "tunl0") if default.matches(n)]
    assert kept == ["eth0", "ens1f0np0", "bond0", "ib0"]
    assert LinkFilter(exclude=()).matches("lo")
    only = LinkFilter(include=("eth*", "ib*"), exclude=("eth9",))
    assert [n for n in ("eth0", "eth9", "ib0", "bond0") if only.matches(n)] == ["eth0", "ib0"]


def test_select_keeps_matching_links_sorted_with_their_speed():
    reader = NetlinkLinks(LinkFilter(), sysfs_root=SYSFS)
    messages = [netlink_message("lo", arphrd=ARPHRD_LOOPBACK, state="UNKNOWN", index=1),
                netlink_message("eth0", index=2), netlink_message("bond0", kind="bond", index=3),
                netlink_message("vethabc", kind="veth", index=4)]
    links = reader.select(messages)
    assert [(x.name, x.kind, x.speed_bits_per_second) for x in links] == [
        ("bond0", "bond", 50 * 10**9), ("eth0", "physical", 25 * 10**9)]


def test_real_netlink_read_of_loopback():
    links = NetlinkLinks(LinkFilter(include=("lo",), exclude=())).read()
    assert [(x.name, x.kind, x.mtu > 0) for x in links] == [("lo", "loopback", True)]


# --- RDMA -------------------------------------------------------------------------------------------------


def test_rdma_fixture_tree():
    ports = read_rdma(SYSFS)
    assert ports == [
        # dual-port ConnectX-3: 32-bit counters, port 1's receive counter saturated (unknown, not stuck)
        RdmaCounters("mlx4_0", 1, "active", "infiniband", 56 * 10**9, "ib0", None, 4000),
        RdmaCounters("mlx4_0", 2, "down", "infiniband", 10 * 10**9, "ib1", None, None),
        # RoCE: the netdev from gid_attrs/ndevs/0; counters are 4-byte words
        RdmaCounters("mlx5_0", 1, "active", "ethernet", 100 * 10**9, "ens1f0np0", 9876543210123 * 4,
                     1234567890 * 4),
        RdmaCounters("mlx5_1", 1, "active", "infiniband", 200 * 10**9, "ibp65s0", 10**9, 2 * 10**9),
    ]


def test_no_rdma_is_no_ports(tmp_path):
    assert read_rdma(str(tmp_path)) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("4: ACTIVE", "active"), ("1: DOWN", "down"), ("2: INIT", "init"), ("ARMED", "armed"), ("", "unknown")])
def test_rdma_state(text, expected):
    assert parse_state(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("100 Gb/sec (4X EDR)", 100 * 10**9), ("2.5 Gb/sec (1X SDR)", 2_500_000_000),
    ("400 Gb/sec (4X NDR)", 400 * 10**9), ("0 Gb/sec", None), ("unknown", None), ("", None)])
def test_rdma_rate(text, expected):
    assert parse_rate_bits_per_second(text) == expected


# --- pods' network namespaces ------------------------------------------------------------------------------


def test_parse_net_dev():
    parsed = parse_net_dev((FIXTURES / "proc-net-dev-two-ifaces.txt").read_text())
    assert parsed == {"lo": (0, 0), "eth0": (1_000_000, 2_000_000), "net1": (30_000_000_000, 40_000_000_000)}


def test_parse_net_dev_names_the_bad_line():
    text = (FIXTURES / "proc-net-dev-pod.txt").read_text() + "  eth1: 1 2 3\n"
    with pytest.raises(NetDevParseError, match=r"line 5: expected '<iface>: <16 counters>', got 'eth1: 1 2 3'"):
        parse_net_dev(text)


class ProcTree:
    """A fake /proc: ``/proc/PID/net/dev`` from a fixture and ``/proc/PID/ns/net`` as a plain file whose
    inode stands for the namespace (hard links: the same namespace)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "self").mkdir(parents=True)  # not used: PID 1 is there
        self.add(1, "proc-net-dev-two-ifaces.txt")

    def add(self, pid: int, net_dev: str, *, same_netns_as: int | None = None) -> None:
        (self.root / str(pid) / "net").mkdir(parents=True)
        (self.root / str(pid) / "ns").mkdir()
        shutil.copy(FIXTURES / net_dev, self.root / str(pid) / "net" / "dev")
        netns = self.root / str(pid) / "ns" / "net"
        if same_netns_as is None:
            netns.write_text("")
        else:
            os.link(self.root / str(same_netns_as) / "ns" / "net", netns)


def test_pod_counters_from_a_proc_tree(tmp_path):
    proc = ProcTree(tmp_path)
    proc.add(100, "proc-net-dev-pod.txt")
    proc.add(101, "proc-net-dev-pod.txt", same_netns_as=100)  # the pod's second container
    proc.add(200, "proc-net-dev-two-ifaces.txt")
    proc.add(300, "proc-net-dev-two-ifaces.txt", same_netns_as=1)  # hostNetwork: true
    trainer, multus, host = PodRef("trainer", "ml", "u1"), PodRef("multus-0", "ml", "u2"), PodRef("agent", "kube", "u3")
    vanished = PodRef("done", "ml", "u4")
    reading = PodNetReader(str(tmp_path)).read(
        {trainer: (100, 101), multus: (200,), host: (300,), vanished: (999,)})
    counters = {c.pod: c for c in reading.counters}
    assert set(counters) == {trainer, multus}
    assert (counters[trainer].interfaces, counters[trainer].rx_bytes_total, counters[trainer].tx_bytes_total,
            counters[trainer].pid) == (1, 734003200, 52428800, 100)  # lo left out
    assert (counters[multus].interfaces, counters[multus].rx_bytes_total) == (2, 30_001_000_000)
    assert reading.skipped == {host: "host network", vanished: "no live process"}


def test_a_vanished_pid_gives_way_to_the_next_one(tmp_path):
    proc = ProcTree(tmp_path)
    proc.add(101, "proc-net-dev-pod.txt")
    pod = PodRef("trainer", "ml", "u1")
    reading = PodNetReader(str(tmp_path)).read({pod: (100, 101)})  # 100 exited after attribution
    assert [(c.pod, c.pid) for c in reading.counters] == [(pod, 101)]


def test_two_pods_in_one_namespace_are_counted_once(tmp_path):
    proc = ProcTree(tmp_path)
    proc.add(100, "proc-net-dev-pod.txt")
    proc.add(200, "proc-net-dev-pod.txt", same_netns_as=100)
    first, second = PodRef("a", "ml", "u1"), PodRef("b", "ml", "u2")
    reading = PodNetReader(str(tmp_path)).read({second: (200,), first: (100,)})
    assert [c.pod for c in reading.counters] == [first]
    assert reading.skipped == {second: "shares the network namespace of ml/a"}


def test_garbled_net_dev_skips_that_pod_with_the_reason(tmp_path):
    proc = ProcTree(tmp_path)
    proc.add(100, "proc-net-dev-pod.txt")
    (tmp_path / "100" / "net" / "dev").write_text("h1\nh2\n  eth0: 12 x\n")
    reading = PodNetReader(str(tmp_path)).read({PodRef("a", "ml", "u1"): (100,)})
    assert reading.counters == ()
    assert "net/dev: line 3: expected '<iface>: <16 counters>'" in reading.skipped[PodRef("a", "ml", "u1")]


def test_pod_pids_from_attributed_gpu_processes():
    def proc(pid: int, workload: Workload | None) -> ProcessSample:
        return ProcessSample(pid, "python", "compute", 1, 1.0, 0.0, workload=workload)

    trainer = Workload("pod", "trainer", "ml", "main", pod_uid="u1")
    sidecar = Workload("pod", "trainer", "ml", "sidecar", pod_uid="u1")
    info = GpuInfo(0, "GPU-0", "H100", None, "0:0", 0, None, None, False)
    gpus = [GpuSample(info, 0.0, processes=(proc(10, trainer), proc(11, sidecar),
                                            proc(12, Workload("systemd_service", "x.service")), proc(13, None))),
            GpuSample(dataclasses.replace(info, index=1, uuid="GPU-1"), 0.0, processes=(proc(10, trainer),))]
    assert pod_pids(gpus) == {PodRef("trainer", "ml", "u1"): (10, 11)}


# --- rates ------------------------------------------------------------------------------------------------


def test_rate_first_sample_then_bytes_per_second():
    rates = RateTracker()
    assert rates.rate("eth0", 1000, 10.0) is None
    assert rates.rate("eth0", 3000, 12.0) == 1000.0
    assert rates.rate("eth0", 3000, 13.0) == 0.0


def test_rate_after_a_reset_or_wrap_is_unknown_then_resumes():
    rates = RateTracker()
    rates.rate("eth0", 2**64 - 100, 0.0)
    assert rates.rate("eth0", 50, 1.0) is None  # went down: reset (or a wrap of unknown width), never negative
    assert rates.rate("eth0", 150, 2.0) == 100.0


def test_rate_of_unknown_values_and_time_standing_still():
    rates = RateTracker()
    rates.rate("p", 100, 1.0)
    assert rates.rate("p", 200, 1.0) is None  # no time elapsed
    assert rates.rate("p", None, 2.0) is None  # unknown (saturated): forgotten
    assert rates.rate("p", 900, 3.0) is None  # a fresh start, not (900-200)/2


def test_rate_tracker_forgets_what_is_gone():
    rates = RateTracker()
    for key in ("a", "b", "c"):
        rates.rate(key, 1, 0.0)
    rates.retain(["b"])
    assert len(rates) == 1
    assert rates.rate("a", 5, 1.0) is None


# --- the source -------------------------------------------------------------------------------------------


class FakeReads:
    """Counters the test moves by hand, and a gate that makes a read hang."""

    def __init__(self) -> None:
        self.link = LinkCounters(2, "eth0", "physical", "up", 1500, 25 * 10**9, 0, 0, 0, 0, 0, 0)
        self.port = RdmaCounters("mlx5_0", 1, "active", "infiniband", 200 * 10**9, "ib0", 0, 0)
        self.pods = PodNetReading()
        self.fail: Exception | None = None
        self.gate = threading.Event()
        self.gate.set()

    def links(self) -> list[LinkCounters]:
        self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [self.link]

    def rdma(self) -> list[RdmaCounters]:
        return [self.port]


class FakePodReader(PodNetReader):
    def __init__(self, reads: FakeReads) -> None:
        super().__init__("/nonexistent")
        self.reads = reads

    def read(self, pods):
        return self.reads.pods


def make_source(reads: FakeReads, clock: FakeClock, timeout: float = 5.0, interval: float = 0.0) -> NetworkSource:
    return NetworkSource(read_links=reads.links, read_rdma_ports=reads.rdma, pod_reader=FakePodReader(reads),
                         timeout=timeout, interval=interval, monotonic=clock)


async def test_source_rates_over_the_window():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock)
    first = await source.poll({})
    assert first.window_seconds == 0.0 and first.links[0].rx_bytes_per_second is None
    assert source.status == SourceStatus("network", True, 0.0)
    clock.advance(2.0)
    reads.link = dataclasses.replace(reads.link, rx_bytes_total=4000, tx_bytes_total=1000)
    reads.port = dataclasses.replace(reads.port, rx_bytes_total=8000, tx_bytes_total=None)
    second = await source.poll({})
    assert second.window_seconds == 2.0
    link = second.links[0]
    assert (link.rx_bytes_per_second, link.tx_bytes_per_second, link.speed_bits_per_second) == (2000, 500, 25e9)
    port = second.rdma[0]
    assert (port.rx_bytes_per_second, port.tx_bytes_per_second) == (4000, None)


async def test_source_pod_rates_and_a_recreated_sandbox():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock)
    pod = PodRef("trainer", "ml", "u1")
    reads.pods = PodNetReading((NetnsCounters(pod, 4026532001, 10, 1, 1000, 500),))
    await source.poll({pod: (10,)})
    clock.advance(1.0)
    reads.pods = PodNetReading((NetnsCounters(pod, 4026532001, 10, 1, 5000, 700),))
    state = await source.poll({pod: (10,)})
    assert state.pods == (PodNetwork("trainer", "ml", "u1", 1, 5000, 700, 4000.0, 200.0),)
    clock.advance(1.0)  # the pod sandbox was re-created: a new namespace, counters from zero
    reads.pods = PodNetReading((NetnsCounters(pod, 4026532999, 11, 1, 100, 10),))
    state = await source.poll({pod: (11,)})
    assert (state.pods[0].rx_bytes_per_second, state.pods[0].tx_bytes_per_second) == (None, None)


async def test_source_reads_on_its_own_cadence():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock, interval=5.0)
    first = await source.poll({})
    reads.link = dataclasses.replace(reads.link, rx_bytes_total=5000)
    for _ in range(4):  # the agent's 1 s polls in between get the last read
        clock.advance(1.0)
        assert await source.poll({}) is first
    clock.advance(0.9)  # 4.9 s: due (a poll tick's jitter must not put it off by a whole tick)
    second = await source.poll({})
    assert second.window_seconds == pytest.approx(4.9)
    assert second.links[0].rx_bytes_per_second == pytest.approx(5000 / 4.9)


async def test_update_reads_first_then_in_the_background():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock, interval=5.0)
    first = await source.update({})  # the first snapshot waits for a read
    assert first.links and source.status.ok
    clock.advance(1.0)
    assert await source.update({}) is first  # not due: nothing started
    assert source._refresh is None
    reads.link = dataclasses.replace(reads.link, tx_bytes_total=10_000)
    clock.advance(4.0)
    reads.gate.clear()  # the read takes its time: the poll must not wait for it
    try:
        assert await source.update({}) is first
        refresh = source._refresh
        assert refresh is not None and not refresh.done()
        assert await source.update({}) is first and source._refresh is refresh  # one read at a time
    finally:
        reads.gate.set()
    await refresh
    latest = await source.update({})
    assert latest is not first and latest.links[0].tx_bytes_per_second == pytest.approx(10_000 / 5.0)
    await source.close()


async def test_close_stops_a_background_read():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock, interval=1.0)
    await source.update({})
    clock.advance(1.0)
    reads.gate.clear()
    try:
        await source.update({})
        assert source._refresh is not None
        await source.close()
        assert source._refresh.cancelled()
    finally:
        reads.gate.set()


async def test_source_counter_reset_gives_no_rate():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock)
    reads.link = dataclasses.replace(reads.link, rx_bytes_total=10**12)
    await source.poll({})
    clock.advance(1.0)
    reads.link = dataclasses.replace(reads.link, rx_bytes_total=10)  # driver reloaded
    state = await source.poll({})
    assert state.links[0].rx_bytes_per_second is None and state.links[0].rx_bytes_total == 10


async def test_source_failure_is_a_state_not_an_exception_and_logs_once(caplog):
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock)
    reads.fail = PermissionError(13, "Operation not permitted")
    with caplog.at_level(logging.INFO, logger="gpuagent.network.source"):
        for _ in range(3):
            state = await source.poll({})
        assert state == NetworkState(error="links (netlink): PermissionError(13, 'Operation not permitted')")
        assert not source.status.ok and source.status.error == state.error
        reads.fail = None
        assert not (await source.poll({})).error
        assert source.status.ok
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["network source failing: links (netlink): PermissionError(13, 'Operation not permitted')",
                        "network source recovered"]


async def test_source_hung_read_times_out_and_never_piles_up():
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock, timeout=0.2)
    reads.gate.clear()  # the netlink read hangs
    try:
        state = await source.poll({})
        assert state.error == "read took longer than 0.2s"
        state = await source.poll({})
        assert state.error.startswith("the previous read is still running")
    finally:
        reads.gate.set()
    for _ in range(50):  # the hung read returns; the next poll starts a fresh one
        state = await source.poll({})
        if not state.error:
            break
        await asyncio.sleep(0.02)
    assert not state.error and source.status.ok


async def test_source_logs_a_skipped_pod_once(caplog):
    reads, clock = FakeReads(), FakeClock()
    source = make_source(reads, clock)
    agent = PodRef("node-agent", "kube-system", "u9")
    reads.pods = PodNetReading(skipped={agent: "host network"})
    with caplog.at_level(logging.INFO, logger="gpuagent.network.source"):
        for _ in range(3):
            await source.poll({agent: (1,)})
    assert [r.getMessage() for r in caplog.records] == [
        "pod kube-system/node-agent uses the host network: its traffic is the node's, not counted as the pod's"]


# --- config -----------------------------------------------------------------------------------------------


def test_config_keys():
    config = load_config(None, env={})
    assert config.network.enabled and config.network.links == ("*",) and "veth*" in config.network.links_exclude
    assert config.network.sysfs_root == "/sys" and config.network.interval == 5.0
    config = load_config(None, env={"GPUAGENT_NETWORK": "false", "GPUAGENT_NETWORK_LINKS": "eth*, ib*",
                                    "GPUAGENT_NETWORK_LINKS_EXCLUDE": "none"})
    assert (config.network.enabled, config.network.links, config.network.links_exclude) == (False, ("eth*", "ib*"), ())
    assert network_source(config.network, proc_root=config.pods.proc_root) is None


def test_config_rejects_a_bad_glob_naming_the_key(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("network_links_exclude: [lo, 'a b']\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path), env={})
    assert str(err.value).startswith(f"{path}: network_links_exclude: expected a list of interface name globs")
    assert "'a b' is not an interface name glob" in str(err.value)


# --- export -----------------------------------------------------------------------------------------------


def network_snapshot(network: NetworkState | None) -> NodeSnapshot:
    return NodeSnapshot(hostname="node-1", backend="sim", taken_at_unix=1.0, taken_at_monotonic=1.0,
                        poll_duration_seconds=0.01, network=network,
                        sources=(SourceStatus("network", not (network and network.error), 0.01),))


STATE = NetworkState(
    links=(
        LinkSample("eth0", "physical", "up", 9000, 100 * 10**9, 10**12, 2 * 10**12, 1.5e9, 2.5e9, rx_errors_total=1),
        LinkSample("ib0", "infiniband", "down", 2044, None, 0, 0, None, None),
    ),
    rdma=(RdmaPort("mlx5_0", 1, "active", "infiniband", 200 * 10**9, "ib0", 4 * 10**9, 8 * 10**9, 1e8, None),
          RdmaPort("mlx4_0", 1, "active", "infiniband", 56 * 10**9, None, None, 4000, None, None)),
    pods=(PodNetwork("trainer-0", "ml", "u1", 1, 5 * 10**9, 10**9, 1.25e8, 2.5e7),
          PodNetwork("7c3e", None, "7c3e", 2, 10, 20, None, None)),
    window_seconds=1.0,
)


def scrape(snapshot: NodeSnapshot) -> str:
    return generate_text(build_registry(lambda: snapshot)).decode()


def test_export_links_rdma_and_pods():
    body = scrape(network_snapshot(STATE))
    eth0, ib0 = 'device="eth0",kind="physical",Hostname="node-1"', 'device="ib0",kind="infiniband",Hostname="node-1"'
    for line in (
        f'gpuagent_network_link_info{{{eth0},oper_state="up"}} 1.0',
        f"gpuagent_network_link_up{{{eth0}}} 1.0",
        f"gpuagent_network_link_up{{{ib0}}} 0.0",
        f"gpuagent_network_link_speed_bytes_per_second{{{eth0}}} 1.25e+10",
        f"gpuagent_network_link_mtu_bytes{{{ib0}}} 2044.0",
        f"gpuagent_network_receive_bytes_total{{{eth0}}} 1e+12",
        f"gpuagent_network_transmit_bytes_total{{{eth0}}} 2e+12",
        f"gpuagent_network_receive_errors_total{{{eth0}}} 1.0",
        f"gpuagent_network_transmit_drops_total{{{eth0}}} 0.0",
        f"gpuagent_network_receive_bytes_per_second{{{eth0}}} 1.5e+09",
        'gpuagent_network_rdma_port_info{device="mlx5_0",port="1",Hostname="node-1",state="active",'
        'link_layer="infiniband",netdev="ib0"} 1.0',
        'gpuagent_network_rdma_port_active{device="mlx5_0",port="1",Hostname="node-1"} 1.0',
        'gpuagent_network_rdma_port_rate_bytes_per_second{device="mlx5_0",port="1",Hostname="node-1"} 2.5e+10',
        'gpuagent_network_rdma_port_receive_bytes_total{device="mlx5_0",port="1",Hostname="node-1"} 4e+09',
        'gpuagent_network_rdma_port_receive_bytes_per_second{device="mlx5_0",port="1",Hostname="node-1"} 1e+08',
        'gpuagent_pod_network_receive_bytes_total{namespace="ml",pod="trainer-0",Hostname="node-1"} 5e+09',
        'gpuagent_pod_network_transmit_bytes_per_second{namespace="ml",pod="trainer-0",Hostname="node-1"} 2.5e+07',
        'gpuagent_pod_network_interfaces{pod="7c3e",Hostname="node-1"} 2.0',
    ):
        assert line in body, line
    # unknown is absent, never 0: ib0's speed and rates, mlx4_0's saturated receive counter, the new pod's rate
    assert "gpuagent_network_link_speed_bytes_per_second{device=\"ib0\"" not in body
    assert "gpuagent_network_receive_bytes_per_second{device=\"ib0\"" not in body
    assert 'gpuagent_network_rdma_port_receive_bytes_total{device="mlx4_0"' not in body
    assert 'gpuagent_network_rdma_port_info{device="mlx4_0",port="1",Hostname="node-1",state="active",' \
           'link_layer="infiniband"} 1.0' in body  # no netdev label when there is none
    assert 'gpuagent_network_rdma_port_transmit_bytes_per_second{device="mlx5_0"' not in body
    assert 'gpuagent_pod_network_receive_bytes_per_second{pod="7c3e"' not in body
    assert 'gpuagent_collector_success{collector="network"} 1.0' in body


@pytest.mark.parametrize("network", [None, NetworkState(error="links (netlink): boom")])
def test_export_nothing_when_off_or_failed(network):
    body = scrape(network_snapshot(network))
    assert "gpuagent_network_" not in body and "gpuagent_pod_network_" not in body
    assert 'gpuagent_collector_success{collector="network"} 1.0' in body


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_export_passes_promtool_lint():
    body = scrape(network_snapshot(STATE))
    ours = "".join(line + "\n" for line in body.splitlines()
                   if "gpuagent_network_" in line or "gpuagent_pod_network_" in line)
    result = subprocess.run(["promtool", "check", "metrics"], input=ours.encode(), capture_output=True,
                            timeout=30, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
