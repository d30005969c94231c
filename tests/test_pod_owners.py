"""Pods' owners: the controller chain walked through the API server (a real HTTP fake of it), cached,
bounded, never waited for; and ``gpuagent_pod_info``'s ``owner_kind``/``owner_name`` labels."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
from fake_apiserver import NODE, FakeApiServer, make_owner, make_pod, owner_ref

from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.pods.attribution import PodName, attribute
from gpuagent.pods.metadata import PodMetadata
from gpuagent.pods.owners import Owner, OwnerRef, OwnerResolver
from gpuagent.snapshot import NodeSnapshot, SourceStatus

FAST = {"relist_backoff": 0.02, "max_backoff": 0.1}
LOGGER = "gpuagent.pods.owners"


async def eventually(predicate: Callable[[], object], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {predicate}")
        await asyncio.sleep(0.005)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def start(api: FakeApiServer):
    """start(**kwargs) -> a running PodMetadata for NODE against ``api``; cancelled at teardown."""
    tasks: list[asyncio.Task] = []

    def _start(**kwargs: object) -> PodMetadata:
        kwargs.setdefault("config", api.kubeconfig())
        for key, value in FAST.items():
            kwargs.setdefault(key, value)
        metadata = PodMetadata(NODE, **kwargs)  # type: ignore[arg-type]
        tasks.append(asyncio.create_task(metadata.run()))
        return metadata

    yield _start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


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
    await eventually(known(metadata, *pods))
    assert {owner_of(metadata, p) for p in pods} == {("Deployment", "web")}
    assert sorted(r.path for r in api.owner_gets) == [
        "/apis/apps/v1/namespaces/serving/deployments/web",
        "/apis/apps/v1/namespaces/serving/replicasets/web-7d9c6b8f5d"]
    # a third replica, and a status change of the first: answered from the cache, no GET
    third = api.add_pod(make_pod("web-7d9c6b8f5d-q8w2z", namespace="serving", owner=rs))
    api.update_pod(pods[0]["metadata"]["uid"], lambda p: p["status"].update(podIP="10.0.0.9"))
    await eventually(known(metadata, third))
    assert owner_of(metadata, third) == ("Deployment", "web") and len(api.owner_gets) == 2
    assert all(r.authorization == "Bearer test-token" for r in api.owner_gets)


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
    await eventually(known(metadata, cron_pod, nb_pod, ray_pod, etl_pod, bare, mirror))
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
    await eventually(lambda: metadata.synced)
    assert owner_of(metadata, pod) == (None, None)  # named at once; its owner being asked
    await eventually(known(metadata, pod), timeout=3.0)
    # the Deployment itself is not served: the walk ends at the last owner it knows
    assert owner_of(metadata, pod) == ("Deployment", "slow")


async def test_forbidden_keeps_the_direct_owner_says_rbac_once_and_retries(
        api: FakeApiServer, start, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    web = make_owner("Deployment", "web")
    rs = make_owner("ReplicaSet", "web-6c8d9f7b5", owner=web)
    api.add_owner(web)
    api.add_owner(rs)
    api.fail_owner_gets(403, times=3)
    pods = [api.add_pod(make_pod(f"web-6c8d9f7b5-{s}", owner=rs)) for s in ("a2b4c", "d5f6g", "h7j8k")]
    resolver = OwnerResolver(retry_after=0.2)
    metadata = start(owners=resolver)
    await eventually(known(metadata, *pods))
    assert {owner_of(metadata, p) for p in pods} == {("ReplicaSet", "web-6c8d9f7b5")}
    # retried after retry_after (pods keep asking as they change); the third 403, then the walk succeeds
    for attempt in range(3):
        await asyncio.sleep(0.25)
        api.update_pod(pods[0]["metadata"]["uid"], lambda p, a=attempt: p["metadata"]["labels"].update(n=str(a)))
    await eventually(lambda: owner_of(metadata, pods[0]) == ("Deployment", "web"), timeout=3.0)
    await eventually(lambda: {owner_of(metadata, p) for p in pods} == {("Deployment", "web")})
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "RBAC must allow get on replicasets (apps)" in warned[0], warned
    assert any("answers the owners' GETs again" in r.getMessage() for r in caplog.records)


async def test_the_cache_is_bounded_and_forgets_the_least_recently_used() -> None:
    resolver = OwnerResolver(max_entries=2)
    refs = [OwnerRef("apps/v1", "ReplicaSet", f"rs-{i}", f"uid-{i}") for i in range(3)]
    assert [resolver.owner("ns", r) for r in refs] == [None, None, None]
    assert len(resolver._wanted) == 2  # more than max_entries pending: asked again on the next look

    class Http:  # what the resolver uses of httpx2.AsyncClient: get(path) -> a 404 response
        async def get(self, path: str) -> object:
            return type("R", (), {"status_code": 404, "content": b"{}"})()

    resolved: list[str] = []
    task = asyncio.create_task(resolver.run(Http(), resolved.append))  # type: ignore[arg-type]
    await eventually(lambda: len(resolved) == 2)
    assert resolver.owner("ns", refs[2]) is None  # now it is asked
    await eventually(lambda: len(resolved) == 3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(resolver._cache) == 2 and "uid-0" not in resolver._cache  # the oldest went
    assert resolver.owner("ns", refs[2]) == Owner("ReplicaSet", "rs-2")  # a 404: the direct owner
    assert resolver.owner("ns", OwnerRef("batch/v1", "CronJob", "c", "u")) == Owner("CronJob", "c")
    assert resolver.of_pod("ns", "p", None) == Owner("Pod", "p")
    with pytest.raises(ValueError, match="at least 1"):
        OwnerResolver(max_entries=0)


def test_pod_info_carries_the_owner() -> None:
    from test_attribution import Alloc, Ident, gpu

    names = {"uid-a": PodName("ml", "web-7d9c6b8f5d-x2k4p", {}, owner_kind="Deployment", owner_name="web"),
             "uid-b": PodName("ml", "pending-0", {})}
    out, pods = attribute([gpu(0, 10), gpu(1, 11)], {10: Ident("uid-a"), 11: Ident("uid-b")},
                          [Alloc("ml", "web-7d9c6b8f5d-x2k4p", "main", "GPU-0"), Alloc("ml", "pending-0", "main", "GPU-1")],
                          names)
    assert {(p.name, p.owner_kind, p.owner_name) for p in pods} == {
        ("web-7d9c6b8f5d-x2k4p", "Deployment", "web"), ("pending-0", None, None)}
    snapshot = NodeSnapshot(hostname="n", backend="sim", taken_at_unix=0.0, taken_at_monotonic=0.0,
                            poll_duration_seconds=0.0, gpus=out, pods=pods,
                            sources=(SourceStatus("nvml", True, 0.0), SourceStatus("pod_resources", True, 0.0)))
    body = generate_text(build_registry(lambda: snapshot, clock=lambda: 0.0)).decode()
    assert ('gpuagent_pod_info{namespace="ml",pod="web-7d9c6b8f5d-x2k4p",uid="uid-a",qos="burstable",names_from="api_server",'
            'owner_kind="Deployment",owner_name="web"} 1.0') in body
    assert 'pod="pending-0",uid="uid-b",qos="burstable",names_from="api_server",owner_kind="",owner_name=""} 1.0' in body


def test_owner_ref_of_the_fake_is_what_the_api_gives() -> None:
    web = make_owner("Deployment", "web")
    assert owner_ref(web) == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                              "uid": web["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
