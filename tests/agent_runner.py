"""A real agent process for integration tests: ``python -m gpuagent run --config FILE``, log in a file; the
other commands as processes (:func:`run_gpuagent`); the ``/proc`` a simulated node's processes are
attributed from (:func:`write_proc`); and what an agent's journal holds (:func:`journal_entries`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def journal_entries(journal: Path) -> list:
    """The freezes an agent's journal has on record (none while it is missing or being rewritten)."""
    try:
        return json.loads(journal.read_text() or "{}").get("entries", [])
    except (OSError, ValueError):
        return []


def clean_env() -> dict[str, str]:
    """The test's environment without its GPUAGENT_* variables (a command reads its own flags only)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")}


def http_get(url: str) -> tuple[int, str]:
    """The status and body of a GET of ``url`` (an error status too, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def run_gpuagent(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m gpuagent ARGS`` from the repository, its output captured."""
    return subprocess.run([sys.executable, "-m", "gpuagent", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=clean_env())


def write_proc(root: Path, first_pid: int, pods: Sequence[tuple[str, str]], service: str) -> Path:
    """``root/<pid>/cgroup`` of the simulated processes ``first_pid``, ``first_pid + 1``, ...: one per pod
    (UID, container ID) in the kubelet's cgroup v2 layout (systemd driver, containerd), then ``service``, a
    systemd service."""
    lines = [f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}"
             f".slice/cri-containerd-{container}.scope\n" for uid, container in pods]
    lines.append(f"0::/system.slice/{service}\n")
    for pid, line in enumerate(lines, start=first_pid):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(line)
    return root


class AgentRunner:
    """Started with ``config`` (which names its ``listen`` address) as ``<workdir>/<name>.yaml``, logging
    to ``<workdir>/<name>.log``; GPUAGENT_* variables of the test's environment are not passed on.
    ``command`` is what runs ``gpuagent`` (``tests/stuck_agent.py`` for the shutdown tests)."""

    def __init__(self, name: str, config: dict[str, Any], workdir: Path,
                 command: Sequence[str] = (sys.executable, "-m", "gpuagent")) -> None:
        self.name = name
        self.target = config["listen"]
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*command, "run", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env=clean_env(),
            )

    def wait_ready(self, timeout: float = 60) -> None:  # a deadline: an agent at nice 19 on a slowed machine
        # served at once but was not ready 30 s later in one run (its first poll beside a busy serial pass)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{self.target}/readyz",
                                                                      timeout=2) as ready:
                if ready.status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"agent {self.name} not ready after {timeout} s:\n{self.log()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=5) as response:
            return response.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> int:
        """SIGTERM, then the exit code: 0 for a clean shutdown (killed after 30 s: the agent's own deadline,
        its backstop and a loaded machine are long past by then)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
