"""``ports.free_port``: processes of one run sharing its registry are never given the same port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ports import REGISTRY_ENV, free_port

HERE = Path(__file__).resolve().parent
TAKE = "import sys; from ports import free_port; print(*(free_port() for _ in range(int(sys.argv[1]))))"


def test_processes_sharing_a_registry_never_get_the_same_port(tmp_path: Path) -> None:
    registry = tmp_path / "ports"
    env = {REGISTRY_ENV: str(registry), "PYTHONPATH": str(HERE)}
    takers = [subprocess.Popen([sys.executable, "-c", TAKE, "40"], stdout=subprocess.PIPE, text=True, env=env)
              for _ in range(4)]
    given = [int(port) for taker in takers for port in taker.communicate(timeout=60)[0].split()]
    assert all(taker.returncode == 0 for taker in takers)
    assert len(given) == 160 and len(set(given)) == 160
    assert sorted(int(line) for line in registry.read_text().split()) == sorted(given)


def test_a_port_given_is_free_to_bind_and_recorded_when_a_registry_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "ports"))
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
    assert (tmp_path / "ports").read_text().split() == [str(port)]
    assert free_port() != port
