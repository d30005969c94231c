"""Hostile names through the real commands: a running agent (its exposition, its log, a 100 KB header),
``snapshot``/``hints``/``top --once`` tables, ``check-config`` on a file that is not YAML, ``report`` against a
Prometheus that answers hostile label values, and the live ``top`` driven by Textual's pilot."""

from __future__ import annotations

import asyncio
import csv
import io
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_runner import ROOT, AgentRunner, clean_env, run_gpuagent
from aiohttp.test_utils import TestServer
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families as parse_text
from test_report import POD_DAY, FakePrometheus, run_cli, serve
from test_top_view import FakeAgent
from test_untrusted import ALL_ESCAPES, ESCAPES, hostile_state, raw_controls

from gpuagent.top.app import NodeScreen, TopApp
from gpuagent.top.client import AgentWatch, new_session
from gpuagent.untrusted import has_unsafe

pytestmark = pytest.mark.integration

HOSTILE_NAME = ESCAPES["osc window title"] + ESCAPES["csi clear screen"] + ESCAPES["bidi override"] + "\x9b\x07\r"


def hostile_scenario(tmp_path: Path) -> Path:
    """The laptop scenario with a process that named itself with escapes, and a GPU model to match."""
    scenario = yaml.safe_load((ROOT / "examples" / "scenarios" / "laptop-1gpu.yaml").read_text())
    scenario["processes"][1]["name"] = "firefox" + HOSTILE_NAME
    path = tmp_path / "hostile-scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))  # the serializer writes the controls as YAML escapes
    return path


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentRunner]:
    config = {"listen": f"127.0.0.1:{free_port()}", "backend": "sim", "scenario": str(hostile_scenario(tmp_path)),
              "poll_interval": 0.5, "pod_resources_socket": None, "kubernetes_api": "off", "mode": "audit",
              "journal_path": str(tmp_path / "journal.json"), "proc_root": str(tmp_path / "proc")}
    runner = AgentRunner("hostile", config, tmp_path)
    try:
        runner.wait_ready()
        yield runner
    finally:
        runner.stop()


def test_the_agent_serves_hostile_names_shown_and_logs_a_huge_header_in_one_line(agent: AgentRunner) -> None:
    exposition = agent.metrics()
    comms = {s.labels["comm"] for m in parse_text(exposition) for s in m.samples if "comm" in s.labels}
    assert any(c.startswith("firefox\\x1b]0;pwned\\x07") for c in comms), comms
    assert not any(has_unsafe(value) for m in parse_text(exposition) for s in m.samples for value in s.labels.values())
    host, port = agent.target.rsplit(":", 1)
    for header in (b"a" * 100_000, b"\x1b]0;pwned\x07\x1b[2J"):  # 100 KB; a value with escapes
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + header + b"\r\n\r\n")
            assert sock.recv(200).startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
    assert agent.metrics()  # and it keeps serving
    assert agent.stop() == 0
    log = agent.log_path.read_text()
    bad = [line for line in log.splitlines() if "bad request from 127.0.0.1" in line]
    assert len(bad) == 2 and "400 LineTooLong" in bad[0] and "400 BadHttpMessage" in bad[1]
    assert all(len(line) < 400 and raw_controls(line) == [] for line in bad)
    assert "Traceback" not in log and "\x1b" not in log


@pytest.mark.parametrize("command", ["snapshot", "hints"])
def test_tables_show_the_escapes(tmp_path: Path, command: str) -> None:
    done = run_gpuagent(command, "--format", "table", "--backend", "sim", "--scenario", str(hostile_scenario(tmp_path)),
)
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout) == [] and raw_controls(done.stderr) == []
    if command == "snapshot":  # (hints name tenants by workload: unattributed here)
        assert "\\x1b]0;pwned\\x07" in done.stdout


def test_check_config_names_the_file_never_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:TOPSECRET:/root:/bin/bash\ndaemon:x:1:1::/:/bin/false\n")
    binary = tmp_path / "blob"
    binary.write_bytes(b"TOPSECRET\x1b]0;pwned\x07\x00more")
    scalar = tmp_path / "key.pem"
    scalar.write_text("-----BEGIN PRIVATE KEY----- TOPSECRET\n")
    for web_config in (secret, binary, scalar):
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"web_config": str(web_config)}))
        done = run_gpuagent("check-config", str(config))
        assert done.returncode == 2 and str(web_config) in done.stderr
        assert "TOPSECRET" not in done.stderr + done.stdout and raw_controls(done.stderr.rstrip("\n")) == []


def test_report_shows_hostile_names_and_reads_only_the_agents_job(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakePrometheus(pods={**POD_DAY, ("=cmd|' /C calc'!A0", "pod" + ALL_ESCAPES, "GPU-aaaa"):
                                (3600.0, 1800.0, 0.0, 0.0, 0.0)})
    with serve(fake):
        base = ["--prometheus", fake.url, "--start", "2024-05-01", "--end", "2024-05-02", "--quiet"]
        code, table, err = run_cli(capsys, *base)
        assert code == 0 and raw_controls(table) == [] and "pod\\x1b[2J" in table and err == ""
        assert 'series: {job=~"gpuagent"}' in table
        code, text, err = run_cli(capsys, *base, "--format", "csv")
        assert code == 0 and err == 'gpuagent report: reading series {job=~"gpuagent"}\n'
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        assert "'=cmd|' /C calc'!A0" in {row["namespace"] for row in rows}
        assert all(float(row["allocated_gpu_hours"]) >= 0 for row in rows)
        assert fake.requests and all('job=~"gpuagent"' in form["query"] for _, form, _ in fake.requests)
        fake.requests.clear()
        assert run_cli(capsys, *base, "--job", "", "--selector", 'cluster="a"')[0] == 0
        assert all('job=~' not in form["query"] and 'cluster="a"' in form["query"] for _, form, _ in fake.requests)


def test_top_once_prints_escapes(tmp_path: Path) -> None:
    agent = FakeAgent(hostile_state(ALL_ESCAPES))

    async def serve_and_print() -> tuple[int, str]:
        async with TestServer(agent.app()) as server:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuagent", "top", "--agent", str(server.make_url("")).rstrip("/"), "--once",
                "--width", "150", cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await proc.communicate()
            return proc.returncode or 0, (out + err).decode()

    code, text = asyncio.run(serve_and_print())
    assert code == 0, text
    assert raw_controls(text.replace("\n", "")) == [] and "\\x1b]0;pwned\\x07" in text


async def test_the_live_view_sends_no_control_to_the_terminal() -> None:
    agent = FakeAgent(hostile_state(ALL_ESCAPES))
    async with TestServer(agent.app()) as server, new_session() as session:
        watch = AgentWatch(str(server.make_url("")).rstrip("/"), session)
        await watch.refresh()
        app = TopApp(lambda: NodeScreen(watch, interval=60))
        async with app.run_test(size=(150, 50)) as pilot:
            await pilot.pause(0.2)
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            await pilot.press("e")  # every tenant's processes too
            await pilot.pause(0.2)
            view = screen.lines
            texts = ["".join(segment.text for segment in view.render_line(y)) for y in range(view.size.height)]
            assert any("\\x1b]0;pwned\\x07" in text for text in texts)
            assert all(raw_controls(text) == [] for text in texts)
            header = screen.query_one("#header").render()
            assert raw_controls(str(header).replace("\n", "")) == []
