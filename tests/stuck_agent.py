"""``gpuagent run`` with request handlers that never finish, for ``tests/test_shutdown.py``.

Run as a script with the arguments of ``gpuagent`` (``python tests/stuck_agent.py run --config FILE``). It is
the real agent, with two more routes on its listener: ``/test/stuck-thread`` waits for a blocking call that
never returns (on the default executor, as the agent's ``/proc`` and netlink reads run), and
``/test/stuck-task`` is a handler that will not be cancelled, and ``/test/block-loop`` blocks the event loop
itself. Each says on stderr (the agent's log) when it holds its request: ``stuck: <route>``, which
``tests/test_shutdown.py`` waits for before it signals, since a SIGTERM that comes before the request
reaches its handler finds nothing stuck and the agent stops cleanly.
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
HELD = "stuck: "  # and the route: the line each handler writes once it holds its request


def held(route: str) -> None:
    print(f"{HELD}{route}", file=sys.stderr, flush=True)


def blocking_read_that_never_returns() -> None:
    held("/test/stuck-thread")  # from the executor's thread: it exists, and will never return
    NEVER.wait()


async def stuck_thread(request: web.Request) -> web.Response:
    await asyncio.to_thread(blocking_read_that_never_returns)
    return web.Response()


async def stuck_task(request: web.Request) -> web.Response:
    held("/test/stuck-task")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # refuses to be cancelled
            continue


async def block_the_event_loop(request: web.Request) -> web.Response:
    held("/test/block-loop")
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
