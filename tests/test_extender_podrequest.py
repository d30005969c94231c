"""The GPU request of a Pod as kube-scheduler sends it (``gpuagent.hints.podrequest``)."""

from __future__ import annotations

from typing import Any

import pytest
from fixture_files import filter_request

from gpuagent.hints.malformed import MalformedPod
from gpuagent.hints.podrequest import (
    PodRequestError,
    gpu_counts,
    pod_fit_request,
    pod_name,
)
from gpuagent.hints.score import FitRequest


@pytest.fixture
def pod() -> dict[str, Any]:
    """The fixture's Burstable pod: one container, nvidia.com/gpu: 1 in requests and limits."""
    return filter_request()["Pod"]


def _with(pod: dict[str, Any], annotations: dict[str, str] | None = None, **resources: Any) -> dict[str, Any]:
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    if resources:
        pod["spec"]["containers"][0]["resources"] = resources
    return pod


def test_the_fixture_pod_asks_for_one_exclusive_gpu(pod: dict) -> None:
    # Its annotations are another vendor's (gpu-agent.example.com/*): not ours, ignored.
    assert pod_fit_request(pod) == FitRequest(gpus=1, exclusive=True, policy="binpack")
    assert pod_name(pod) == "ml-team/llm-train-7d9c6b8f5d-x2kqp"


def test_share_memory_and_placement_annotations(pod: dict) -> None:
    _with(pod, {"gpuagent.io/gpu-share": "30%", "gpuagent.io/gpu-memory": "8Gi",
                "gpuagent.io/placement": "spread", "gpuagent.io/priority": "high"})
    request = pod_fit_request(pod)
    assert request == FitRequest(gpus=1, memory_bytes=8 * 2**30, share=0.3, exclusive=False, policy="spread")


def test_memory_without_share_is_still_an_exclusive_gpu(pod: dict) -> None:
    _with(pod, {"gpuagent.io/gpu-memory": "20G"})
    assert pod_fit_request(pod) == FitRequest(gpus=1, memory_bytes=20 * 10**9, exclusive=True)


def test_a_pod_without_gpus_is_none(pod: dict) -> None:
    _with(pod, {"gpuagent.io/gpu-share": "not even parsed"}, limits={"cpu": "2"}, requests={"cpu": "1"})
    assert pod_fit_request(pod) is None
    del pod["spec"]["containers"][0]["resources"]
    assert pod_fit_request(pod) is None


def test_containers_sum_and_init_containers_take_the_max(pod: dict) -> None:
    second = {"name": "second", "resources": {"limits": {"nvidia.com/gpu": "2"}}}  # requests default from limits
    pod["spec"]["containers"].append(second)
    assert gpu_counts(pod).by_resource == {"nvidia.com/gpu": 3}
    pod["spec"]["initContainers"] = [{"name": "warmup", "resources": {"requests": {"nvidia.com/gpu": "4"},
                                                                      "limits": {"nvidia.com/gpu": "4"}}}]
    assert gpu_counts(pod).by_resource == {"nvidia.com/gpu": 4}  # max(3, 4)
    pod["spec"]["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    assert gpu_counts(pod).by_resource == {"nvidia.com/gpu": 3}  # max(3, 1)
    assert pod_fit_request(pod).gpus == 3  # type: ignore[union-attr]


def test_sidecar_init_containers_add_to_the_app_containers(pod: dict) -> None:
    # restartPolicy: Always makes an init container a sidecar: it runs beside the app containers, and beside
    # every init container after it.
    pod["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
    ]
    # app: 1 + sidecar 1 = 2; warmup runs with the sidecar: 2 + 1 = 3
    assert gpu_counts(pod).by_resource == {"nvidia.com/gpu": 3}


def test_configured_resource_names_count_as_gpus(pod: dict) -> None:
    _with(pod, limits={"nvidia.com/gpu.shared": "1"})
    assert pod_fit_request(pod) is None
    request = pod_fit_request(pod, gpu_resource_names=("nvidia.com/gpu", "nvidia.com/gpu.shared"))
    assert request is not None and request.gpus == 1


def test_mig_resources_name_the_profile(pod: dict) -> None:
    _with(pod, limits={"nvidia.com/mig-1g.10gb": "2"}, requests={"nvidia.com/mig-1g.10gb": "2"})
    assert pod_fit_request(pod) == FitRequest(gpus=2, mig_profile="1g.10gb", exclusive=False)


@pytest.mark.parametrize(
    ("annotations", "resources", "field", "words"),
    [
        ({"gpuagent.io/gpu-share": "0.5"}, None, 'annotations["gpuagent.io/gpu-share"]', "ambiguous"),
        ({"gpuagent.io/gpu-share": "150%"}, None, 'annotations["gpuagent.io/gpu-share"]', "(0, 100]"),
        ({"gpuagent.io/gpu-memory": "8GB"}, None, 'annotations["gpuagent.io/gpu-memory"]', "did you mean"),
        ({"gpuagent.io/gpu-memory": "512m"}, None, 'annotations["gpuagent.io/gpu-memory"]', "milli"),
        ({"gpuagent.io/placement": "pack"}, None, 'annotations["gpuagent.io/placement"]', "binpack or spread"),
        ({"gpuagent.io/gpu-share": "30"}, {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
         'annotations["gpuagent.io/gpu-share"]', "MIG instance"),
        ({}, {"limits": {"nvidia.com/mig-9g.1tb": "1"}}, "Pod.spec", "unknown MIG profile"),
        ({}, {"limits": {"nvidia.com/gpu": "0.5"}}, 'limits["nvidia.com/gpu"]', "whole number"),
        ({}, {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}},
         'requests["nvidia.com/gpu"]', "differs from limit"),
        ({}, {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}}, "Pod.spec", "more than one kind"),
        ({}, {"limits": {"nvidia.com/gpu": "65"}}, "Pod.spec", "from 1 to 64"),
    ],
)
def test_bad_values_are_reported_naming_the_field(
    pod: dict, annotations: dict, resources: dict | None, field: str, words: str
) -> None:
    pod["metadata"]["annotations"] = annotations
    if resources is not None:
        pod["spec"]["containers"][0]["resources"] = resources
    with pytest.raises(PodRequestError) as info:
        pod_fit_request(pod)
    assert field in info.value.field
    assert words in info.value.message


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.pop("spec"), "Pod.spec"),
        (lambda p: p["spec"].update(containers=[]), "Pod.spec.containers"),
        (lambda p: p["spec"].update(containers={"a": 1}), "Pod.spec.containers"),
        (lambda p: p["spec"]["containers"].append("x"), "Pod.spec.containers[1]"),
        (lambda p: p["spec"]["containers"][0].update(resources=[]), "Pod.spec.containers[0].resources"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits="1"),
         "Pod.spec.containers[0].resources.limits"),
        (lambda p: p["spec"].update(initContainers=7), "Pod.spec.initContainers"),
        (lambda p: p["metadata"].update(annotations=["a"]), "Pod.metadata.annotations"),
    ],
)
def test_a_body_that_is_not_a_pod_is_malformed(pod: dict, mutate: Any, field: str) -> None:
    mutate(pod)
    with pytest.raises(MalformedPod) as info:
        pod_fit_request(pod)
    assert info.value.field == field


def test_a_non_string_annotation_is_reported(pod: dict) -> None:
    pod["metadata"]["annotations"] = {"gpuagent.io/gpu-share": 30}
    with pytest.raises(PodRequestError, match="expected a string"):
        pod_fit_request(pod)
