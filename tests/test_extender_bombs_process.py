"""The must-show for the extender under abuse: a real ``gpuagent extender`` process fed the worst bodies the
tests know, several at once, keeps its peak RSS under the Deployment's memory limit and answers ``/healthz``
within 1 s all along; every bomb is a 4xx naming the limit.

The bodies: the issue's gzip bomb (about 200 KB inflating to 200 MB), JSON nested 8 MB deep, arrays of
node names and of empty containers just under and over the size cap, and an 8 MB string of 4-byte
characters (32 MB once decoded).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_extender_abuse import gzip_bomb
from test_extender_agents import free_port

from gpuagent.hints.extender_app import MAX_BODY_BYTES
from gpuagent.quantities import parse_memory

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def memory_limit_bytes() -> int:
    for doc in yaml.safe_load_all((ROOT / "deploy" / "extender" / "extender.yaml").read_text()):
        if doc and doc["kind"] == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            return parse_memory(container["resources"]["limits"]["memory"])
    raise AssertionError("no Deployment in deploy/extender/extender.yaml")


def worst_bodies() -> list[tuple[str, bytes, dict[str, str]]]:
    pod = json.dumps({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    fill = MAX_BODY_BYTES - 200
    names_under = ('{"Pod": ' + pod + ', "NodeNames": [' + ",".join(['"n"'] * (fill // 4)) + "]}").encode()
    return [
        ("gzip bomb", gzip_bomb(200 * 1024 * 1024), {"Content-Encoding": "gzip"}),
        ("deep", b"[" * fill, {}),
        ("names under the cap", names_under, {}),
        ("names over the cap", names_under[:-2] + b',"n"' * 1000 + b"]}", {}),
        ("empty containers", b"[" + b"{}," * (fill // 3) + b"{}]", {}),
        ("a huge string", ('{"Pod": {"metadata": {"name": "' + "\U0001f600" * (fill // 4) + '"}}}').encode(), {}),
    ]


async def post(port: int, body: bytes, headers: dict[str, str]) -> int | None:
    """The status answered; None when the extender closed the connection before the body was all sent and
    no answer could be read (it stops reading at a cap and closes after answering)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    try:
        writer.write(f"POST /gpuagent/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode())
        writer.write(body)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        answer = await asyncio.wait_for(reader.read(), 120)
    except ConnectionResetError:
        answer = b""
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


async def healthz_latencies(port: int, stop: asyncio.Event) -> list[float]:
    latencies = []
    while not stop.is_set():
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.05)
    return latencies


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_the_worst_bodies_keep_the_extender_under_its_memory_limit_and_answering(tmp_path: Path) -> None:
    port = free_port()
    agents = tmp_path / "agents.yaml"
    agents.write_text(yaml.safe_dump({"gpu-node-1": "http://127.0.0.1:9"}))
    log = (tmp_path / "extender.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "extender", "--agents", str(agents), "--url-prefix", "/gpuagent",
         "--listen", f"127.0.0.1:{port}", "--kubernetes-api", "off"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")},
    )
    bodies = worst_bodies()

    async def attack() -> tuple[list[tuple[str, int]], list[float]]:
        for _ in range(300):
            try:
                await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "extender.log").read_text()
                await asyncio.sleep(0.1)
        stop = asyncio.Event()
        watcher = asyncio.create_task(healthz_latencies(port, stop))
        statuses = []
        for _ in range(2):  # each body three at a time, twice
            for name, body, headers in bodies:
                answers = await asyncio.gather(*(post(port, body, headers) for _ in range(3)))
                statuses += [(name, status) for status in answers]
        stop.set()
        return statuses, await watcher

    try:
        statuses, latencies = asyncio.run(attack())
        rss = peak_rss_bytes(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    output = (tmp_path / "extender.log").read_text()
    assert all(status is None or 400 <= status < 500 for _, status in statuses), statuses
    for name, _, _ in bodies:  # each refused with an answer at least once (the others may be cut short)
        assert any(status is not None for seen, status in statuses if seen == name), (name, statuses)
    assert rss < memory_limit_bytes(), f"peak RSS {rss / 2**20:.0f} MiB"
    assert latencies and max(latencies) < 1.0, f"/healthz took up to {max(latencies):.2f} s"  # the bound
    assert "Traceback" not in output, output[-3000:]
    print(f"peak RSS {rss / 2**20:.0f} MiB, /healthz max {max(latencies) * 1000:.0f} ms over {len(latencies)}")
