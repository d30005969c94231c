"""The must-show: a real ``gpuagent extender`` process and three real agents on loopback, one stopped mid-test.

Three ``gpuagent run --backend sim`` processes play three nodes with different GPUs: an 8xH100 node shared
by 64 processes, an A100 node in MIG mode and a laptop with one busy GPU. The extender maps the three node
names to them through an agents file and gets the JSON kube-scheduler sends (ExtenderArgs with the full
Pod and NodeNames, the shared fixture's shape). Then the H100 agent is stopped with SIGTERM, and after the
staleness bound that node is filtered out as unreachable while the other two still answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixture_files import filter_request
from ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "scenarios"
H100, A100, LAPTOP = "gpu-h100-node-1", "gpu-a100-mig-node-2", "gpu-laptop-node-3"
NODE_SCENARIOS = {H100: "h100-8x-64proc.yaml", A100: "a100-mig.yaml", LAPTOP: "laptop-1gpu.yaml"}
MAX_AGE_SECONDS = 3.0

pytestmark = pytest.mark.integration


def http(method: str, url: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    text = raw.decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[str]
    url: str

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stdout.read() if self.proc.stdout else ""

    def wait_until(self, path: str, ok: Callable[[int, Any], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.output()}"
            try:
                if ok(*http("GET", self.url + path, timeout=2)):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: {path} not ready in {timeout}s")

    def stop(self, timeout: float = 20) -> int:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=timeout)
        return self.proc.returncode


@pytest.fixture
def processes() -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuagent", *args, "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")}, **(env or {})},
        )
        process = Process(name, proc, f"http://127.0.0.1:{port}")
        started.append(process)
        return process

    yield start
    for process in started:  # always: a failed assertion must not leave agents running
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait(timeout=10)
        if process.proc.stdout:
            process.proc.stdout.close()


@pytest.fixture
def cluster(processes: Callable[..., Process], tmp_path: Path) -> dict[str, Process]:
    """Three agents (node name -> process) and the extender (key "extender"), all ready."""
    agents = {}
    for node, scenario in NODE_SCENARIOS.items():
        agents[node] = processes(
            node, "run", "--backend", "sim", "--scenario", str(SCENARIOS / scenario),
            "--kubernetes-api", "off", "--pod-resources-socket", "", "--journal-path", str(tmp_path / f"{node}.json"),
            env={"NODE_NAME": node},
        )
    for agent in agents.values():
        agent.wait_until("/v1/hints", lambda status, body: status == 200)
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(yaml.safe_dump({node: agent.url for node, agent in agents.items()}))
    extender = processes(
        "extender", "extender", "--agents", str(agents_file), "--url-prefix", "/gpuagent",
        "--max-age", str(MAX_AGE_SECONDS), "--refresh-interval", "0.5", "--timeout", "1",
    )
    extender.wait_until("/healthz", lambda status, body: status == 200)
    return {**agents, "extender": extender}


def pod_args(annotations: dict[str, str], resources: dict[str, str], nodes: list[str] | None = None) -> dict:
    """The scheduler's ExtenderArgs (nodeCacheCapable): the fixture's full Pod with these GPU asks."""
    args = filter_request()
    pod = args["Pod"]
    pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], **annotations}
    pod["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "8", "memory": "64Gi", **resources}
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "4", "memory": "32Gi", **resources}
    args["NodeNames"] = nodes or [H100, A100, LAPTOP]
    return args


SHARED_30 = pod_args({"gpuagent.io/gpu-share": "30%"}, {"nvidia.com/gpu": "1"})
MIG_1G = pod_args({}, {"nvidia.com/mig-1g.10gb": "1"})
TWO_SHARED = pod_args({"gpuagent.io/gpu-share": "20", "gpuagent.io/gpu-memory": "8Gi"}, {"nvidia.com/gpu": "2"})


def test_extender_with_three_real_agents_one_stopped_mid_test(cluster: dict[str, Process]) -> None:
    extender = cluster["extender"].url + "/gpuagent"

    # The fixture's pod as sent: one whole GPU (no share annotation). No node has a GPU without tenants.
    status, reply = http("POST", extender + "/filter", pod_args({}, {"nvidia.com/gpu": "1"}))
    assert status == 200, reply
    assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["NodeNames"] == [] and reply["Nodes"] is None and reply["Error"] == ""
    assert set(reply["FailedNodes"]) == {H100, A100, LAPTOP}
    assert "not free for exclusive use" in reply["FailedNodes"][LAPTOP]
    assert "MIG is enabled" in reply["FailedNodes"][A100]

    # A 30% share of one GPU: the H100 and laptop nodes, not the MIG node.
    status, reply = http("POST", extender + "/filter", SHARED_30)
    assert status == 200, reply
    assert reply["NodeNames"] == [H100, LAPTOP]
    assert list(reply["FailedNodes"]) == [A100]
    status, scores = http("POST", extender + "/prioritize", SHARED_30)
    assert status == 200, scores
    by_host = {item["Host"]: item["Score"] for item in scores}
    assert list(by_host) == [H100, A100, LAPTOP]
    assert by_host[A100] == 0
    assert 1 <= by_host[H100] <= 10 and 1 <= by_host[LAPTOP] <= 10

    # A MIG instance: only the A100 node.
    status, reply = http("POST", extender + "/filter", MIG_1G)
    assert reply["NodeNames"] == [A100], reply
    assert "MIG is not enabled" in reply["FailedNodes"][H100]

    # Two shared GPUs with 8 GiB each: only the 8-GPU node; the laptop has one GPU.
    status, reply = http("POST", extender + "/filter", TWO_SHARED)
    assert reply["NodeNames"] == [H100], reply
    assert "needs 2 GPUs, 1 can take it" in reply["FailedNodes"][LAPTOP]

    # The same call with a full NodeList (nodeCacheCapable: false) is answered with the node objects.
    full = json.loads(json.dumps(SHARED_30))
    full["Nodes"] = {"metadata": {}, "items": [{"metadata": {"name": n}, "status": {}} for n in full["NodeNames"]]}
    full["NodeNames"] = None
    status, reply = http("POST", extender + "/filter", full)
    assert reply["NodeNames"] is None
    assert [item["metadata"]["name"] for item in reply["Nodes"]["items"]] == [H100, LAPTOP]

    # Stop the H100 node's agent. Within the staleness bound its last hints still count; after it, the node
    # is filtered out as unreachable, and the other two still answer.
    stopped_at = time.monotonic()
    assert cluster[H100].stop() == 0
    deadline = stopped_at + MAX_AGE_SECONDS + 10
    while True:
        status, reply = http("POST", extender + "/filter", SHARED_30)
        assert status == 200, reply
        if H100 in reply["FailedAndUnresolvableNodes"]:
            break
        assert reply["NodeNames"] == [H100, LAPTOP], "before the bound the node is judged on its last hints"
        assert time.monotonic() < deadline, "the stopped agent's node was never filtered out"
        time.sleep(0.2)
    assert time.monotonic() - stopped_at >= MAX_AGE_SECONDS - 0.6  # not before the bound (minus one refresh)
    reason = reply["FailedAndUnresolvableNodes"][H100]
    assert reason.startswith("gpuagent: node agent unreachable (cannot connect"), reason
    assert f"older than the {MAX_AGE_SECONDS:g}s staleness bound" in reason
    assert reply["NodeNames"] == [LAPTOP]
    assert list(reply["FailedNodes"]) == [A100]
    status, scores = http("POST", extender + "/prioritize", SHARED_30)
    by_host = {item["Host"]: item["Score"] for item in scores}
    assert by_host[H100] == 0 and by_host[A100] == 0 and by_host[LAPTOP] >= 1
    status, reply = http("POST", extender + "/filter", MIG_1G)
    assert reply["NodeNames"] == [A100]

    # What the extender says about itself.
    status, health = http("GET", cluster["extender"].url + "/healthz")
    assert health["agents"] == {"fresh": 2, "stale": 0, "unreachable": 1}
    status, metrics = http("GET", cluster["extender"].url + "/metrics")
    assert 'gpuagent_extender_agents{state="unreachable"} 1.0' in metrics
    assert 'gpuagent_extender_agent_fetches_total{result="error"}' in metrics
    assert 'gpuagent_extender_requests_total{outcome="ok",verb="filter"}' in metrics

    # A malformed call is a 400 naming the field; the extender keeps serving.
    status, reply = http("POST", extender + "/filter", {"Pod": {"spec": {}}, "NodeNames": [H100]})
    assert status == 400 and reply["field"] == "Pod.spec.containers"
    assert http("POST", extender + "/filter", MIG_1G)[0] == 200

    assert cluster["extender"].stop() == 0
