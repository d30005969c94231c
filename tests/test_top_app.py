"""gpuagent top driven headless by Textual's own pilot, against real agent processes.

The node: ``tests/tenant_node.py``'s simulated 8xH100 node with 43 named pods (fake API server, the real
pod-resources gRPC server), audit-mode shares and memory ladder, an idle pod (research/notebook-5), an
XID and a stale GPU. The keys (sort, reverse, filter, namespace, expand, fold, help, pause, quit) are
pressed as a person would and checked on what the screen shows. Then a stale agent (SIGSTOP: it stops
answering, the view says so and keeps its last figures; SIGCONT: it comes back), and the cluster view,
from an agents file and from a real Prometheus, with one of its two agents stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_server import PrometheusServer, prometheus_binary
from tenant_node import IDLE_POD, ROOT, Agent, tenant_agent
from textual.pilot import Pilot

from gpuagent.top.app import ClusterScreen, NodeScreen, TopApp
from gpuagent.top.client import NO_ANSWER, AgentWatch, new_session
from gpuagent.top.cluster import AgentsSource, prometheus_source, read_agents_file
from gpuagent.top.screens import HelpScreen, NamespaceScreen

pytestmark = pytest.mark.integration

SIZE = (150, 60)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with tenant_agent(tmp_path_factory.mktemp("top-node")) as agent:
        yield agent


@pytest.fixture
def small_agent(tmp_path: Path) -> Iterator[Agent]:
    """A second node: the simulated A100 MIG node, no pods."""
    agent = Agent("gpu-node-2", {"backend": "sim", "scenario": str(ROOT / "examples/scenarios/a100-mig.yaml"),
                                 "poll_interval": 0.5, "pod_resources_socket": None, "kubernetes_api": "off",
                                 "journal_path": str(tmp_path / "journal.json")}, tmp_path)
    try:
        agent.wait_ready()
        yield agent
    finally:
        if agent.proc.poll() is None:
            os.kill(agent.proc.pid, signal.SIGCONT)
        agent.stop()


async def until(pilot: Pilot, what: str, ok: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}\n{shown(pilot)}")
        await pilot.pause(0.1)


def shown(pilot: Pilot) -> str:
    """What the screen shows: its header, then its lines, as plain text."""
    screen = pilot.app.screen
    if not isinstance(screen, (NodeScreen, ClusterScreen)):
        return f"<{type(screen).__name__}>"
    return screen.header_text + "\n".join(line.text.plain for line in screen.lines.lines)


def body(pilot: Pilot) -> str:
    screen = pilot.app.screen
    assert isinstance(screen, (NodeScreen, ClusterScreen))
    return "\n".join(line.text.plain for line in screen.lines.lines)


async def test_keys_sort_filter_expand_namespace_help_pause_and_quit(node: Agent) -> None:
    async with new_session() as session:
        watch = AgentWatch(f"http://{node.target}", session)
        app = TopApp(lambda: NodeScreen(watch))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "the first snapshot", lambda: "GPU 7" in body(pilot))
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            assert "gpu-node-1" in screen.header_text and "mode audit" in screen.header_text
            assert "43 pods" in screen.header_text and "sort SM ▼" in screen.header_text
            await until(pilot, "the XID and the stale GPU", lambda: "XID 31" in body(pilot) and "STALE" in body(pilot))
            assert " OVER" in body(pilot) and "(unit)" in body(pilot)

            await pilot.press("s")  # the next column: EFF, descending
            assert screen.options.sort == "eff" and "sort EFF ▼" in screen.header_text
            await pilot.press("r")
            assert screen.options.descending is False and "sort EFF ▲" in screen.header_text
            await pilot.press("S", "S")  # back past SM to PROC
            assert screen.options.sort == "procs"

            await pilot.press("slash", *"notebook", "minus", "5", "enter")
            await until(pilot, "the text filter", lambda: "notebook-5" in body(pilot))
            text = body(pilot)
            tenants = [line for line in text.splitlines() if line.startswith("    ▸ ")]
            assert [t.split()[1] for t in tenants] == ["research/notebook-5"], text
            assert "GPU 5" in text and "GPU 0" not in text
            assert "/notebook-5" in screen.header_text
            await until(pilot, "the idle pod flagged", lambda: "IDLE " in body(pilot))

            await pilot.press("down", "down", "enter")  # GPU 5's two lines, then the tenant: expand it
            await until(pilot, "its process", lambda: "notebook-5 [lab]" in body(pilot))
            await pilot.press("up", "enter")  # fold GPU 5: its tenants go
            await until(pilot, "GPU 5 folded", lambda: "notebook-5 [lab]" not in body(pilot))
            assert "▸ GPU 5" in body(pilot)
            await pilot.press("enter")
            await pilot.press("slash", "escape")  # escape in the box clears the filter
            await until(pilot, "every GPU back", lambda: "GPU 7" in body(pilot))

            await pilot.press("n")
            assert isinstance(app.screen, NamespaceScreen)
            await pilot.press("down", "enter")  # (all), research, serving, training
            await until(pilot, "research only", lambda: "ns=research" in screen.header_text)
            namespaces = {line.split()[1].split("/")[0] for line in body(pilot).splitlines()
                          if line.startswith("    ▸ ")}
            assert namespaces == {"research"}
            await pilot.press("n", "up", "enter")  # back to all (the picker starts on the current one)
            await until(pilot, "all namespaces", lambda: "ns=" not in screen.header_text)

            await pilot.press("e")  # every tenant's processes
            await until(pilot, "every process", lambda: "pretrain-rank0" in body(pilot) or
                        "[main]" in body(pilot))
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("x")
            assert app.screen is screen

            await pilot.press("p")
            assert "PAUSED" in screen.header_text
            frozen = body(pilot)
            await pilot.pause(1.5)  # three polls of the agent: a paused view asks nothing, shows the same
            assert body(pilot) == frozen
            await pilot.press("p")
            await until(pilot, "going on", lambda: body(pilot) != frozen)
            await pilot.press("q")
        assert app.return_code == 0 or app.return_code is None


async def test_a_view_paused_while_its_answer_is_on_the_way_stays_as_paused(node: Agent) -> None:
    """'p' pressed while a refresh waits for the agent (long on a loaded machine): that answer, when it
    comes, is not drawn. It was, once: the keys test's paused view changed under it now and then."""
    async with new_session() as session:
        watch = AgentWatch(f"http://{node.target}", session)
        asking, answered = asyncio.Event(), asyncio.Event()
        refresh = watch.refresh

        async def slow_refresh() -> None:
            asking.set()
            await asyncio.sleep(0.3)  # the agent slow to answer
            await refresh()
            answered.set()

        watch.refresh = slow_refresh  # type: ignore[method-assign]
        app = TopApp(lambda: NodeScreen(watch))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "the first snapshot", lambda: "GPU 7" in body(pilot))
            asking.clear()
            await until(pilot, "a refresh asking", asking.is_set)
            answered.clear()
            await pilot.press("p")  # while it waits for its answer
            frozen = body(pilot)
            await until(pilot, "its answer", answered.is_set)
            await pilot.pause(0.2)
            assert body(pilot) == frozen
            assert "PAUSED" in app.screen.header_text  # type: ignore[attr-defined]
            await pilot.press("q")


async def test_a_stale_agent_is_said_so_with_its_last_figures(small_agent: Agent) -> None:
    async with new_session() as session:
        watch = AgentWatch(f"http://{small_agent.target}", session, timeout_seconds=1)
        async with TopApp(lambda: NodeScreen(watch)).run_test(size=SIZE) as pilot:
            await until(pilot, "the first snapshot", lambda: "MIG 1 4g.40gb" in body(pilot))
            os.kill(small_agent.proc.pid, signal.SIGSTOP)
            try:
                screen = pilot.app.screen
                assert isinstance(screen, NodeScreen)
                await until(pilot, "no answer", lambda: "NO ANSWER" in screen.header_text)
                assert "no answer within 1 s" in screen.header_text
                text = body(pilot)  # the last figures stay, said to be old: never zeros
                assert ("MIG 1 4g.40gb" in text and "GPU 3" in text and "96%" in text) or "%" in text
            finally:
                os.kill(small_agent.proc.pid, signal.SIGCONT)
            await until(pilot, "answering again", lambda: "NO ANSWER" not in screen.header_text)
            assert "snapshot" in screen.header_text


async def test_cluster_from_an_agents_file_with_one_agent_stopped(node: Agent, small_agent: Agent,
                                                                 tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(yaml.safe_dump({"gpu-node-1": f"http://{node.target}",
                                      "gpu-node-2": f"http://{small_agent.target}"}))
    async with new_session() as session:
        source = AgentsSource(read_agents_file(str(agents)), session, timeout_seconds=1)

        def node_screen(url: str) -> NodeScreen:
            return NodeScreen(AgentWatch(url, session, timeout_seconds=1))

        app = TopApp(lambda: ClusterScreen(source, interval=0.5, node_screen=node_screen))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "both nodes", lambda: "gpu-node-2" in body(pilot) and "gpu-node-1" in body(pilot))
            cluster = app.screen
            assert isinstance(cluster, ClusterScreen)
            await until(pilot, "both answer", lambda: sum(line.rstrip().endswith(" ok")
                                                          for line in body(pilot).splitlines()) == 2)
            # GPU 6's call hangs from the scenario's third second: unresponsive once the call's timeout has
            # passed, which a node started just before this test has not always reached at its first answer
            await until(pilot, "GPU 6 unresponsive", lambda: "unresponsive 1" in next(
                line for line in body(pilot).splitlines() if "gpu-node-1" in line))
            line_1 = next(line for line in body(pilot).splitlines() if "gpu-node-1" in line)
            assert line_1.split()[1:4] == ["8", "0", "8"]  # 8 GPUs, none free, 8 busy
            small_agent.stop()
            await until(pilot, "gpu-node-2 not answering",
                        lambda: "NO ANSWER" in next(line for line in body(pilot).splitlines() if "gpu-node-2" in line))
            line_2 = next(line for line in body(pilot).splitlines() if "gpu-node-2" in line)
            assert "connection refused" in line_2 and " 0 " not in line_2  # dashes, not zeros
            assert "1 not fresh" in cluster.header_text

            await pilot.press("s")  # sort by GPUs, descending: gpu-node-1 (8) first, gpu-node-2 (-) last
            assert cluster.options.sort == "gpus"
            lines = [line for line in body(pilot).splitlines() if "gpu-node" in line]
            assert "gpu-node-1" in lines[0]
            cluster.lines.cursor = "node:gpu-node-1"
            await pilot.press("enter")
            await until(pilot, "gpu-node-1's view", lambda: isinstance(app.screen, NodeScreen)
                        and "GPU 7" in body(pilot))
            await pilot.press("slash", "escape")  # the first escape closes the filter box, and stays
            await pilot.pause(0.2)
            assert isinstance(app.screen, NodeScreen)
            await pilot.press("escape")
            await until(pilot, "back to the cluster", lambda: app.screen is cluster)


def test_once_prints_the_cluster_with_a_node_not_answering(node: Agent, tmp_path: Path) -> None:
    """``gpuagent top --agents FILE --once``: one line per node, the silent one said so, exit 0."""
    agents = tmp_path / "agents.yaml"
    agents.write_text(yaml.safe_dump({"gpu-node-1": f"http://{node.target}", "gpu-node-9": "http://127.0.0.1:9"}))
    out = subprocess.run([sys.executable, "-m", "gpuagent", "top", "--agents", str(agents), "--once",
                          "--width", "150"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("cluster  2 nodes from agents file") and "1 not fresh" in lines[0]
    node_1 = next(line for line in lines if "gpu-node-1" in line)
    node_9 = next(line for line in lines if "gpu-node-9" in line)
    assert node_1.split()[1:4] == ["8", "0", "8"] and node_1.rstrip().endswith("ok")
    assert "NO ANSWER" in node_9 and "connection refused" in node_9 and node_9.split()[1:4] == ["-", "-", "-"]


async def test_cluster_from_prometheus_with_one_agent_stopped(node: Agent, small_agent: Agent,
                                                              tmp_path: Path) -> None:
    prometheus_binary()  # skips, saying how to install it, when it is missing
    with PrometheusServer([node.target, small_agent.target], tmp_path / "prometheus") as prom:
        prom.wait_for_samples("gpuagent_up", 4, timeout=45)
        source = prometheus_source(prom.url, selector=None, agent_url=None, headers={}, timeout_seconds=10)
        await source.refresh()
        assert source.error is None
        rows = {r.node: r for r in source.rows()}
        assert set(rows) == {"gpu-node-1", "gpu-node-2"}
        one, two = rows["gpu-node-1"], rows["gpu-node-2"]
        assert (one.gpus, one.free, one.busy, one.state) == (8, 0, 8, "ok")
        assert one.url == f"http://{node.target}" and one.health == "unresponsive 1"
        assert one.age_seconds is not None and one.age_seconds < 30
        assert (two.gpus, two.state) == (4, "ok") and two.health == "ok"
        prom.wait_for("max(rate(gpuagent_pod_gpu_allocated_seconds_total[1m]))", lambda r: r.has_data, 30)
        await source.refresh()
        idle_pod = {r.node: r for r in source.rows()}["gpu-node-1"].idle_held
        assert idle_pod is not None and idle_pod > 0, f"{IDLE_POD} is held idle"

        small_agent.stop()
        prom.wait_for(f'up{{instance="{small_agent.target}"}} == 0', lambda r: r.has_data, 30)
        await source.refresh()
        two = {r.node: r for r in source.rows()}["gpu-node-2"]
        assert two.state == NO_ANSWER and "up=0" in two.message and two.gpus is None

    await source.refresh()  # Prometheus gone: the source says so, its rows stay
    assert source.error is not None and "cannot reach Prometheus" in source.error
    assert {r.node for r in source.rows()} == {"gpu-node-1", "gpu-node-2"}


async def test_a_cluster_screen_shows_a_prometheus_that_went_away(tmp_path: Path) -> None:
    from gpuagent.prom.client import PrometheusClient
    from gpuagent.top.cluster import PrometheusSource

    source = PrometheusSource(PrometheusClient("http://127.0.0.1:9", timeout_seconds=1))
    async with TopApp(lambda: ClusterScreen(source, interval=0.5)).run_test(size=SIZE) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, ClusterScreen)
        await until(pilot, "the error", lambda: "NO ANSWER: cannot reach Prometheus" in screen.header_text)
        assert "no nodes yet" in body(pilot)
        await asyncio.sleep(0)


async def test_a_redraw_after_the_widgets_are_gone_draws_nothing_and_raises_nothing(tmp_path: Path) -> None:
    """A fetch that ends while the app quits redraws a screen whose widgets were removed already: it was a
    NoMatches from the refresh worker, which textual turns into the app's crash (seen in two CI runs, one
    missing the lines, one the header)."""
    from gpuagent.prom.client import PrometheusClient
    from gpuagent.top.app import LineView
    from gpuagent.top.cluster import PrometheusSource

    source = PrometheusSource(PrometheusClient("http://127.0.0.1:9", timeout_seconds=1))
    async with TopApp(lambda: ClusterScreen(source, interval=60)).run_test(size=SIZE) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, ClusterScreen) and screen.drawable()
        await screen.query_one("#header").remove()  # the quitting app removes them in any order
        assert not screen.drawable()
        screen.redraw()  # nothing to draw on: returns
        await screen.query_one(LineView).remove()
        assert not screen.drawable()
        screen.redraw()
        await pilot.pause()
