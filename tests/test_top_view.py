"""gpuagent top without a terminal: the view model of a recorded /v1/state, sorting, filtering, expanding,
the frames as text (every state in words, "-" and never 0 for a figure not given), the cluster rows, and
the client against a real aiohttp server of ours (ETag and 304, a stuck poller, wrong answers).

The fixtures are real agents' /v1/state (``tests/fixtures/top/record.py``): the tenant node of
``tests/tenant_node.py`` (8xH100, 43 pods, audit-mode shares and memory ladder, an idle pod, an XID, a
stale GPU) and the simulated A100 MIG node.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuagent.top import render
from gpuagent.top.arrange import ViewOptions, arrange, tenant_key
from gpuagent.top.client import NO_ANSWER, OK, STALE, STARTING, AgentWatch, check_agent_url, new_session
from gpuagent.top.cluster import NodeRow, row_of, worst_health
from gpuagent.top.cluster_view import ClusterOptions, arrange_nodes, cluster_body
from gpuagent.top.errors import TopError
from gpuagent.top.history import History, sparkline
from gpuagent.top.model import node_view

FIXTURES = Path(__file__).parent / "fixtures" / "top"
ROOT = Path(__file__).resolve().parents[1]


def tenants_state() -> dict[str, Any]:
    return json.loads((FIXTURES / "h100-tenants.json").read_text())


def mig_state() -> dict[str, Any]:
    return json.loads((FIXTURES / "a100-mig.json").read_text())


def frame(state: dict[str, Any], options: ViewOptions | None = None, width: int = 140) -> str:
    options = options or ViewOptions()
    node = node_view(state)
    return render.plain(render.body(arrange(node, options), options, History(), width))


# -- the model --------------------------------------------------------------------------------------------

def test_tenants_carry_shares_ladder_idle_and_processes() -> None:
    node = node_view(tenants_state())
    assert (node.hostname, node.mode, len(node.gpus)) == ("gpu-node-1", "audit", 8)
    assert node.namespaces() == ("research", "serving", "training")
    gpu5 = node.gpus[5]
    assert gpu5.xid_last == 31 and gpu5.sharing_mode == "time_sliced"
    by_name = {t.name: t for t in gpu5.tenants}
    idle = by_name["research/notebook-5"]
    assert idle.idle_flagged and idle.idle_seconds and idle.idle_seconds >= 2 and idle.sm_ratio == 0.0
    assert idle.share_limit_ratio == 0.15 and idle.ladder_stage == "ok" and idle.namespace == "research"
    assert idle.gpu_hours_today is not None and idle.gpu_hours_today > 0
    train = by_name["training/train-5"]
    assert train.containers == ("main", "prefetch") and len(train.processes) == 2
    assert train.memory_limit_bytes == 4 * 2**30 and train.share_limit_ratio == 0.4
    assert train.ladder_stage in ("warned", "terminating", "killed")  # its 10 GiB are over the 4Gi default
    unit = by_name["tokenizer-cache@5.service"]
    assert unit.kind == "systemd_service" and unit.namespace is None and unit.share_limit_ratio == 0.1
    stale = node.gpus[6]
    assert stale.stale and "exceeded" in stale.health_detail
    assert node.idle_gpus_held is not None and node.idle_gpus_held > 0


def test_mig_instances_hold_their_tenants() -> None:
    node = node_view(mig_state())
    gpu0 = node.gpus[0]
    assert gpu0.mig_enabled and [m.profile for m in gpu0.migs][:1] == ["4g.40gb"]
    assert all(t.mig_instance for m in gpu0.migs for t in m.tenants)
    assert node.mode == "off"
    text = frame(mig_state())
    assert "MIG 1 4g.40gb" in text and "GPM [" in text


def test_missing_figures_are_dashes_never_zeros() -> None:
    state = tenants_state()
    for key in ("enforcement", "accounting"):
        state.pop(key)
    gpu = state["gpus"][0]
    for key in ("power_watts", "temperature_celsius", "gpu_util_percent", "sm_clock_hz"):
        gpu[key] = None
    state["hints"]["gpus"][0]["sm_util_ratio"] = None
    node = node_view(state)
    tenant = node.gpus[0].tenants[0]
    assert (tenant.efficiency_ratio, tenant.frozen_ratio, tenant.idle_seconds, tenant.gpu_hours_today) == (
        None, None, None, None)
    lines = render.gpu_block(node.gpus[0], History(), 140)
    assert "SM [      -       ]    -" in lines[1].plain and "-/700W" in lines[1].plain
    assert "-°C" in lines[1].plain and " 0%" not in lines[1].plain.split("MEM")[0]
    row = render.tenant_line(tenant, 140, expanded=False).plain
    assert row.rstrip().endswith("-") and " 0.00" not in row


@pytest.mark.parametrize("bad", [{}, {"hostname": "x"}, {"hostname": 1, "gpus": []}, {"gpus": "no"}])
def test_a_body_that_is_not_a_snapshot_is_an_error_naming_it(bad: dict[str, Any]) -> None:
    with pytest.raises(TopError, match="not a gpuagent /v1/state"):
        node_view(bad)


def test_odd_types_inside_the_body_read_as_unknown() -> None:
    state = tenants_state()
    gpu = state["gpus"][1]
    gpu["memory_used_bytes"] = "lots"
    gpu["health"] = 7
    gpu["processes"] = "none"
    state["hints"]["gpus"][1]["tenants"] = [{"name": None}, "x", {"name": "ns/p", "kind": "pod", "sm_util_ratio": True}]
    node = node_view(state)
    assert node.gpus[1].memory_used_bytes is None and node.gpus[1].health == "?"
    assert [t.sm_ratio for t in node.gpus[1].tenants] == [None, None]
    assert "GPU 1" in frame(state)


# -- sort, filter, expand ----------------------------------------------------------------------------------

def names(rows: list[Any]) -> list[str]:
    return [r.tenant.name for r in rows if r.kind == "tenant"]


def test_sort_by_any_column_and_reverse_keep_gpus_in_order_and_unknowns_last() -> None:
    node = node_view(tenants_state())
    for key in ("name", "procs", "sm", "eff", "memory", "share", "frozen", "throttled", "ladder", "idle", "today"):
        options = ViewOptions(sort=key, descending=True)
        rows = arrange(node, options)
        assert [r.gpu.index for r in rows if r.kind == "gpu"] == list(range(8)), key
        from gpuagent.top.arrange import COLUMNS

        column = next(c for c in COLUMNS if c.key == key)
        for gpu in node.gpus:
            values = [column.value(r.tenant) for r in rows if r.kind == "tenant" and r.gpu is gpu]
            known = [v for v in values if v is not None]
            assert known == sorted(known, reverse=True), key
            assert values[len(known):] == [None] * (len(values) - len(known)), f"{key}: unknowns last"
    by_name = names(arrange(node, ViewOptions(sort="name", descending=False)))
    assert by_name[:3] == sorted(by_name[:3])
    options = ViewOptions()
    assert options.next_sort().sort == "eff" and options.next_sort(-1).sort == "procs"
    assert options.sorted_by("sm").descending is False and options.sorted_by("name").descending is False


def test_filters_by_namespace_and_text_keep_only_gpus_with_a_match() -> None:
    node = node_view(tenants_state())
    research = arrange(node, ViewOptions(namespace="research"))
    assert {r.tenant.namespace for r in research if r.tenant} == {"research"}
    assert sum(1 for r in research if r.kind == "gpu") == 7  # GPU 7 is pretrain-0's alone
    by_text = arrange(node, ViewOptions(text="NOTEBOOK-5"))
    assert names(by_text) == ["research/notebook-5"] and [r.gpu.index for r in by_text if r.kind == "gpu"] == [5]
    pid = node.gpus[2].tenants[0].processes[0].pid
    assert [r.gpu.index for r in arrange(node, ViewOptions(text=str(pid))) if r.kind == "gpu"] == [2]
    assert names(arrange(node, ViewOptions(text="prefetch"))) == [  # a container, and a process of pretrain-0
        *(f"training/train-{g}" for g in range(7)), "training/pretrain-0"]
    assert arrange(node, ViewOptions(text="no-such-thing")) == []


def expanded_all(node: Any, options: ViewOptions) -> ViewOptions:
    for row in arrange(node, options):
        if row.kind == "tenant":
            options = options.toggled(row.key)
    return options


def test_a_filter_that_finds_a_tenant_through_its_processes_lists_those_processes_only() -> None:
    node = node_view(tenants_state())
    options = expanded_all(node, ViewOptions(text="prefetch"))
    listed = {(r.tenant.name, r.process.comm) for r in arrange(node, options) if r.kind == "process"}
    # train-g's prefetch container, and pretrain-0's dataloader process (8 processes, one of them matches)
    assert listed == {*((f"training/train-{g}", f"dataloader-prefetch-{g}") for g in range(7)),
                      ("training/pretrain-0", "dataloader-prefetch-7")}
    pid = node.gpus[7].tenants[0].processes[1].pid
    by_pid = expanded_all(node, ViewOptions(text=str(pid)))
    assert [r.process.pid for r in arrange(node, by_pid) if r.kind == "process"] == [pid]
    text = frame(tenants_state(), by_pid)
    pretrain = next(line for line in text.splitlines() if "training/pretrain-0" in line)
    assert pretrain.split()[2] == "1"  # PROC: the processes listed, not its 8
    assert "eval-7" in text and "train-worker-7" not in text
    # a filter on the tenant's own name: the tenant, with every process it has
    by_name = expanded_all(node, ViewOptions(text="training/pretrain-0"))
    assert len([r for r in arrange(node, by_name) if r.kind == "process"]) == 8


def test_expand_shows_processes_and_a_folded_gpu_hides_its_tenants() -> None:
    node = node_view(tenants_state())
    gpu = node.gpus[0]
    train = next(t for t in gpu.tenants if t.name == "training/train-0")
    options = ViewOptions().toggled(tenant_key(gpu, train))
    rows = arrange(node, options)
    processes = [r.process for r in rows if r.kind == "process"]
    assert sorted(p.comm for p in processes) == ["dataloader-prefetch-0", "train-worker-0"]
    text = frame(tenants_state(), options)
    assert "▾ training/train-0" in text and "dataloader-prefetch-0" in text and "[main]" in text
    assert ViewOptions().toggled(tenant_key(gpu, train)).toggled(tenant_key(gpu, train)) == ViewOptions()
    folded = arrange(node, ViewOptions().toggled(f"gpu:{gpu.uuid}"))
    assert [r.kind for r in folded if r.gpu is gpu] == ["gpu"]


def test_the_tenants_sm_says_its_window_and_age_where_they_differ_from_the_gpus() -> None:
    """A tenant's SM is NVML's per-process mean over the last read's window, read every 10 s off the share
    controller's GPUs: its GPU's SM is this poll's. Where they differ, the GPU's line says how."""
    state = tenants_state()
    taken = state["taken_at_unix"]  # the agent polls every 0.5 s here
    gpus = state["gpus"]
    gpus[0].update(process_util_read_at_unix=taken - 4.0, process_util_window_seconds=10.0)  # read 4 s ago
    gpus[6].update(process_util_read_at_unix=taken, process_util_window_seconds=0.5)  # read this poll
    gpus[7].update(process_util_read_at_unix=taken, process_util_window_seconds=10.0)  # just read, 10 s mean
    lines = {int(line.split()[1]): line for line in frame(state).splitlines() if line.startswith("  GPU ")}
    assert "(tenant SM: 10s mean, 4.0s older)" in lines[0]
    assert "(tenant SM: 10s mean)" in lines[7]
    assert "tenant SM" not in lines[6] and "tenant SM" not in lines[1]  # as fresh as the GPU's; not known
    mig = mig_state()
    mig["gpus"][0].update(process_util_read_at_unix=mig["taken_at_unix"] - 9.0)
    assert "tenant SM" not in frame(mig)  # MIG: no per-process SM, nothing to qualify


# -- the frame in words -----------------------------------------------------------------------------------

def test_the_frame_spells_out_every_state() -> None:
    text = frame(tenants_state())
    assert "GPU 5  NVIDIA H100 80GB HBM3  ok  XID 31" in text
    assert "STALE" in text  # GPU 6
    assert "IDLE " in text and " OVER" in text
    assert "research/notebook-5" in text and "(unit)" in text
    node = node_view(tenants_state())
    header = render.plain(render.header(node, render_status(OK), "http://x", ViewOptions(), 140, now_unix=0))
    assert "gpu-node-1" in header and "mode audit" in header and "43 pods" in header and "idle-held" in header
    for state, word in ((STALE, "STALE: "), (NO_ANSWER, "NO ANSWER: "), (STARTING, "STARTING: ")):
        lines = render.header(node, render_status(state, "why"), "http://x", ViewOptions(), 140, paused=True)
        assert word + "why" in lines[1].text.plain and "PAUSED" in lines[1].text.plain
    assert "no data: why" in render.plain(render.no_data(render_status(NO_ANSWER, "why")))


def render_status(state: str, message: str = "") -> Any:
    from gpuagent.top.client import AgentStatus

    return AgentStatus(state, message, 0.4)


def test_figures_bars_and_sparklines() -> None:
    assert render.duration(None) == "-" and render.duration(5) == "5.0s" and render.duration(42.7) == "42s" and render.duration(3725) == "1h02m"
    assert render.duration(65) == "1m05s" and render.duration(90000) == "1d01h"
    assert render.percent(None) == "-" and render.percent(0.0) == "0%" and render.gib(None) == "-"
    assert render.bar(0.5, 10).plain == "[████    ]" and render.bar(None, 7).plain == "[  -  ]"
    assert render.bar(1.7, 6).plain == "[████]"
    assert sparkline([0.0, 0.5, None, 1.0], 6) == "  ▁▅ █"
    history = History(size=3)
    for t in range(5):
        history.add(float(t), {"g": t / 4})
    history.add(4.0, {"g": 0.0})  # the same snapshot again: no point
    assert history.of("g") == (0.5, 0.75, 1.0)


# -- the cluster rows ---------------------------------------------------------------------------------------

def test_worst_health_counts_the_worst_state() -> None:
    assert worst_health(["ok", "ok"], 0) == "ok"
    assert worst_health(["ok", "lost", "error", "lost"], 1) == "lost 2"
    assert worst_health(["ok", "ok"], 2) == "stale 2"


def test_cluster_rows_never_show_zeros_for_a_node_without_figures() -> None:
    answered = FakeWatch("http://a:9402", tenants_state())
    silent = FakeWatch("http://b:9402", None, error="cannot connect: connection refused")
    row_a, row_b = row_of("node-a", answered), row_of("node-b", silent)  # type: ignore[arg-type]
    assert (row_a.gpus, row_a.free, row_a.busy, row_a.state) == (8, 0, 8, OK)
    assert row_a.health == "unresponsive 1"  # GPU 6: its read hangs (and its figures are stale)
    assert row_a.idle_held and row_a.idle_held > 0
    assert row_b.state == NO_ANSWER and (row_b.gpus, row_b.free, row_b.busy) == (None, None, None)
    text = render.plain(cluster_body([row_a, row_b], 150))
    line_b = next(line for line in text.splitlines() if "node-b" in line)
    assert "NO ANSWER" in line_b and "connection refused" in line_b and " 0 " not in line_b
    rows = [row_a, row_b, NodeRow("node-c", None, STALE, "old", gpus=4, free=4, busy=0, idle_held=0.0,
                                  health="ok", age_seconds=99)]
    assert [r.node for r in arrange_nodes(rows, ClusterOptions(sort="free", descending=True))] == [
        "node-c", "node-a", "node-b"]
    assert [r.node for r in arrange_nodes(rows, ClusterOptions(text="-b"))] == ["node-b"]
    assert ClusterOptions().next_sort().sort == "gpus"


class FakeWatch:
    def __init__(self, url: str, state: dict[str, Any] | None, error: str | None = None) -> None:
        self.url, self.state, self.error = url, state, error

    def status(self) -> Any:
        from gpuagent.top.client import AgentStatus

        if self.error:
            return AgentStatus(NO_ANSWER, self.error, None)
        return AgentStatus(OK, "", 0.5)


# -- the client against a server of ours ------------------------------------------------------------------

class FakeAgent:
    """/healthz and /v1/state as the agent serves them, with an ETag, and switches for every failure."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state, self.etag = state, '"a-1"'
        self.health: tuple[int, dict[str, Any]] = (200, {"status": "ok", "snapshot_age_seconds": 0.2})
        self.state_answer: tuple[int, bytes] | None = None  # an answer other than the state
        self.requests: list[tuple[str, str | None]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/v1/state", self.get_state)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response(self.health[1], status=self.health[0])

    async def get_state(self, request: web.Request) -> web.Response:
        self.requests.append(("/v1/state", request.headers.get("If-None-Match")))
        if self.state_answer is not None:
            return web.Response(status=self.state_answer[0], body=self.state_answer[1])
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers={"ETag": self.etag})
        return web.json_response(self.state, headers={"ETag": self.etag})


async def test_the_watch_asks_conditionally_and_keeps_the_last_snapshot_on_failure() -> None:
    agent = FakeAgent(tenants_state())
    async with TestServer(agent.app()) as server, new_session() as session:
        now = [100.0]
        watch = AgentWatch(str(server.make_url("")).rstrip("/"), session, clock=lambda: now[0])
        await watch.refresh()
        assert watch.state_changed and watch.status().state == OK and watch.error is None
        await watch.refresh()
        assert not watch.state_changed and agent.requests[-1] == ("/v1/state", '"a-1"')  # a 304
        now[0] += 2
        assert watch.snapshot_age_seconds() == pytest.approx(2.2)  # /healthz's age plus the time since
        agent.health = (503, {"status": "stuck", "snapshot_age_seconds": 45.0})
        await watch.refresh()
        assert watch.status().state == STALE and "stuck" in watch.status().message
        agent.health = (200, {"status": "ok", "snapshot_age_seconds": 0.1})
        agent.state_answer = (200, b"<html>proxy error</html>")
        agent.etag = '"a-2"'
        await watch.refresh()
        status = watch.status()
        assert status.state == NO_ANSWER and "/v1/state: not JSON" in status.message
        assert watch.state is not None  # what it had is kept, and said to be old
        agent.state_answer = (503, b'{"error": "no snapshot yet"}')
        fresh = AgentWatch(watch.url, session)
        await fresh.refresh()
        assert fresh.status().state == STARTING and fresh.state is None
        agent.state_answer = (200, json.dumps({"hostname": "x"}).encode())
        await fresh.refresh()
        assert "not a gpuagent snapshot" in (fresh.error or "")
        agent.state_answer = (404, b'{"error": "Not Found"}')
        await fresh.refresh()
        assert fresh.error == "/v1/state: HTTP 404 (Not Found)"
    gone = AgentWatch(watch.url, session := new_session())
    async with session:
        await gone.refresh()
    assert gone.status().state == NO_ANSWER and "cannot connect" in gone.status().message


@pytest.mark.parametrize("url", ["htp://x", "gpu-node:9402", "http://", "http://h:99999", "http://h:9402/?a=1"])
def test_a_wrong_agent_url_is_one_clear_error(url: str) -> None:
    with pytest.raises(TopError, match="--agent"):
        check_agent_url(url)
    assert check_agent_url("http://gpu-node-1:9402/") == "http://gpu-node-1:9402"


def test_a_stuck_snapshot_keeps_its_figures_with_the_warning() -> None:
    state = copy.deepcopy(tenants_state())
    node = node_view(state)
    lines = render.header(node, render_status(STALE, "the agent's poller is stuck"), "u", ViewOptions(), 140)
    assert "STALE: the agent's poller is stuck" in lines[1].text.plain
    assert "training/train-0" in frame(state)


def test_the_agent_never_imports_the_tui() -> None:
    """The agent's footprint does not change: neither the agent nor the command line pulls in Textual or
    Rich (``gpuagent top`` imports them when it runs)."""
    code = ("import sys, gpuagent.agent, gpuagent.cli; gpuagent.cli.build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'rich'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# -- the command line ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "said"), [
    (["--agent", "htp://x"], "--agent: expected an http:// or https:// URL"),
    (["--agent", "http://127.0.0.1:9"], "cannot use the agent at http://127.0.0.1:9: cannot connect"),
    (["--interval", "0"], "--interval: expected seconds from 0.1 to 3600, got '0'"),
    (["--width", "wide"], "--width: expected a number of columns from 40 to 1000"),
    (["--selector", 'a="b"'], "--selector, --header and --agent-url go with --prometheus"),
    (["--prometheus", "ftp://x"], "--prometheus: expected an http:// or https:// URL"),
    (["--prometheus", "http://127.0.0.1:9"], "cannot reach Prometheus at http://127.0.0.1:9"),
    (["--prometheus", "http://127.0.0.1:9", "--selector", "nope"], "--selector: expected label matchers"),
    (["--prometheus", "http://127.0.0.1:9", "--agent-url", "http://x"], "--agent-url: expected a URL with {node}"),
    (["--agents", "/no/such/file.yaml"], "--agents: "),
])
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], said: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from gpuagent.cli import main

    assert main(["top", *args, "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuagent top: ") and said in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("content", "said"), [
    ("gpu-node-1: ftp://x\n", "gpu-node-1: expected an http:// or https:// URL"),
    ("Bad_Node: http://x:9402\n", "expected a node name"),
    ("{}\n", "the file names no node"),
    ("[a, b]\n", "expected a mapping"),
])
def test_a_bad_agents_file_names_what_is_wrong(content: str, said: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from gpuagent.cli import main

    path = tmp_path / "agents.yaml"
    path.write_text(content)
    assert main(["top", "--agents", str(path), "--once"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_without_hints_tenants_come_from_the_processes() -> None:
    """An agent whose hints failed still shows who runs where; what only the hints know is "-"."""
    state = tenants_state()
    state["hints"] = None
    gpu = node_view(state).gpus[5]
    by_name = {t.name: t for t in gpu.tenants}
    assert "research/notebook-5" in by_name and by_name["training/train-5"].containers == ("main", "prefetch")
    assert by_name["research/notebook-5"].memory_limit_bytes is None
    assert by_name["training/train-5"].share_limit_ratio == 0.4  # the enforcer's, which does not need hints
    assert gpu.sharing_mode is None and "GPU 5" in frame(state)
