"""GET /v1/hints (ETag, 304), POST /v1/hints/score (answers and every kind of bad input), the hint metrics and
the ``gpuagent hints`` verb, on a real aiohttp server with the simulated 8xH100 node's snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from test_hints_score import H100, sim_snapshot

from gpuagent.api.app import build_app
from gpuagent.export import build_registry
from gpuagent.hints.codec import hints_from_jsonable, hints_to_jsonable
from gpuagent.hints.score import parse_fit_request, score_node
from gpuagent.hints.table import format_hints_table
from gpuagent.snapshot.node import NodeSnapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def busy() -> NodeSnapshot:
    return sim_snapshot(H100, 60.0, 61.0)


@pytest.fixture
def holder(busy: NodeSnapshot) -> dict:
    return {"snapshot": None, "now": busy.taken_at_unix + 1.0}


@pytest.fixture
async def client(holder: dict):
    latest = lambda: holder["snapshot"]  # noqa: E731
    clock = lambda: holder["now"]  # noqa: E731
    app = build_app(latest, build_registry(latest, clock=clock), clock=clock)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_503_before_the_first_poll_and_without_hints(client, holder, busy) -> None:
    for response in (await client.get("/v1/hints"), await client.post("/v1/hints/score", json={})):
        assert response.status == 503 and "first poll" in (await response.json())["error"]
    holder["snapshot"] = replace(busy, hints=None)
    response = await client.get("/v1/hints")
    assert response.status == 503 and "hints" in (await response.json())["error"]


async def test_hints_of_a_stuck_poller_are_a_503_not_a_304(client, holder, busy) -> None:
    holder["snapshot"] = busy
    etag = (await client.get("/v1/hints")).headers["ETag"]
    holder["now"] = busy.taken_at_unix + 31.0  # past max(30 s, 5 polls): the poller is stuck
    stuck = await client.get("/v1/hints", headers={"If-None-Match": etag})
    assert stuck.status == 503 and "stuck" in (await stuck.json())["error"]


async def test_hints_round_trip_with_etag_and_304(client, holder, busy) -> None:
    holder["snapshot"] = busy
    first = await client.get("/v1/hints")
    assert first.status == 200 and first.content_type == "application/json"
    etag = first.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and not etag.startswith("W/")
    assert hints_from_jsonable(await first.json()) == busy.hints
    again = await client.get("/v1/hints", headers={"If-None-Match": etag})
    assert again.status == 304 and again.headers["ETag"] == etag and await again.read() == b""
    assert (await client.get("/v1/hints", headers={"If-None-Match": f'"other", W/{etag}'})).status == 304
    assert (await client.get("/v1/hints", headers={"If-None-Match": '"other"'})).status == 200
    # A later poll with the same figures: still 304 (the ETag leaves out the timestamp) ...
    assert busy.hints is not None
    later = replace(busy, taken_at_unix=busy.taken_at_unix + 5,
                    hints=replace(busy.hints, taken_at_unix=busy.taken_at_unix + 5))
    holder["snapshot"] = later
    assert (await client.get("/v1/hints", headers={"If-None-Match": etag})).status == 304
    # ... and changed figures: a 200 with a new ETag.
    changed = replace(later, hints=replace(later.hints, free_gpu_count=later.hints.free_gpu_count + 1))
    holder["snapshot"] = changed
    fresh = await client.get("/v1/hints", headers={"If-None-Match": etag})
    assert fresh.status == 200 and fresh.headers["ETag"] != etag


async def test_score_answers_as_score_node(client, holder, busy) -> None:
    holder["snapshot"] = busy
    body = {"gpus": 2, "memory": "8Gi", "share": 0.1, "policy": "spread"}
    response = await client.post("/v1/hints/score", json=body)
    assert response.status == 200
    answer = await response.json()
    expected = score_node(busy.hints, parse_fit_request(body), now=holder["now"], max_age_seconds=30.0)
    assert answer == {"node": busy.hints.hostname, "taken_at_unix": busy.hints.taken_at_unix,
                      **expected.to_jsonable()}
    assert answer["fits"] and len(answer["gpus"]) == 2 and 1 <= answer["score"] <= 100


async def test_score_of_stale_hints(client, holder, busy) -> None:
    holder["snapshot"] = busy
    holder["now"] = busy.taken_at_unix + 120  # the poller stopped publishing two minutes ago
    answer = await (await client.post("/v1/hints/score", json={"memory": 1})).json()
    assert not answer["fits"] and "old" in answer["reasons"]["node"]


@pytest.mark.parametrize(("body", "field"), [
    ({"gpus": "one"}, "gpus"),
    ({"gpus": -1}, "gpus"),
    ({"memory": -1}, "memory"),
    ({"memory": "-20Gi"}, "memory"),
    ({"memory": {"bytes": 5}}, "memory"),
    ({"share": -0.1}, "share"),
    ({"share": 2}, "share"),
    ({"mig_profile": "9g.99gb"}, "mig_profile"),
    ({"exclusive": 1}, "exclusive"),
    ({"policy": None}, "policy"),
    ({"unknown": 1}, "unknown"),
    ([1, 2], "body"),
    ("text", "body"),
])
async def test_invalid_score_requests_get_400_naming_the_field(client, holder, busy, body, field) -> None:
    holder["snapshot"] = busy
    response = await client.post("/v1/hints/score", json=body)
    assert response.status == 400
    error = await response.json()
    assert error["field"] == field and error["error"]


async def test_bodies_that_are_not_json(client, holder, busy) -> None:
    holder["snapshot"] = busy
    headers = {"Content-Type": "application/json"}
    bad_json = await client.post("/v1/hints/score", data=b"{nope", headers=headers)
    assert bad_json.status == 400 and (await bad_json.json())["field"] == "body"
    bad_utf8 = await client.post("/v1/hints/score", data=b'{"gpus": "\xff"}', headers=headers)
    assert bad_utf8.status == 400 and "UTF-8" in (await bad_utf8.json())["error"]
    deep = await client.post("/v1/hints/score", data=b"[" * 50_000, headers=headers)
    assert deep.status == 400
    text = await client.post("/v1/hints/score", data=b"{}", headers={"Content-Type": "text/plain"})
    assert text.status == 415 and (await text.json())["field"] == "Content-Type"


async def test_huge_bodies_get_413(client, holder, busy) -> None:
    holder["snapshot"] = busy
    huge = json.dumps({"gpus": 1, "padding": "x" * 70_000}).encode()
    sized = await client.post("/v1/hints/score", data=huge, headers={"Content-Type": "application/json"})
    assert sized.status == 413 and (await sized.json())["field"] == "body"

    async def chunks():
        for _ in range(80):
            yield b" " * 1024

    chunked = await client.post("/v1/hints/score", data=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status == 413
    assert (await client.get("/readyz")).status == 200  # and it keeps serving


async def test_hint_metrics(client, holder, busy) -> None:
    holder["snapshot"] = busy
    text = await (await client.get("/metrics")).text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hints = busy.hints
    free = {s.labels["UUID"]: s.value for s in families["gpuagent_gpu_free_memory_bytes"].samples}
    assert free == {g.uuid: float(g.memory_free_bytes) for g in hints.gpus}
    share = families["gpuagent_gpu_schedulable_share_ratio"].samples
    assert all(0 <= s.value <= 1 for s in share) and len(share) == 8
    assert set(share[0].labels) == {"gpu", "UUID", "Hostname"}
    modes = {s.labels["mode"] for s in families["gpuagent_gpu_sharing_mode_info"].samples}
    assert modes == {"time_sliced"}
    assert "10 s" in families["gpuagent_gpu_sm_util_short_ratio"].documentation
    assert "300 s" in families["gpuagent_gpu_sm_util_long_ratio"].documentation
    (taken,) = families["gpuagent_hints_timestamp_seconds"].samples
    assert taken.value == hints.taken_at_unix
    (free_gpus,) = families["gpuagent_node_free_gpus"].samples
    assert free_gpus.value == 0


def test_table(busy: NodeSnapshot) -> None:
    assert busy.hints is not None
    text = format_hints_table(busy.hints)
    lines = text.splitlines()
    assert "GPUs 8/8 healthy, 0 free" in lines[0]
    assert lines[2].split()[:4] == ["GPU", "MODEL", "HEALTH", "MODE"]
    assert len([line for line in lines if "NVIDIA H100" in line]) == 8
    assert "tenant unattributed (unknown)" in text


@pytest.mark.integration
def test_cli_prints_this_nodes_hints() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gpuagent", "hints", "--backend", "sim", "--scenario",
         str(ROOT / "examples" / "scenarios" / "a100-mig.yaml")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    hints = hints_from_jsonable(json.loads(run.stdout))
    assert [g.sharing_mode for g in hints.gpus] == ["mig", "mig", "mig", "time_sliced"]
    assert hints_to_jsonable(hints)["gpus"][1]["free_mig_profiles"][0]["profile"] == "1g.10gb"
    table = subprocess.run(
        [sys.executable, "-m", "gpuagent", "hints", "--backend", "sim", "--scenario",
         str(ROOT / "examples" / "scenarios" / "a100-mig.yaml"), "--format", "table"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert table.returncode == 0, table.stderr
    assert "GPU 1 MIG 1g.10gb: 3 idle, 0 can be created" in table.stdout  # nb-erin starts at t = 20 s
