"""Pods' owners: the resolver's cache and bounds, and ``gpuagent_pod_info``'s ``owner_kind``/``owner_name``.
The walk through the API server (a real HTTP fake of it) is tested with the watcher, in test_metadata.py."""

from __future__ import annotations

import asyncio

import pytest
from fake_apiserver import eventually, make_owner, owner_ref

from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_text
from gpuagent.pods.attribution import PodName, attribute
from gpuagent.pods.owners import Owner, OwnerRef, OwnerResolver
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus


async def test_the_cache_is_bounded_and_forgets_the_least_recently_used() -> None:
    resolver = OwnerResolver(max_entries=2)
    refs = [OwnerRef("apps/v1", "ReplicaSet", f"rs-{i}", f"uid-{i}") for i in range(3)]
    assert [resolver.owner("ns", r) for r in refs] == [None, None, None]
    assert len(resolver._wanted) == 2  # more than max_entries pending: asked again on the next look

    class Http:  # what the resolver uses of httpx2.AsyncClient: get(path) -> a 404 response
        async def get(self, path: str, params: object = None) -> object:
            return type("R", (), {"status_code": 404, "content": b"{}"})()

    resolved: list[str] = []
    task = asyncio.create_task(resolver.run(Http(), resolved.append))  # type: ignore[arg-type]
    await eventually(lambda: len(resolved) == 2, timeout=5)
    assert resolver.owner("ns", refs[2]) is None  # now it is asked
    await eventually(lambda: len(resolved) == 3, timeout=5)
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
