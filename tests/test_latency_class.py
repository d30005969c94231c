"""The latency class wired into the agent (issue 29 item 3): who is in it, and what the agent does with it.

Who: a ``policies`` rule's ``latency_sensitive: true``, or a pod's ``gpuagent.io/latency-sensitive``
annotation as the operator's ``pod_annotations`` lets it count (preempting one's neighbours is raising one's
priority: under ``lower-only`` a pod may only leave the class); ``check-config`` names a bad value's key
path, and ``/v1/state`` shows the class and where it came from. What: a GPU with a latency pod gets a
:class:`LatencyController` around its rotation, and the preemption freezes the GPU's batch pods through the
cycler while the latency pod's ``cpu.stat`` moves (fake clocks and CPU readings here; real cgroups in
``test_latency_class_cgroups.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuagent import cli
from gpuagent.enforce.policy import (
    NodeDefaults,
    PolicyRule,
    PolicyValueError,
    limits_for_pod,
    parse_rules,
)
from gpuagent.snapshot import PodUse

LATENCY = "gpuagent.io/latency-sensitive"
SERVING = PolicyRule(match_namespace="serving", latency_sensitive=True)


def pod(namespace: str = "research", **annotations: str) -> PodUse:
    return PodUse(name="svc-0", namespace=namespace, annotations=annotations)


def asking(value: str, namespace: str = "research") -> PodUse:
    return pod(namespace, **{LATENCY: value})


# --- who is latency-sensitive ----------------------------------------------------------------------------


def test_a_rule_puts_its_pods_in_the_class_and_says_so_in_the_origins() -> None:
    limits, problems = limits_for_pod(pod("serving"), NodeDefaults(), [SERVING])
    assert limits.latency_sensitive is True and problems == ()
    assert dict(limits.origins)["latency_sensitive"] == "policies[0]"
    limits, _ = limits_for_pod(pod("research"), NodeDefaults(), [SERVING])
    assert limits.latency_sensitive is False
    assert dict(limits.origins)["latency_sensitive"] == "the node default"


def test_under_lower_only_a_pod_cannot_put_itself_in_the_class() -> None:
    limits, problems = limits_for_pod(asking("true"), NodeDefaults())
    assert limits.latency_sensitive is False
    [problem] = problems
    assert problem.annotation == LATENCY
    assert problem.message == (
        "refused: the latency class preempts the GPU's other pods, and the operator did not give it (the node "
        "default) while pod_annotations is lower-only here (the config's pod_annotations): an annotation may "
        "only leave it; using the node default instead (false)")


def test_under_lower_only_a_pod_may_leave_the_class_or_repeat_the_operators_word() -> None:
    limits, problems = limits_for_pod(asking("false", "serving"), NodeDefaults(), [SERVING])
    assert limits.latency_sensitive is False and problems == ()
    assert dict(limits.origins)["latency_sensitive"] == "annotation"
    limits, problems = limits_for_pod(asking("yes", "serving"), NodeDefaults(), [SERVING])
    assert limits.latency_sensitive is True and problems == ()


def test_under_any_the_annotation_counts_and_under_ignore_it_is_not_read() -> None:
    limits, problems = limits_for_pod(asking("true"), NodeDefaults(pod_annotations="any"))
    assert limits.latency_sensitive is True and problems == ()
    assert dict(limits.origins)["latency_sensitive"] == "annotation"
    limits, problems = limits_for_pod(asking("maybe"), NodeDefaults(pod_annotations="ignore"))
    assert limits.latency_sensitive is False
    assert [p.message.split(";")[0] for p in problems] == [
        "ignored: pod_annotations is ignore here (the config's pod_annotations)"]


def test_a_bad_annotation_value_is_a_problem_and_the_operators_value_stands() -> None:
    limits, problems = limits_for_pod(asking("sometimes", "serving"), NodeDefaults(pod_annotations="any"),
                                      [SERVING])
    assert limits.latency_sensitive is True
    assert problems[0].message.startswith("expected true or false (also yes/no, 1/0), got 'sometimes'")


def test_a_misspelt_annotation_gets_a_hint() -> None:
    _, problems = limits_for_pod(pod(**{"gpuagent.io/latency-sensitiv": "true"}), NodeDefaults())
    assert problems[0].message == f"unknown annotation, ignored: did you mean {LATENCY}?"


def test_rules_read_the_key_alone_or_beside_limits() -> None:
    rules = parse_rules([{"match_namespace": "serving", "latency_sensitive": True},
                         {"match_pod": "api-*", "latency_sensitive": "no", "gpu_share": 30}])
    assert [r.latency_sensitive for r in rules] == [True, False]


@pytest.mark.parametrize(("value", "fragment"), [
    ("sometimes", "expected true or false (also yes/no, 1/0), got 'sometimes'"),
    (2, "expected true or false (also yes/no, 1/0), got '2'"),
    ([True], "expected true or false"),
    (None, "expected true or false"),
])
def test_a_bad_rule_value_names_the_item_and_key(value: Any, fragment: str) -> None:
    with pytest.raises(PolicyValueError) as info:
        parse_rules([{"match_namespace": "a", "gpu_share": 10}, {"match_pod": "x", "latency_sensitive": value}])
    assert info.value.key_path == "policies[1].latency_sensitive"
    assert fragment in info.value.message


@pytest.mark.parametrize(("text", "fragment"), [
    ("policies:\n  - {match_namespace: a, latency_sensitive: often}\n",
     "policies[0].latency_sensitive: expected true or false (also yes/no, 1/0), got 'often'"),
    ("policies:\n  - {match_namespace: a, latency_sensitve: true}\n",
     "policies[0].latency_sensitve: unknown key; did you mean latency_sensitive?"),
])
def test_check_config_refuses_a_bad_key_or_value_naming_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, fragment: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert cli.main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: ") and fragment in err and len(err.splitlines()) == 1


def test_check_config_passes_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("policies:\n  - {match_namespace: serving, latency_sensitive: true, gpu_share: 30}\n")
    assert cli.main(["check-config", str(path)]) == 0, capsys.readouterr().err
