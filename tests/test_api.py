"""The HTTP API on a real aiohttp server: probes, state, metrics negotiation and JSON errors."""

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpuagent.api.app import build_app
from gpuagent.export import build_registry
from gpuagent.snapshot.gpu import GpuInfo, GpuSample
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.processes import ProcessSample

NOW = 1_800_000_000.0


def snapshot(taken_at: float = NOW) -> NodeSnapshot:
    info = GpuInfo(
        index=0, uuid="GPU-0000", name="NVIDIA H100 80GB HBM3", serial="1", pci_bus_id="00000000:18:00.0",
        minor_number=0, memory_total_bytes=80 * 2**30, power_limit_watts=700.0, mig_enabled=False,
    )
    gpu = GpuSample(
        info=info, sampled_at_unix=taken_at, gpu_util_percent=42.0, memory_used_bytes=2**30,
        memory_free_bytes=79 * 2**30, power_watts=300.5,
        processes=(ProcessSample(pid=7, comm="python", kind="compute", used_memory_bytes=2**30,
                                 sm_util_percent=40.0, memory_util_percent=10.0),),
    )
    return NodeSnapshot(
        hostname="node-a", backend="sim", taken_at_unix=taken_at, taken_at_monotonic=1.0,
        poll_duration_seconds=0.004, driver_version="550.54.15", gpus=(gpu,),
        sources=(SourceStatus("nvml", True, 0.004),), polls_total=1,
    )


@pytest.fixture
def holder():
    return {"snapshot": None, "now": NOW}


@pytest.fixture
async def client(holder):
    latest = lambda: holder["snapshot"]  # noqa: E731
    clock = lambda: holder["now"]  # noqa: E731
    app = build_app(latest, build_registry(latest, clock=clock), clock=clock)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_before_the_first_poll(client):
    ready = await client.get("/readyz")
    assert ready.status == 503
    assert (await client.get("/healthz")).status == 200
    state = await client.get("/v1/state")
    assert state.status == 503 and "first poll" in (await state.json())["error"]
    metrics = await client.get("/metrics")
    assert metrics.status == 200 and "gpuagent_up 0.0" in await metrics.text()


async def test_ready_state_and_metrics(client, holder):
    holder["snapshot"] = snapshot()
    ready = await client.get("/readyz")
    assert ready.status == 200 and (await ready.json())["gpus"] == 1
    state = await (await client.get("/v1/state")).json()
    assert state["hostname"] == "node-a"
    assert state["gpus"][0]["info"]["uuid"] == "GPU-0000"
    assert state["gpus"][0]["processes"][0]["comm"] == "python"
    assert state["gpus"][0]["health"] == "ok"
    assert state["allocation"] == {"pods": {}, "gpus": {"GPU-0000": {
        "index": 0, "allocated_to": [], "used_by": [], "memory_used_bytes": 2**30,
        "memory_total_bytes": 80 * 2**30}}}
    text = await (await client.get("/metrics")).text()
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0000"' in text
    assert "gpuagent_process_gpu_memory_used_bytes" in text


async def test_state_is_serialised_once_per_snapshot(client, holder):
    holder["snapshot"] = snapshot()
    first = await (await client.get("/v1/state")).read()
    assert await (await client.get("/v1/state")).read() == first
    holder["snapshot"] = snapshot(taken_at=NOW + 1)
    assert json.loads(await (await client.get("/v1/state")).read())["taken_at_unix"] == NOW + 1


async def test_state_answers_304_for_the_snapshot_a_client_has(client, holder):
    """gpuagent top asks at the poll rate: a second ask within one poll costs no body."""
    holder["snapshot"] = snapshot()
    first = await client.get("/v1/state")
    etag = first.headers["ETag"]
    assert first.status == 200 and first.headers["Cache-Control"] == "no-cache"
    again = await client.get("/v1/state", headers={"If-None-Match": etag})
    assert again.status == 304 and again.headers["ETag"] == etag and await again.read() == b""
    assert (await client.get("/v1/state", headers={"If-None-Match": f'"x", W/{etag}'})).status == 304
    holder["snapshot"] = snapshot(taken_at=NOW + 1)  # the next poll: a new ETag, the new body
    changed = await client.get("/v1/state", headers={"If-None-Match": etag})
    assert changed.status == 200 and changed.headers["ETag"] != etag
    assert (await changed.json())["taken_at_unix"] == NOW + 1


async def test_openmetrics_when_asked(client, holder):
    holder["snapshot"] = snapshot()
    response = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    names = {family.name for family in text_string_to_metric_families(await response.text())}
    assert "DCGM_FI_DEV_GPU_UTIL" in names


async def test_gzip_when_accepted(client, holder):
    holder["snapshot"] = snapshot()
    response = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert response.headers.get("Content-Encoding") == "gzip"


async def test_healthz_reports_a_stuck_poller(client, holder):
    holder["snapshot"] = snapshot()
    assert (await client.get("/healthz")).status == 200
    holder["now"] = NOW + 120
    response = await client.get("/healthz")
    assert response.status == 503 and (await response.json())["status"] == "stuck"


async def test_errors_are_json(client):
    missing = await client.get("/nope")
    assert missing.status == 404 and "error" in await missing.json()
    wrong_method = await client.post("/metrics", data=b"x")
    assert wrong_method.status == 405 and "error" in await wrong_method.json()
    too_big = await client.post("/v1/state", data=b"x" * (128 * 1024))
    assert too_big.status in (405, 413) and "error" in await too_big.json()
