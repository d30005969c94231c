"""``gpuagent top`` against an agent that answers what no gpuagent sends (issue 28, item 8).

A 100,000-level document, ``NaN``, ``Infinity``, ``1e999``, ``1e308`` where a time or a figure goes, or a body
whose shape makes the model trip: each is one error for that node, in ``--once`` (one line, exit 2) and in
the live view (the node's header says why; the app goes on). An error nothing catches ends the app with one
line and a traceback without local variables (Textual's own panel lists them: a node's pod names).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from textual.pilot import Pilot
from textual.worker import WorkerFailed

from gpuagent.top import render
from gpuagent.top.app import NodeScreen, TopApp, ViewScreen
from gpuagent.top.client import NO_ANSWER, OK, AgentWatch, new_session
from gpuagent.top.errors import TopError
from gpuagent.top.model import node_view

FIXTURES = Path(__file__).parent / "fixtures" / "top"
SIZE = (150, 50)
DEEP = b"[" * 100_000 + b"]" * 100_000


def good_state() -> dict[str, Any]:
    return json.loads((FIXTURES / "h100-tenants.json").read_text())


def with_poll(text: str) -> bytes:
    """The good body with ``poll_interval_seconds`` written as ``text`` (a literal json.dumps would not)."""
    state = good_state()
    state["poll_interval_seconds"] = "@@"
    return json.dumps(state).replace('"@@"', text).encode()


class HostileAgent:
    """/healthz as an agent's, /v1/state whatever the test sets (always 200, always a new ETag)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.served = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/v1/state", self.state)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "snapshot_age_seconds": 0.1})

    async def state(self, request: web.Request) -> web.Response:
        self.served += 1
        if request.headers.get("If-None-Match") == '"same"':
            return web.Response(status=304)  # a hostile agent may well say "nothing new" to keep its body
        return web.Response(body=self.body, content_type="application/json", headers={"ETag": '"same"'})


def url_of(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


@pytest.mark.parametrize(("body", "said"), [
    (DEEP, "nested deeper than 32 levels"),
    (with_poll("NaN"), "NaN is not a number JSON allows"),
    (with_poll("Infinity"), "Infinity is not a number JSON allows"),
    (with_poll("1e999"), "out of range"),
    (b"[1, 2", "not JSON"),
], ids=["deep", "nan", "infinity", "1e999", "not-json"])
async def test_the_watch_refuses_what_no_parser_should_read(body: bytes, said: str) -> None:
    async with TestServer(HostileAgent(body).app()) as server, new_session() as session:
        watch = AgentWatch(url_of(server), session)
        await watch.refresh()  # never raises: RecursionError was not a ValueError and escaped
    assert watch.state is None and said in (watch.error or "")
    assert watch.status().state == NO_ANSWER


@pytest.mark.parametrize(("key", "value", "said"), [
    ("poll_interval_seconds", 1e308, "poll_interval_seconds: expected a number"),
    ("taken_at_unix", 1e308, "taken_at_unix: expected a number from 0"),
    ("taken_at_unix", -5, "taken_at_unix: expected a number from 0"),
    ("poll_interval_seconds", 10**19, "poll_interval_seconds: expected a number"),
])
def test_a_figure_no_gpu_has_is_the_nodes_error(key: str, value: float, said: str) -> None:
    state = good_state()
    state[key] = value
    with pytest.raises(TopError, match="/v1/state cannot be shown: " + said):
        node_view(state)


def test_a_figure_deep_inside_is_checked_where_the_model_reads_it() -> None:
    state = good_state()
    state["accounting"]["day_started_at_unix"] = 1e300  # time.gmtime raised OverflowError in the renderer
    with pytest.raises(TopError, match="day_started_at_unix"):
        node_view(state)
    state = good_state()
    state["gpus"][0]["power_watts"] = -1e300
    with pytest.raises(TopError, match="power_watts"):
        node_view(state)


def test_any_failure_while_building_the_view_is_one_line_for_that_node() -> None:
    state = good_state()
    state["hints"]["gpus"][0]["uuid"] = ["a list is no key"]  # a TypeError (unhashable) inside the model
    with pytest.raises(TopError) as caught:
        node_view(state)
    assert str(caught.value).startswith("/v1/state cannot be shown: TypeError: unhashable")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def run_once(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from gpuagent.cli import main

    code = main(["top", "--agent", url, "--once", "--width", "120"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("body", "said"), [
    (DEEP, "nested deeper than 32 levels"),
    (with_poll("Infinity"), "Infinity is not a number"),
    (with_poll("1e308"), "poll_interval_seconds: expected a number"),
], ids=["deep", "infinity", "1e308"])
async def test_once_says_one_line_and_exits_2(body: bytes, said: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    async with TestServer(HostileAgent(body).app()) as server:
        code, out, err = await asyncio.to_thread(run_once, url_of(server), capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gpuagent top: ") and said in err
    assert "Traceback" not in err


async def until(pilot: Pilot, what: str, ok: Callable[[], bool], timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ok():
        assert loop.time() < deadline, f"not within {timeout:g} s: {what}"
        await pilot.pause(0.05)


async def test_the_live_view_shows_a_hostile_node_as_its_error_and_goes_on() -> None:
    agent = HostileAgent(with_poll("1e308"))
    async with TestServer(agent.app()) as server, new_session() as session:
        watch = AgentWatch(url_of(server), session)
        app = TopApp(lambda: NodeScreen(watch, interval=0.25))
        async with app.run_test(size=SIZE) as pilot:
            screen = pilot.app.screen
            assert isinstance(screen, NodeScreen)
            await until(pilot, "the node's error", lambda: "cannot be shown" in screen.header_text)
            assert "NO ANSWER" in screen.header_text and "poll_interval_seconds" in screen.header_text
            served = agent.served
            await until(pilot, "two more refreshes", lambda: agent.served >= served + 2)
            assert "cannot be shown" in screen.header_text  # a 304 does not clear it: the body is asked again
            agent.body = json.dumps(good_state()).encode()
            await until(pilot, "the node's figures", lambda: screen.node is not None and watch.error is None)
            assert watch.status().state == OK
            await pilot.press("q")
        assert app.return_code == 0


async def test_a_node_that_breaks_the_renderer_is_its_error_not_the_apps_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("renderer tripped on team-a/secret-pod\x1b[2J")

    monkeypatch.setattr(render, "body", broken)
    async with TestServer(HostileAgent(json.dumps(good_state()).encode()).app()) as server, \
            new_session() as session:
        watch = AgentWatch(url_of(server), session)
        app = TopApp(lambda: NodeScreen(watch, interval=0.25))
        async with app.run_test(size=SIZE) as pilot:
            screen = pilot.app.screen
            assert isinstance(screen, NodeScreen)
            await until(pilot, "the node's error", lambda: "ValueError: renderer tripped" in screen.header_text)
            assert "\\x1b[2J" in screen.header_text and "\x1b" not in screen.header_text
            await pilot.press("q")
        assert app.return_code == 0


class Exploding(ViewScreen):
    """A screen whose refresh fails in a way nothing catches (a bug of ours), with a pod name in a local."""

    async def fetch(self) -> None:
        pods = ["team-a/secret-training-pod"]  # noqa: F841 -- Textual's panel would print it
        raise RuntimeError("refresh failed")

    def next_interval(self) -> float:
        return 0.25

    def redraw(self) -> None:
        pass


async def test_an_uncaught_error_ends_the_app_with_exit_1_and_no_local_variables(
        capsys: pytest.CaptureFixture[str]) -> None:
    app = TopApp(lambda: Exploding(interval=0.25, clock=lambda: 0.0))
    with pytest.raises(WorkerFailed, match="refresh failed"):  # run_test raises what ended the app
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "the app to stop", lambda: app.return_code is not None)
    assert app.return_code == 1
    err = capsys.readouterr().err
    assert "gpuagent top stopped: RuntimeError: refresh failed" in err
    assert "in fetch" in err  # the traceback stays, for a bug report
    assert "secret-training-pod" not in err and "locals" not in err
