"""``export.scrape``: the body cached per snapshot, gzip built from a cached head, through real HTTP too."""

from __future__ import annotations

import dataclasses
import gzip
import zlib

import pytest
from aiohttp.test_utils import TestClient, TestServer
from snapshots import TAKEN_AT, two_gpu_node

from gpuagent.api.app import build_app
from gpuagent.export import build_registry, scrape
from gpuagent.export.dcgm import DcgmCollector
from gpuagent.export.exposition import generate_openmetrics, generate_text

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Clock:
    def __init__(self) -> None:
        self.now = TAKEN_AT + 1.0

    def __call__(self) -> float:
        return self.now


def test_body_is_the_encoders_output_in_both_formats_plain_and_gzipped():
    snapshot = two_gpu_node()
    registry = build_registry(lambda: snapshot, clock=Clock(), timer=lambda: 0.0)
    for accept, encode in ((None, generate_text), (OPENMETRICS, generate_openmetrics)):
        expected = encode(registry)
        for _ in range(2):  # first scrape of the snapshot, then from the cache
            plain = scrape(registry, accept, None)
            assert not plain.gzipped and plain.body == expected
            zipped = scrape(registry, accept, "gzip, deflate")
            assert zipped.gzipped
            assert gzip.decompress(zipped.body) == expected
            assert zlib.decompress(zipped.body, wbits=31) == expected  # one member, CRC and size right


def test_renderers_run_once_per_snapshot_while_the_age_keeps_moving(monkeypatch):
    calls = []
    render = DcgmCollector.render

    def counting(self, snapshot):
        calls.append(snapshot)
        return render(self, snapshot)

    monkeypatch.setattr(DcgmCollector, "render", counting)
    holder = {"snapshot": two_gpu_node()}
    clock = Clock()
    registry = build_registry(lambda: holder["snapshot"], clock=clock)
    first = scrape(registry, None, None).body.decode()
    clock.now += 2.0
    second = scrape(registry, None, "gzip").body
    assert len(calls) == 1
    assert "gpuagent_snapshot_age_seconds 1.0" in first
    assert "gpuagent_snapshot_age_seconds 3.0" in gzip.decompress(second).decode()

    snap = holder["snapshot"]
    gpu = dataclasses.replace(snap.gpus[0], temperature_celsius=77)
    holder["snapshot"] = dataclasses.replace(snap, gpus=(gpu, *snap.gpus[1:]))
    third = scrape(registry, None, None).body.decode()
    assert len(calls) == 2
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="0"' in third and "} 77.0\n" in third
    assert "} 77.0\n" not in first


def test_a_failed_renderer_is_tried_again_on_the_same_snapshot(monkeypatch):
    snapshot = two_gpu_node()
    registry = build_registry(lambda: snapshot, clock=Clock())

    def boom(self, snapshot):
        raise RuntimeError("renderer bug")

    with monkeypatch.context() as patch:
        patch.setattr(DcgmCollector, "render", boom)
        assert 'gpuagent_collector_success{collector="dcgm"} 0.0' in scrape(registry, None, None).body.decode()
    body = scrape(registry, None, None).body.decode()
    assert 'gpuagent_collector_success{collector="dcgm"} 1.0' in body and "DCGM_FI_DEV_GPU_TEMP{" in body


@pytest.fixture
async def served():
    holder = {"snapshot": two_gpu_node()}
    clock = Clock()
    latest = lambda: holder["snapshot"]  # noqa: E731
    app = build_app(latest, build_registry(latest, clock=clock), clock=clock)
    async with TestClient(TestServer(app)) as client:
        yield client


def timeless(body: bytes) -> list[bytes]:
    """The body less the collectors' durations (real timer)."""
    return [line for line in body.splitlines() if not line.startswith(b"gpuagent_collector_duration_seconds{")]


async def test_http_gzip_decodes_to_the_plain_body(served):
    plain = await (await served.get("/metrics", headers={"Accept-Encoding": "identity"})).read()
    for _ in range(2):
        response = await served.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert response.headers["Content-Encoding"] == "gzip"
        assert "Accept-Encoding" in response.headers["Vary"]
        assert timeless(await response.read()) == timeless(plain)  # decoded by aiohttp's client
    response = await served.get("/metrics", headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert (await response.text()).endswith("# EOF\n")
