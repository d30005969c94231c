"""The extender and pods asking for GPUs through DRA ResourceClaims: the claim specs it understands, what it
passes unjudged and why, its reads from the (fake) API server, and a DRA pod scheduled against a simulated
DRA node as a device-plugin pod is."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_apiserver import FakeApiServer, make_claim, make_claim_template
from fixture_files import filter_request
from test_dra_agent import node, node_snapshot  # noqa: F401 (node is a fixture)
from test_extender import KNOWN, NODES, VirtualAgents, agents, all_free  # noqa: F401 (agents is a fixture)

from gpuagent.hints.agents import AgentCache, AgentDirectory
from gpuagent.hints.claim_reader import ClaimReader
from gpuagent.hints.claims import ClaimGpus, ClaimRef, Unjudged, claim_refs, object_gpus, spec_gpus
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_app import build_app, build_registry
from gpuagent.hints.extender_config import load_options
from gpuagent.hints.extender_serve import claim_reader
from gpuagent.hints.malformed import MalformedPod
from gpuagent.hints.podrequest import PodRequestError, pod_fit_request
from gpuagent.hints.score import FitRequest
from gpuagent.kubeapi import ApiConnection


def whole(count: int | None = None, device_class: str = "gpu.nvidia.com", **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if count is not None:
        exactly["count"] = count
    return {"name": "gpu", "exactly": exactly}


def mig(expression: str, **extra: Any) -> dict[str, Any]:
    return {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com",
                                       "selectors": [{"cel": {"expression": expression}}], **extra}}


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def dra_pod(*claims: dict[str, str], gpus: int = 0, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The fixture pod, its nvidia.com/gpu request replaced by ResourceClaims (``gpus`` keeps some)."""
    pod = copy.deepcopy(filter_request()["Pod"])
    container = pod["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}
    container["resources"]["claims"] = [{"name": c["name"]} for c in claims]
    pod["spec"]["resourceClaims"] = list(claims)
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


# -- claim specs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("requests", "expected"), [
    ([whole()], {None: 1}),
    ([whole(2), whole(1)], {None: 3}),
    ([{"name": "old", "deviceClassName": "gpu.nvidia.com", "count": 2}], {None: 2}),  # v1beta1's shape
    ([mig("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")], {"1g.10gb": 1}),
    ([mig('device.attributes["gpu.nvidia.com"].type == "mig" && device.attributes["gpu.nvidia.com"].profile'
          ' == "3g.40gb"', count=2)], {"3g.40gb": 2}),
    ([mig("'2g.20gb' == device.attributes['gpu.nvidia.com'].profile")], {"2g.20gb": 1}),
    ([mig("device.attributes['gpu.nvidia.com'].profile == '1g.10gb+me'")], {"1g.10gb+me": 1}),
    ([whole(device_class="dra.net"), whole(1, allocationMode="ExactCount")], {None: 1}),  # a NIC: not ours
    ([whole(4, adminAccess=True)], {}),  # monitoring access, not an allocation
    ([{"name": "nic", "firstAvailable": [{"name": "a", "deviceClassName": "dra.net"}]}], {}),
    ([whole(1, selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == "
                                                 "'NVIDIA H100 80GB HBM3'"}}])], {None: 1}),
])
def test_what_a_claim_asks_for(requests: list, expected: dict) -> None:
    assert spec_gpus(spec(*requests), "ResourceClaim ml/x").by_kind == expected


@pytest.mark.parametrize(("request_", "category", "fragment"), [
    (whole(allocationMode="All"), "all_devices", "request gpu: allocationMode All: as many GPUs as match"),
    ({"name": "pick", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"},
                                         {"name": "small", "deviceClassName": "mig.nvidia.com"}]},
     "first_available", "request pick: firstAvailable among GPU alternatives"),
    (mig("device.attributes['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0"), "mig_profile",
     "selectors name no profile"),
    ({"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}},
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '2g.20gb'"}}]}},
     "mig_profile", "name 2 profiles (1g.10gb, 2g.20gb)"),
    (whole(0), "unreadable", "count 0 is not a whole number >= 1"),
])
def test_what_cannot_be_judged_says_why(request_: dict, category: str, fragment: str) -> None:
    with pytest.raises(Unjudged) as info:
        spec_gpus(spec(request_), "ResourceClaimTemplate ml/t")
    assert info.value.category == category and fragment in info.value.reason
    assert info.value.reason.startswith("ResourceClaimTemplate ml/t request ")


def test_an_allocated_claim_and_a_template_object() -> None:
    ref = ClaimRef("resourceclaims", "ml", "shared", "Pod.spec.resourceClaims[0]")
    with pytest.raises(Unjudged, match="ResourceClaim ml/shared is already allocated: its devices") as info:
        object_gpus(ref, make_claim("shared", [whole()], namespace="ml", allocated_on="node-1"))
    assert info.value.category == "allocated"
    assert object_gpus(ref, make_claim("shared", [whole(2)], namespace="ml")).by_kind == {None: 2}
    template = ClaimRef("resourceclaimtemplates", "ml", "two", "Pod.spec.resourceClaims[0]")
    assert object_gpus(template, make_claim_template("two", [whole(2)], namespace="ml")).by_kind == {None: 2}
    with pytest.raises(Unjudged, match="no claim spec"):
        object_gpus(template, {"kind": "ResourceClaimTemplate", "spec": {}})


@pytest.mark.parametrize(("claims", "field", "message"), [
    ("gpu", "Pod.spec.resourceClaims", "expected a list of PodResourceClaims, got 'gpu'"),
    (["gpu"], "Pod.spec.resourceClaims[0]", "expected a PodResourceClaim object"),
    ([{"name": "gpu"}], "Pod.spec.resourceClaims[0]", "exactly one of resourceClaimName"),
    ([{"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}], "Pod.spec.resourceClaims[0]",
     "exactly one of"),
    ([{"name": "gpu", "resourceClaimName": 7}], "Pod.spec.resourceClaims[0]", "expected a claim or template name"),
])
def test_malformed_resource_claims_name_the_field(claims: Any, field: str, message: str) -> None:
    pod = dra_pod()
    pod["spec"]["resourceClaims"] = claims
    with pytest.raises(MalformedPod) as info:
        claim_refs(pod)
    assert info.value.field == field and message in info.value.message


def test_claim_refs_read_both_forms() -> None:
    pod = dra_pod({"name": "a", "resourceClaimTemplateName": "single-gpu"}, {"name": "b", "resourceClaimName": "s"})
    assert [(r.kind, r.namespace, r.name) for r in claim_refs(pod)] == [
        ("resourceclaimtemplates", "ml-team", "single-gpu"), ("resourceclaims", "ml-team", "s")]


# -- the pod's request ----------------------------------------------------------------------------------------
def test_claims_are_counted_like_resources() -> None:
    pod = dra_pod({"name": "a", "resourceClaimTemplateName": "t"}, annotations={"gpuagent.io/gpu-share": "30"})
    assert pod_fit_request(pod, claims=ClaimGpus({None: 2})) == FitRequest(gpus=2, share=0.3, policy="binpack")
    mig_pod = dra_pod({"name": "a", "resourceClaimTemplateName": "t"}, annotations={})
    assert pod_fit_request(mig_pod, claims=ClaimGpus({"1g.10gb": 1})) == FitRequest(
        gpus=1, mig_profile="1g.10gb", policy="binpack")
    assert pod_fit_request(pod, claims=ClaimGpus({})) is None  # a NIC claim: no GPU asked for
    plus_plugin = dra_pod({"name": "a", "resourceClaimTemplateName": "t"}, gpus=1)
    assert pod_fit_request(plus_plugin, claims=ClaimGpus({None: 1})) == FitRequest(
        gpus=2, exclusive=True, policy="binpack")
    with pytest.raises(PodRequestError, match=r"more than one kind of GPU device \(nvidia.com/gpu, "
                                              r"ResourceClaims: 1g.10gb\)"):
        pod_fit_request(plus_plugin, claims=ClaimGpus({"1g.10gb": 1}))
    with pytest.raises(PodRequestError) as info:
        pod_fit_request(pod, claims=ClaimGpus({None: 99}))
    assert info.value.field == "Pod.spec.resourceClaims"


# -- reading claims from the API server -----------------------------------------------------------------------

@pytest.fixture
async def reader(api: FakeApiServer) -> AsyncIterator[ClaimReader]:
    made = ClaimReader(ApiConnection(config=api.kubeconfig()), timeout=1.0)
    yield made
    await made.close()


async def test_templates_and_claims_are_read_and_cached(api: FakeApiServer, reader: ClaimReader) -> None:
    api.add_claim_template(make_claim_template("single-gpu", [whole()], namespace="ml-team"))
    api.add_claim(make_claim("shared-mig", [mig("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")],
                             namespace="ml-team"))
    pod = dra_pod({"name": "a", "resourceClaimTemplateName": "single-gpu"})
    assert (await reader.pod_gpus(pod)).by_kind == {None: 1}
    assert api.owner_gets[-1].path == "/apis/resource.k8s.io/v1/namespaces/ml-team/resourceclaimtemplates/single-gpu"
    both = dra_pod({"name": "a", "resourceClaimTemplateName": "single-gpu"},
                   {"name": "b", "resourceClaimName": "shared-mig"})
    assert (await reader.pod_gpus(both)).by_kind == {None: 1, "1g.10gb": 1}
    assert reader.reads == 2  # the template came from the cache
    # concurrent calls for one object share one read
    many = await asyncio.gather(*(reader.pod_gpus(dra_pod({"name": "c", "resourceClaimName": "fresh"}))
                                  for _ in range(5)), return_exceptions=True)
    assert reader.reads == 3 and all(isinstance(m, Unjudged) for m in many)
    assert "ResourceClaim ml-team/fresh does not exist (yet)" in str(many[0])
    assert await reader.pod_gpus(filter_request()["Pod"]) is None  # no claims: nothing read


async def test_reads_that_fail_are_unjudged_with_the_reason(api: FakeApiServer, reader: ClaimReader) -> None:
    api.fail_owner_gets(403)
    with pytest.raises(Unjudged) as info:
        await reader.pod_gpus(dra_pod({"name": "a", "resourceClaimTemplateName": "t"}))
    assert info.value.category == "unreadable"
    assert info.value.reason.startswith("cannot read ResourceClaimTemplate ml-team/t: forbidden: RBAC must allow "
                                        "get on resourceclaimtemplates (API group resource.k8s.io)")
    await api.stop()
    gone = ClaimReader(ApiConnection(config=api.kubeconfig()), timeout=0.5)
    try:
        with pytest.raises(Unjudged, match="cannot read ResourceClaim ml-team/x: ConnectError"):
            await gone.pod_gpus(dra_pod({"name": "a", "resourceClaimName": "x"}))
    finally:
        await gone.close()


async def test_without_api_access_a_pod_with_claims_is_unjudged() -> None:
    reader = ClaimReader(None)
    with pytest.raises(Unjudged) as info:
        await reader.pod_gpus(dra_pod({"name": "a", "resourceClaimName": "x"}))
    assert info.value.category == "no_api" and "no API server access" in info.value.reason


def test_claim_reader_follows_the_options(tmp_path) -> None:
    off = claim_reader(load_options(None, env={}, overrides={"kubernetes_api": "off"}))
    assert off._connection is None
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    on = claim_reader(load_options(None, env={}, overrides={"kubeconfig": str(kubeconfig),
                                                           "gpu_device_classes": "gpu.example.com",
                                                           "mig_device_classes": "none"}))
    assert on._connection is not None and on._gpu_classes == ("gpu.example.com",) and on._mig_classes == ()


# -- the extender, end to end -----------------------------------------------------------------------------------
async def extender_on(
    virtual: VirtualAgents, api: FakeApiServer | None
) -> tuple[Extender, TestClient, AgentCache]:
    directory = AgentDirectory(template=virtual.base_url + "/n/{node}", urls={})
    cache = AgentCache(directory, timeout_seconds=1.0, refresh_interval_seconds=5.0, known=KNOWN)
    claims = ClaimReader(ApiConnection(config=api.kubeconfig()) if api is not None else None)
    extender = Extender(cache, claims=claims)
    registry = build_registry(extender)
    await cache.start()
    client = TestClient(TestServer(build_app(extender, registry, prefix="/gpu"), host="127.0.0.1"))
    await client.start_server()
    return extender, client, cache


async def test_a_dra_pod_is_scheduled_as_a_device_plugin_pod_on_a_simulated_dra_node(
    node, agents: VirtualAgents, api: FakeApiServer, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """The agent of a simulated node whose whole GPUs are all held (three of them through DRA claims) and
    whose MIG GPU has an idle 3g.40gb instance, next to an empty node: a pod asking for a whole GPU through
    a ResourceClaimTemplate gets exactly the verdicts a pod asking for nvidia.com/gpu gets."""
    caplog.set_level(logging.INFO, logger="gpuagent.hints.extender")
    snapshot = await node_snapshot(node)
    assert snapshot.hints is not None
    dra_node, empty = NODES[0], NODES[1]
    agents.hints[dra_node] = snapshot.hints
    agents.hints[empty] = all_free(empty)
    api.add_claim_template(make_claim_template("single-gpu", [whole()], namespace="ml-team"))
    api.add_claim_template(make_claim_template(
        "mig-3g", [mig("device.attributes['gpu.nvidia.com'].profile == '3g.40gb'")], namespace="ml-team"))
    api.add_claim_template(make_claim_template("all-gpus", [whole(allocationMode="All")], namespace="ml-team"))
    extender, client, cache = await extender_on(agents, api)
    try:
        async def verdicts(pod: dict[str, Any]) -> tuple[dict, dict]:
            body = filter_request()
            body["Pod"], body["NodeNames"] = pod, [dra_node, empty]
            filtered = await (await client.post("/gpu/filter", json=body)).json()
            scores = await (await client.post("/gpu/prioritize", json=body)).json()
            return filtered, {s["Host"]: s["Score"] for s in scores}

        plugin_filter, plugin_scores = await verdicts(filter_request()["Pod"])  # nvidia.com/gpu: 1
        dra_filter, dra_scores = await verdicts(dra_pod({"name": "gpu", "resourceClaimTemplateName": "single-gpu"}))
        assert dra_filter == plugin_filter and dra_scores == plugin_scores
        assert dra_filter["NodeNames"] == [empty]
        assert dra_filter["FailedNodes"][dra_node].startswith("gpuagent: needs 1 GPUs, 0 can take it")

        mig_filter, _ = await verdicts(dra_pod({"name": "m", "resourceClaimTemplateName": "mig-3g"}))
        assert mig_filter["NodeNames"] == [dra_node]  # the idle 3g.40gb instance; the empty node has no MIG

        unjudged_filter, unjudged_scores = await verdicts(dra_pod({"name": "g", "resourceClaimTemplateName": "all-gpus"}))
        assert unjudged_filter["NodeNames"] == [dra_node, empty] and set(unjudged_scores.values()) == {0}
        logged = [r.getMessage() for r in caplog.records if "without judging" in r.getMessage()]
        assert logged == ["pod ml-team/llm-train-7d9c6b8f5d-x2kqp passed on every node without judging its GPU "
                          "claims: ResourceClaimTemplate ml-team/all-gpus request gpu: allocationMode All: as many "
                          "GPUs as match on the node, which kube-scheduler's DRA plugin decides"]  # once
        metrics = await (await client.get("/metrics")).text()
        assert 'gpuagent_extender_pods_unjudged_total{reason="all_devices",verb="filter"} 1.0' in metrics
        assert 'gpuagent_extender_pods_unjudged_total{reason="all_devices",verb="prioritize"} 1.0' in metrics
        # a malformed resourceClaims is a 400 naming the field, as any malformed pod
        bad = dra_pod({"name": "gpu"})
        body = filter_request()
        body["Pod"] = bad
        response = await client.post("/gpu/filter", json=body)
        assert response.status == 400
        assert (await response.json())["field"] == "Pod.spec.resourceClaims[0]"
    finally:
        await client.close()
        await cache.close()
        await extender.claims.close()
