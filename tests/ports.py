"""Loopback ports for test servers that must be told their port before they start (an agent process,
Prometheus), safe when tests run in parallel.

The port comes from the OS (a bind to port 0, so nothing listens on it now), and is never handed out twice in
one run: every port given is recorded in a registry file shared by all the run's processes, under an
exclusive ``flock``, and one already recorded is skipped. Without that, two pytest-xdist workers can each be
given the same just-released port and one server fails to bind. The registry is ``$TEST_PORT_REGISTRY``:
``scripts/run_tests.py`` sets one for both its passes, ``conftest.py`` one per pytest-xdist run (in the run's
temporary directory); unset, this process is the whole run. A server that can bind port 0 itself and say
which port it got needs none of this.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

REGISTRY_ENV = "TEST_PORT_REGISTRY"
_given: set[int] = set()


def registry_path() -> Path | None:
    """The file recording the ports given in this run, or None when this process is the whole run."""
    path = os.environ.get(REGISTRY_ENV)
    return Path(path) if path else None


def _os_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    """A loopback TCP port nobody listens on and no other test of this run was given."""
    path = registry_path()
    with _locked(path) as taken:
        for _ in range(200):
            port = _os_port()
            if port not in taken and port not in _given:
                _given.add(port)
                if path is not None:
                    with path.open("a") as registry:
                        registry.write(f"{port}\n")
                return port
    raise RuntimeError(f"no loopback port free that this run has not already given ({len(_given)} given)")


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[set[int]]:
    """The registry's ports, read under its exclusive lock (held until the block ends)."""
    if path is None:
        yield set()
        return
    with path.open("a+") as registry:
        fcntl.flock(registry, fcntl.LOCK_EX)
        try:
            registry.seek(0)
            yield {int(line) for line in registry.read().split() if line.isdigit()}
        finally:
            fcntl.flock(registry, fcntl.LOCK_UN)
