"""Idle detection: an idle tenant is flagged after the window, a busy one never; one Event per episode,
POSTed to a fake API server (events.k8s.io/v1); the poster's rate limit and failures."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer
from simclock import FakeClock
from test_accounting import NamedTenants, pod, pod_workload, sim_agent, uuids

from gpuagent.accounting.events import IdleEventPoster, IdleNotice, idle_event
from gpuagent.config import load_config
from gpuagent.demo.run import DEMO_DEFAULTS
from gpuagent.export.exposition import generate_text
from gpuagent.kubeapi import ApiConnection

WINDOW = 1800.0
STEP = 60.0  # a poll a minute of scenario time: a 30-minute window in 30 polls

SCENARIO = {
    "version": 1,
    "name": "idle-tenants",
    "gpus": [{"model": "H100-SXM5-80GB", "count": 2}],
    "processes": [
        # idle for 50 min, busy for 10, idle again
        {"name": "notebook", "gpu": 0, "memory": "20Gi",
         "sm_util": {"steps": [[0, 1], [3000, 60], [3600, 0]]}},
        {"name": "trainer", "gpu": 1, "memory": "60Gi", "sm_util": {"sine": {"min": 30, "max": 95, "period": 600}}},
    ],
}


async def test_idle_tenant_is_flagged_after_the_window_busy_one_never_one_event_per_episode(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    agent, nvml = sim_agent(tmp_path, SCENARIO, clock, poll_interval=STEP, slow_poll_interval=STEP,
                            idle_window=WINDOW, hostname="gpu-node-1")
    gpu_ids, _ = uuids(nvml)
    agent.pods = NamedTenants(  # type: ignore[assignment]
        {"notebook": pod_workload("research", "notebook-0", "jupyter"),
         "trainer": pod_workload("ml", "train-0", "trainer")},
        [pod("research", "notebook-0", "jupyter", [gpu_ids[0]], uid="6f1c2b3a-0000-4000-8000-000000000001"),
         pod("ml", "train-0", "trainer", [gpu_ids[1]], uid="6f1c2b3a-0000-4000-8000-000000000002")],
    )
    flagged_at: list[float] = []
    async with FakeApiServer() as api:
        poster = IdleEventPoster("gpu-node-1", ApiConnection(config=api.kubeconfig()), clock=clock)
        agent.accountant.events = poster
        task = asyncio.create_task(poster.run())
        try:
            events_at_first_flag = None
            while clock.t < 6000:
                clock.advance(STEP)
                snap = await agent.poll_once()
                assert snap.accounting is not None
                names = {(e.name, e.gpu_index) for e in snap.accounting.idle}
                assert ("train-0", 1) not in names  # the busy tenant: never
                if ("notebook-0", 0) in names:
                    flagged_at.append(clock.t)
                await poster.flush()
                if flagged_at and events_at_first_flag is None:
                    events_at_first_flag = len(api.events)
                if clock.t == 2940:  # still in the first idle episode, long after the flag
                    assert len(api.events) == 1
            body = generate_text(agent.registry).decode()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await poster.aclose()
            await agent.devices.close()
    # first episode: idle from the first poll (t=60), flagged once 30 min long (t=1860), until the busy
    # phase at t=3000; second: idle again from the poll at t=3600, flagged from t=5400
    first = [t for t in flagged_at if t < 3000]
    second = [t for t in flagged_at if t > 3000]
    assert first[0] == 60 + WINDOW and first[-1] == 2940
    assert second[0] == 3600 + WINDOW
    assert events_at_first_flag == 1
    assert [e.status for e in api.events] == [201, 201]  # one Event per episode, each accepted
    event = api.events[0].body
    assert event["reason"] == "GpuIdle" and event["type"] == "Warning" and event["action"] == "FlagIdle"
    assert event["reportingController"] == "gpuagent.io/agent" and event["reportingInstance"] == "gpu-node-1"
    assert event["regarding"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "research",
                                  "name": "notebook-0", "uid": "6f1c2b3a-0000-4000-8000-000000000001"}
    assert api.events[0].namespace == "research" and event["metadata"]["name"].startswith("notebook-0.")
    assert gpu_ids[0] in event["note"] and "nothing is stopped" in event["note"]
    assert snap.accounting.events_total == {"posted": 2}
    # the gauge: the current episode's length, and the flag is >= the window
    line = next(x for x in body.splitlines() if x.startswith('gpuagent_pod_gpu_idle_seconds{namespace="research"'))
    assert float(line.rsplit(" ", 1)[1]) == clock.t - 3600
    busy = next(x for x in body.splitlines() if x.startswith('gpuagent_pod_gpu_idle_seconds{namespace="ml"'))
    assert float(busy.rsplit(" ", 1)[1]) == 0.0
    assert 'gpuagent_accounting_events_total{outcome="posted"} 2.0' in body
    idle_allocated = next(x for x in body.splitlines()
                          if x.startswith('gpuagent_pod_gpu_idle_allocated_seconds_total{namespace="research"'))
    # idle intervals: 60-2940 and 3600-6000. Alone on its GPU, the notebook's busy is the device's utilization
    # at each poll (trapezoid): the intervals with one busy end, 2940-3000 and 3540-3600, are not idle.
    assert float(idle_allocated.rsplit(" ", 1)[1]) == pytest.approx((2940 - 60) + (6000 - 3600))
    efficiency = next(x for x in body.splitlines()
                      if x.startswith('gpuagent_pod_gpu_efficiency_ratio{namespace="ml"'))
    assert 0.5 < float(efficiency.rsplit(" ", 1)[1]) < 0.75  # the sine's mean, 62.5 %


async def test_the_poster_is_rate_limited_and_counts_failures_without_retrying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    notice = IdleNotice("ns", "p", "uid-1", ("GPU 0 (GPU-x)",), 1900.0, 0.05)
    async with FakeApiServer() as api:
        poster = IdleEventPoster("node-a", ApiConnection(config=api.kubeconfig()), burst=2, refill_seconds=60,
                                 clock=clock)
        task = asyncio.create_task(poster.run())
        try:
            assert [poster.submit(notice) for _ in range(3)] == ["queued", "queued", "rate_limited"]
            await poster.flush()
            clock.advance(60)
            api.fail_next(403, times=2)
            with caplog.at_level(logging.WARNING, logger="gpuagent.accounting.events"):
                assert poster.submit(notice) == "queued"
                await poster.flush()
                clock.advance(60)
                assert poster.submit(notice) == "queued"
                await poster.flush()
            assert sum("refused: HTTP 403" in r.message for r in caplog.records) == 1  # once per change
            await api.stop()  # the API server is away
            clock.advance(60)
            poster.submit(notice)
            await poster.flush()
            assert poster.submit(IdleNotice("Not_A_Namespace", "p", None, (), 0, 0.05)) == "dropped"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await poster.aclose()
    assert poster.counts() == {"posted": 2, "rate_limited": 1, "failed": 2, "unreachable": 1, "dropped": 1}
    assert len(api.events) == 4  # two accepted, two refused: nothing was retried


def test_the_event_body_passes_the_api_servers_rules() -> None:
    from fake_apiserver import _event_problems

    long_name = "a" * 250
    body = idle_event(IdleNotice("ns", long_name, None, ("GPU 3 (GPU-y)",) * 200, 4000.0, 0.05),
                      node="n" * 300, now_unix=1_790_000_000.123456)
    assert _event_problems(body, "ns") == []
    assert len(body["metadata"]["name"]) <= 253 and len(body["note"]) <= 1024
    assert body["eventTime"] == "2026-09-21T14:13:20.123456Z"
    assert "uid" not in body["regarding"]


async def test_the_demo_flags_its_idle_allocation_at_the_first_poll_and_the_agent_after_its_window(
    tmp_path: Path,
) -> None:
    """The demo's first screen shows the idle GPU its README promises (``DEMO_DEFAULTS``' ``idle_window``,
    1 s: flagged at the second poll, a second after the agent starts); the agent's own default still waits
    30 minutes."""
    idle_gpu = {"version": 1, "name": "demo-idle-allocation", "gpus": [{"model": "H100-SXM5-80GB"}],
                "processes": [{"name": "eval-harness", "gpu": 0, "memory": "22Gi", "sm_util": 0}]}
    flagged_at = {}
    windows = {"demo": DEMO_DEFAULTS["idle_window"], "default": load_config(None, env={}).accounting.idle_window}
    for label, window in windows.items():
        clock = FakeClock()
        (tmp_path / label).mkdir()
        agent, nvml = sim_agent(tmp_path / label, idle_gpu, clock, idle_window=window)
        gpu_ids, _ = uuids(nvml)
        agent.pods = NamedTenants({"eval-harness": pod_workload("batch", "eval-nightly", "eval")},  # type: ignore[assignment]
                                  [pod("batch", "eval-nightly", "eval", [gpu_ids[0]])])
        try:
            clock.t = 1.0
            while clock.t <= 130.0 and label not in flagged_at:
                snap = await agent.poll_once()
                assert snap.accounting is not None
                if [i.name for i in snap.accounting.idle] == ["eval-nightly"]:
                    flagged_at[label] = clock.t
                clock.advance(1.0)
        finally:
            await agent.devices.close()
    assert flagged_at == {"demo": 2.0}  # the second poll; the agent's 1800 s default: not in two minutes
