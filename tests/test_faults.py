"""The fault table of docs/operations.md, one test per fault, against the agent as it serves: the real Agent
on loopback HTTP over the simulated NVML, real processes, real kubepods-shaped cgroups, a real pod-resources
gRPC server and a real (small) tmpfs. Each test reads /metrics and /healthz during the fault and after it
clears, counts the log lines the fault caused, and, where cgroups are involved, checks that nothing is left
frozen.

The hung NVML call has its own tests: ``test_agent_process.py`` (a real ``gpuagent run`` process) and
``test_agent_sim.py::test_fault_timeline`` (the hang released).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from cgroups import (
    UNIFIED,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from ports import free_port
from simclock import FakeClock

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.devices.sim.scenario import FAKE_PID_BASE
from gpuagent.enforce.actions import FreezeTarget
from gpuagent.enforce.journal import Journal

pytestmark = pytest.mark.integration

H100 = {"model": "H100-SXM5-80GB"}


def write_scenario(tmp_path: Path, gpu_count: int, processes: list[dict], faults: list[dict] = ()) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "faults", "gpus": [{**H100, "count": gpu_count}],
                                    "processes": processes, "faults": list(faults)}))
    return path


def make_agent(scenario: Path, clock: FakeClock | None = None, **overrides: object) -> tuple[Agent, SimulatedNvml]:
    settings = {"backend": "sim", "scenario": str(scenario), "listen": f"127.0.0.1:{free_port()}",
                "poll_interval": 0.1, "slow_poll_interval": 0.1, "nvml_timeout": 1.0,
                "pod_resources_socket": None, "kubernetes_api": "off", "idle_events": "off", **overrides}
    config = load_config(None, env={}, overrides=settings)
    nvml = SimulatedNvml(load_scenario(scenario), **({"clock": clock} if clock else {}))
    return Agent(config, nvml=nvml, backend="sim"), nvml


class Served:
    """The agent serving on loopback, and what a scraper sees of it."""

    def __init__(self, agent: Agent, session: aiohttp.ClientSession) -> None:
        self.agent = agent
        self.url = f"http://{agent.config.server.listen_host}:{agent.config.server.listen_port}"
        self.session = session

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.text()

    async def metrics(self) -> str:
        status, body = await self.get("/metrics")
        assert status == 200, body
        return body

    async def healthy(self) -> bool:
        return (await self.get("/healthz"))[0] == 200

    async def value(self, prefix: str) -> float | None:
        for line in (await self.metrics()).splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return None

    async def wait_value(self, prefix: str, want: Callable[[float | None], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not want(value := await self.value(prefix)):
            assert time.monotonic() < deadline, f"{prefix}: {value} after {timeout} s"
            await asyncio.sleep(0.05)

    async def polls(self, n: int) -> None:
        """Let ``n`` more polls happen (the fault is seen by many polls, and must still be logged once)."""
        start = self.agent.latest.polls_total if self.agent.latest else 0
        deadline = time.monotonic() + 10 + n
        while (self.agent.latest.polls_total if self.agent.latest else 0) < start + n:
            assert time.monotonic() < deadline, "polling stalled"
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def serving(agent: Agent, *, ready: bool = True) -> AsyncIterator[Served]:
    """The agent served on a free port, once ``/readyz`` says 200 (``ready=False``: once a first snapshot
    is published, for an agent that cannot be ready yet)."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.serve(stop))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            served = Served(agent, session)
            deadline = time.monotonic() + 15
            while True:
                assert not task.done(), task.exception() if not task.cancelled() else "cancelled"
                with contextlib.suppress(aiohttp.ClientError):
                    if (await served.get("/readyz"))[0] == 200 or (not ready and agent.latest is not None):
                        break
                assert time.monotonic() < deadline, "agent not ready"
                await asyncio.sleep(0.05)
            yield served
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def address(handle: object) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def logged(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.levelno >= level)


# --- devices ---------------------------------------------------------------------------------------------

async def test_gpu_falls_off_the_bus_mid_poll_and_comes_back(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    """GPU_IS_LOST from a call in the middle of GPU 1's read (utilization answered, memory did not)."""
    caplog.set_level(logging.INFO)
    agent, nvml = make_agent(write_scenario(tmp_path, 2, [{"name": "a", "gpu": 0}, {"name": "b", "gpu": 1}]))
    real_memory = nvml.nvmlDeviceGetMemoryInfo
    nvml.nvmlInit()
    lost = address(nvml.nvmlDeviceGetHandleByIndex(1))

    def off_the_bus(handle, *args, **kwargs):
        if address(handle) == lost:
            raise nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)
        return real_memory(handle, *args, **kwargs)

    async with serving(agent) as served:
        await served.wait_value('gpuagent_gpu_health{gpu="1"', lambda v: v == 1.0)
        assert 'DCGM_FI_DEV_FB_USED{gpu="1"' in await served.metrics()
        nvml.nvmlDeviceGetMemoryInfo = off_the_bus  # the module attribute, as the agent calls it
        try:
            await served.wait_value('DCGM_FI_DEV_GPU_UTIL{gpu="1"', lambda v: v is None)
            await served.polls(10)
            body = await served.metrics()
            assert 'state="lost"} 1.0' in body and 'gpuagent_gpu_health{gpu="1"' in body
            assert 'DCGM_FI_DEV_FB_USED{gpu="1"' not in body  # its device series go, its health stays
            assert 'DCGM_FI_DEV_FB_USED{gpu="0"' in body and 'gpuagent_gpu_stale{gpu="0"' in body
            assert await served.value('gpuagent_gpu_stale{gpu="0"') == 0.0
            assert await served.value("gpuagent_up") == 1.0 and await served.healthy()
        finally:
            nvml.nvmlDeviceGetMemoryInfo = real_memory
        await served.wait_value('DCGM_FI_DEV_FB_USED{gpu="1"', lambda v: v is not None)
        await served.polls(3)
        body = await served.metrics()
        assert 'state="lost"} 1.0' not in body and await served.healthy()
    assert logged(caplog, "GPU 1 (", logging.WARNING) == 1  # one line for the change, not one per poll
    assert logged(caplog, "GPU 1 (") == 2 and logged(caplog, "is healthy again") == 1


async def test_nvml_init_fails_then_the_driver_reloads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock(start=0.0)
    scenario = write_scenario(tmp_path, 2, [{"name": "a", "gpu": 0}],
                              [{"init_failure": {"until": 100, "error": "DRIVER_NOT_LOADED"}}])
    agent, _ = make_agent(scenario, clock)
    async with serving(agent, ready=False) as served:
        await served.polls(10)
        body = await served.metrics()
        assert "gpuagent_up 0.0" in body and 'gpuagent_source_success{source="nvml"} 0.0' in body
        assert "DCGM_FI_DEV_GPU_UTIL" not in body and await served.healthy()
        status, ready = await served.get("/readyz")  # alive, but not ready while NVML is down
        assert status == 503 and "DRIVER_NOT_LOADED" in json.loads(ready)["reason"]
        clock.t = 101.0  # the driver finished loading
        await served.wait_value("gpuagent_up", lambda v: v == 1.0)
        assert (await served.get("/readyz"))[0] == 200
        await served.polls(3)
        body = await served.metrics()
        assert 'DCGM_FI_DEV_GPU_UTIL{gpu="1"' in body and 'gpuagent_source_success{source="nvml"} 1.0' in body
        assert await served.healthy()
    assert logged(caplog, "NVML unavailable", logging.ERROR) == 1
    assert logged(caplog, "NVML is available again") == 1


async def test_xid_storm_keeps_serving_and_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock(start=0.0)
    scenario = write_scenario(tmp_path, 2, [{"name": "a", "gpu": 0}],
                              [{"xid_storm": {"gpu": 0, "at": 10, "code": 13, "count": 20000}}])
    agent, _ = make_agent(scenario, clock)
    async with serving(agent) as served:
        await served.polls(2)
        before = agent.latest.polls_total
        clock.t = 10.5
        await served.wait_value('DCGM_FI_DEV_XID_ERRORS{gpu="0"', lambda v: v == 13.0)
        assert await served.healthy()  # during the storm
        deadline = time.monotonic() + 20
        while agent.devices.xids.record_for(0).totals.get(13) != 20000:
            assert time.monotonic() < deadline, agent.devices.xids.record_for(0).totals
            assert await served.healthy()
            await asyncio.sleep(0.05)
        await served.polls(3)
        assert agent.latest.polls_total > before + 3  # polling went on through it
        body = await served.metrics()
        assert 'gpuagent_source_success{source="xid_events"} 1.0' in body
        assert 'gpuagent_gpu_stale{gpu="0"' in body and await served.value('gpuagent_gpu_stale{gpu="0"') == 0.0
        assert await served.value('DCGM_FI_DEV_XID_ERRORS{gpu="1"') in (None, 0.0)
    assert logged(caplog, "XID 13 on GPU 0") == 1


# --- processes, cgroups, the kubelet -----------------------------------------------------------------------

async def test_a_process_that_exits_between_listing_and_lookup(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """NVML lists a PID whose /proc entry is gone by the time its cgroup is read (the /proc tree under
    ``proc_root`` has no such PID): it gets no workload, and that is no error."""
    caplog.set_level(logging.INFO)
    uid = new_pod_uid()
    proc_root = tmp_path / "proc"
    (proc_root / str(FAKE_PID_BASE)).mkdir(parents=True)
    (proc_root / str(FAKE_PID_BASE) / "cgroup").write_text(
        "0::/" + kubelet_container_path("systemd", "burstable", uid, "containerd", new_container_id()) + "\n")
    gone = FAKE_PID_BASE + 1
    clock = FakeClock(start=0.0)
    agent, _ = make_agent(write_scenario(tmp_path, 1, [
        {"name": "alive", "gpu": 0, "memory": "2Gi", "sm_util": 30},
        {"name": "exited", "gpu": 0, "memory": "1Gi", "sm_util": 30, "stop": 100},
    ]), clock, proc_root=str(proc_root), network=False)  # its fake PIDs have no network namespace
    async with serving(agent) as served:
        await served.polls(5)
        body = await served.metrics()
        assert f'pid="{gone}"' in body  # NVML's figures for it are still served
        assert f'pod="{uid}"' in body and not [line for line in body.splitlines()
                                                if f'pid="{gone}"' in line and 'pod="' in line]
        assert 'gpuagent_source_success{source="cgroups"} 1.0' in body and await served.healthy()
        clock.t = 101.0  # NVML stops listing it
        await served.polls(3)
        body = await served.metrics()
        assert f'pid="{gone}"' not in body and f'pod="{uid}"' in body
        assert 'gpuagent_source_success{source="cgroups"} 1.0' in body and await served.healthy()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_pod_resources_socket_disappears_and_returns(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    caplog.set_level(logging.INFO)
    uid = new_pod_uid()
    proc_root = tmp_path / "proc"
    (proc_root / str(FAKE_PID_BASE)).mkdir(parents=True)
    (proc_root / str(FAKE_PID_BASE) / "cgroup").write_text(
        "0::/" + kubelet_container_path("systemd", "burstable", uid, "containerd", new_container_id()) + "\n")
    scenario = write_scenario(tmp_path, 2, [{"name": "trainer", "gpu": 0, "memory": "4Gi", "sm_util": 50}])
    with short_socket_dir() as directory:
        sock = directory / "kubelet.sock"
        agent, nvml = make_agent(scenario, proc_root=str(proc_root), pod_resources_socket=str(sock),
                                 pod_resources_interval=0.1)
        nvml.nvmlInit()
        uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
        job = Pod("job-0", "ml", [Container("main", [gpus(uuids[0])])])
        kubelet_server = PodResourcesServer(sock, pods=[job], allocatable=[gpus(*uuids)])
        async with kubelet_server as kubelet, serving(agent) as served:
            source = 'gpuagent_source_success{source="pod_resources"}'
            await served.wait_value(source, lambda v: v == 1.0)
            await served.wait_value('gpuagent_pod_gpu_memory_used_bytes{namespace="ml",pod="job-0"',
                                    lambda v: v is not None)
            await kubelet.stop()  # the kubelet restarts: its socket goes
            assert not sock.exists()
            await served.wait_value(source, lambda v: v == 0.0)
            await served.polls(15)
            body = await served.metrics()
            assert 'namespace="ml",pod="job-0"' in body  # the last allocations are kept
            assert await served.healthy()
            kubelet.set_pods([job, Pod("job-1", "ml", [Container("main", [gpus(uuids[1])])])])
            await kubelet.start()
            await served.wait_value(source, lambda v: v == 1.0)
            await served.wait_value('gpuagent_pod_gpu_allocated{namespace="ml",pod="job-1"',
                                    lambda v: v is not None)
            assert await served.healthy()
    assert logged(caplog, "kubelet pod-resources unavailable", logging.WARNING) == 1
    assert logged(caplog, "kubelet pod-resources answers again") == 1


# --- enforcement: the freeze journal and cgroups -------------------------------------------------------------

@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()  # closing the sandbox thaws what a test left frozen


class Tenants:
    """Two pods on GPU 0, each a real process in its own kubepods cgroup (v2); pod "hog" is held to 10 %."""

    def __init__(self, sandbox: CgroupSandbox, tmp_path: Path) -> None:
        if sandbox.hierarchy(UNIFIED) is None:
            pytest.skip("no cgroup v2 hierarchy here")
        self.uids = {"hog": new_pod_uid(), "other": new_pod_uid()}
        self.procs = {name: sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd",
                                                                 new_container_id()),
                                          argv=("sleep", "600"), controllers=[UNIFIED])
                      for name, uid in self.uids.items()}
        self.scenario = write_scenario(tmp_path, 1, [
            {"name": name, "pid": proc.pid, "gpu": 0, "memory": "1Gi", "sm_util": 90}
            for name, proc in self.procs.items()])

    def agent(self, journal: Path) -> Agent:
        agent, _ = make_agent(self.scenario, mode="enforce", journal_path=str(journal), poll_interval=0.1,
                              share_period=0.2, policies=[{"match_pod": self.uids["hog"], "gpu_share": 10}])
        return agent

    def frozen(self, name: str) -> bool:
        control = self.procs[name].paths[UNIFIED] / "cgroup.freeze"
        return control.exists() and control.read_text().strip() == "1"

    def none_frozen(self) -> bool:
        return not any(self.frozen(name) for name in self.procs)


def action_counts(body: str) -> dict[str, float]:
    """gpuagent_enforcement_actions_total summed by outcome."""
    counts: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("gpuagent_enforcement_actions_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = counts.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


FREEZES_DONE = 'gpuagent_enforcement_actions_total{action="freeze",outcome="done"}'


async def test_a_cgroup_vanishes_while_frozen(cgroup_sandbox: CgroupSandbox, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    tenants = Tenants(cgroup_sandbox, tmp_path)
    agent = tenants.agent(tmp_path / "journal.json")
    async with serving(agent) as served:
        await served.wait_value(FREEZES_DONE, lambda v: (v or 0) >= 3)  # the hog is in its duty cycle
        hog = tenants.procs["hog"]
        hog.kill()  # the container ends (SIGKILL works on a v2-frozen task) and its cgroup is removed
        deadline = time.monotonic() + 5
        while True:
            try:
                hog.paths[UNIFIED].rmdir()
                break
            except OSError:
                assert time.monotonic() < deadline, "cgroup not removable"
                await asyncio.sleep(0.02)
        deadline = time.monotonic() + 10
        while not (action_counts(await served.metrics()).get("gone")):  # its thaw or its next freeze
            assert time.monotonic() < deadline, "the vanished cgroup was never counted as gone"
            await asyncio.sleep(0.05)
        await served.polls(10)
        body = await served.metrics()
        assert not action_counts(body).get("failed") and await served.healthy()
        assert 'gpuagent_source_success{source="nvml"} 1.0' in body
        assert not tenants.frozen("other")
    assert tenants.none_frozen()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_corrupt_journal_at_start_is_moved_aside_and_its_cgroups_thawed(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed agent left "hog" frozen, and its journal was cut short mid-write (a torn disk write)."""
    caplog.set_level(logging.INFO)
    tenants = Tenants(cgroup_sandbox, tmp_path)
    hog = tenants.procs["hog"]
    (hog.paths[UNIFIED] / "cgroup.freeze").write_text("1")
    journal = tmp_path / "journal.json"
    writer = Journal(journal)
    writer.add(FreezeTarget("v2", hog.cgroup_paths[UNIFIED]), "over its GPU share")
    writer.add(FreezeTarget("v2", "/kubepods.slice/kubepods-podtorn.slice/cri-containerd-x.scope"), "x")
    whole = journal.read_bytes()
    journal.write_bytes(whole[: whole.index(b"podtorn")])  # cut inside the second entry
    agent = tenants.agent(journal)
    async with serving(agent) as served:
        await served.polls(5)
        assert await served.healthy() and 'gpuagent_source_success{source="nvml"} 1.0' in await served.metrics()
        await served.wait_value(FREEZES_DONE, lambda v: (v or 0) >= 1)  # enforcement goes on, journal anew
    assert tenants.none_frozen()
    aside = list(tmp_path.glob("journal.json.corrupt-*"))
    assert len(aside) == 1
    assert logged(caplog, str(journal), logging.ERROR) == 1  # the corrupt file, named once
    assert logged(caplog, "a previous run left frozen", logging.WARNING) == 1


async def test_disk_full_when_writing_the_journal(cgroup_sandbox: CgroupSandbox, small_tmpfs: Path,
                                                  tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    tenants = Tenants(cgroup_sandbox, tmp_path)
    filler = small_tmpfs / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    agent = tenants.agent(small_tmpfs / "journal.json")
    failed = 'gpuagent_enforcement_actions_total{action="freeze",outcome="failed"}'
    async with serving(agent) as served:
        await served.wait_value(failed, lambda v: (v or 0) >= 3)
        for _ in range(20):  # never frozen without a journal entry
            assert tenants.none_frozen()
            await asyncio.sleep(0.02)
        assert await served.value(FREEZES_DONE) in (None, 0.0) and await served.healthy()
        assert 'gpuagent_source_success{source="nvml"} 1.0' in await served.metrics()
        filler.unlink()  # space again
        await served.wait_value(FREEZES_DONE, lambda v: (v or 0) >= 1)
        assert await served.healthy()
    assert tenants.none_frozen()
    assert logged(caplog, "cannot write the freeze journal", logging.WARNING) == 1
