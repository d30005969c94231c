"""The demo's API server takes a token and bounds what it keeps (issue 28, item 10).

On loopback, any local user could write to it: 300 Events of 1 MB each from ``nobody`` were all 201, kept
for ever and logged whole. Now a request without the server's bearer token is a 401; only the kubeconfig,
created 0600 in the demo's 0700 directory, holds the token; an Event is at most 64 KiB (413), the last
1,000 are kept and each is logged cut, its controls shown.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from gpuagent.demo import apiserver
from gpuagent.demo.apiserver import MAX_EVENT_BYTES, ApiServer
from gpuagent.demo.node import demo_node
from gpuagent.demo.run import serving
from gpuagent.devices.sim import kubernetes_demo_path, load_scenario

EVENTS = "/apis/events.k8s.io/v1/namespaces/batch/events"


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    server = ApiServer(demo_node(load_scenario(kubernetes_demo_path())))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def event(note: str = "idle") -> dict[str, object]:
    return {"reason": "GpuIdle", "regarding": {"kind": "Pod", "name": "x"}, "note": note}


@pytest.mark.parametrize("header", [None, "Bearer demo", "Bearer ", "Basic Zm9vOmJhcg=="])
async def test_a_request_without_the_token_is_refused(api: ApiServer, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    async with aiohttp.ClientSession(api.url, headers=headers) as http:
        async with http.post(EVENTS, json=event()) as posted:
            assert posted.status == 401 and (await posted.json())["reason"] == "Unauthorized"
        async with http.get("/api/v1/pods") as listed:
            assert listed.status == 401
    assert len(api.events) == 0


async def test_each_start_has_its_own_token() -> None:
    node = demo_node(load_scenario(kubernetes_demo_path()))
    assert ApiServer(node).token != ApiServer(node).token and len(ApiServer(node).token) >= 40


async def test_bodies_are_capped_and_kept_events_are_a_ring(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(apiserver, "MAX_EVENTS", 3)
    api = ApiServer(demo_node(load_scenario(kubernetes_demo_path())))
    await api.start()
    try:
        async with aiohttp.ClientSession(api.url, headers={"Authorization": f"Bearer {api.token}"}) as http:
            async with http.post(EVENTS, data=b"x" * (MAX_EVENT_BYTES + 1),
                                 headers={"Content-Type": "application/json"}) as big:
                assert big.status == 413 and (await big.json())["reason"] == "RequestEntityTooLarge"
            async with http.post(EVENTS, data=b"[" * 10_000 + b"]" * 10_000) as deep:
                assert deep.status == 400
            with caplog.at_level(logging.INFO, logger=apiserver.__name__):
                async with http.post(EVENTS, json=event("\x1b[2J" + "n" * 10_000)) as long:
                    assert long.status == 201
            (line,) = [r.getMessage() for r in caplog.records if r.name == apiserver.__name__]
            assert len(line) < 3 * apiserver.LOGGED_CHARS and "\\x1b[2J" in line and "\x1b" not in line
            for i in range(5):
                async with http.post(EVENTS, json=event(f"n{i}")) as posted:
                    assert posted.status == 201
    finally:
        await api.stop()
    assert [e["note"] for e in api.events] == ["n2", "n3", "n4"]


def test_the_demos_kubeconfig_holds_the_token_in_a_directory_only_its_user_enters(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    node = demo_node(load_scenario(kubernetes_demo_path()))
    with serving(node, workdir) as (_, kubeconfig):
        mode = os.stat(kubeconfig).st_mode
        assert stat.S_IMODE(mode) == 0o600
        token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
        assert token != "demo" and len(token) >= 40
    kubeconfig.unlink()
    kubeconfig.symlink_to(workdir / "elsewhere")  # planted: the file is never written through it
    with pytest.raises(FileExistsError):
        ApiServer(node).write_kubeconfig(kubeconfig)
    assert not (workdir / "elsewhere").exists()
