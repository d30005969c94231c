"""Fixtures shared by test modules."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer


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
async def api() -> AsyncIterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1 (``fake_apiserver``), stopped at teardown."""
    async with FakeApiServer() as server:
        yield server

