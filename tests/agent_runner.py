"""A real agent process for integration tests: ``python -m gpuagent run --config FILE``, log in a file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


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
                env={k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")},
            )

    def wait_ready(self, timeout: float = 30) -> None:
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
