"""Slow and many clients against the HTTP listeners (``gpuagent.httpguard``), and storms of one log line
(``gpuagent.ratelog``).

In process, with small limits: a half-sent request head is dropped after the header timeout; at the cap a
new connection evicts the oldest waiting one; requests being answered leave the reserved slots to
``/metrics`` and the probes. Then the must-show: a real agent process under the unit's ``LimitNOFILE`` with
2,000 half-sent requests held open still answers ``/metrics`` and writes a handful of log lines.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import json
import logging
import resource
import socket
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from agent_runner import ROOT, AgentRunner
from test_tls import free_port

from gpuagent.httpguard import (
    FILES_KEPT,
    ConnectionGuard,
    GuardCollector,
    GuardedSite,
    ServerLimits,
    fitted,
    raise_open_file_limit,
)
from gpuagent.ratelog import RepeatFilter

HALF_SENT = b"GET /v1/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


BIG_ANSWER = b"x" * (1 << 20)


@contextlib.asynccontextmanager
async def guarded(limits: ServerLimits) -> AsyncIterator[tuple[int, ConnectionGuard, asyncio.Event]]:
    """A listener with ``/metrics`` (answers at once), ``/slow`` (answers when the event is set), ``/big``
    (1 MiB at once) and ``POST /echo`` (reads its body, up to 64 KiB), behind the JSON errors."""
    from aiohttp import web

    from gpuagent.httpbody import BodyLimits, read_body
    from gpuagent.httperrors import json_errors

    release = asyncio.Event()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="up 1\n")

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=BIG_ANSWER)

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await read_body(request, BodyLimits(max_bytes=64 * 1024)))

    app = web.Application(middlewares=[json_errors], client_max_size=64 * 1024)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/slow", slow)
    app.router.add_get("/big", big)
    app.router.add_post("/echo", echo)
    guard = ConnectionGuard(limits)
    guard.install(app)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, **limits.runner_options())
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    try:
        yield site.port, guard, release
    finally:
        release.set()
        await runner.cleanup()


async def get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except (ConnectionResetError, asyncio.IncompleteReadError):
        return True
    except TimeoutError:
        return False


async def test_a_half_sent_request_head_is_dropped_after_the_header_timeout() -> None:
    async with guarded(ServerLimits(header_timeout_seconds=0.3, keepalive_seconds=30)) as (port, guard, _):
        silent = await asyncio.open_connection("127.0.0.1", port)  # connects, sends nothing
        half = await asyncio.open_connection("127.0.0.1", port)
        half[1].write(HALF_SENT)
        for reader, _writer in (silent, half):
            assert await closed_by_server(reader, 10)
        assert guard.timed_out == 2
        # a keep-alive connection: its second request, half sent, is dropped too
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await reader.readuntil(b"up 1\n")).startswith(b"HTTP/1.1 200")
        writer.write(HALF_SENT)
        assert await closed_by_server(reader, 10)
        for _, w in (silent, half, (reader, writer)):
            w.close()


async def test_at_the_cap_a_new_connection_evicts_the_oldest_waiting_one() -> None:
    limits = ServerLimits(max_connections=5, reserved=1, header_timeout_seconds=60)
    async with guarded(limits) as (port, guard, _):
        held = []
        for _ in range(5):
            held.append(await asyncio.open_connection("127.0.0.1", port))
            held[-1][1].write(HALF_SENT)
        await asyncio.sleep(0.1)
        assert guard.open == 5
        status, body = await get(port, "/metrics")  # the 6th: gets in, the oldest goes
        assert status == 200 and body.endswith(b"up 1\n")
        assert await closed_by_server(held[0][0], 10)
        assert guard.evicted >= 1 and guard.open <= 5
        for _, writer in held:
            writer.close()


async def test_requests_being_answered_leave_the_reserved_slots_to_scrapes_and_probes() -> None:
    limits = ServerLimits(max_connections=4, reserved=2, header_timeout_seconds=60)
    async with guarded(limits) as (port, guard, release):
        slow = [asyncio.create_task(get(port, "/slow")) for _ in range(2)]
        while guard.open < 2 or guard._answering_others < 2:
            await asyncio.sleep(0.01)
        status, body = await get(port, "/slow")  # a third: over the cap minus the reserve
        assert status == 503 and b"kept for /metrics" in body and b"Retry-After: 1" in body
        assert (await get(port, "/metrics"))[0] == 200  # the reserved slot
        release.set()
        assert [status for status, _ in await asyncio.gather(*slow)] == [200, 200]


async def wait_for(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length: status, headers (lower-case names), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 10)
    return int(lines[0].split()[1]), headers, body


def post_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


async def test_a_closed_connection_ends_the_drain_of_a_refused_body() -> None:
    """The leak of issue 28: a request refused with its body unread is drained by aiohttp for its lingering
    time; a connection closed meanwhile (evicted to make room) kept its task and buffers for all of it, and
    a flood that reconnects piled them up (63 to 265 MB in 4 s). Now closing it ends its task at once."""
    limits = ServerLimits(max_connections=2, reserved=0, header_timeout_seconds=60)  # lingers 60 s
    async with guarded(limits) as (port, guard, _):
        before = len(asyncio.all_tasks())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post_head("/nope", 100) + b"{")
        status, headers, body = await answer(reader)
        assert status == 404 and headers["content-type"].startswith("application/json")
        assert json.loads(body) == {"error": "Not Found"}
        assert headers["connection"] == "close"  # the body is never read, nor a request after it
        assert guard.body_bytes == 0
        others = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]  # evicts the drained one
        assert await closed_by_server(reader, 10)
        assert guard.evicted >= 1
        await wait_for(lambda: len(asyncio.all_tasks()) <= before + 2, within=5)  # the two new ones' tasks
        for _, w in [*others, (reader, writer)]:
            w.close()


async def test_request_bodies_in_flight_share_one_budget() -> None:
    async with guarded(ServerLimits(body_budget_bytes=1000, header_timeout_seconds=60)) as (port, guard, _):
        first = await asyncio.open_connection("127.0.0.1", port)
        first[1].write(post_head("/echo", 800) + b"{")  # its head reserves 800 bytes; the body trickles
        await wait_for(lambda: guard.body_bytes == 800)
        second = await asyncio.open_connection("127.0.0.1", port)
        second[1].write(post_head("/echo", 800) + b"{")
        status, headers, body = await answer(second[0])
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        assert json.loads(body) == {"error": "too many request bodies being read at once", "field": "body"}
        assert guard.body_refused == 1
        unknown = await asyncio.open_connection("127.0.0.1", port)
        unknown[1].write(post_head("/nope", 800) + b"{")  # an unknown path reserves nothing
        assert (await answer(unknown[0]))[0] == 404
        third = await asyncio.open_connection("127.0.0.1", port)
        third[1].write(post_head("/echo", 200) + b"y" * 200)  # fits beside the first
        assert (await answer(third[0]))[::2] == (200, b"y" * 200)
        first[1].write(b"z" * 799)
        assert (await answer(first[0]))[::2] == (200, b"{" + b"z" * 799)
        await wait_for(lambda: guard.body_bytes == 0)
        for _, w in (first, second, unknown, third):
            w.close()


async def test_a_request_aiohttp_cannot_parse_gets_a_json_error() -> None:
    async with guarded(ServerLimits()) as (port, _guard, _):
        for bad in (b"G\x01T / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(bad)
            status, headers, body = await answer(reader)
            assert status == 400 and headers["content-type"].startswith("application/json"), body
            error = json.loads(body)
            assert error["field"] == "request" and error["error"].startswith("Bad Request"), error
            writer.close()


def small_receive_buffer(writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)


async def test_a_client_that_does_not_read_its_answer_is_closed_after_the_send_timeout() -> None:
    async with guarded(ServerLimits(send_timeout_seconds=0.5)) as (port, guard, _):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        small_receive_buffer(writer)
        writer.write(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await wait_for(lambda: guard.send_timed_out == 1)
        await wait_for(lambda: guard.open == 0 and guard.stalled_bytes == 0)
        assert (await get(port, "/metrics"))[0] == 200
        writer.close()


async def test_past_the_send_budget_the_longest_unread_answer_goes() -> None:
    # Each holds its 1 MiB answer and what of it the kernel did not take: room for two.
    limits = ServerLimits(send_budget_bytes=5 << 20, send_timeout_seconds=60)
    async with guarded(limits) as (port, guard, _):
        readers = []
        for count in range(1, 4):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            small_receive_buffer(writer)
            writer.write(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            readers.append((reader, writer))
            await wait_for(lambda n=count: len(guard._stalled) + guard.send_evicted == n)
        assert guard.send_evicted == 1 and guard.stalled_bytes <= limits.send_budget_bytes
        first = readers[0][0]
        with contextlib.suppress(ConnectionResetError):  # what the kernel took, then the end
            while await asyncio.wait_for(first.read(1 << 16), 10):
                pass
        assert guard.open == 2
        for _, writer in readers:
            writer.close()


def test_the_guard_counts_on_metrics() -> None:
    guard = ConnectionGuard(ServerLimits(max_connections=100, body_budget_bytes=4096), open_files=None)
    guard.open, guard.evicted, guard.body_refused, guard.body_bytes = 7, 3, 2, 100
    families = {family.name: family for family in GuardCollector(guard).collect()}
    sample = {(s.name, tuple(s.labels.values())): s.value for f in families.values() for s in f.samples}
    assert sample[("gpuagent_http_connections_open", ())] == 7
    assert sample[("gpuagent_http_connections_max", ())] == 100
    assert sample[("gpuagent_http_connections_closed_total", ("evicted",))] == 3
    assert sample[("gpuagent_http_requests_refused_total", ("body_budget",))] == 2
    assert sample[("gpuagent_http_body_reserved_bytes", ())] == 100
    assert sample[("gpuagent_http_body_budget_bytes", ())] == 4096


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 1100:
        pytest.skip(f"the hard open-file limit is {hard}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert raise_open_file_limit() == (1024, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        assert raise_open_file_limit() == (hard, hard)  # nothing more to raise
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_storm_of_one_warning_is_a_few_lines_and_a_count() -> None:
    now = [0.0]
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Collect()
    handler.addFilter(RepeatFilter(interval_seconds=10, burst=3, clock=lambda: now[0]))
    logger = logging.getLogger("test.storm")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        for i in range(10_000):
            logger.error("accept failed: %s (%d%%)", "Too many open files", i % 100)
        logger.warning("another kind")
        logger.info("info is not held back")
        logger.info("info is not held back")
        now[0] = 10.5
        logger.error("accept failed: %s (%d%%)", "Too many open files", 1)
    finally:
        logger.removeHandler(handler)
    assert records[:3] == ["accept failed: Too many open files (0%)", "accept failed: Too many open files (1%)",
                           "accept failed: Too many open files (2%)"]
    assert records[3:6] == ["another kind", "info is not held back", "info is not held back"]
    assert records[6] == "accept failed: Too many open files (1%) [9997 more like this held back in the last 10 s]"
    assert len(records) == 7


# --- the must-show: a real agent under the unit's file limit -----------------------------------------------------


def unit_nofile() -> int:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "systemd" / "gpuagent.service")
    return int(unit["Service"]["LimitNOFILE"])


def test_the_unit_sizes_its_file_limit_for_the_connection_cap() -> None:
    assert unit_nofile() >= ServerLimits().max_connections + FILES_KEPT  # the cap, accepts in flight, its own
    assert fitted(ServerLimits(), unit_nofile()) == ServerLimits()  # the full cap under the unit's limit


def test_the_cap_is_lowered_to_fit_a_smaller_open_file_limit(caplog: pytest.LogCaptureFixture) -> None:
    limits = fitted(ServerLimits(), 1024)  # systemd's default
    assert limits.max_connections == 1024 - FILES_KEPT and limits.reserved == ServerLimits().reserved
    assert fitted(ServerLimits(), 100).max_connections == 16
    with caplog.at_level(logging.WARNING, logger="gpuagent.httpguard"):
        guard = ConnectionGuard(open_files=1024)
    assert guard.limits.max_connections == 1024 - FILES_KEPT
    assert "leaves room for 384 connections, not 512" in caplog.text


SLOW_CLIENTS = 2_000  # of each kind
HEAD_LIMIT = 256 * 1024 * 1024  # the DaemonSet's memory limit (256Mi)
SLOW_BODY = (b"POST /v1/hints/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{")
NOT_READ = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 40  # pipelined, answers never read
KINDS = {"heads": HALF_SENT, "bodies": SLOW_BODY, "readers": NOT_READ}


def limited_agent(
    tmp_path: Path, nofile: int, hard: int | None = None, **config: Any
) -> tuple[AgentRunner, int]:
    """An agent process (simulated GPUs, ``config`` added) whose open-file limit is ``nofile`` (soft) and
    ``hard`` (default: ``nofile``), ready; and its port."""
    port = free_port()
    limited = (sys.executable, "-c", "import resource, runpy, sys; "
               f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {hard or nofile})); "
               "sys.argv[0] = 'gpuagent'; runpy.run_module('gpuagent', run_name='__main__')")
    agent = AgentRunner("agent", {
        "listen": f"127.0.0.1:{port}", "backend": "sim", "hostname": "slow-clients", "pod_resources_socket": None,
        "kubernetes_api": "off", "journal_path": str(tmp_path / "journal.json"), "log_level": "info", **config,
    }, tmp_path, command=limited)
    agent.wait_ready()
    return agent, port


def slow_clients(port: int, count: int, sends: bytes, *, receive_buffer: int | None = None) -> list[socket.socket]:
    """``count`` connections to ``port``, each having sent ``sends`` (non-blocking: no waiting); with
    ``receive_buffer``, a receive window that small (a client that reads nothing holds little)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 200:
        pytest.skip(f"this process may open {hard} files, fewer than {count} connections need")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = soft + count + 256 if hard == resource.RLIM_INFINITY else min(hard, soft + count + 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        sockets.append(sock)
    time.sleep(0.5)
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.send(sends)
    return sockets


def half_sent_clients(port: int, count: int) -> list[socket.socket]:
    return slow_clients(port, count, HALF_SENT)


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in bytes (``VmHWM``: the peak resident memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def soft_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise KeyError("Max open files")


def test_metrics_and_probes_answer_under_2000_slow_clients_of_each_kind(tmp_path: Path) -> None:
    """Issue 28 item 3's must-show: an agent started at containerd's soft 1,024 open files (under the unit's
    hard limit) raises it, and 2,000 clients of each kind (half a head; a head and a trickle of its body;
    pipelined requests whose answers are never read) leave ``/metrics`` and the probes answering within
    1 s and the agent under the DaemonSet's 256 MiB; every connection it took is closed in time."""
    nofile = unit_nofile()
    agent, port = limited_agent(tmp_path, 1024, nofile)
    sockets: list[socket.socket] = []
    try:
        assert soft_open_files(agent.proc.pid) == nofile
        assert "raised the open-file limit from 1024 to its hard limit" in agent.log_path.read_text()
        lines_before = agent.log_path.read_text().count("\n")
        for kind, sends in KINDS.items():
            sockets += slow_clients(port, SLOW_CLIENTS, sends, receive_buffer=4096 if kind == "readers" else None)
            for path in ("/metrics", "/healthz", "/readyz"):
                started = time.monotonic()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    assert response.status == 200
                    response.read()
                assert time.monotonic() - started < 1.0, (kind, path)  # the bound
        for sock in sockets[SLOW_CLIENTS:2 * SLOW_CLIENTS]:  # the bodies trickle on
            with contextlib.suppress(OSError):
                sock.send(b" ")
        # Every one the agent took is closed, timed out or evicted: counted as they close, for up to half a
        # minute past the header timeout (a loaded machine sweeps them late: 330 of 512 were closed 3 s
        # past it in one run, 510 in another), since a count at one instant measured the machine's speed.
        time.sleep(ServerLimits().header_timeout_seconds)
        deadline = time.monotonic() + 30
        closed, waiting = 0, list(sockets)
        while True:
            still = []
            for sock in waiting:
                try:
                    gone = sock.recv(1 << 16) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                closed += gone
                if not gone:
                    still.append(sock)
            waiting = still
            if closed >= ServerLimits().max_connections or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert closed >= ServerLimits().max_connections
        peak = proc_status(agent.proc.pid, "VmHWM")
        assert peak < HEAD_LIMIT, f"peak RSS {peak / 2**20:.0f} MiB"
        metrics = agent.metrics()
        assert 'gpuagent_http_connections_closed_total{reason="evicted"}' in metrics
        log = agent.log_path.read_text()
        assert "Too many open files" not in log
        assert log.count("\n") - lines_before < 20, log[-3000:]
    finally:
        for sock in sockets:
            sock.close()
        assert agent.stop() == 0, agent.log()


def test_the_admin_token_over_plain_http_is_warned_of(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    agent, port = limited_agent(tmp_path, unit_nofile(), admin_token_file=str(token))
    try:
        assert f"take their bearer token over plain HTTP on 127.0.0.1:{port}" in agent.log_path.read_text()
    finally:
        assert agent.stop() == 0, agent.log()


def test_an_open_file_limit_too_small_for_a_flood_costs_a_few_log_lines_not_a_storm(tmp_path: Path) -> None:
    """At 300 files the agent's own files and a burst of accepts exhaust it: accepts fail with EMFILE (asyncio
    retries a second later), and the log holds a few tracebacks and counts, not one per failure."""
    agent, port = limited_agent(tmp_path, 300)
    sockets: list[socket.socket] = []
    try:
        sockets = half_sent_clients(port, 1_000)
        time.sleep(3)
        for sock in sockets[:500]:  # some leave: the agent gets files back and serves again
            sock.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, agent.log()
        log = agent.log_path.read_text()
        assert log.count("Too many open files") <= 30, log[-3000:]
        assert log.count("\n") < 400, log[-3000:]
    finally:
        for sock in sockets:
            sock.close()
        assert agent.stop() == 0, agent.log()
