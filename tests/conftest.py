"""Fixtures shared by test modules."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import NODE, FakeApiServer

FAST_BACKOFF = {"relist_backoff": 0.02, "max_backoff": 0.1}


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
async def api() -> AsyncIterator[FakeApiServer]:
    """A fake Kubernetes API server on 127.0.0.1 (``fake_apiserver``), stopped at teardown."""
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def reflector(api: FakeApiServer) -> AsyncIterator[Callable[..., Any]]:
    """reflector(cls, **kwargs) -> a running ``pods.reflector.Reflector`` subclass for NODE against ``api``
    (fast backoff unless given), cancelled at teardown."""
    tasks: list[asyncio.Task] = []

    def start(cls: type, **kwargs: object) -> Any:
        kwargs.setdefault("config", api.kubeconfig())
        for key, value in FAST_BACKOFF.items():
            kwargs.setdefault(key, value)
        made = cls(NODE, **kwargs)
        tasks.append(asyncio.create_task(made.run()))
        return made

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
