"""``gpuagent demo`` (what ``make run`` runs, ``tests/test_repository.py``): a simulated Kubernetes node whose pods the agent names from the first screen.

The scenario's ``pods:`` are checked like the rest of a scenario (every error names its path); the demo
node serves them through its own kubelet socket, API server and ``/proc`` tree, and a real ``gpuagent
demo`` process attributes every GPU process to a named pod with its owner, flags the stray and holds the
idle allocation, which ``gpuagent top --once`` shows on its first screen.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_runner import clean_env, run_gpuagent
from agent_runner import http_get as get
from prometheus_server import free_port

from gpuagent.demo.node import demo_node
from gpuagent.demo.run import DEMO_DEFAULTS, WIRED_KEYS, demo_config
from gpuagent.devices.sim import ScenarioError, kubernetes_demo_path, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "scenarios" / "demo-k8s-node.yaml"
PODS = {  # namespace/name -> (owner kind, owner name)
    "training/llama-pretrain-0": ("StatefulSet", "llama-pretrain"),
    "training/llama-pretrain-1": ("StatefulSet", "llama-pretrain"),
    "serving/chat-api-6d8f7b9c4-x2kqp": ("Deployment", "chat-api"),
    "serving/chat-api-6d8f7b9c4-r7tzw": ("Deployment", "chat-api"),
    "research/notebook-alice-0": ("StatefulSet", "notebook-alice"),
    "serving/embedder-5c6b4d7f8-fq9lm": ("Deployment", "embedder"),
    "serving/embedder-5c6b4d7f8-mw4zd": ("Deployment", "embedder"),
    "inference/whisper-7f9c8d6b5-k4wnt": ("Deployment", "whisper"),
    "research/notebook-bob-0": ("StatefulSet", "notebook-bob"),
    "batch/ocr-backfill-8hzl2": ("Job", "ocr-backfill"),
    "batch/eval-nightly-29012340-5xq7c": ("CronJob", "eval-nightly"),
    "serving/reranker-84d5f6c7b9-t8vnx": ("Deployment", "reranker"),
}


# -- the scenario's pods ---------------------------------------------------------------------------------

def test_the_example_is_the_packaged_demo_and_has_every_kind_of_tenant() -> None:
    assert EXAMPLE.resolve() == kubernetes_demo_path().resolve()
    scenario = load_scenario(EXAMPLE)
    assert {f"{p.namespace}/{p.name}" for p in scenario.pods} == set(PODS)
    node = demo_node(scenario)
    resources = {d.resource_name for pod in node.pods for c in pod.containers for d in c.devices}
    assert resources == {"nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb",
                         "nvidia.com/mig-1g.10gb"}
    replicas = [d.device_id for pod in node.pods for c in pod.containers for d in c.devices if "::" in d.device_id]
    assert len(replicas) == 5  # three on the time-sliced GPU, two MPS clients
    kinds = {p.type for p in scenario.processes}
    assert {"mps_server", "mps_client", "compute"} <= kinds
    shares = {p.name: p.annotations["gpuagent.io/gpu-share"] for p in scenario.pods
              if "gpuagent.io/gpu-share" in p.annotations}  # GPU 2's tenants: alice over her 20 %
    assert shares == {"chat-api-6d8f7b9c4-x2kqp": "40", "chat-api-6d8f7b9c4-r7tzw": "40", "notebook-alice-0": "20"}


BASE = """
gpus: [{model: H100-SXM5-80GB, count: 2}, {model: H100-SXM5-80GB, mig: {instances: [{profile: 3g.40gb, id: 1}]}}]
processes:
  - {name: a, gpu: 0}
  - {name: b, gpu: 1}
  - {name: dup, gpu: 1}
  - {name: dup, gpu: 0}
  - {name: real, gpu: 0, pid: 1}
"""


@pytest.mark.parametrize(("pods", "expected"), [
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "processes": ["nope"]}]}],
     "pods[0].containers[0].processes[0]: no process is named 'nope'"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "processes": ["dup"]}]}],
     "pods[0].containers[0].processes[0]: 2 processes are named 'dup'"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "processes": ["real"]}]}],
     "pods[0].containers[0].processes[0]: process 'real' is a real PID (1)"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "processes": ["a"]},
                                                      {"name": "d", "processes": ["a"]}]}],
     "pods[0].containers[1].processes[0]: process 'a' already runs in ns/p/c"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "devices": [{"gpu": 0}]}]},
      {"namespace": "ns", "name": "q", "containers": [{"name": "c", "devices": [{"gpu": 0, "replica": 1}]}]}],
     "pods[1].containers[0].devices[0]: replica 1 of GPU 0 is already allocated to ns/p/c"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "devices": [{"gpu": 2}]}]}],
     "pods[0].containers[0].devices[0]: GPU 2 is in MIG mode: give mig_instance (GPU instance IDs: 1)"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "devices": [{"gpu": 2, "mig_instance": 4}]}]}],
     "pods[0].containers[0].devices[0].mig_instance: GPU 2 has no GPU instance 4 (it has: 1)"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "devices": [{"gpu": 7}]}]}],
     "pods[0].containers[0].devices[0].gpu: GPU index 7 does not exist"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c"}]},
      {"namespace": "ns", "name": "p", "containers": [{"name": "c"}]}],
     "pods[1].name: pod ns/p is declared twice"),
    ([{"namespace": "NS", "name": "p", "containers": [{"name": "c"}]}], "pods[0].namespace"),
    ([{"namespace": "ns", "name": "p", "containers": [{"name": "c", "devices": [{"gpu": 0, "replica": 0,
                                                                               "mig_instance": 1}]}]}],
     "pods[0].containers[0].devices[0]"),
])
def test_a_bad_pod_is_named_by_its_path(pods: list[dict[str, Any]], expected: str) -> None:
    data = yaml.safe_load(BASE)
    data["pods"] = pods
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, source="demo.yaml")
    assert any(expected in line for line in str(caught.value).splitlines()), str(caught.value)


def test_a_pod_uid_is_stable_and_its_cgroup_is_the_kubelets() -> None:
    one, two = (demo_node(load_scenario(EXAMPLE)) for _ in range(2))
    assert [p.uid for p in one.pods] == [p.uid for p in two.pods]
    pod = next(p for p in one.pods if p.name == "llama-pretrain-0")  # Guaranteed: no QoS slice
    assert re.fullmatch(r"/kubepods\.slice/kubepods-pod[0-9a-f_]{36}\.slice/cri-containerd-[0-9a-f]{64}\.scope",
                        pod.cgroup_path(pod.containers[0]))
    pod = next(p for p in one.pods if p.name == "notebook-bob-0")
    assert "/kubepods-burstable.slice/kubepods-burstable-pod" in pod.cgroup_path(pod.containers[0])


def test_the_demo_sets_the_wiring_and_keeps_what_the_user_chose(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("idle_window: 30\n")
    config = demo_config(str(config_file), {"mode": "off", "listen": "127.0.0.1:19402", "backend": None},
                         scenario=str(EXAMPLE), hostname="gpu-node-1", workdir=tmp_path,
                         socket=tmp_path / "kubelet.sock", kubeconfig=tmp_path / "kubeconfig")
    assert config.enforce.mode == "off" and config.accounting.idle_window == 30  # a flag and the file win over the demo's defaults
    assert config.pods.pod_resources_interval == DEMO_DEFAULTS["pod_resources_interval"]
    assert (config.devices.backend, config.agent.hostname, config.kubeapi.kubernetes_api) == ("sim", "gpu-node-1", "on")
    assert config.pods.proc_root == str(tmp_path / "proc") and config.enforce.cgroup_root == str(tmp_path / "cgroup")
    assert set(WIRED_KEYS) <= {k for k, source in config.sources.items() if source.startswith("flag")}


# -- the demo's kubelet and API server, as the agent's clients read them ---------------------------------

async def test_the_kubelet_lists_every_allocation_to_the_agents_client() -> None:
    from podresources_server import short_socket_dir

    from gpuagent.demo.kubelet import KubeletServer
    from gpuagent.pods.podresources import PodResourcesClient

    node = demo_node(load_scenario(EXAMPLE))
    with short_socket_dir() as sockets:
        kubelet = KubeletServer(sockets / "kubelet.sock", node)
        await kubelet.start()
        client = PodResourcesClient(str(kubelet.socket))
        try:
            got = await client.fetch()
        finally:
            await client.close()
            await kubelet.stop()
    allocated = {(a.namespace, a.pod, a.container, a.device_id) for a in got.allocations}
    expected = {(p.namespace, p.name, c.name, d.device_id) for p in node.pods for c in p.containers for d in c.devices}
    assert allocated == expected and len(allocated) == len(PODS)  # one device a pod
    assert set(got.allocatable) == {d.device_id for d in node.allocatable} >= {a[3] for a in allocated}
    assert got.pods_seen == len(PODS)


async def test_the_api_server_serves_the_pods_and_their_owner_chains() -> None:
    import aiohttp

    from gpuagent.demo.apiserver import ApiServer

    api = ApiServer(demo_node(load_scenario(EXAMPLE)))
    await api.start()
    try:
        async with aiohttp.ClientSession(api.url, headers={"Authorization": f"Bearer {api.token}"}) as http:
            async def get(path: str, **params: str) -> tuple[int, Any]:
                async with http.get(path, params=params) as response:
                    return response.status, await response.json()

            _, pods = await get("/api/v1/pods", fieldSelector="spec.nodeName=gpu-node-1")
            assert {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods["items"]} == set(PODS)
            assert (await get("/api/v1/pods", fieldSelector="spec.nodeName=elsewhere"))[1]["items"] == []
            chat = next(p for p in pods["items"] if p["metadata"]["name"] == "chat-api-6d8f7b9c4-x2kqp")
            (owner,) = chat["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("ReplicaSet", "chat-api-6d8f7b9c4")
            _, replicaset = await get("/apis/apps/v1/namespaces/serving/replicasets/chat-api-6d8f7b9c4")
            (top,) = replicaset["metadata"]["ownerReferences"]
            assert (top["kind"], top["name"]) == ("Deployment", "chat-api")
            status, deployment = await get("/apis/apps/v1/namespaces/serving/deployments/chat-api")
            assert status == 200 and "ownerReferences" not in deployment["metadata"]
            _, job = await get("/apis/batch/v1/namespaces/batch/jobs/eval-nightly-29012340")
            assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
            status, missing = await get("/apis/apps/v1/namespaces/serving/deployments/nope")
            assert status == 404 and missing["kind"] == "Status" and missing["reason"] == "NotFound"
            async with http.get("/api/v1/pods", params={"watch": "true", "resourceVersion": "1",
                                                        "timeoutSeconds": "0.2"}) as watch:
                assert watch.status == 200 and await watch.read() == b""  # nothing changes; it ends on time
            event = {"reason": "GpuIdle", "regarding": {"kind": "Pod", "name": "x"}, "note": "idle"}
            async with http.post("/apis/events.k8s.io/v1/namespaces/batch/events", json=event) as posted:
                assert posted.status == 201
            async with http.post("/apis/events.k8s.io/v1/namespaces/batch/events", data=b"[") as bad:
                assert bad.status == 400
    finally:
        await api.stop()
    assert list(api.events) == [event]


# -- a real demo process ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``gpuagent demo`` on a free port, polling every 0.5 s, until its pods are named with their owners."""
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuagent", "demo", "--listen", url.removeprefix("http://"),
                                 "--poll-interval", "0.5", "--idle-window", "2"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=clean_env())
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError, ValueError, KeyError):
                status, body = get(url + "/v1/state")
                if status == 200 and sum(p.get("owner_kind") is not None for p in json.loads(body)["pods"]) == len(PODS):
                    break
            assert time.monotonic() < deadline, "the demo's pods were not all named:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        assert code == 0, log.read_text()[-3000:]


@pytest.mark.integration
def test_the_demo_names_every_pod_with_its_owner_in_the_state(demo: str) -> None:
    state = json.loads(get(demo + "/v1/state")[1])
    assert state["backend"] == "sim" and state["hostname"] == "gpu-node-1" and len(state["gpus"]) == 8
    pods = {f"{p['namespace']}/{p['name']}": p for p in state["pods"]}
    assert {k: (p["owner_kind"], p["owner_name"]) for k, p in pods.items()} == PODS
    assert {p["names_from"] for p in pods.values()} == {"api_server"}
    unattributed = [proc for gpu in state["gpus"] for proc in gpu["processes"]
                    if proc.get("kind") != "mps_server" and not (proc.get("workload") or {}).get("name")]
    assert not unattributed, unattributed
    uuids = [gpu["info"]["uuid"] for gpu in state["gpus"]]
    alice = pods["research/notebook-alice-0"]
    assert uuids[6] in alice["used_gpus"] and uuids[6] not in alice["allocated_gpus"]  # the stray
    idle = pods["batch/eval-nightly-29012340-5xq7c"]
    assert idle["allocated_gpus"] == [uuids[5]] and idle["sm_util_percent"] == 0
    mig = {p["name"] for p in state["pods"] if any("MIG-" in d for c in p["containers"]
                                                   for d in c["allocated_devices"])}
    assert mig == {"whisper-7f9c8d6b5-k4wnt", "notebook-bob-0", "ocr-backfill-8hzl2"}


@pytest.mark.integration
def test_the_demos_metrics_say_simulated_and_flag_the_stray_and_the_audit(demo: str) -> None:
    metrics = get(demo + "/metrics")[1]
    assert "gpuagent_simulated 1.0" in metrics and 'backend="sim"' in metrics
    assert re.search(r'gpuagent_pod_gpu_unallocated_use\{[^}]*pod="notebook-alice-0"[^}]*\} 1\.0', metrics)
    assert re.search(r'gpuagent_pod_info\{[^}]*pod="chat-api-6d8f7b9c4-x2kqp"[^}]*owner_kind="Deployment"'
                     r'[^}]*owner_name="chat-api"', metrics)
    assert re.search(r'gpuagent_pod_gpu_share_limit_ratio\{[^}]*pod="notebook-alice-0"[^}]*\} 0\.2', metrics)
    # over its share on a contended GPU: throttling decided (the controller ramps up over a few polls)
    frozen = re.compile(r'gpuagent_pod_gpu_frozen_ratio\{[^}]*pod="notebook-alice-0"[^}]*\} ([0-9.]+)')
    deadline = time.monotonic() + 30
    while not ((found := frozen.search(metrics)) and float(found.group(1)) > 0):
        assert time.monotonic() < deadline, "notebook-alice-0 was never decided throttled"
        time.sleep(0.2)
        metrics = get(demo + "/metrics")[1]
    assert re.search(r'gpuagent_pod_gpu_mps_active_thread_ratio\{[^}]*pod="embedder-5c6b4d7f8-fq9lm"[^}]*\} 0\.4',
                     metrics)


@pytest.mark.integration
def test_top_once_shows_named_pods_on_its_first_screen(demo: str) -> None:
    out = subprocess.run([sys.executable, "-m", "gpuagent", "top", "--agent", demo, "--once", "--width", "130"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean_env())
    assert out.returncode == 0, out.stderr
    first_screen = "\n".join(out.stdout.splitlines()[:24])
    for tenant in ("training/llama-pre", "serving/chat-api", "research/notebook-", "serving/embedder"):
        assert tenant in first_screen, first_screen
    assert "unattributed" not in first_screen


WORKLOADS = {f"{key.split('/')[0]}/{kind}/{name}" for key, (kind, name) in PODS.items()}


@pytest.mark.integration
def test_report_and_recommend_name_the_workloads_of_a_scraped_demo_within_seconds(
        demo: str, tmp_path: Path) -> None:
    """A Prometheus scraping the live demo: a few seconds of it, and report bills every pod by name,
    recommend names every workload by its owner (with too little history to size them, and says so)."""
    from prometheus_server import run_prometheus

    with run_prometheus([demo.removeprefix("http://")], tmp_path / "prometheus") as prom:
        start = time.time()
        prom.wait_for_samples("gpuagent_pod_gpu_allocated_seconds_total", 8)
        end = time.time()
        span = ("--prometheus", prom.url, "--start", f"{start:.3f}", "--end", f"{end:.3f}", "--format", "json")
        report = run_gpuagent("report", *span, "--step", "1s")
        assert report.returncode == 0, report.stderr
        billed = {f"{p['namespace']}/{p['pod']}" for p in json.loads(report.stdout)["pods"]}
        assert billed == set(PODS)
        recommend = run_gpuagent("recommend", *span, "--step", "1s", "--chunk", "1h")
        assert recommend.returncode == 0, recommend.stderr
        rows = {w["workload"]: w["recommendation"]["action"] for w in json.loads(recommend.stdout)["workloads"]}
        assert set(rows) == WORKLOADS
        assert set(rows.values()) == {"insufficient_history"}  # seconds of it: named, not sized

