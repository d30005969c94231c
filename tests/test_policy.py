"""gpuagent.enforce.policy: annotation and rule parsing, precedence, problems with hints, rule matching."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuagent.enforce.policy import Limits, limits_for_pod, limits_for_workload
from gpuagent.enforce.rules import (
    NodeDefaults,
    PolicyRule,
    node_defaults,
    parse_bool,
    parse_priority,
    parse_rules,
)
from gpuagent.quantities import MEMORY_MAX_BYTES, PolicyValueError, parse_memory, parse_share
from gpuagent.snapshot.enforcement import PolicyProblem
from gpuagent.snapshot.pods import PodUse
from gpuagent.snapshot.processes import Workload

GI, MI = 2**30, 2**20


def pod(name: str = "train-0", namespace: str | None = "research", **annotations: str) -> PodUse:
    return PodUse(name=name, namespace=namespace, annotations=annotations)


def error_of(parse, value) -> str:
    with pytest.raises(PolicyValueError) as info:
        parse(value)
    return str(info.value)


# --- values -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ratio"), [
    ("30", 0.30), ("30%", 0.30), (" 30% ", 0.30), ("30.5%", 0.305), ("30.5", 0.305), ("100", 1.0),
    ("100%", 1.0), ("1", 0.01), ("0.5%", 0.005), (".5%", 0.005), ("5.", 0.05), ("007", 0.07),
])
def test_share_good(text: str, ratio: float) -> None:
    assert parse_share(text) == pytest.approx(ratio)


@pytest.mark.parametrize(("text", "fragment"), [
    ("130", "expected a percent in (0, 100] like 30 or 30%, got '130'"),
    ("0", "got '0'"),
    ("0%", "got '0%'"),
    ("-5", "got '-5'"),
    ("thirty", "got 'thirty'"),
    ("", "got ''"),
    ("30%%", "got '30%%'"),
    ("%30", "got '%30'"),
    ("1e1", "got '1e1'"),
    ("nan", "got 'nan'"),
    ("inf", "got 'inf'"),
    ("1_0", "got '1_0'"),
    ("\u0663\u0660", "expected a percent"),  # Arabic-Indic digits are not ours
    ("100.01", "got '100.01'"),
    ("0.5", "ambiguous share '0.5'"),  # half a percent, or half a GPU? Never guessed
    ("0.5", "write 50 for 50 percent of the GPU, or 0.5% for less than one percent"),
    ("x" * 500, "..."),
])
def test_share_bad(text: str, fragment: str) -> None:
    assert fragment in error_of(parse_share, text)


@pytest.mark.parametrize(("text", "size"), [
    ("8Gi", 8 * GI), ("512Mi", 512 * MI), ("8G", 8 * 10**9), ("8000M", 8 * 10**9), ("1.5Gi", 1536 * MI),
    ("8589934592", 8 * GI), ("1Ki", 1024), ("1k", 1000), ("2Ti", 2 * 2**40), ("3T", 3 * 10**12),
    ("1Pi", 2**50), ("1P", 10**15), ("7Ei", 7 * 2**60), ("1E", 10**18), ("+5Gi", 5 * GI), (" 8Gi ", 8 * GI),
    ("1e3", 1000), ("1E9", 10**9), ("2.5e9", 25 * 10**8), (".5Gi", 512 * MI), ("1.", 1),
    ("0.1Ki", 103),  # a fraction of a byte rounds up, as Kubernetes' Quantity.Value() does
    ("1.5", 2), (str(MEMORY_MAX_BYTES), MEMORY_MAX_BYTES),
])
def test_memory_good(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize(("text", "fragment"), [
    ("lots", "expected a Kubernetes memory quantity like 8Gi, 512Mi, 8G or plain bytes, got 'lots'"),
    ("-5Gi", "expected a memory size > 0, got '-5Gi'"),
    ("0", "expected a memory size > 0, got '0'"),
    ("0Gi", "> 0"),
    ("0e5", "> 0"),
    ("1e3Gi", "an exponent takes no suffix"),  # Kubernetes refuses it too
    ("512m", "'m' is milli, thousandths of a byte: did you mean 512Mi or 512M?"),
    ("8GB", "did you mean 8G or 8Gi?"),
    ("8gi", "did you mean 8Gi?"),
    ("8GiB", "did you mean 8Gi?"),
    ("8 Gi", "did you mean 8Gi?"),
    ("8K", "did you mean 8k or 8Ki?"),
    ("8Zi", "got '8Zi'"),
    ("", "got ''"),
    ("Gi", "got 'Gi'"),
    ("8Gi8", "got '8Gi8'"),
    ("1,5Gi", "got '1,5Gi'"),
    (".5", "at least one byte"),
    ("1e-9999999", "at least one byte"),
    ("8Ei", f"at most {MEMORY_MAX_BYTES} bytes"),
    ("1e999999999", f"at most {MEMORY_MAX_BYTES} bytes"),
    ("9" * 64, "at most"),
    ("9" * 65, "..."),
    ("inf", "got 'inf'"),
    ("\u0668Gi", "expected a Kubernetes memory quantity"),
])
def test_memory_bad(text: str, fragment: str) -> None:
    assert fragment in error_of(parse_memory, text)


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("100", 100), ("-1000", -1000), ("1000", 1000), ("+7", 7), ("high", 100), ("HIGH", 100),
    ("normal", 0), (" Low ", -100),
])
def test_priority_good(text: str, value: int) -> None:
    assert parse_priority(text) == value


@pytest.mark.parametrize("text", ["1001", "-1001", "5.0", "urgent", "", "1e2", "0x10", "99999999999999999999"])
def test_priority_bad(text: str) -> None:
    message = error_of(parse_priority, text)
    assert "expected an integer from -1000 to 1000 or high, normal, low" in message
    assert repr(text) in message


@pytest.mark.parametrize(("text", "value"), [
    ("true", True), ("True", True), ("YES", True), ("1", True), ("on", True), (" false ", False),
    ("no", False), ("0", False), ("Off", False),
])
def test_bool_good(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["", "maybe", "2", "t", "y", "truee"])
def test_bool_bad(text: str) -> None:
    assert f"expected true or false (also yes/no, 1/0), got {text!r}" in error_of(parse_bool, text)


@given(st.text(max_size=80))
def test_parsers_raise_only_policy_value_errors(text: str) -> None:
    for parse in (parse_memory, parse_share, parse_priority, parse_bool):
        try:
            parse(text)
        except PolicyValueError as error:
            assert error.message and str(error)


@given(st.integers(min_value=1, max_value=MEMORY_MAX_BYTES))
def test_memory_round_trips_plain_bytes(n: int) -> None:
    assert parse_memory(str(n)) == n


@given(st.integers(min_value=1, max_value=MEMORY_MAX_BYTES // GI), st.sampled_from(["Gi", "Mi", "Ki"]))
def test_memory_round_trips_binary_suffixes(n: int, suffix: str) -> None:
    assert parse_memory(f"{n}{suffix}") == n * {"Gi": GI, "Mi": MI, "Ki": 1024}[suffix]


@given(st.integers(min_value=1, max_value=10000))
def test_share_round_trips_percent(tenths: int) -> None:
    percent = tenths / 100  # 0.01 .. 100
    text = f"{percent:g}%"
    assert parse_share(text) == pytest.approx(percent / 100)


# --- node defaults ------------------------------------------------------------------------------------------


def test_node_defaults_from_config_values() -> None:
    assert node_defaults(25, "8Gi") == NodeDefaults(share_ratio=0.25, memory_bytes=8 * GI)
    assert node_defaults() == NodeDefaults()
    with pytest.raises(PolicyValueError, match="got 'lots'"):
        node_defaults(None, "lots")
    for bad in (dict(share_ratio=0.0), dict(share_ratio=1.5), dict(memory_bytes=0), dict(priority=2000)):
        with pytest.raises(PolicyValueError):
            NodeDefaults(**bad)


# --- pods: precedence and problems --------------------------------------------------------------------------

DEFAULTS = NodeDefaults(share_ratio=0.25, memory_bytes=4 * GI, priority=-5)


def test_no_annotation_no_rule_gives_the_node_default() -> None:
    limits, problems = limits_for_pod(pod(), DEFAULTS)
    assert limits == Limits(share_ratio=0.25, memory_bytes=4 * GI, priority=-5, exempt=False, source="default")
    assert problems == ()
    assert limits_for_pod(pod(), NodeDefaults()) == (Limits(None, None), ())


def test_under_any_every_limit_annotation_wins_but_exempt_stays_the_operators() -> None:
    trusting = NodeDefaults(share_ratio=0.25, memory_bytes=4 * GI, priority=-5, pod_annotations="any")
    limits, problems = limits_for_pod(pod(**{
        "gpuagent.io/gpu-share": "30%", "gpuagent.io/gpu-memory": "8Gi", "gpuagent.io/priority": "high",
        "gpuagent.io/exempt": "yes",
    }), trusting)
    assert limits == Limits(share_ratio=0.30, memory_bytes=8 * GI, priority=100, exempt=False, source="annotation")
    assert [(p.annotation, p.message) for p in problems] == [(
        "gpuagent.io/exempt",
        "ignored: exempt is the operator's (a policies rule's exempt: true), never a pod's; "
        "using the node default instead (false)",
    )]


def test_precedence_is_per_field_annotation_then_rule_then_default() -> None:
    rules = [PolicyRule(match_namespace="research", share_ratio=0.5, memory_bytes=2 * GI)]
    limits, _ = limits_for_pod(pod(**{"gpuagent.io/gpu-share": "30"}), DEFAULTS, rules)
    # share: annotation; memory: the rule; priority: the default
    assert (limits.share_ratio, limits.memory_bytes, limits.priority, limits.source) == (0.3, 2 * GI, -5,
                                                                                         "annotation")
    limits, _ = limits_for_pod(pod(), DEFAULTS, rules)
    assert (limits.share_ratio, limits.memory_bytes, limits.source) == (0.5, 2 * GI, "config")


def test_first_matching_rule_that_sets_a_field_wins() -> None:
    rules = [
        PolicyRule(match_pod="other-*", share_ratio=0.9),  # does not match
        PolicyRule(match_namespace="research", share_ratio=0.2),  # first match for share
        PolicyRule(match_namespace="res*", share_ratio=0.7, memory_bytes=GI),  # later: memory only
        PolicyRule(match_kind="pod", memory_bytes=9 * GI, exempt=True),
    ]
    limits, _ = limits_for_pod(pod(), DEFAULTS, rules)
    assert limits == Limits(share_ratio=0.2, memory_bytes=GI, priority=-5, exempt=True, source="config")


@pytest.mark.parametrize(("key", "value", "fragment", "field", "fallback"), [
    ("gpuagent.io/gpu-share", "thirty", "expected a percent in (0, 100] like 30 or 30%, got 'thirty'",
     "share_ratio", 0.25),
    ("gpuagent.io/gpu-share", "0", "got '0'", "share_ratio", 0.25),
    ("gpuagent.io/gpu-share", "0.3", "ambiguous share", "share_ratio", 0.25),
    ("gpuagent.io/gpu-memory", "-5Gi", "expected a memory size > 0, got '-5Gi'", "memory_bytes", 4 * GI),
    ("gpuagent.io/gpu-memory", "1e3Gi", "an exponent takes no suffix", "memory_bytes", 4 * GI),
    ("gpuagent.io/priority", "urgent", "got 'urgent'", "priority", -5),
    ("gpuagent.io/exempt", "maybe", "expected true or false", "exempt", False),
])
def test_a_bad_annotation_is_a_problem_and_its_field_falls_back(key, value, fragment, field, fallback) -> None:
    annotations = {key: value}
    if field != "priority":
        annotations["gpuagent.io/priority"] = "-7"  # a good annotation next to the bad one (below -5)
    limits, problems = limits_for_pod(pod(**annotations), DEFAULTS)
    assert getattr(limits, field) == fallback
    if field != "priority":
        assert limits.priority == -7 and limits.source == "annotation"  # the good one is still used
    [problem] = problems
    assert (problem.pod, problem.namespace, problem.annotation, problem.value) == ("train-0", "research", key,
                                                                                   value)
    assert fragment in problem.message
    assert "using the node default instead" in problem.message


def test_a_bad_annotation_names_the_rule_it_falls_back_to() -> None:
    rules = [PolicyRule(match_name="nothing", priority=1), PolicyRule(match_namespace="research", share_ratio=0.4)]
    limits, [problem] = limits_for_pod(pod(**{"gpuagent.io/gpu-share": "thirty"}), DEFAULTS, rules)
    assert limits.share_ratio == 0.4 and limits.source == "config"
    assert problem.message.endswith("; using policies[1] instead (40%)")
    _, [problem] = limits_for_pod(pod(**{"gpuagent.io/gpu-memory": "lots"}), NodeDefaults())
    assert problem.message.endswith("; using the node default instead (no limit)")


@pytest.mark.parametrize(("key", "fragment"), [
    ("gpuagent.io/gpu-shares", "did you mean gpuagent.io/gpu-share?"),
    ("gpuagent.io/gpu_memory", "did you mean gpuagent.io/gpu-memory?"),
    ("gpuagent.io/GPU-Share", "did you mean gpuagent.io/gpu-share?"),
    ("gpuagent.io/priorty", "did you mean gpuagent.io/priority?"),
    ("gpuagent.io/exempted", "did you mean gpuagent.io/exempt?"),
    ("gpuagent.io/colour", "known are gpuagent.io/gpu-share, gpuagent.io/gpu-memory, gpuagent.io/priority, "
                           "gpuagent.io/exempt"),
])
def test_an_unknown_annotation_is_a_problem_with_a_hint(key: str, fragment: str) -> None:
    limits, problems = limits_for_pod(pod(**{key: "30"}), DEFAULTS)
    assert limits.share_ratio == 0.25 and limits.source == "default"
    assert problems == (PolicyProblem(pod="train-0", namespace="research", annotation=key, value="30",
                                      message=problems[0].message),)
    assert "unknown annotation" in problems[0].message and fragment in problems[0].message


def test_other_annotations_are_not_ours_and_problems_are_sorted() -> None:
    _, problems = limits_for_pod(pod(**{
        "team": "search", "gpuagent.io/zzz": "1", "gpuagent.io/gpu-share": "lots", "gpuagent.io/abc": "2",
    }), DEFAULTS)
    assert [p.annotation for p in problems] == ["gpuagent.io/abc", "gpuagent.io/gpu-share", "gpuagent.io/zzz"]


# --- rules: matching ----------------------------------------------------------------------------------------


def workload(kind: str = "systemd_service", name: str = "ollama.service", **kw) -> Workload:
    kw.setdefault("cgroup", f"/system.slice/{name}")
    return Workload(kind=kind, name=name, **kw)


@pytest.mark.parametrize(("rule", "matches"), [
    (PolicyRule(match_namespace="research"), True),
    (PolicyRule(match_namespace="res*"), True),
    (PolicyRule(match_namespace="Research"), False),  # case-sensitive
    (PolicyRule(match_namespace="prod"), False),
    (PolicyRule(match_pod="train-?"), True),
    (PolicyRule(match_pod="infer-*"), False),
    (PolicyRule(match_kind="pod"), True),
    (PolicyRule(match_kind="docker"), False),
    (PolicyRule(match_name="train-*"), True),
    (PolicyRule(match_cgroup="/kubepods*"), False),  # a PodUse carries no cgroup
    (PolicyRule(match_namespace="research", match_pod="train-*"), True),
    (PolicyRule(match_namespace="research", match_pod="infer-*"), False),  # every selector must match
    (PolicyRule(), True),  # no selector: everything (parse_rules refuses it; the dataclass allows it)
])
def test_rules_match_pods(rule: PolicyRule, matches: bool) -> None:
    rule = PolicyRule(**{**{f: getattr(rule, f) for f in rule.__slots__}, "priority": 42})
    limits, _ = limits_for_pod(pod(), DEFAULTS, [rule])
    assert (limits.priority == 42) is matches


def test_a_pod_without_namespace_matches_no_namespace_rule() -> None:
    limits, _ = limits_for_pod(pod(namespace=None), DEFAULTS, [PolicyRule(match_namespace="*", priority=1)])
    assert limits.priority == -5


@pytest.mark.parametrize(("rule", "target", "matches"), [
    (PolicyRule(match_kind="systemd_service"), workload(), True),
    (PolicyRule(match_kind="systemd_*"), workload(), True),
    (PolicyRule(match_kind="docker"), workload(), False),
    (PolicyRule(match_name="ollama*"), workload(), True),
    (PolicyRule(match_name="jupyter-*"), workload(), False),
    (PolicyRule(match_cgroup="/system.slice/*"), workload(), True),
    (PolicyRule(match_cgroup="/user.slice/*"), workload(), False),
    (PolicyRule(match_cgroup="/system.slice/*"), workload(cgroup="", cgroup_v2="/system.slice/x.service"), True),
    (PolicyRule(match_cgroup="/freezer/*"), workload(cgroup_freezer="/freezer/x"), True),
    (PolicyRule(match_cgroup="*"), workload(cgroup=""), False),  # no cgroup known
    (PolicyRule(match_pod="*"), workload(), False),  # match_pod only matches pods
    (PolicyRule(match_pod="train-*"), workload(kind="pod", name="train-0", namespace="research"), True),
    (PolicyRule(match_namespace="research"), workload(kind="pod", name="train-0", namespace="research"), True),
    (PolicyRule(match_namespace="*"), workload(), False),  # no namespace off Kubernetes
    (PolicyRule(match_kind="slurm_job", match_name="12345"), workload(kind="slurm_job", name="12345"), True),
    (PolicyRule(match_kind="slurm_job", match_name="1*"), workload(kind="docker", name="12345"), False),
])
def test_rules_match_workloads(rule: PolicyRule, target: Workload, matches: bool) -> None:
    rule = PolicyRule(**{**{f: getattr(rule, f) for f in rule.__slots__}, "share_ratio": 0.1})
    limits = limits_for_workload(target, DEFAULTS, [rule])
    assert limits.share_ratio == (0.1 if matches else 0.25)
    assert limits.source == ("config" if matches else "default")


def test_a_workload_gets_rules_then_defaults() -> None:
    rules = [PolicyRule(match_kind="docker", exempt=True),
             PolicyRule(match_cgroup="/system.slice/ollama*", memory_bytes=GI, priority=3)]
    assert limits_for_workload(workload(), DEFAULTS, rules) == Limits(
        share_ratio=0.25, memory_bytes=GI, priority=3, exempt=False, source="config")
    assert limits_for_workload(workload(), DEFAULTS) == Limits(0.25, 4 * GI, -5, False, "default")


# --- rules: parsing -----------------------------------------------------------------------------------------


def test_parse_rules_good() -> None:
    raw = [
        {"match_namespace": "research-*", "gpu_share": 20},
        {"match_pod": "infer-*", "match_namespace": "prod", "gpu_share": "30.5%", "gpu_memory": "8Gi",
         "priority": "high", "exempt": "no"},
        {"match_kind": "systemd_service", "match_name": "ollama.service", "gpu_memory": 1024, "priority": -3,
         "exempt": True},
        {"match_cgroup": "/system.slice/*", "gpu_share": 12.5},
        {"match_kind": "*", "exempt": 1},
    ]
    assert parse_rules(raw) == (
        PolicyRule(match_namespace="research-*", share_ratio=0.2),
        PolicyRule(match_namespace="prod", match_pod="infer-*", share_ratio=0.305, memory_bytes=8 * GI,
                   priority=100, exempt=False),
        PolicyRule(match_kind="systemd_service", match_name="ollama.service", memory_bytes=1024, priority=-3,
                   exempt=True),
        PolicyRule(match_cgroup="/system.slice/*", share_ratio=0.125),
        PolicyRule(match_kind="*", exempt=True),
    )
    assert parse_rules(None) == () and parse_rules([]) == ()


@pytest.mark.parametrize(("raw", "fragment"), [
    ({"match_kind": "pod"}, "policies: expected a list of rules, got dict"),
    ("rules", "policies: expected a list of rules, got str"),
    ([{"match_kind": "pod", "gpu_share": 5}, "x"], "policies[1]: expected a mapping"),
    ([{"match_kind": "pod", "gpu_share": 5}] * 2 + [{"match_kind": "pod", "gpu_share": 130}],
     "policies[2].gpu_share: expected a percent in (0, 100] like 30 or 30%, got '130'"),
    ([{"match_kind": "pod", "gpu_share": 0.5}], "policies[0].gpu_share: ambiguous share '0.5'"),
    ([{"match_kind": "pod", "gpu_share": True}], "policies[0].gpu_share: expected a percent"),
    ([{"match_kind": "pod", "gpu_share": float("nan")}], "policies[0].gpu_share: expected a percent"),
    ([{"match_kind": "pod", "gpu_memory": "lots"}], "policies[0].gpu_memory: expected a Kubernetes memory"),
    ([{"match_kind": "pod", "gpu_memory": 0}], "policies[0].gpu_memory: expected a memory size > 0"),
    ([{"match_kind": "pod", "gpu_memory": 1.5}], "policies[0].gpu_memory: expected a Kubernetes memory"),
    ([{"match_kind": "pod", "priority": 5000}], "policies[0].priority: expected an integer from -1000"),
    ([{"match_kind": "pod", "priority": 1.0}], "policies[0].priority: expected an integer"),
    ([{"match_kind": "pod", "exempt": "maybe"}], "policies[0].exempt: expected true or false"),
    ([{"match_kind": "pod", "exempt": None}], "policies[0].exempt: expected true or false"),
    ([{"match_kind": "pod", "gpu_shares": 5}], "policies[0].gpu_shares: unknown key; did you mean gpu_share?"),
    ([{"match_kind": "pod", "gpu-memory": "1Gi"}], "policies[0].gpu-memory: unknown key; did you mean gpu_memory?"),
    ([{"namespace": "x", "gpu_share": 5}], "policies[0].namespace: unknown key; did you mean match_namespace?"),
    ([{"match_kind": "systemd-service", "gpu_share": 5}],
     "policies[0].match_kind: unknown workload kind 'systemd-service': did you mean systemd_service?"),
    ([{"match_kind": "vm", "gpu_share": 5}], "policies[0].match_kind: unknown workload kind 'vm': one of pod,"),
    ([{"match_pod": 123, "gpu_share": 5}], "policies[0].match_pod: expected a non-empty string"),
    ([{"match_pod": "", "gpu_share": 5}], "policies[0].match_pod: expected a non-empty string"),
    ([{"gpu_share": 5}], "policies[0]: expected at least one of match_namespace"),
    ([{"match_pod": "x"}], "policies[0]: expected at least one limit: gpu_share, gpu_memory, priority, exempt"),
])
def test_parse_rules_errors_name_the_item_and_key(raw, fragment: str) -> None:
    with pytest.raises(PolicyValueError) as info:
        parse_rules(raw)
    assert fragment in str(info.value)
    assert info.value.key_path and str(info.value).startswith(info.value.key_path + ": ")
