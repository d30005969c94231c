"""Admin endpoints (``gpuagent.api.admin``): off by default, a bearer token from a file on the listener, or a
0600 unix socket without a token; a manual thaw really thaws a real frozen cgroup and holds throttling off;
a policy reload applies a good file and rejects a bad one, keeping the old rules."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from cgroups import (
    UNIFIED,
    CgroupSandbox,
    kubelet_container_path,
    new_container_id,
    new_pod_uid,
    sandbox_for_test,
)
from ports import free_port

from gpuagent.agent import Agent
from gpuagent.api.admin import RELOAD_PATH, THAW_PATH, AdminActions
from gpuagent.api.app import build_app
from gpuagent.config import ConfigError, load_config
from gpuagent.export import build_registry

BUSY = ("python3", "-c", "while True: pass")


class Recorder:
    """AdminActions that remember their calls; reload raises ``error`` when set."""

    def __init__(self) -> None:
        self.thaws: list[float] = []
        self.reloads = 0
        self.error: ConfigError | None = None

    def thaw(self, pause: float) -> dict[str, Any]:
        self.thaws.append(pause)
        return {"thawed": 2, "paused_seconds": pause}

    def reload(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        self.reloads += 1
        return {"policies": 1}

    def actions(self) -> AdminActions:
        return AdminActions(thaw=self.thaw, reload_policies=self.reload)


def app_with(recorder: Recorder, token_file: Path | None) -> TestServer:
    return TestServer(build_app(lambda: None, build_registry(lambda: None), admin=recorder.actions(),
                                admin_token_file=str(token_file) if token_file else None))


async def test_no_admin_route_unless_configured() -> None:
    async with TestClient(TestServer(build_app(lambda: None, build_registry(lambda: None)))) as client:
        for path in (THAW_PATH, RELOAD_PATH):
            response = await client.post(path, json={})
            assert response.status == 404
            assert "error" in await response.json()
    recorder = Recorder()  # actions but no token file: the listener still has none (socket only)
    async with TestClient(app_with(recorder, None)) as client:
        assert (await client.post(THAW_PATH, json={})).status == 404
    assert recorder.thaws == []


async def test_bearer_token_none_wrong_right_and_rotated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("s3cret-token\n")
    recorder = Recorder()
    async with TestClient(app_with(recorder, token_file)) as client:
        missing = await client.post(THAW_PATH, json={"pause_seconds": 5})
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await missing.json())["field"] == "Authorization"

        for header in ("Bearer wrong", "Bearer s3cret-token-and-more", "Basic czNjcmV0LXRva2Vu", "s3cret-token"):
            wrong = await client.post(THAW_PATH, json={"pause_seconds": 5}, headers={"Authorization": header})
            assert wrong.status == 401, header
            assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
        assert recorder.thaws == []

        right = await client.post(THAW_PATH, json={"pause_seconds": 5},
                                  headers={"Authorization": "Bearer s3cret-token"})
        assert right.status == 200 and await right.json() == {"thawed": 2, "paused_seconds": 5.0}
        assert recorder.thaws == [5.0]
        reload = await client.post(RELOAD_PATH, headers={"Authorization": "bearer s3cret-token"})
        assert reload.status == 200 and recorder.reloads == 1

        token_file.write_text("rotated")  # re-read on change: the old token stops working at once
        old = await client.post(THAW_PATH, headers={"Authorization": "Bearer s3cret-token"})
        assert old.status == 401
        new = await client.post(THAW_PATH, headers={"Authorization": "Bearer rotated"})
        assert new.status == 200 and recorder.thaws == [5.0, 0.0]

        token_file.unlink()  # no file, or an empty one: nobody gets in, one log line
        with caplog.at_level(logging.WARNING, logger="gpuagent.api.tokens"):
            for _ in range(3):
                gone = await client.post(THAW_PATH, headers={"Authorization": "Bearer rotated"})
                assert gone.status == 401
        assert len([r for r in caplog.records if "cannot be read" in r.getMessage()]) == 1
        token_file.write_text("")
        assert (await client.post(THAW_PATH, headers={"Authorization": "Bearer "})).status == 401
        assert recorder.thaws == [5.0, 0.0]


@pytest.mark.parametrize(("body", "field"), [
    ({"pause_seconds": -1}, "pause_seconds"),
    ({"pause_seconds": 3601}, "pause_seconds"),
    ({"pause_seconds": "60"}, "pause_seconds"),
    ({"pause_seconds": True}, "pause_seconds"),
    ({"pause": 60}, "pause"),
    ([60], "body"),
    ("not json", "body"),
    ("x" * 5000, "body"),
])
async def test_bad_thaw_bodies_are_rejected_naming_the_field(tmp_path: Path, body: Any, field: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t")
    recorder = Recorder()
    auth = {"Authorization": "Bearer t"}
    async with TestClient(app_with(recorder, token_file)) as client:
        if isinstance(body, str):
            response = await client.post(THAW_PATH, data=body, headers=auth)
        else:
            response = await client.post(THAW_PATH, json=body, headers=auth)
        assert response.status in (400, 413)
        assert (await response.json())["field"] == field
    assert recorder.thaws == []


async def test_reload_errors_are_400_naming_the_key_path(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t")
    recorder = Recorder()
    recorder.error = ConfigError("policies[0].gpu_share", "expected a percent", "/etc/gpuagent/config.yaml")
    async with TestClient(app_with(recorder, token_file)) as client:
        response = await client.post(RELOAD_PATH, headers={"Authorization": "Bearer t"})
        assert response.status == 400
        body = await response.json()
        assert body["field"] == "policies[0].gpu_share" and "previous policies are kept" in body["error"]
        extra = await client.post(RELOAD_PATH, json={"force": True}, headers={"Authorization": "Bearer t"})
        assert extra.status == 400 and (await extra.json())["field"] == "force"


# --- the real agent ----------------------------------------------------------------------------------------


def write_config(path: Path, **values: Any) -> None:
    path.write_text(yaml.safe_dump(values))


async def test_reload_applies_a_changed_policy_and_keeps_the_old_on_error(tmp_path: Path) -> None:
    config_file = tmp_path / "gpuagent.yaml"
    base = {"backend": "sim", "mode": "audit", "journal_path": str(tmp_path / "journal.json")}
    write_config(config_file, **base, policies=[{"match_namespace": "ml", "gpu_share": 30}])
    agent = Agent(load_config(str(config_file), env={}))
    assert agent.enforcer is not None and agent.enforcer.rules[0].share_ratio == 0.30

    write_config(config_file, **base, policies=[{"match_namespace": "ml", "gpu_share": "45%"},
                                                {"match_kind": "*", "gpu_share": 10}])
    assert agent.admin_reload_policies() == {"policies": 2, "applied": True, "mode": "audit"}
    assert [rule.share_ratio for rule in agent.enforcer.rules] == [0.45, 0.10]

    write_config(config_file, **base, policies=[{"match_namespace": "ml", "gpu_share": 130}])
    with pytest.raises(ConfigError) as bad:
        agent.admin_reload_policies()
    assert bad.value.key_path == "policies[0].gpu_share"
    write_config(config_file, **base, polices=[])  # a typo is the config's own error, named as such
    with pytest.raises(ConfigError) as typo:
        agent.admin_reload_policies()
    assert typo.value.key_path == "polices"
    assert [rule.share_ratio for rule in agent.enforcer.rules] == [0.45, 0.10]  # the old ones stay
    await agent.devices.close()


@pytest.fixture
def cgroup_sandbox() -> Iterator[CgroupSandbox]:
    yield from sandbox_for_test()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


@pytest.mark.serial  # measures a real process's CPU progress
@pytest.mark.integration
async def test_socket_thaw_really_thaws_and_holds_throttling_off(
    cgroup_sandbox: CgroupSandbox, tmp_path: Path
) -> None:
    """One busy tenant over a 10 % share is frozen in duty cycles; a thaw over the 0600 admin socket (no
    token) thaws its real cgroup and keeps it thawed for the pause, then throttling resumes by itself. The
    TCP listener has no admin route."""
    if cgroup_sandbox.hierarchy(UNIFIED) is None:
        pytest.skip("needs the cgroup v2 hierarchy")
    path = kubelet_container_path("systemd", "burstable", new_pod_uid(), "containerd", new_container_id())
    proc = cgroup_sandbox.spawn(path, argv=BUSY)
    freeze_file = proc.paths[UNIFIED] / "cgroup.freeze"
    scenario = tmp_path / "one.yaml"
    scenario.write_text(yaml.safe_dump({"version": 1, "name": "one", "gpus": [{"model": "H100-SXM5-80GB"}],
                                        "processes": [{"pid": proc.pid, "name": "busy", "gpu": 0, "memory": "1Gi",
                                                       "sm_util": {"follow_cpu": {"scale": 1.0,
                                                                                  "queue_seconds": 0.1}}}]}))
    admin_socket = tmp_path / "admin.sock"
    port = free_port()
    config_file = tmp_path / "gpuagent.yaml"
    write_config(config_file, backend="sim", scenario=str(scenario), listen=f"127.0.0.1:{port}",
                 poll_interval=0.25, mode="enforce", journal_path=str(tmp_path / "journal.json"),
                 kubernetes_api="off", idle_events="off", network=False, pod_resources_socket=None,
                 work_conserving=False, admin_socket=str(admin_socket),
                 policies=[{"match_kind": "pod", "gpu_share": 10}])
    agent = Agent(load_config(str(config_file), env={}))
    stop = asyncio.Event()
    serving = asyncio.create_task(agent.serve(stop))

    def freezes() -> int:
        # The gate's own count, not the last snapshot's: that one lags by up to a poll, so a freeze made
        # just before the pause would show up during it.
        return agent.enforcer.actions.counts().get(("freeze", "done"), 0)

    try:
        await wait_until(lambda: freezes() > 0, 10, "the tenant is throttled")
        assert stat.S_IMODE(os.stat(admin_socket).st_mode) == 0o600

        async with aiohttp.ClientSession() as tcp:
            for admin_path in (THAW_PATH, RELOAD_PATH):
                async with tcp.post(f"http://127.0.0.1:{port}{admin_path}", json={}) as response:
                    assert response.status == 404
            async with tcp.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200

        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(admin_socket))) as unix:
            async with unix.post("http://admin" + THAW_PATH, json={"pause_seconds": 3}) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            assert body["paused_seconds"] == 3 and body["mode"] == "enforce"
            assert freeze_file.read_text().strip() == "0"
            paused_at, cpu_before, freezes_before = time.monotonic(), cpu_seconds(proc.pid), freezes()
            while time.monotonic() - paused_at < 2.5:  # held thawed through the polls of the pause
                assert freeze_file.read_text().strip() == "0"
                await asyncio.sleep(0.05)
            assert freezes() == freezes_before
            # It really ran: throttled at 10 % it would get ~0.25 s of 2.5 s (generous: the CPUs are shared).
            assert cpu_seconds(proc.pid) - cpu_before > 0.6

            await wait_until(lambda: freezes() > freezes_before, 10, "throttling resumes after the pause")

            async with unix.post("http://admin" + RELOAD_PATH) as response:
                assert response.status == 200 and (await response.json())["policies"] == 1
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
    assert freeze_file.read_text().strip() == "0"  # thawed on the way out too


# --- counters exported at 0 from the start ------------------------------------------------------------------


def test_known_action_outcomes_are_the_gates_own_names() -> None:
    from gpuagent.enforce.actions import ACTIONS, OUTCOMES
    from gpuagent.export.enforcement import KNOWN_ACTIONS

    assert set(KNOWN_ACTIONS) == {"audit", "enforce"}
    for pairs in KNOWN_ACTIONS.values():
        assert {a for a, _ in pairs} == set(ACTIONS) and {o for _, o in pairs} <= set(OUTCOMES)
    assert not any(o == "audit" for _, o in KNOWN_ACTIONS["enforce"])
    assert not any(o in ("done", "failed") for a, o in KNOWN_ACTIONS["audit"] if a == "freeze")


@pytest.mark.parametrize("mode", ["enforce", "audit"])
def test_enforcement_actions_total_starts_at_zero_for_every_known_pair(mode: str) -> None:
    import dataclasses

    from prometheus_client.parser import text_string_to_metric_families
    from snapshots import two_gpu_node

    from gpuagent.export.enforcement import KNOWN_ACTIONS
    from gpuagent.export.exposition import generate_text
    from gpuagent.snapshot.enforcement import EnforcementState

    counted = {("freeze", "done"): 3} if mode == "enforce" else {("freeze", "audit"): 2}
    snapshot = dataclasses.replace(two_gpu_node(), enforcement=EnforcementState(mode=mode, actions_total=counted))
    registry = build_registry(lambda: snapshot, clock=lambda: snapshot.taken_at_unix)
    text = generate_text(registry).decode()
    series = {
        (s.labels["action"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text) if family.name == "gpuagent_enforcement_actions"
        for s in family.samples if s.name.endswith("_total")
    }
    assert set(series) == set(KNOWN_ACTIONS[mode])
    assert {pair: v for pair, v in series.items() if v} == counted
    idle = dataclasses.replace(snapshot, enforcement=None)  # enforcement off: no series at all
    assert "gpuagent_enforcement_actions_total" not in generate_text(build_registry(lambda: idle)).decode()
