"""``gpuagent run`` with request handlers that never finish, for ``tests/test_shutdown.py``.

Run as a script with the arguments of ``gpuagent`` (``python tests/stuck_agent.py run --config FILE``). It is
the real agent, with two more routes on its listener: ``/test/stuck-thread`` waits for a blocking call that
never returns (on the default executor, as the agent's ``/proc`` and netlink reads run), and
``/test/stuck-task`` is a handler that will not be cancelled, and ``/test/block-loop`` blocks the event loop
itself.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from aiohttp import web

import gpuagent.agent
from gpuagent.cli import main

NEVER = threading.Event()


def blocking_read_that_never_returns() -> None:
    NEVER.wait()


async def stuck_thread(request: web.Request) -> web.Response:
    await asyncio.to_thread(blocking_read_that_never_returns)
    return web.Response()


async def stuck_task(request: web.Request) -> web.Response:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # refuses to be cancelled
            continue


async def block_the_event_loop(request: web.Request) -> web.Response:
    time.sleep(3600)  # a blocking call on the loop: nothing else runs, the shutdown included
    return web.Response()


_build_app = gpuagent.agent.build_app


def build_app(*args: object, **kwargs: object) -> web.Application:
    app = _build_app(*args, **kwargs)
    app.router.add_get("/test/stuck-thread", stuck_thread)
    app.router.add_get("/test/stuck-task", stuck_task)
    app.router.add_get("/test/block-loop", block_the_event_loop)
    return app


if __name__ == "__main__":
    gpuagent.agent.build_app = build_app
    sys.exit(main(sys.argv[1:]))
