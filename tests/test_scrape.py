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


# --- label text and the caches ------------------------------------------------------------------------------


def test_label_text_helpers_give_what_merged_dicts_give():
    from gpuagent.export.families import (
        add,
        extend,
        gauge,
        join,
        label_pairs,
        label_text,
        with_label,
    )

    gpu = label_text({"gpu": "0", "UUID": "GPU-1", "Hostname": "node"})
    pod = label_pairs((("namespace", "ns"), ("pod", 'a"b\\c\nd')))
    assert join(pod, gpu) == label_text({"namespace": "ns", "pod": 'a"b\\c\nd', "gpu": "0", "UUID": "GPU-1",
                                         "Hostname": "node"})
    assert join("", gpu, "") == gpu and join("", "") == ""
    assert with_label(gpu, "reason", 'x"y') == label_text({"gpu": "0", "UUID": "GPU-1", "Hostname": "node",
                                                          "reason": 'x"y'})
    assert with_label("", "le", "+Inf") == '{le="+Inf"}'
    assert extend(gpu, ()) is gpu
    assert extend(pod, (("container", "c"),)) == with_label(pod, "container", "c")
    metric = gauge("m", "Help.")
    add(metric, join(pod, gpu), 1)
    [sample] = metric.samples  # client_python's view parses the text back, escapes undone
    assert sample.labels == {"namespace": "ns", "pod": 'a"b\\c\nd', "gpu": "0", "UUID": "GPU-1",
                             "Hostname": "node"}


def _churned(snapshot, step: int):
    """The snapshot with every process under a new PID (a churning node: new label sets every poll)."""
    gpus = []
    for gpu in snapshot.gpus:
        processes = tuple(
            dataclasses.replace(p, pid=100_000 + step * 10 + i, used_memory_bytes=step * 1024 + i)
            for i, p in enumerate(gpu.processes)
        )
        gpus.append(dataclasses.replace(gpu, processes=processes, energy_joules_total=float(step)))
    return dataclasses.replace(snapshot, gpus=tuple(gpus), polls_total=step)


def _text_caches(registry) -> list:
    """Every label-text cache the registry's renderers keep across snapshots."""
    from gpuagent.export.families import TextCache

    [collector] = list(registry._collector_to_names)
    return [v for r in collector._renderers for v in vars(r).values() if isinstance(v, TextCache)]


def test_caches_are_bounded_by_the_live_series_under_churn():
    from gpuagent.export.exposition import cache_sizes
    from gpuagent.export.families import label_text_cache_size

    base = two_gpu_node()
    holder = {"snapshot": base}
    registry = build_registry(lambda: holder["snapshot"], clock=Clock(), timer=lambda: 0.0)
    [collector] = list(registry._collector_to_names)
    caches = _text_caches(registry)
    assert caches  # the renderers of many rows keep their label texts
    sizes = []
    for step in range(400):  # ~2,400 process label sets and ~2,800 values that live one poll each
        holder["snapshot"] = _churned(base, step)
        body = scrape(registry, None, None).body
        sizes.append((label_text_cache_size(), cache_sizes(), max(len(c) for c in caches)))
    rows = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    names = sum(1 for line in body.splitlines() if line.startswith(b"# TYPE"))
    texts = max(size for size, _, _ in sizes[200:])
    assert texts < 3 * max(rows, 256)  # emptied once as many texts are dead as alive
    assert max(size for _, _, size in sizes[200:]) < 3 * max(rows, 256)
    assert max(c["values"] for _, c, _ in sizes[200:]) <= 2 * rows  # this snapshot's and the previous one's
    assert len(collector._served) <= names  # one family served last per name


def test_a_family_unchanged_since_the_last_snapshot_reuses_its_text_and_only_then():
    base = two_gpu_node()
    snapshots = [base, _churned(base, 1), _churned(base, 1), base, _churned(base, 2)]
    holder = {"snapshot": base}
    clock = Clock()
    registry = build_registry(lambda: holder["snapshot"], clock=clock, timer=lambda: 0.0)
    for snapshot in snapshots:
        holder["snapshot"] = snapshot
        for accept, encode in ((None, generate_text), (OPENMETRICS, generate_openmetrics)):
            fresh = build_registry(lambda snapshot=snapshot: snapshot, clock=clock, timer=lambda: 0.0)
            assert scrape(registry, accept, None).body == encode(fresh)


def test_health_renders_its_snapshot_families_once_and_the_age_on_every_scrape():
    from gpuagent.export.health import HealthCollector

    clock = Clock()
    health = HealthCollector(clock=clock)
    snapshot = two_gpu_node()
    first = {m.name: m for m in health.render(snapshot)}
    clock.now += 5.0
    second = {m.name: m for m in health.render(snapshot)}
    assert list(first) == list(second)
    assert first["gpuagent_gpu_health"] is second["gpuagent_gpu_health"]  # its text is encoded once
    assert first["gpuagent_snapshot_age_seconds"].values == [1.0]
    assert second["gpuagent_snapshot_age_seconds"].values == [6.0]
    third = {m.name: m for m in health.render(_churned(snapshot, 1))}
    assert third["gpuagent_gpu_health"] is first["gpuagent_gpu_health"]  # the same rows: served again
    assert third["gpuagent_polls"] is not first["gpuagent_polls"]
    assert third["gpuagent_polls"].values == [1.0]  # a counter family is named without _total
