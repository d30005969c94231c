"""Pod metadata from the API server (list + watch by node) against a real HTTP fake of the API server."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from fake_apiserver import (
    NODE,
    FakeApiServer,
    container_id,
    eventually,
    make_owner,
    make_pod,
    metadata_runner,
)

from gpuagent.pods.attribution import PodName
from gpuagent.pods.metadata import PodMetadata, api_server_available, strip_runtime
from gpuagent.pods.owners import OwnerResolver

REPO = Path(__file__).resolve().parent.parent
LOGGER = "gpuagent.pods.metadata"


@pytest.fixture
async def start(api: FakeApiServer) -> AsyncIterator[Callable[..., PodMetadata]]:
    """start(**kwargs) -> a running PodMetadata for NODE against ``api``; cancelled at teardown."""
    async with metadata_runner(api) as starter:
        yield starter


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)


def uid_of(pod: dict) -> str:
    return pod["metadata"]["uid"]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


# -- without a server --------------------------------------------------------------------------------------
def test_importing_the_module_loads_no_kubernetes_client() -> None:
    code = ("import sys, gpuagent.pods.metadata\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2', 'msgspec')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_api_server_available_needs_the_service_host_and_a_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert not api_server_available(env, str(tmp_path))
    (tmp_path / "token").write_text("eyJ...")
    assert api_server_available(env, str(tmp_path))
    assert not api_server_available({}, str(tmp_path))
    assert not api_server_available({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, str(tmp_path))


@pytest.mark.parametrize(("raw", "bare"), [
    ("containerd://" + "a" * 64, "a" * 64), ("cri-o://" + "b" * 64, "b" * 64),
    ("docker://" + "c" * 64, "c" * 64), ("d" * 64, "d" * 64),
])
def test_strip_runtime(raw: str, bare: str) -> None:
    assert strip_runtime(raw) == bare


def test_a_node_name_is_required() -> None:
    with pytest.raises(ValueError, match="node_name"):
        PodMetadata("")


# -- list ----------------------------------------------------------------------------------------------------
async def test_the_first_list_names_this_nodes_pods_by_uid(api: FakeApiServer, start) -> None:
    train = api.add_pod(make_pod("train-0", namespace="ml", containers=("trainer", "logger"),
                                 init_containers=("fetch-weights",), ephemeral_containers=("debugger",),
                                 annotations={"gpuagent.io/gpu-share": "0.5", "gpuagent.io/priority": "high",
                                              "example.com/owner": "team-a"}, qos="Guaranteed"))
    infer = api.add_pod(make_pod("infer-0", namespace="ml", runtime="cri-o", qos="BestEffort", gpus=0))
    legacy = api.add_pod(make_pod("legacy-0", runtime="docker"))
    pending = api.add_pod(make_pod("pending-0", started=False))
    api.add_pod(make_pod("elsewhere-0", node="gpu-node-2"))
    api.add_pod(make_pod("unscheduled-0", node=None))

    metadata = start()
    await eventually(lambda: metadata.synced)

    view = metadata.names_by_uid()
    assert set(view) == {uid_of(train), uid_of(infer), uid_of(legacy), uid_of(pending)}
    # owners are walked beside the list (their ReplicaSets are not served here: they stay the owners)
    await eventually(lambda: all(n.owner_kind for n in metadata.names_by_uid().values()))
    view = metadata.names_by_uid()
    t = uid_of(train)
    assert view[t] == PodName(
        namespace="ml", name="train-0",
        containers_by_id={container_id(t, c): c for c in ("trainer", "logger", "fetch-weights", "debugger")},
        annotations={"gpuagent.io/gpu-share": "0.5", "gpuagent.io/priority": "high"}, qos="guaranteed",
        owner_kind="ReplicaSet", owner_name="train-0-rs")
    assert view[uid_of(infer)].containers_by_id == {container_id(uid_of(infer), "main"): "main"}
    assert view[uid_of(infer)].qos == "besteffort"
    assert view[uid_of(legacy)].containers_by_id == {container_id(uid_of(legacy), "main"): "main"}
    assert view[uid_of(pending)].containers_by_id == {}  # ContainerCreating: no IDs yet
    assert all(len(cid) == 64 and "://" not in cid for n in view.values() for cid in n.containers_by_id)
    assert metadata.status == (True, "")

    await eventually(lambda: api.open_watches == 1)
    first_list, first_watch = api.requests[0], api.watches[0]
    assert first_list.path == "/api/v1/pods"
    assert first_list.query == {"fieldSelector": f"spec.nodeName={NODE}", "resourceVersion": "0"}
    assert first_list.authorization == "Bearer test-token"
    assert first_watch.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert first_watch.query["resourceVersion"] == api.resource_version  # the list's version
    assert first_watch.query["allowWatchBookmarks"] == "true"
    assert 300 <= int(first_watch.query["timeoutSeconds"]) < 600
    assert all(r.query["fieldSelector"] == f"spec.nodeName={NODE}" for r in api.requests)


async def test_a_static_pods_mirror_is_also_known_by_the_kubelets_uid(api: FakeApiServer, start) -> None:
    config_hash = "487a0dc6dccaeefbcfedba7a7ce1ca18"
    mirror = api.add_pod(make_pod("dcgm-static", namespace="kube-system", mirror_of=config_hash))
    metadata = start()
    await eventually(lambda: metadata.synced)
    view = metadata.names_by_uid()
    assert view[config_hash] is view[uid_of(mirror)]
    assert view[config_hash].name == "dcgm-static"
    await eventually(lambda: api.open_watches == 1)
    api.delete_pod(uid_of(mirror))
    await eventually(lambda: metadata.names_by_uid() == {})


# -- watch ---------------------------------------------------------------------------------------------------
async def test_watch_events_update_the_view_within_a_second(api: FakeApiServer, start) -> None:
    first = api.add_pod(make_pod("first"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    before = metadata.names_by_uid()

    second = api.add_pod(make_pod("second", annotations={"gpuagent.io/gpu-memory": "20Gi"}))
    await eventually(lambda: uid_of(second) in metadata.names_by_uid())
    assert metadata.names_by_uid()[uid_of(second)].annotations == {"gpuagent.io/gpu-memory": "20Gi"}
    assert set(before) == {uid_of(first)}  # a caller's view never changes under it

    # MODIFIED: the container restarted (new ID), an annotation changed
    def restart(pod: dict) -> None:
        pod["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "e" * 64
        pod["metadata"]["annotations"]["gpuagent.io/gpu-memory"] = "40Gi"
    api.update_pod(uid_of(second), restart)
    await eventually(lambda: metadata.names_by_uid()[uid_of(second)].containers_by_id == {"e" * 64: "main"})
    assert metadata.names_by_uid()[uid_of(second)].annotations == {"gpuagent.io/gpu-memory": "40Gi"}

    # a status change that touches nothing kept: the same view object stays
    kept = metadata.names_by_uid()
    api.update_pod(uid_of(second), lambda pod: pod["status"].update(podIP="10.244.3.99"))
    await eventually(lambda: api.watches and metadata.names_by_uid() is kept)

    # a pod scheduled later to this node arrives as ADDED for this watch; other nodes' pods never do
    late = api.add_pod(make_pod("late", node=None))
    api.add_pod(make_pod("other-node", node="gpu-node-2"))
    api.update_pod(uid_of(late), lambda pod: pod["spec"].update(nodeName=NODE))
    await eventually(lambda: uid_of(late) in metadata.names_by_uid())

    api.delete_pod(uid_of(first))
    await eventually(lambda: uid_of(first) not in metadata.names_by_uid())
    assert set(metadata.names_by_uid()) == {uid_of(second), uid_of(late)}
    assert len(api.lists) == 1 and metadata.status == (True, "")


async def test_a_bookmark_moves_the_resume_point_and_nothing_else(api: FakeApiServer, start) -> None:
    api.add_pod(make_pod("a"))
    metadata = start()
    # synced, watching, and its owner's walk answered (that changes the view too)
    await eventually(lambda: metadata.synced and api.open_watches == 1
                     and all(n.owner_kind for n in metadata.names_by_uid().values()))
    view = metadata.names_by_uid()
    api.add_pod(make_pod("elsewhere", node="gpu-node-2"))  # moves the version; this node sees nothing
    api.send_bookmark()
    await asyncio.sleep(0.05)
    assert metadata.names_by_uid() is view
    api.drop_connections()
    await eventually(lambda: len(api.watches) == 2 and api.open_watches == 1)
    assert api.watches[1].query["resourceVersion"] == api.resource_version  # from the bookmark
    assert len(api.lists) == 1


async def test_410_gone_relists_and_the_view_is_right_afterwards(api: FakeApiServer, start) -> None:
    stays = api.add_pod(make_pod("stays"))
    goes = api.add_pod(make_pod("goes"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)

    # changes the watch never delivers (compacted away), then the watch is expired
    api.delete_pod(uid_of(goes), notify=False)
    came = api.add_pod(make_pod("came"), notify=False)
    api.expire_watch()

    await eventually(lambda: set(metadata.names_by_uid()) == {uid_of(stays), uid_of(came)})
    assert len(api.lists) == 2
    assert "resourceVersion" not in api.lists[1].query  # a consistent list after 410, not from the cache
    await eventually(lambda: api.open_watches == 1)
    assert api.watches[-1].query["resourceVersion"] == api.resource_version
    assert metadata.status == (True, "")

    # the watch then goes on as before
    newest = api.add_pod(make_pod("newest"))
    await eventually(lambda: uid_of(newest) in metadata.names_by_uid())


async def test_a_resume_point_expired_while_away_relists(api: FakeApiServer, start) -> None:
    api.add_pod(make_pod("a"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    await api.stop()
    api.expire_watch()  # compaction while the agent is cut off
    b = api.add_pod(make_pod("b"))
    await api.start()
    await eventually(lambda: uid_of(b) in metadata.names_by_uid(), timeout=10.0)
    assert len(api.lists) == 2


async def test_a_dropped_connection_resumes_the_watch_without_a_relist(api: FakeApiServer, start) -> None:
    api.add_pod(make_pod("a"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    api.drop_connections()
    await eventually(lambda: len(api.watches) == 2 and api.open_watches == 1)
    b = api.add_pod(make_pod("b"))
    await eventually(lambda: uid_of(b) in metadata.names_by_uid())
    assert len(api.lists) == 1
    assert metadata.status == (True, "")


async def test_the_servers_watch_timeout_ends_the_stream_and_it_is_resumed(api: FakeApiServer, start) -> None:
    metadata = start(watch_timeout=0.5)  # timeoutSeconds=1: the fake ends the stream cleanly after 1 s
    await eventually(lambda: metadata.synced)
    await eventually(lambda: len(api.watches) == 2, timeout=2.5)
    assert api.watches[0].query["timeoutSeconds"] == "1"
    assert len(api.lists) == 1 and metadata.status == (True, "")


async def test_a_broken_event_relists(api: FakeApiServer, start, caplog: pytest.LogCaptureFixture) -> None:
    a = api.add_pod(make_pod("a"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    api.send_raw(b'{"type": "ADDED", "object": {"metadata": {"name": 7}}}\n')
    await eventually(lambda: len(api.lists) == 2 and api.open_watches == 1)
    assert any("bad event" in m for m in warnings(caplog))
    assert set(metadata.names_by_uid()) == {uid_of(a)}
    await eventually(lambda: metadata.status == (True, ""))


# -- failures ------------------------------------------------------------------------------------------------
async def test_server_down_then_back_recovers_with_capped_backoff(
    api: FakeApiServer, start, caplog: pytest.LogCaptureFixture
) -> None:
    a = api.add_pod(make_pod("a"))
    metadata = start(relist_backoff=0.05, max_backoff=0.2)
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    await asyncio.sleep(0.25)  # the watch has proved healthy (up for max_backoff): its loss is resumed at once
    await api.stop()
    await eventually(lambda: not metadata.status[0])
    error = metadata.status[1]
    assert error.startswith(f"API server unreachable: pods watch on node {NODE}")
    assert set(metadata.names_by_uid()) == {uid_of(a)}  # kept while away
    await asyncio.sleep(1.6)  # uncapped, the next retry would now be 1.6 s away (0.05 * 2**5)
    b = api.add_pod(make_pod("b"))
    back = time.monotonic()
    await api.start()
    await eventually(lambda: metadata.status == (True, "") and uid_of(b) in metadata.names_by_uid(), timeout=5.0)
    # within one capped retry (0.2 s, plus whatever a loaded machine adds), long before the 1.6 s that an
    # uncapped backoff would wait
    assert time.monotonic() - back < 1.0
    assert len(warnings(caplog)) == 1 and "unreachable" in warnings(caplog)[0]  # logged once, not per retry
    assert any("answers again" in r.getMessage() for r in caplog.records if r.name == LOGGER)


async def test_backoff_grows_and_is_capped(api: FakeApiServer, start) -> None:
    api.fail_next(500, times=6)
    metadata = start(relist_backoff=0.05, max_backoff=0.4)
    await eventually(lambda: metadata.synced, timeout=15.0)
    times = [r.at for r in api.lists]
    assert len(times) == 7
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Judged by lower bounds where it can be (a loaded machine only lengthens a wait), each wait at least
    # 0.75 of its backoff (the jitter): it doubles, 0.05, 0.1, 0.2, 0.4 s ...
    assert all(g >= 0.75 * 0.05 * 2**k for k, g in enumerate(gaps[:4])), gaps
    # ... and stays at the cap: uncapped, the last wait would be 1.6 s (0.05 * 2**5), capped it is 0.4
    assert gaps[5] < 1.2, gaps


async def test_forbidden_is_reported_as_rbac_and_logged_once(
    api: FakeApiServer, start, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next(403, times=4)
    metadata = start()
    await eventually(lambda: not metadata.status[0] and "forbidden" in metadata.status[1])
    error = metadata.status[1]
    assert error.startswith(f"forbidden: pods list on node {NODE}")
    assert "RBAC" in error and 'cannot list resource "pods"' in error
    assert not metadata.synced
    await eventually(lambda: metadata.synced, timeout=10.0)
    assert len(api.lists) == 5  # retried every max_backoff
    assert metadata.status == (True, "")
    forbidden = [m for m in warnings(caplog) if "forbidden" in m]
    assert len(forbidden) == 1


async def test_forbidden_watch_keeps_the_view(api: FakeApiServer, start) -> None:
    a = api.add_pod(make_pod("a"))
    metadata = start()
    await eventually(lambda: metadata.synced and api.open_watches == 1)
    await asyncio.sleep(0.15)  # healthy: resumed at once when dropped, and that attempt is refused
    api.fail_next(403, times=1)
    api.drop_connections()
    await eventually(lambda: not metadata.status[0])
    assert metadata.status[1].startswith(f"forbidden: pods watch on node {NODE}")
    assert set(metadata.names_by_uid()) == {uid_of(a)}
    await eventually(lambda: metadata.status == (True, ""))


async def test_a_rejected_token_is_unauthorized(api: FakeApiServer, start) -> None:
    metadata = start(config=api.kubeconfig(token="expired"))
    await eventually(lambda: metadata.status[1].startswith(f"unauthorized: pods list on node {NODE}"))
    assert "expired or invalid token" in metadata.status[1]
    assert api.requests[0].authorization == "Bearer expired"


async def test_no_configuration_is_a_status_not_an_exception(start) -> None:
    from lightkube import KubeConfig

    metadata = start(config=KubeConfig(clusters={}, contexts={}))  # no current context
    await eventually(lambda: metadata.status[1].startswith("no Kubernetes API configuration"))
    assert not metadata.synced


async def test_a_bug_is_reported_and_retried_not_raised(
    api: FakeApiServer, start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gpuagent.pods.metadata as module

    def broken(pod: object, owner: object = None) -> PodName:
        raise KeyError("surprise")

    api.add_pod(make_pod("a"))
    monkeypatch.setattr(module, "pod_name", broken)
    metadata = start()
    await eventually(lambda: metadata.status[1].startswith("internal error: KeyError"))
    await eventually(lambda: len(api.lists) >= 3)
    assert len([m for m in warnings(caplog) if "internal error" in m]) == 1  # with its traceback, once
    monkeypatch.undo()
    await eventually(lambda: metadata.synced and metadata.status == (True, ""))


async def test_a_shared_lightkube_client_is_used_and_left_open(api: FakeApiServer, start) -> None:
    import lightkube
    from lightkube.resources.core_v1 import Pod

    a = api.add_pod(make_pod("a"))
    client = lightkube.AsyncClient(config=api.kubeconfig())
    metadata = start(client=client, config=None)
    await eventually(lambda: uid_of(a) in metadata.names_by_uid())
    names = [p.metadata.name async for p in client.list(Pod, namespace="*", fields={"spec.nodeName": NODE})]
    assert names == ["a"]
    await client.close()


# -- cancellation and memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["watching", "backing off", "connecting"])
async def test_cancel_stops_run_promptly_and_leaves_no_tasks(api: FakeApiServer, where: str) -> None:
    baseline = asyncio.all_tasks()
    metadata = PodMetadata(NODE, config=api.kubeconfig(), relist_backoff=5.0, max_backoff=30.0)
    if where == "backing off":
        api.fail_next(500, times=1)
    if where == "connecting":
        await api.stop()
    task = asyncio.create_task(metadata.run())
    if where == "watching":
        await eventually(lambda: api.open_watches == 1)
    else:
        await eventually(lambda: not metadata.status[0] and metadata.status[1] != PodMetadata(NODE).status[1])
    began = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - began < 1.0
    # nothing of ours is left, and the fake's connection handlers end: the client closed its connections
    await eventually(lambda: asyncio.all_tasks() - baseline == set())


# Peak RSS from VmHWM: ru_maxrss would carry the forking parent's peak across exec.
RSS_PROBE = """
import asyncio, json, sys
import gpuagent.pods.metadata as m
url = sys.argv[1]
async def main():
    from lightkube import KubeConfig
    from lightkube.config.models import Cluster, User
    config = KubeConfig.from_one(cluster=Cluster(server=url), user=User(token="test-token"))
    pods = m.PodMetadata("gpu-node-1", config=config)
    task = asyncio.create_task(pods.run())
    while not pods.synced:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return len(pods.names_by_uid())
n = asyncio.run(main()) if url else 0
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"pods": n, "rss_mib": int(hwm.split()[1]) / 1024}))
"""


# -- owners ---------------------------------------------------------------------------------------------------
OWNERS_LOGGER = "gpuagent.pods.owners"


def owner_of(metadata: PodMetadata, pod: dict) -> tuple[str | None, str | None]:
    name = metadata.names_by_uid().get(pod["metadata"]["uid"])
    return (None, None) if name is None else (name.owner_kind, name.owner_name)


def known(metadata: PodMetadata, *pods: dict) -> Callable[[], bool]:
    return lambda: all(owner_of(metadata, p)[0] is not None for p in pods)


async def test_deployment_pods_are_owned_by_their_deployment_with_one_get_per_owner(
        api: FakeApiServer, start) -> None:
    web = make_owner("Deployment", "web", namespace="serving")
    rs = make_owner("ReplicaSet", "web-7d9c6b8f5d", namespace="serving", owner=web)
    api.add_owner(web)
    api.add_owner(rs)
    pods = [api.add_pod(make_pod(f"web-7d9c6b8f5d-{s}", namespace="serving", owner=rs)) for s in ("x2k4p", "b9m7q")]
    metadata = start()
    await eventually(known(metadata, *pods), timeout=5)
    assert {owner_of(metadata, p) for p in pods} == {("Deployment", "web")}
    assert sorted(r.path for r in api.owner_gets) == [
        "/apis/apps/v1/namespaces/serving/deployments/web",
        "/apis/apps/v1/namespaces/serving/replicasets/web-7d9c6b8f5d"]
    # a third replica, and a status change of the first: answered from the cache, no GET
    third = api.add_pod(make_pod("web-7d9c6b8f5d-q8w2z", namespace="serving", owner=rs))
    api.update_pod(pods[0]["metadata"]["uid"], lambda p: p["status"].update(podIP="10.0.0.9"))
    await eventually(known(metadata, third), timeout=5)
    assert owner_of(metadata, third) == ("Deployment", "web") and len(api.owner_gets) == 2
    assert all(r.authorization == "Bearer test-token" for r in api.owner_gets)
    assert all(r.query == {"resourceVersion": "0"} for r in api.owner_gets)  # the API server's cache


async def test_jobs_of_a_cronjob_statefulsets_of_a_notebook_and_other_controllers(
        api: FakeApiServer, start) -> None:
    nightly = make_owner("CronJob", "nightly-eval", namespace="research")
    job = make_owner("Job", "nightly-eval-29412000", namespace="research", owner=nightly)
    notebook = make_owner("Notebook", "alice", namespace="research", api_version="kubeflow.org/v1")
    sts = make_owner("StatefulSet", "alice", namespace="research", owner=notebook)
    ray = make_owner("RayCluster", "tune", namespace="research", api_version="ray.io/v1")
    plain_job = make_owner("Job", "etl-once", namespace="research")
    for obj in (job, sts, plain_job):
        api.add_owner(obj)
    cron_pod = api.add_pod(make_pod("nightly-eval-29412000-h7x2k", namespace="research", owner=job))
    nb_pod = api.add_pod(make_pod("alice-0", namespace="research", owner=sts))
    ray_pod = api.add_pod(make_pod("tune-worker-x8k2p", namespace="research", owner=ray))
    etl_pod = api.add_pod(make_pod("etl-once-4kq9z", namespace="research", owner=plain_job))
    bare = api.add_pod(make_pod("debug-shell", namespace="research", owner=None))
    mirror = api.add_pod(make_pod("dcgm-static", namespace="kube-system", mirror_of="0" * 32))
    metadata = start()
    await eventually(known(metadata, cron_pod, nb_pod, ray_pod, etl_pod, bare, mirror), timeout=5)
    assert owner_of(metadata, cron_pod) == ("CronJob", "nightly-eval")
    assert owner_of(metadata, nb_pod) == ("Notebook", "alice")
    assert owner_of(metadata, ray_pod) == ("RayCluster", "tune")  # a custom resource: not walked
    assert owner_of(metadata, etl_pod) == ("Job", "etl-once")
    assert owner_of(metadata, bare) == ("Pod", "debug-shell")  # no controller: itself
    assert owner_of(metadata, mirror) == ("Pod", "dcgm-static")  # its Node groups nothing
    # only what is walked is asked for: the Jobs and the StatefulSet, not the CronJob, Notebook or RayCluster
    assert sorted(r.path.split("/")[-2] for r in api.owner_gets) == ["jobs", "jobs", "statefulsets"]


async def test_the_view_never_waits_for_an_owner(api: FakeApiServer, start) -> None:
    rs = make_owner("ReplicaSet", "slow-5f6d7c8b9", namespace="ml", owner=make_owner("Deployment", "slow"))
    api.add_owner(rs)
    api.owner_delay = 0.5
    pod = api.add_pod(make_pod("slow-5f6d7c8b9-abcde", namespace="ml", owner=rs))
    metadata = start()
    await eventually(lambda: metadata.synced, timeout=5)
    assert owner_of(metadata, pod) == (None, None)  # named at once; its owner being asked
    await eventually(known(metadata, pod), timeout=5)
    # the Deployment itself is not served: the walk ends at the last owner it knows
    assert owner_of(metadata, pod) == ("Deployment", "slow")


async def test_forbidden_keeps_the_direct_owner_says_rbac_once_and_retries(
        api: FakeApiServer, start, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=OWNERS_LOGGER)
    web = make_owner("Deployment", "web")
    rs = make_owner("ReplicaSet", "web-6c8d9f7b5", owner=web)
    api.add_owner(web)
    api.add_owner(rs)
    api.fail_owner_gets(403, times=3)
    pods = [api.add_pod(make_pod(f"web-6c8d9f7b5-{s}", owner=rs)) for s in ("a2b4c", "d5f6g", "h7j8k")]
    resolver = OwnerResolver(retry_after=0.2)
    metadata = start(owners=resolver)
    await eventually(known(metadata, *pods), timeout=10)
    assert {owner_of(metadata, p) for p in pods} == {("ReplicaSet", "web-6c8d9f7b5")}
    # retried after retry_after as pods keep asking (each change a chance): past the third 403 the walk
    # succeeds. Changes keep coming until it has (a busy machine may fold several into one retry).
    for attempt in range(200):
        if owner_of(metadata, pods[0]) == ("Deployment", "web"):
            break
        await asyncio.sleep(0.25)
        api.update_pod(pods[0]["metadata"]["uid"], lambda p, a=attempt: p["metadata"]["labels"].update(n=str(a)))
    await eventually(lambda: owner_of(metadata, pods[0]) == ("Deployment", "web"), timeout=10)
    await eventually(lambda: {owner_of(metadata, p) for p in pods} == {("Deployment", "web")}, timeout=10)
    warned = [r.getMessage() for r in caplog.records if r.name == OWNERS_LOGGER and r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "RBAC must allow get on replicasets (apps)" in warned[0], warned
    assert any("answers the owners' GETs again" in r.getMessage() for r in caplog.records)


@pytest.mark.integration
async def test_listing_200_pods_costs_little_memory(api: FakeApiServer) -> None:
    for i in range(200):
        api.add_pod(make_pod(f"job-{i}", containers=("main", "sidecar")))
    prelude = "import aiohttp, prometheus_client, yaml\n"  # what the agent has loaded anyway

    async def probe(url: str) -> dict:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", prelude + RSS_PROBE, url, cwd=REPO, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return json.loads(out)

    await probe(api.url)  # once unmeasured: a fresh checkout's first import compiles every module (bytecode
    # written beside it), which raised this process's peak by several MiB that no agent pays twice
    bare, listed = await probe(""), await probe(api.url)
    assert listed["pods"] == 200
    # lightkube (config, httpx2, models) plus the slim decode of 200 full pods (~2 MB of JSON)
    assert listed["rss_mib"] - bare["rss_mib"] < 20, (bare, listed)
