"""``gpuagent hints`` and ``gpuagent snapshot`` without pod sources (issue 30 item 5): run from a shell on the
demo's scenario, with no kubelet and no API server, they showed unattributed tenants where the running demo's
``/v1/hints`` named its pods, and said nothing of why. Now one line on stderr says which pod source is
missing or failed, and which endpoint of the running agent has the pods; with a pod source, nothing."""

from __future__ import annotations

import json
import sys
import types

import pytest

from gpuagent import cli
from gpuagent.config import load_config
from gpuagent.devices.sim import kubernetes_demo_path
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus

pytestmark = pytest.mark.usefixtures("restore_logging")  # the CLI sets up the root logger


def test_no_pod_source_configured_names_both_and_the_agents_endpoint() -> None:
    config = load_config(None, overrides={"listen": "0.0.0.0:9555", "kubernetes_api": "off"})
    line = cli.without_pod_sources("hints", config, [SourceStatus("nvml", True, 0.0)])
    assert line is not None and "\n" not in line
    assert line.startswith("gpuagent hints: no pod sources: no kubelet pod-resources socket at "
                           f"{config.pods.pod_resources_socket}, the API server not used (kubernetes_api off)")
    assert line.endswith("curl -s http://127.0.0.1:9555/v1/hints")  # every interface: ask it on loopback
    snapshot = cli.without_pod_sources("snapshot", config, [])
    assert snapshot is not None and snapshot.endswith("/v1/state")


def test_a_failed_pod_source_says_its_error_and_one_that_answered_says_nothing() -> None:
    config = load_config(None, overrides={"listen": "[::1]:9402"})
    failed = [SourceStatus("pod_resources", False, 0.1, "connect: no such file"),
              SourceStatus("api_server", False, 0.0, "403 Forbidden\nsecond line")]
    line = cli.without_pod_sources("hints", config, failed)
    assert line is not None and "\n" not in line  # an error's newline is shown as an escape
    assert "the kubelet's pod-resources socket failed (connect: no such file)" in line
    assert "the API server failed (403 Forbidden" in line and "http://[::1]:9402/v1/hints" in line
    answered = [SourceStatus("pod_resources", True, 0.1), SourceStatus("api_server", False, 0.0, "403")]
    assert cli.without_pod_sources("hints", config, answered) is None


@pytest.mark.parametrize("command", ["snapshot", "hints"])
def test_the_commands_print_the_line_once_on_stderr_and_their_output_unchanged(
        command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the command, on a stand-in agent: the line on stderr, stdout the JSON alone."""
    polled = NodeSnapshot("node-a", "sim", 0.0, 0.0, 0.0, sources=(SourceStatus("cgroups", True, 0.0),))
    module = types.ModuleType("gpuagent.agent")
    module.poll_once = lambda config: polled  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuagent.agent", module)
    monkeypatch.setattr(cli, "_write", lambda text: 0)  # hints of an empty node: not what is tested here
    assert cli.main([command, "--backend", "sim"]) == (1 if command == "hints" else 0)
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "no pod sources" in line] == [
        line for line in err.splitlines() if line.startswith(f"gpuagent {command}: no pod sources: ")]
    assert err.count("no pod sources") == 1


def test_on_the_demos_scenario_hints_says_why_its_tenants_are_unattributed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The real one-shot poll of the demo's scenario (no kubelet, no API server here): the sources it
    reports are the ones the line reads, so the line comes, and the hints on stdout are still JSON."""
    assert cli.main(["hints", "--backend", "sim", "--scenario", str(kubernetes_demo_path())]) == 0
    out, err = capsys.readouterr()
    hints = json.loads(out)
    assert hints and "unattributed" in out
    [line] = [line for line in err.splitlines() if "no pod sources" in line]
    assert line.startswith("gpuagent hints: no pod sources: no kubelet pod-resources socket at ")
    assert line.endswith("/v1/hints")
