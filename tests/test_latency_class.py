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

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_fast_paths import pod_node
from test_timeslice import FakeTime, Recorder

from gpuagent import cli
from gpuagent.enforce.enforcer import Enforcer
from gpuagent.enforce.journal import FreezeTarget
from gpuagent.enforce.memory import LadderSettings, MemoryLadder
from gpuagent.enforce.policy import limits_for_pod
from gpuagent.enforce.rules import NodeDefaults, PolicyRule, parse_rules
from gpuagent.enforce.timeslice import (
    Cycler,
    LatencyController,
    Preemption,
    RotationController,
    RotationPlan,
    Tenant,
)
from gpuagent.quantities import PolicyValueError
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import PodUse

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


def test_check_config_passes_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("policies:\n  - {match_namespace: serving, latency_sensitive: true, gpu_share: 30}\n")
    assert cli.main(["check-config", str(path)]) == 0, capsys.readouterr().err


# --- the cycler's hold --------------------------------------------------------------------------------------


def rotation_cycler() -> tuple[Cycler[str], FakeTime, Recorder]:
    clock = FakeTime()
    recorder = Recorder(clock)  # fails on a freeze of a frozen target, a thaw of a thawed one
    return Cycler(recorder.freeze, recorder.thaw, plan=RotationPlan(1.0, seed=0), clock=clock,
                  sleep=clock.sleep), clock, recorder


def test_a_hold_freezes_a_tenant_the_plan_does_not_throttle_and_its_end_thaws_and_drops_it() -> None:
    cycler, _, rec = rotation_cycler()
    cycler.hold("gpu0", {"b": ["b1", "b2"]})
    assert rec.frozen == {"b1", "b2"} and cycler.frozen_keys == {"b"}
    cycler.hold("gpu0", {"b": ["b1", "b2"]})  # the same hold again writes nothing
    cycler.hold("gpu0", {})
    assert rec.frozen == set() and cycler.frozen_keys == frozenset()
    cycler.hold("gpu0", {"b": ["b1"]})
    cycler.stop_all()
    assert rec.frozen == set()


def test_a_held_tenant_stays_frozen_when_the_poll_takes_its_fraction_and_thaws_when_it_leaves() -> None:
    cycler, _, rec = rotation_cycler()
    cycler.set("b", ["b1"], 0.5, group="gpu0")
    cycler.hold("gpu0", {"b": ["b1"]})
    cycler.set("b", ["b1"], 0.0, group="gpu0")  # out of the rotation, still held
    assert rec.frozen == {"b1"}
    cycler.set("b", (), 0.0)  # released by the enforcer: thawed whatever holds it
    assert rec.frozen == set() and cycler.frozen_keys == frozenset()


async def test_the_plan_never_thaws_a_held_tenant_and_its_turns_resume_after_the_hold() -> None:
    cycler, clock, rec = rotation_cycler()
    cycler.set("a", ["a1"], 0.5, group="gpu0")
    cycler.set("b", ["b1"], 0.5, group="gpu0")
    thawed_while_held: list[float] = []
    b_thawed_after: list[float] = []

    def check(now: float, seconds: float) -> None:
        if 3.0 <= now < 8.0 and "b1" not in rec.frozen:
            thawed_while_held.append(now)
        if now >= 8.0 and "b1" not in rec.frozen:
            b_thawed_after.append(seconds)

    clock.on_sleep = check
    task = asyncio.create_task(cycler.run())
    while clock.t < 3.0:
        await asyncio.sleep(0)
    cycler.hold("gpu0", {"b": ["b1"]})
    while clock.t < 8.0:
        await asyncio.sleep(0)
    cycler.hold("gpu0", {})
    while clock.t < 20.0:
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert thawed_while_held == []
    assert sum(b_thawed_after) == pytest.approx(6.0, rel=0.25)  # its half of the 12 s after the hold
    assert rec.frozen == set()


# --- the preemption, with fake CPU counters -----------------------------------------------------------------


class FakeCounter:
    def __init__(self) -> None:
        self.value = 0.0
        self.closed = False

    def seconds(self) -> float | None:
        return None if self.closed else self.value

    def waited(self) -> float | None:
        return None

    def close(self) -> None:
        self.closed = True


def busy_service_gpu() -> LatencyController:
    """A GPU's controller after one poll: ``svc`` (30 %, latency) well under its share, two trainers."""
    controller = LatencyController({"svc"}, sense_s=0.005)
    controller.update(0.0, [Tenant("svc", 0.1, 0.3), Tenant("t0", 0.45, 0.35), Tenant("t1", 0.45, 0.35)])
    return controller


def test_the_preemption_holds_the_batch_tenants_while_the_service_cpu_moves() -> None:
    cycler, _, rec = rotation_cycler()
    counters: dict[tuple[str, ...], FakeCounter] = {}

    def open_counters(targets):
        return [counters.setdefault(tuple(targets), FakeCounter())]

    preemption = Preemption(cycler, open_counters)
    controller = busy_service_gpu()
    preemption.watch("gpu0", controller, {"svc": ["svc1"]}, {"t0": ["t01", "t02"], "t1": ["t11"]})
    svc = counters[("svc1",)]
    assert preemption.sense(1.000) == []  # the first reading: nothing to compare with
    svc.value += 0.004  # 4 ms of CPU in 5 ms: a request in hand
    for group in preemption.sense(1.005):
        preemption.apply(group)
    assert rec.frozen == {"t01", "t02", "t11"} and cycler.frozen_keys == {"t0", "t1"}
    svc.value += 0.004
    assert preemption.sense(1.010) == []  # still busy: nothing changes
    for group in preemption.sense(1.016):  # still 6 ms, over a scheduler tick: let go
        preemption.apply(group)
    assert rec.frozen == set()
    svc.value += 0.005
    for group in preemption.sense(1.021):
        preemption.apply(group)
    assert rec.frozen == {"t01", "t02", "t11"}
    preemption.unwatch("gpu0")
    assert rec.frozen == set() and svc.closed


def test_the_preemption_hands_each_latency_workload_its_cpu_pressure_or_the_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuagent.enforce.timeslice import preempt

    class Pressed(FakeCounter):
        def waited(self) -> float | None:
            return 0.25

    cycler, _, _ = rotation_cycler()
    monkeypatch.setattr(preempt, "system_waited", lambda: 0.004)
    preemption = Preemption(cycler, lambda targets: [Pressed() if "own" in targets[0] else FakeCounter()])
    one, two = busy_service_gpu(), busy_service_gpu()
    preemption.watch("gpu0", one, {"svc": ["own"]}, {"t0": ["t01"]})
    preemption.watch("gpu1", two, {"svc": ["none"]}, {"t0": ["t11"]})
    preemption.pressure()
    assert one._waited == {"svc": 0.25} and two._waited == {"svc": 0.004}  # its cgroup's, else the node's
    preemption.stop()


def test_a_watch_keeps_its_counters_while_the_targets_are_the_same_and_stop_lets_go() -> None:
    cycler, _, rec = rotation_cycler()
    opened: list[FakeCounter] = []

    def open_counters(targets):
        opened.append(FakeCounter())
        return [opened[-1]]

    preemption = Preemption(cycler, open_counters)
    controller = busy_service_gpu()
    preemption.watch("gpu0", controller, {"svc": ["svc1"]}, {"t0": ["t01"]})
    preemption.watch("gpu0", controller, {"svc": ["svc1"]}, {"t0": ["t01"]})
    assert len(opened) == 1
    preemption.watch("gpu0", controller, {"svc": ["svc2"]}, {"t0": ["t01"]})  # a restarted container
    assert len(opened) == 2 and opened[0].closed and not opened[1].closed
    preemption.watch("gpu0", controller, {"svc": ["svc2"]}, {})  # nothing to preempt: not watched
    assert preemption.watched == frozenset() and opened[1].closed
    preemption.watch("gpu0", controller, {"svc": ["svc2"]}, {"t0": ["t01"]})
    opened[-1].value = 0.0
    preemption.sense(0.0)
    opened[-1].value = 0.005
    for group in preemption.sense(0.005):
        preemption.apply(group)
    assert rec.frozen == {"t01"}
    preemption.stop()
    assert rec.frozen == set() and opened[-1].closed
    preemption.apply("gpu0")  # a late call from the thread after the stop holds nothing
    assert rec.frozen == set()


async def test_the_sensing_thread_reads_on_its_period_and_the_loop_applies_the_hold() -> None:
    cycler, _, rec = rotation_cycler()

    class Spinning(FakeCounter):
        """A service's CPU: one second a second while it has a request in hand, still otherwise."""

        busy = True

        def seconds(self) -> float | None:
            if self.busy and not self.closed:
                self.value = time.monotonic()
            return super().seconds()

    counter = Spinning()
    preemption = Preemption(cycler, lambda targets: [counter])
    preemption.watch("gpu0", busy_service_gpu(), {"svc": ["svc1"]}, {"t0": ["t01"]})
    task = asyncio.create_task(preemption.run())

    async def until(condition) -> None:
        for _ in range(5000):  # up to ~50 s on a starved machine
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the preemption never changed the hold")

    await until(lambda: rec.frozen == {"t01"})
    counter.busy = False
    await until(lambda: rec.frozen == set())
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert rec.frozen == set() and counter.closed


# --- the enforcer's wiring ----------------------------------------------------------------------------------

SVC, T0, T1 = "ns/svc", "ns/t0", "ns/t1"
RULES = [PolicyRule(match_pod="svc", latency_sensitive=True, share_ratio=0.3),
         PolicyRule(match_pod="t*", share_ratio=0.35)]


def target(name: str) -> FreezeTarget:
    return FreezeTarget("v2", f"/kubepods/{name}")


class FakeActions:
    """What the enforcer asks of ``Actions`` (the cycler's freezes go to a ``Recorder``)."""

    mode = "enforce"
    frozen: frozenset[FreezeTarget] = frozenset()

    def __init__(self) -> None:
        self.released: list[FreezeTarget] = []

    def target_for(self, cgroup_v2: str | None, cgroup_freezer: str | None) -> FreezeTarget | None:
        return FreezeTarget("v2", cgroup_v2) if cgroup_v2 else None

    def release(self, target: FreezeTarget) -> bool:
        self.released.append(target)
        return True

    def counts(self) -> dict[tuple[str, str], int]:
        return {}

    def thaw_all(self) -> int:
        return 0


def node(t: float, uses: dict[str, float], annotations: dict[str, dict[str, str]] | None = None) -> NodeSnapshot:
    """One GPU with a pod ``ns/<name>`` per use (SM use 0-1), each in cgroup ``/kubepods/<name>``."""
    snapshot = pod_node(t, {name: (annotations or {}).get(name, {}) for name in uses})
    gpu = snapshot.gpus[0]
    processes = tuple(
        replace(p, sm_util_percent=uses[p.workload.name] * 100.0,
                workload=replace(p.workload, cgroup_v2=f"/kubepods/{p.workload.name}"))
        for p in gpu.processes if p.workload is not None)
    return replace(snapshot, gpus=(replace(gpu, processes=processes),))


def wired(rules=RULES, controller=RotationController, defaults: NodeDefaults | None = None):
    clock = FakeTime()
    rec = Recorder(clock)
    counters: dict[str, FakeCounter] = {}
    actions = FakeActions()
    cycler = Cycler(rec.freeze, rec.thaw, plan=RotationPlan(1.0, seed=0), clock=clock, sleep=clock.sleep)
    enforcer = Enforcer(mode="enforce", actions=actions, ladder=MemoryLadder(LadderSettings()),  # type: ignore[arg-type]
                        defaults=defaults, rules=rules, cycler=cycler, controller=controller, clock=clock,
                        cpu=lambda targets: [counters.setdefault(t.path, FakeCounter()) for t in targets])
    return enforcer, clock, rec, counters, actions


def request(enforcer: Enforcer, counter: FakeCounter, now: float, busy: bool) -> None:
    """One reading of the service's CPU ``busy`` (or not) since the last, applied as the loop would."""
    counter.value += 0.005 if busy else 0.0
    assert enforcer.preemption is not None
    for group in enforcer.preemption.sense(now):
        enforcer.preemption.apply(group)


BUSY = {"svc": 0.1, "t0": 0.45, "t1": 0.45}


def test_a_gpu_with_a_latency_pod_gets_the_class_and_its_requests_preempt_the_batch_pods() -> None:
    enforcer, _, rec, counters, _ = wired()
    state = enforcer.update(node(0.0, BUSY))
    uuid = state.shares[0].gpu_uuid
    decided = {d.owner: d for d in state.limits}
    assert decided[SVC].latency_sensitive and decided[SVC].sources["latency_sensitive"] == "policies[0]"
    assert not decided[T0].latency_sensitive
    shares = {s.pod: s for s in state.shares}
    assert shares["svc"].frozen_ratio == 0.0 and shares["svc"].achieved_ratio == pytest.approx(0.1)
    assert enforcer.preemption is not None and enforcer.preemption.watched == {uuid}
    svc = counters["/kubepods/svc"]
    request(enforcer, svc, 0.100, busy=False)
    assert rec.frozen == set()
    request(enforcer, svc, 0.105, busy=True)
    assert rec.frozen == {target("t0"), target("t1")}
    request(enforcer, svc, 0.110, busy=False)
    assert rec.frozen == set()
    state = enforcer.update(node(1.0, BUSY))
    shares = {s.pod: s for s in state.shares}
    assert (shares["svc"].latency_standing, shares["svc"].preemptions_total) == ("exempt", 1)
    assert state.latency_ticks is None  # a test's clock: no kernel ticks read beside it
    assert (shares["t0"].latency_standing, shares["t0"].preemptions_total) == (None, 0)


def test_the_class_standing_and_preemptions_are_exported_for_the_pods_in_it() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gpuagent.export import build_registry
    from gpuagent.export.exposition import generate_text

    enforcer, _, _, counters, _ = wired()
    enforcer.update(node(0.0, BUSY))
    request(enforcer, counters["/kubepods/svc"], 0.100, busy=False)
    request(enforcer, counters["/kubepods/svc"], 0.105, busy=True)
    snapshot = node(1.0, BUSY)
    snapshot = replace(snapshot, enforcement=enforcer.update(snapshot))
    text = generate_text(build_registry(lambda: snapshot)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    standing = {s.labels["standing"]: s.value for s in families["gpuagent_pod_gpu_latency_standing"].samples}
    assert standing == {"exempt": 1.0, "over": 0.0, "capped": 0.0}  # the service alone: the others are batch
    [preempted] = families["gpuagent_pod_gpu_preemptions"].samples
    assert preempted.labels["pod"] == "svc" and preempted.value == 1.0 and "gpu" in preempted.labels


def test_the_class_leaves_with_the_rule_and_the_held_pods_are_thawed() -> None:
    enforcer, clock, rec, counters, _ = wired()
    enforcer.update(node(0.0, BUSY))
    request(enforcer, counters["/kubepods/svc"], 0.100, busy=False)
    request(enforcer, counters["/kubepods/svc"], 0.105, busy=True)
    assert rec.frozen == {target("t0"), target("t1")}
    enforcer.set_rules([PolicyRule(match_pod="*", share_ratio=0.3)])  # no latency class any more
    clock.t = 1.0
    enforcer.update(node(1.0, BUSY))
    assert enforcer.preemption is not None and enforcer.preemption.watched == frozenset()
    assert rec.frozen == set()  # the hold let go (the plan's turns start with the cycler's next period)
    assert counters["/kubepods/svc"].closed


def test_a_lone_batch_pod_out_of_the_rotation_is_still_preempted_and_released_when_it_leaves() -> None:
    enforcer, clock, rec, counters, actions = wired()
    state = enforcer.update(node(0.0, {"svc": 0.1, "t0": 0.9}))
    assert {s.pod: s.frozen_ratio for s in state.shares} == {"svc": 0.0, "t0": 0.0}  # no turns to take
    request(enforcer, counters["/kubepods/svc"], 0.100, busy=False)
    request(enforcer, counters["/kubepods/svc"], 0.105, busy=True)
    assert rec.frozen == {target("t0")}
    clock.t = 1.0
    enforcer.update(node(1.0, {"svc": 0.1}))  # t0 left the GPU
    assert rec.frozen == set() and actions.released == [target("t0")]


def test_a_pause_thaws_the_held_pods_and_watches_nothing_until_it_ends() -> None:
    enforcer, clock, rec, counters, actions = wired()
    enforcer.update(node(0.0, BUSY))
    request(enforcer, counters["/kubepods/svc"], 0.100, busy=False)
    request(enforcer, counters["/kubepods/svc"], 0.105, busy=True)
    enforcer.pause(10.0)
    assert rec.frozen == set() and enforcer.preemption is not None and enforcer.preemption.watched == set()
    assert {target("t0"), target("t1")} <= set(actions.released)  # off the journal
    clock.t = 1.0
    enforcer.update(node(1.0, BUSY))
    assert enforcer.preemption.watched == set()
    clock.t = 11.0
    enforcer.update(node(11.0, BUSY))
    assert len(enforcer.preemption.watched) == 1


def test_an_annotation_counts_under_any_and_not_under_lower_only() -> None:
    asked = {"svc": {LATENCY: "true"}}
    rules = [PolicyRule(match_pod="*", share_ratio=0.3)]
    enforcer, *_ = wired(rules=rules)
    state = enforcer.update(node(0.0, BUSY, asked))
    assert enforcer.preemption is not None and enforcer.preemption.watched == set()
    assert [p.annotation for p in state.problems] == [LATENCY]
    enforcer, *_ = wired(rules=rules, defaults=NodeDefaults(pod_annotations="any"))
    state = enforcer.update(node(0.0, BUSY, asked))
    assert enforcer.preemption is not None and len(enforcer.preemption.watched) == 1
    assert {d.owner: d for d in state.limits}[SVC].sources["latency_sensitive"] == "annotation"


def test_under_the_duty_scheme_the_class_is_not_applied_and_the_log_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    from gpuagent.enforce.timeslice import ShareController

    enforcer, *_ = wired(controller=ShareController)
    enforcer.update(node(0.0, BUSY))
    enforcer.update(node(1.0, BUSY))
    assert enforcer.preemption is not None and enforcer.preemption.watched == set()
    said = [r.getMessage() for r in caplog.records if "latency-sensitive" in r.getMessage()]
    assert said == ["latency-sensitive workloads (ns/svc) are not a class under share_scheme: duty: they are "
                    "throttled as any other (the latency class needs the rotation)"]


# --- the cpu.stat reader ------------------------------------------------------------------------------------


def hybrid_host(root: Path) -> tuple[Path, Path]:
    """A pod's cgroup in a v2 hierarchy (``unified``) and in a v1 cpuacct one, 2.5 and 1.5 CPU seconds."""
    v2 = root / "unified" / "kubepods" / "svc"
    v1 = root / "cpu,cpuacct" / "kubepods" / "svc"
    v2.mkdir(parents=True)
    v1.mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpuacct.usage").write_text("0\n")
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (v1 / "cpuacct.usage").write_text("1500000000\n")
    return v2, v1


def test_the_reader_reads_v2_cpu_stat_and_v1_cpuacct_usage_and_rereads_the_open_file(tmp_path: Path) -> None:
    from gpuagent.enforce.cpustat import CpuStat

    v2, _ = hybrid_host(tmp_path)
    reader = CpuStat(str(tmp_path), v2_mount=str(tmp_path / "unified"))
    [new, old] = reader.open([FreezeTarget("v2", "/kubepods/svc"), FreezeTarget("v1", "/kubepods/svc")])
    assert (new.seconds(), old.seconds()) == (2.5, 1.5)
    with open(v2 / "cpu.stat", "r+") as f:  # the same file, rewritten in place: read again at offset 0
        f.write("usage_usec 3000000\n")
    assert new.seconds() == 3.0
    new.close()
    assert new.seconds() is None
    assert reader.open([FreezeTarget("v2", "/kubepods/gone"), FreezeTarget("v2", "/kubepods/../x"),
                        FreezeTarget("v2", "kubepods/svc")]) == []
    assert CpuStat(str(tmp_path)).open([FreezeTarget("v2", "/kubepods/svc")]) == []  # no v2 mounted


def test_the_reader_reads_a_v2_cgroups_cpu_pressure_and_the_nodes_where_it_has_none(tmp_path: Path) -> None:
    from gpuagent.enforce.cpustat import CpuStat, read_pressure, system_waited

    v2, _ = hybrid_host(tmp_path)
    (v2 / "cpu.pressure").write_text("some avg10=7.39 avg60=5.76 avg300=5.31 total=9133882264\n"
                                     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    reader = CpuStat(str(tmp_path), v2_mount=str(tmp_path / "unified"))
    [new, old] = reader.open([FreezeTarget("v2", "/kubepods/svc"), FreezeTarget("v1", "/kubepods/svc")])
    assert new.waited() == pytest.approx(0.0739) and old.waited() is None  # v1 cgroups have no PSI
    new.close()
    assert new.waited() is None
    for bad in (b"", b"full avg10=1.00", b"some avg10=x", b"some avg10=250.0 avg60=0", b"some total=5"):
        assert read_pressure(bad) is None, bad
    (tmp_path / "pressure").write_text("some avg10=0.50 avg60=0.00 avg300=0.00 total=1\n")
    assert system_waited(str(tmp_path / "pressure")) == pytest.approx(0.005)
    assert system_waited(str(tmp_path / "nowhere")) is None


@pytest.mark.serial  # a spinning service and the sensing's own CPU: at nice 19 beside the serial pass's
# tenants it was starved past 60 s in a full run (1.7 s alone)
def test_the_sensing_bench_prints_its_cost_per_period() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "bench/bench_preemption.py", "--designs", "shipped,5ms", "--loads",
                           "busy", "--seconds", "0.3", "--rounds", "1"], cwd=root, capture_output=True, text=True,
                          timeout=60)
    if done.returncode == 2 and "no writable cgroup v2" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["shipped at busy", "5ms at busy"]
    assert all(" % of a core, " in line and " readings a second, " in line and " load average " in line
               for line in lines)


# --- through the real freezer -------------------------------------------------------------------------------


@pytest.fixture
def cgroup_sandbox():
    from cgroups import sandbox_for_test

    yield from sandbox_for_test()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["audit", "enforce"])
def test_a_preemption_goes_through_the_freezer_journaled_and_audit_only_counts(
        cgroup_sandbox, tmp_path: Path, mode: str) -> None:
    from cgroups import kubelet_container_path, new_pod_uid
    from fake_apiserver import container_id

    from gpuagent.enforce.actions import Actions
    from gpuagent.enforce.journal import Journal

    uid = new_pod_uid()
    proc = cgroup_sandbox.spawn(kubelet_container_path("systemd", "burstable", uid, "containerd",
                                                       container_id(uid, "main")))  # a sleep: no CPU judged
    journal = Journal(tmp_path / "journal.json")
    actions = Actions(mode=mode, journal=journal)
    batch = actions.target_for(proc.cgroup_paths.get("unified"), proc.cgroup_paths.get("freezer"))
    assert batch is not None
    cycler: Cycler[FreezeTarget] = Cycler(lambda t: actions.freeze(t, reason="preempted"), actions.thaw,
                                          plan=RotationPlan(1.0))
    counter = FakeCounter()
    preemption = Preemption(cycler, lambda targets: [counter])
    preemption.watch("gpu0", busy_service_gpu(), {"svc": ["svc1"]}, {"t0": [batch]})
    preemption.sense(0.0)
    counter.value = 0.005
    for group in preemption.sense(0.005):
        preemption.apply(group)
    if mode == "audit":
        assert actions.counts()[("freeze", "audit")] == 1
        assert not actions.is_frozen(batch) and journal.targets() == frozenset()
    else:
        assert actions.counts()[("freeze", "done")] == 1 and journal.targets() == {batch}
        for _ in range(500):  # the kernel freezes within milliseconds
            if actions.is_frozen(batch):
                break
            time.sleep(0.01)
        assert actions.is_frozen(batch)
    for group in preemption.sense(0.011):  # still over a scheduler tick: let go
        preemption.apply(group)
    assert actions.counts()[("thaw", mode if mode == "audit" else "done")] == 1
    for _ in range(500):
        if not actions.is_frozen(batch):
            break
        time.sleep(0.01)
    assert not actions.is_frozen(batch) and batch not in actions.frozen
    actions.release(batch)
    assert journal.targets() == frozenset()
