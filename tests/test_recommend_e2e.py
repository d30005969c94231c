"""``gpuagent recommend`` end to end: a real agent (simulated node of 6 H100s) with a (fake) API server and a
real kubelet pod-resources server, scraped every second by a real Prometheus; then the recommender over the
run, against what Prometheus itself answers.

The node: ``serving/llm-api`` (a Deployment's 2 replicas at 20 % SM with 9 GiB, GPUs 0 and 1),
``ml/trainer`` (a Deployment at 95 %, GPU 2), ``research/alice-0`` (a Kubeflow Notebook's StatefulSet pod,
idle, GPU 3), ``batch/nightly-...`` (a CronJob's Job, 10 % with a burst to 50 % one second in five, GPU 4)
and ``render.service`` (a systemd service at 30 %, GPU 5). The agent reads the pods' owners from the API
server, walking ReplicaSet -> Deployment, StatefulSet -> Notebook and Job -> CronJob, and puts them on
``gpuagent_pod_info``; the recommender groups pods by them.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_runner
import pytest
import yaml
from agent_runner import AgentRunner, run_gpuagent
from fake_apiserver import FakeApiServer, container_id, make_owner, make_pod
from podresources_server import Container, Pod, PodResourcesServer, gpus, short_socket_dir
from prometheus_server import PrometheusServer, free_port, prometheus_binary
from test_report_e2e import LoopThread, gpu_uuids

ROOT = Path(__file__).resolve().parents[1]
FAKE_PID = 4_200_000  # the simulator's PID of scenario process i
HOST = "recommend-node"
GIB = 1024**3
WEEK = 7 * 86400.0

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Tenant:
    namespace: str
    pod: str
    container: str
    gpu: int
    sm_util: Any
    memory: str
    uid: str
    owner: str  # the top owner, as "Kind/name"


def _steps(low: float, high: float) -> dict[str, Any]:
    return {"steps": [[0, low], [4, high]], "repeat": True, "period": 5}


TENANTS = (
    Tenant("serving", "llm-api-7d9c6b8f5d-x2k4p", "server", 0, 20, "9Gi", "0b1c2d3e-0000-4000-8000-000000000001",
           "Deployment/llm-api"),
    Tenant("serving", "llm-api-7d9c6b8f5d-b9m7q", "server", 1, 20, "9Gi", "0b1c2d3e-0000-4000-8000-000000000002",
           "Deployment/llm-api"),
    Tenant("ml", "trainer-5b7c9d2f4-k8m2n", "pytorch", 2, 95, "60Gi", "0b1c2d3e-0000-4000-8000-000000000003",
           "Deployment/trainer"),
    Tenant("research", "alice-0", "notebook", 3, 0, "2Gi", "0b1c2d3e-0000-4000-8000-000000000004",
           "Notebook/alice"),
    Tenant("batch", "nightly-29412000-h7x2k", "etl", 4, _steps(10, 50), "4Gi",
           "0b1c2d3e-0000-4000-8000-000000000005", "CronJob/nightly"),
)
SERVICE = "render.service"  # GPU 5, not a pod


def scenario() -> dict[str, Any]:
    processes: list[dict[str, Any]] = [
        {"name": t.container, "gpu": t.gpu, "memory": t.memory, "sm_util": t.sm_util} for t in TENANTS]
    processes.append({"name": "render", "gpu": 5, "memory": "1Gi", "sm_util": 30})
    return {"version": 1, "name": "recommend-e2e", "gpus": [{"model": "H100-SXM5-80GB", "count": 6}],
            "processes": processes}


def write_proc(root: Path) -> Path:
    """``/proc/<pid>/cgroup`` of every scenario process, with the API server's container IDs."""
    return agent_runner.write_proc(root, FAKE_PID, [(t.uid, container_id(t.uid, t.container)) for t in TENANTS],
                                   SERVICE)


def cluster(api: FakeApiServer) -> None:
    """The pods on the API server, each under its controllers."""
    llm = make_owner("Deployment", "llm-api", namespace="serving")
    llm_rs = make_owner("ReplicaSet", "llm-api-7d9c6b8f5d", namespace="serving", owner=llm)
    trainer = make_owner("Deployment", "trainer", namespace="ml")
    trainer_rs = make_owner("ReplicaSet", "trainer-5b7c9d2f4", namespace="ml", owner=trainer)
    notebook = make_owner("Notebook", "alice", namespace="research", api_version="kubeflow.org/v1")
    sts = make_owner("StatefulSet", "alice", namespace="research", owner=notebook)
    cron = make_owner("CronJob", "nightly", namespace="batch")
    job = make_owner("Job", "nightly-29412000", namespace="batch", owner=cron)
    for obj in (llm, llm_rs, trainer, trainer_rs, sts, cron, job):
        api.add_owner(obj)
    controllers = {"llm-api": llm_rs, "trainer": trainer_rs, "alice-0": sts, "nightly": job}
    for t in TENANTS:
        controller = next(c for prefix, c in controllers.items() if t.pod.startswith(prefix))
        api.add_pod(make_pod(t.pod, namespace=t.namespace, node=HOST, uid=t.uid, containers=(t.container,),
                             owner=controller))


@dataclass
class Run:
    prometheus: PrometheusServer
    start_unix: float
    end_unix: float
    workdir: Path

    @property
    def range_ms(self) -> int:
        return round((self.end_unix - self.start_unix) * 1000)

    def recommend(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_gpuagent("recommend", "--prometheus", self.prometheus.url, "--start", f"{self.start_unix:.3f}",
                            "--end", f"{self.end_unix:.3f}", "--step", "1s", "--chunk", "1h", "--min-history", "8s",
                            *args, timeout=120)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prometheus_binary()
    work = tmp_path_factory.mktemp("recommend-e2e")
    scenario_path = work / "node.yaml"
    scenario_path.write_text(yaml.safe_dump(scenario()))
    proc_root = write_proc(work / "proc")
    uuids = gpu_uuids(scenario_path)
    served = [Pod(t.pod, t.namespace, [Container(t.container, [gpus(uuids[t.gpu])])]) for t in TENANTS]
    target = f"127.0.0.1:{free_port()}"
    loop = LoopThread()
    agent: AgentRunner | None = None
    try:
        with short_socket_dir() as sockets:
            kubelet = PodResourcesServer(sockets / "kubelet.sock", pods=served, allocatable=[gpus(*uuids[:5])])
            loop.run(kubelet.start())
            api = FakeApiServer()
            loop.run(api.start())
            cluster(api)
            config = {"backend": "sim", "scenario": str(scenario_path), "poll_interval": 0.5, "listen": target,
                      "hostname": HOST, "proc_root": str(proc_root), "pod_resources_socket": str(kubelet.socket_path),
                      "pod_resources_interval": 0.5, "kubernetes_api": "on",
                      "kubeconfig": str(api.write_kubeconfig(work / "kubeconfig")), "idle_events": "off",
                      "mode": "off", "journal_path": str(work / "journal.json"), "energy_interval": 0.5,
                      # per-process use every poll: the bursts (one second in five) are what is recommended on
                      "process_utilization_interval": 0.5}
            with PrometheusServer([target], work / "prometheus") as prom:
                agent = AgentRunner("agent", config, work)
                agent.wait_ready()
                prom.wait_for('count(gpuagent_pod_info{owner_kind!=""})', lambda r: r.has_data and float(
                    r.result[0]["value"][1]) == len(TENANTS), 30, "every pod's owner on gpuagent_pod_info")
                start = round(time.time(), 3)
                time.sleep(16)
                end = round(time.time(), 3)
                time.sleep(1.5)  # every scrape stamped before the end is in Prometheus
                yield Run(prom, start, end, work)
            loop.run(api.stop())
            loop.run(kubelet.stop(0))
    finally:
        if agent is not None:
            agent.stop()
        loop.close()


@pytest.fixture(scope="module")
def document(run: Run) -> dict:
    done = run.recommend("--format", "json", "--patch", str(run.workdir / "patches"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_agent_names_every_pods_owner(run: Run) -> None:
    info = run.prometheus.query("gpuagent_pod_info", run.end_unix).result
    owners = {s["metric"]["pod"]: f'{s["metric"]["owner_kind"]}/{s["metric"]["owner_name"]}' for s in info}
    assert owners == {t.pod: t.owner for t in TENANTS}


def test_pods_are_grouped_by_owner_and_each_gets_its_recommendation(document: dict) -> None:
    rows = {w["workload"]: w for w in document["workloads"]}
    assert {w: r["recommendation"]["summary"] for w, r in rows.items()} == {
        "serving/Deployment/llm-api": "MIG 2g.20gb",  # 20 % x 1.2 = 24 % <= 2/7; 9 GiB x 1.2 <= 19.6 GiB
        "ml/Deployment/trainer": "keep",
        "research/Notebook/alice": "release",
        "batch/CronJob/nightly": "share 60% 5Gi",  # bursts to 50 %: x 1.2; 4 GiB x 1.2 = 4.8 -> 5 GiB
        f"systemd_service/{SERVICE}": "MIG 3g.40gb",  # 30 % x 1.2 = 36 % <= 3/7
    }
    llm = rows["serving/Deployment/llm-api"]
    assert llm["pods"] == sorted(t.pod for t in TENANTS if t.pod.startswith("llm-api"))
    assert llm["grouped_by"] == "api_server" and llm["devices"] == 2 and llm["gpus_held"] == pytest.approx(2, abs=0.05)
    assert llm["containers"] == ["server"] and llm["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert llm["sm_ratio"]["p50"] == pytest.approx(0.2, abs=0.02) and llm["memory_bytes"]["max"] == 9 * GIB
    assert rows["research/Notebook/alice"]["idle_ratio"] == pytest.approx(1.0, abs=0.05)
    nightly = rows["batch/CronJob/nightly"]["sm_ratio"]
    assert nightly["p50"] == pytest.approx(0.1, abs=0.02) and nightly["max"] == pytest.approx(0.5, abs=0.02)
    assert document["warnings"] == []


def test_savings_are_the_counters_increase_scaled_to_a_week(run: Run, document: dict) -> None:
    rows = {w["workload"]: w for w in document["workloads"]}
    result = run.prometheus.query(f"increase(gpuagent_pod_gpu_allocated_seconds_total[{run.range_ms}ms])",
                                  run.end_unix).result
    result += run.prometheus.query(f"increase(gpuagent_workload_gpu_allocated_seconds_total[{run.range_ms}ms])",
                                   run.end_unix).result
    by_pod = {s["metric"].get("pod") or s["metric"]["workload"]: float(s["value"][1]) for s in result}
    range_s = run.range_ms / 1000
    scale = WEEK / range_s / 3600
    # What the code guarantees: it scales by end - start of two Unix times as doubles (each within half an
    # ulp of its millisecond), so its range is exact to one ulp of the end: 2.4e-7 s, 1.5e-8 of a 16 s range
    # (it was 4.5e-9 off in a run), beyond the sums' own rounding.
    rel = math.ulp(run.end_unix) / range_s + 1e-9
    for workload, row in rows.items():
        pods = row["pods"]
        now = sum(by_pod[p] for p in pods) * scale
        saved = row["savings"]
        assert saved["current_gpu_hours_week"] == pytest.approx(now, rel=rel), workload
        action = row["recommendation"]["action"]
        if action in ("mig", "share"):
            after = now * row["recommendation"]["size_gpus"] / row["device_size_gpus"]
        else:
            after = now * (1 - row["idle_ratio"]) if action == "release" else now
        assert saved["recommended_gpu_hours_week"] == pytest.approx(after, rel=rel), workload
    assert rows["serving/Deployment/llm-api"]["recommendation"]["size_gpus"] == pytest.approx(2 / 7)
    packing = document["packing"][0]
    # 6 GPUs now; after: the trainer whole, llm-api's two 2g and render's 3g in one MIG GPU, nightly's share
    assert (packing["gpus_now"], packing["whole"], packing["mig"], packing["shared"], packing["gpus_after"]) == (
        6, 1, 1, 1, 3)


def test_patches_for_the_deployment_and_the_cronjob(run: Run, document: dict) -> None:
    patches = run.workdir / "patches"
    names = sorted(p.name for p in patches.iterdir())
    assert names == ["batch.cronjob.nightly.yaml", "kustomization.yaml", "serving.deployment.llm-api.yaml"]
    llm = yaml.safe_load((patches / "serving.deployment.llm-api.yaml").read_text())
    (container,) = llm["spec"]["template"]["spec"]["containers"]
    assert container == {"name": "server", "resources": {
        "limits": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"},
        "requests": {"nvidia.com/gpu": None, "nvidia.com/mig-2g.20gb": "1"}}}
    nightly = yaml.safe_load((patches / "batch.cronjob.nightly.yaml").read_text())
    assert nightly["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"] == {
        "gpuagent.io/gpu-share": "60%", "gpuagent.io/gpu-memory": "5Gi"}


def test_table_and_html_of_the_run(run: Run) -> None:
    table = run.recommend("--format", "table")
    assert table.returncode == 0, table.stderr
    assert "serving/Deployment/llm-api" in table.stdout and "MIG 2g.20gb" in table.stdout
    page = run.workdir / "recommend.html"
    done = run.recommend("--format", "html", "--output", str(page))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    text = page.read_text()
    assert text.count("<svg") == 3 and "research/Notebook/alice" in text
