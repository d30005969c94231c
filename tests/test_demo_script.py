"""``scripts/demo.sh`` (``make demo``) stops everything and leaves nothing behind, however it is stopped.

The script's tools are stand-ins here (its ``python``, ``gpuagent``, ``prometheus`` and ``promtool``, each a
few lines that say what was done to them), so what is tested is the script's own handling of a hangup, an
interrupt and a SIGTERM in a second, not the demo (``test_demo.py``) or Prometheus.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The demo stand-in: says whether SIGHUP reaches it (a hangup must not kill it before it can clean up), then
# waits for SIGTERM, the signal on which the real one removes its temporary directory.
GPUAGENT = f"""#!{sys.executable}
import os, signal, sys, time
state = os.environ["STUB_STATE"]
def stopped(*_):
    open(os.path.join(state, "gpuagent.terminated"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
hup = "ignored" if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else "default"
with open(os.path.join(state, "gpuagent.started"), "w") as f:
    f.write(f"{{os.getpid()}} {{hup}}")
while True:
    time.sleep(0.05)
"""
PYTHON = """#!/bin/sh
# python -m gpuagent.demo.history ... --out FILE: the week's history, here an empty file
while [ $# -gt 0 ]; do [ "$1" = --out ] && : > "$2"; shift; done
"""
PROMTOOL = "#!/bin/sh\nexit 0\n"
PROMETHEUS = """#!/bin/sh
echo $$ > "$STUB_STATE/prometheus.pid"
trap 'exit 0' TERM
while :; do sleep 0.05; done
"""


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def stand_ins(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """The script's environment (its BIN, WORK and PATH on the stand-ins) and the stand-ins' state folder;
    whatever a stand-in left running is ended at teardown."""
    bin_dir, tools, state = tmp_path / "bin", tmp_path / "tools", tmp_path / "state"
    state.mkdir()
    executable(bin_dir / "python", PYTHON)
    executable(bin_dir / "gpuagent", GPUAGENT)
    executable(tools / "promtool", PROMTOOL)
    executable(tools / "prometheus", PROMETHEUS)
    env = {"PATH": f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}", "BIN": str(bin_dir),
           "WORK": str(tmp_path / "work"), "STUB_STATE": str(state), "LISTEN": "127.0.0.1:1",
           "PROMETHEUS_LISTEN": "127.0.0.1:1"}
    yield env, state
    for name in ("gpuagent.started", "prometheus.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((state / name).read_text().split()[0]), signal.SIGKILL)


def wait_for(path: Path, script: subprocess.Popen[bytes], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert script.poll() is None, script.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    return path.read_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGHUP, 129), (signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_demo_and_prometheus_and_removes_the_work_folder(
    stand_ins: tuple[dict[str, str], Path], sig: signal.Signals, status: int
) -> None:
    env, state = stand_ins
    script = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pid, hup = wait_for(state / "gpuagent.started", script).split()
        prometheus = int(wait_for(state / "prometheus.pid", script))
        assert hup == "ignored"  # a terminal's hangup reaches the whole group: the script's trap stops it
        assert Path(env["WORK"], "prometheus.yml").exists()
        script.send_signal(sig)
        assert script.wait(30) == status, script.communicate()
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert (state / "gpuagent.terminated").exists()  # stopped with SIGTERM: the real one cleans up on it
    assert not alive(int(pid)) and not alive(prometheus)
    assert not Path(env["WORK"]).exists()


def test_the_demo_ending_by_itself_also_stops_prometheus_and_removes_the_work_folder(
    stand_ins: tuple[dict[str, str], Path]
) -> None:
    env, state = stand_ins
    script = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pid = int(wait_for(state / "gpuagent.started", script).split()[0])
        prometheus = int(wait_for(state / "prometheus.pid", script))
        os.kill(pid, signal.SIGTERM)  # as when the demo stops on its own
        assert script.wait(30) == 0, script.communicate()
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert not alive(prometheus) and not Path(env["WORK"]).exists()
