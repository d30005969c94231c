"""Fixtures shared by test modules, and what makes the suite safe to run in parallel (``tests/README.md``):
one registry of loopback ports per pytest-xdist run (``ports.py``), and the ``serial`` marker's rule: tests
that measure CPU shares never run on an xdist worker, beside other tests, where their CPU is not their own.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer
from ports import REGISTRY_ENV

SERIAL_USAGE = ("measure CPU shares and need a CPU of their own: run them without xdist "
                "(`pytest -p no:xdist -m serial`), the others with `-m 'not serial' -n N`, "
                "or both passes as `make test` does (scripts/run_tests.py)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A serial test on an xdist worker fails at once, saying how to run it (an error in the worker's
    collection would end the run without the reason)."""
    if item.get_closest_marker("serial") and os.environ.get("PYTEST_XDIST_WORKER") is not None:
        pytest.fail(f"tests marked serial {SERIAL_USAGE}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers, the modules that start processes or servers (an ``integration`` test in them) and
    the ``long`` ones (property tests of many seconds) first: xdist hands modules out in collection order (the
    runner turns off its reordering by test count, which put them last, where one long module alone made the
    run's tail: ``test_verdict_key``'s 16 s ended a fresh-clone run 12 s after the other workers)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    slow = {item.module.__name__ for item in items if isinstance(item, pytest.Function)
            and (item.get_closest_marker("integration") or item.get_closest_marker("long"))}
    items.sort(key=lambda item: not (isinstance(item, pytest.Function) and item.module.__name__ in slow))


@pytest.fixture(scope="session", autouse=True)
def _one_port_registry_per_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """On an xdist worker without a registry from scripts/run_tests.py, the run's own (in the run's base
    temporary directory, which every worker's lies in)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None or os.environ.get(REGISTRY_ENV):
        yield
        return
    os.environ[REGISTRY_ENV] = str(tmp_path_factory.getbasetemp().parent / "ports")
    try:
        yield
    finally:
        del os.environ[REGISTRY_ENV]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root, a mount namespace we may mount in); skipped where it cannot be mounted."""
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mountpoint)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


@pytest.fixture
def agent_off_the_burn_cpu() -> Iterator[None]:
    """The test process (the agent) off the highest CPU, where end-to-end tests' tenants contend."""
    before = os.sched_getaffinity(0)
    others = before - {max(before)}
    if not others:
        pytest.skip("needs two CPUs: one for the tenants, one for the agent")
    os.sched_setaffinity(0, others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were before the test: the CLI's ``main`` sets them up."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1 (``fake_apiserver``), stopped at teardown."""
    async with FakeApiServer() as server:
        yield server

