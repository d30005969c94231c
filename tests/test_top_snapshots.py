"""Frames of gpuagent top compared with the committed SVGs (pytest-textual-snapshot, Textual's own pilot).

The data are real agents' recorded /v1/state (``tests/fixtures/top/``, with the sparklines' history) and the
clock is frozen (UTC), so a frame changes only when the view does. After a deliberate change of the view:
``.venv/bin/python -m pytest tests/test_top_snapshots.py --snapshot-update``, then look at the new SVGs
(``tests/__snapshots__/test_top_snapshots/``) before committing them; a failing comparison writes an HTML
report of both frames next to the test run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuagent.top.app import ClusterScreen, NodeScreen, TopApp
from gpuagent.top.client import NO_ANSWER, STALE, AgentWatch
from gpuagent.top.cluster import NodeRow, row_of
from gpuagent.top.history import History

FIXTURES = Path(__file__).parent / "fixtures" / "top"
NODE_SIZE = (150, 52)
CLUSTER_SIZE = (150, 14)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The header's clock reads local time: UTC here, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class RecordedWatch(AgentWatch):
    """An agent that answered once, 0.4 s after its snapshot, and is never asked again."""

    def __init__(self, url: str, state: dict[str, Any]) -> None:
        super().__init__(url, None, clock=lambda: 0.0)  # type: ignore[arg-type]  # never asks: no session
        self.state = state
        self.health, self.health_at, self.answered_at = {"status": "ok", "snapshot_age_seconds": 0.4}, 0.0, 0.0

    async def refresh(self) -> None:
        self.state_changed = False


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def node_app(fixture: str = "h100-tenants.json") -> TopApp:
    state = recorded(fixture)
    history = History()
    for i, point in enumerate(state.pop("history")):
        history.add(float(i), point)
    frozen = state["taken_at_unix"] + 0.4
    watch = RecordedWatch("http://gpu-node-1:9402", state)
    return TopApp(lambda: NodeScreen(watch, interval=3600, clock=lambda: frozen, history=history))


class RecordedSource:
    description = "agents file"
    error = None

    def __init__(self, rows: list[NodeRow]) -> None:
        self._rows = rows

    async def refresh(self) -> None:
        return None

    def rows(self) -> list[NodeRow]:
        return self._rows


def cluster_app(fixture: str = "h100-tenants.json") -> TopApp:
    tenants, mig = recorded(fixture), recorded("a100-mig.json")
    rows = [
        row_of("gpu-node-1", RecordedWatch("http://gpu-node-1:9402", tenants)),
        row_of("gpu-node-2", RecordedWatch("http://gpu-node-2:9402", mig)),
        NodeRow("gpu-node-3", "http://gpu-node-3:9402", NO_ANSWER, "cannot connect: connection refused",
                age_seconds=42.0),
        NodeRow("gpu-node-4", "http://gpu-node-4:9402", STALE, "the agent's poller is stuck", age_seconds=95.0),
    ]
    frozen = tenants["taken_at_unix"] + 0.4
    return TopApp(lambda: ClusterScreen(RecordedSource(rows), interval=3600, clock=lambda: frozen))


def test_node_view(snap_compare: Any) -> None:
    assert snap_compare(node_app(), terminal_size=NODE_SIZE)


def test_node_view_filtered_and_expanded(snap_compare: Any) -> None:
    """research only, sorted by memory, notebook-5's process shown."""
    keys = ["n", "down", "enter", *["s"] * 3, *["down"] * 11, "enter"]  # GPUs 0-4 and their one tenant each
    assert snap_compare(node_app(), terminal_size=NODE_SIZE, press=keys)


def test_node_view_monochrome(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """NO_COLOR: every state still reads (words, brackets, bold and reverse)."""
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(node_app(), terminal_size=NODE_SIZE)


def test_node_help(snap_compare: Any) -> None:
    assert snap_compare(node_app(), terminal_size=NODE_SIZE, press=["question_mark"])


def test_cluster_view(snap_compare: Any) -> None:
    assert snap_compare(cluster_app(), terminal_size=CLUSTER_SIZE)


# The README's pictures are frames of these same apps on the demo node (what `make run` serves, recorded by
# `tests/fixtures/top/record.py demo`): `make pictures` records it and regenerates them, checked here.
DOCS = Path(__file__).resolve().parents[1] / "docs"
DEMO = "demo-k8s-node.json"
README_FRAMES = {
    "top-node.svg": (lambda: node_app(DEMO), (132, 44), []),
    "top-cluster.svg": (lambda: cluster_app(DEMO), (132, 10), []),
}


@pytest.mark.parametrize("name", sorted(README_FRAMES))
async def test_the_readme_pictures_are_current_frames(name: str, request: pytest.FixtureRequest) -> None:
    make, size, keys = README_FRAMES[name]
    app = make()
    async with app.run_test(size=size) as pilot:
        await pilot.press(*keys)
        await pilot.pause(0.3)
        for _ in range(100):  # a loaded machine may not have drawn the footer's keys yet: wait for them
            if app.screen.query("FooterKey"):
                break
            await pilot.pause(0.1)
        await pilot.pause(0.1)
        svg = app.export_screenshot(title="gpuagent top")
    path = DOCS / name
    if request.config.getoption("--snapshot-update", default=False):
        path.write_text(svg)
    assert path.read_text() == svg, f"{path} is not the current frame: run this test with --snapshot-update"
