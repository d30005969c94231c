"""gpuagent top in a real terminal: Debian's tmux runs the command against a real agent process, types the
keys a person types and reads the screen back (``capture-pane``), for the live view and for ``--once``.

Each test has its own tmux server (``-L``, no user config) that is killed at the end; tmux comes from
``scripts/install-system-deps.sh`` (the tests are skipped, saying so, where it is missing).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tenant_node import ROOT, Agent, tenant_agent

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 150, 50
EXIT = "gpuagent-top-exited="


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with tenant_agent(tmp_path_factory.mktemp("top-tmux")) as agent:
        yield agent


class Tmux:
    """One private tmux server with one window of WIDTH x HEIGHT running ``command``."""

    def __init__(self, command: list[str]) -> None:
        if shutil.which("tmux") is None:
            message = "tmux is not installed: run scripts/install-system-deps.sh (`make test` does)"
            if os.environ.get("GPUAGENT_REQUIRE_PROMETHEUS"):
                pytest.fail(message)
            pytest.skip(message)
        self.socket = f"gpuagent-top-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAGENT_", "TMUX"))}
        env.update(TERM="xterm-256color", COLUMNS=str(WIDTH), LINES=str(HEIGHT))
        # a shell says how the command ended and keeps the pane open, its output on it, until the end
        shell = " ".join(_quote(part) for part in command) + f"; echo {EXIT}$?; sleep 3600"
        self.tmux("new-session", "-d", "-s", "top", "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(ROOT),
                  shell, env=env)

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, timeout=30, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def screen(self, scrollback: bool = False) -> str:
        """What the terminal shows; with ``scrollback``, what scrolled off its top too."""
        return self.tmux("capture-pane", "-p", "-t", "top", *(("-S", "-") if scrollback else ()))

    def keys(self, *keys: str) -> None:
        """Key names as tmux knows them (``Enter``, ``Down``, ``q``)."""
        for key in keys:
            self.tmux("send-keys", "-t", "top", key)
            time.sleep(0.05)

    def type(self, text: str) -> None:
        """Text typed as is, one character at a time."""
        for char in text:
            self.tmux("send-keys", "-t", "top", "-l", char)
            time.sleep(0.05)

    def wait(self, what: str, text: str, timeout: float = 30, gone: bool = False) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if (text in screen) != gone:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout:g} s: {what}\n{screen}")
            time.sleep(0.2)

    def exit_status(self, timeout: float = 30) -> int:
        screen = self.wait("the command's end", EXIT, timeout)
        return int(re.findall(rf"{EXIT}(\d+)", screen)[-1])

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _quote(part: str) -> str:
    return "'" + part.replace("'", "'\\''") + "'"


@pytest.fixture
def terminal() -> Iterator[list[Tmux]]:
    opened: list[Tmux] = []
    yield opened
    for tmux in opened:
        tmux.close()


def top(terminal: list[Tmux], *args: str) -> Tmux:
    tmux = Tmux([sys.executable, "-m", "gpuagent", "top", *args])
    terminal.append(tmux)
    return tmux


def test_the_live_view_in_a_real_terminal(node: Agent, terminal: list[Tmux]) -> None:
    tmux = top(terminal, "--agent", f"http://{node.target}")
    screen = tmux.wait("the first frame", "GPU 2")
    assert "gpu-node-1" in screen and "mode audit" in screen and "sort SM ▼" in screen
    assert "q quit" in screen and "? help" in screen  # the footer's keys
    tmux.keys("s")
    tmux.wait("sorted by EFF", "sort EFF ▼")
    tmux.keys("/")
    tmux.wait("the filter box", "filter: part of a name")  # focused: what is typed now goes there
    tmux.type("notebook-5")
    tmux.keys("Enter")
    screen = tmux.wait("the filter applied", "research/notebook-0", gone=True)
    tenants = [line for line in screen.splitlines() if line.startswith("    ▸ ") or line.startswith("    ▾ ")]
    assert len(tenants) == 1 and "research/notebook-5" in tenants[0], screen
    tmux.keys("Down", "Down", "Enter")
    tmux.wait("its process", "notebook-5 [lab]")
    tmux.keys("?")
    tmux.wait("the help", "Any key closes this help")
    tmux.keys("x")
    tmux.wait("the help closed", "Any key closes this help", gone=True)
    tmux.keys("p")
    tmux.wait("paused", "PAUSED")
    tmux.keys("q")
    assert tmux.exit_status() == 0


def test_once_prints_one_frame_the_width_of_the_terminal(node: Agent, terminal: list[Tmux]) -> None:
    tmux = top(terminal, "--agent", f"http://{node.target}", "--once")
    assert tmux.exit_status() == 0
    screen = tmux.screen(scrollback=True)  # 8 GPUs and 57 tenants: longer than the terminal
    lines = [line for line in screen.splitlines() if line and EXIT not in line]
    assert lines[0].startswith("gpu-node-1  sim") and len(lines[0]) == WIDTH  # the clock at the right edge
    assert lines[2].lstrip().startswith("TENANT") and "GPU-h" in lines[2]
    assert "GPU 0  NVIDIA H100 80GB HBM3" in screen and "\x1b" not in screen
    assert all(len(line) <= WIDTH for line in lines)
    assert "GPU 7" in screen and "training/pretrain-0" in screen


def test_once_against_a_wrong_url_is_one_line_and_exit_2(terminal: list[Tmux], tmp_path: Path) -> None:
    tmux = top(terminal, "--agent", "http://127.0.0.1:9", "--once")
    assert tmux.exit_status() == 2
    said = [line for line in tmux.screen().splitlines() if line.strip() and EXIT not in line]
    assert said == ["gpuagent top: cannot use the agent at http://127.0.0.1:9: cannot connect: connection refused"]
