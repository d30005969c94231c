"""The per-poll work made linear in the pods of a node (``bench/bench_scale.py``) decides what it decided before.

Each faster path is checked against the code it replaced, kept here as the reference, on random inputs:
the share controller's allowances and excesses (once pairwise over a GPU's tenants, quadratic), and the
memos that spare re-parsing every pod's annotations on every poll.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from snapshots import two_gpu_node
from test_timeslice import Plant

from gpuagent import quantities
from gpuagent.agent import build_enforcer
from gpuagent.config import load_config
from gpuagent.enforce.policy import NodeDefaults, limits_for_pod, parse_rules
from gpuagent.enforce.timeslice import ShareController, Tenant, _Decision, _SumsOfOthers, _TenantState
from gpuagent.quantities import PolicyValueError, parse_memory, parse_share
from gpuagent.snapshot import ContainerUse, NodeSnapshot, PodUse, ProcessSample, Workload

# -- the share controller -------------------------------------------------------------------------------------


class PairwiseController(ShareController):
    """The controller as it was: every tenant's allowance and excess summed over the others, pair by pair."""

    def _classify(self, decisions: list[_Decision]) -> None:
        for d in decisions:
            stderr = d.noise / math.sqrt(max(len(d.state.samples), 1))
            d.active = d.achieved + stderr >= self.idle_threshold
        for d in decisions:
            share = d.tenant.share_ratio
            if share is None:
                continue
            share = min(max(float(share), 0.0), 1.0)
            others = [o for o in decisions if o is not d]
            if self.work_conserving:
                reserved = math.fsum(
                    max(o.achieved, o.tenant.share_ratio or 0.0) if o.active else o.achieved for o in others
                )
                d.allowance = max(share, 1.0 - reserved)
                d.limited = any(o.active for o in others)
            else:
                d.allowance = share
                d.limited = True
            d.error = d.use - d.allowance
            d.state.errors.append(d.error)

    def _effective_errors(self, decisions: list[_Decision]) -> list[float]:
        return [self._effective_error(d, decisions) for d in decisions]

    def _effective_error(self, d: _Decision, decisions: list[_Decision]) -> float:
        if d.error <= 0.0:
            return d.error
        deficit = 0.0
        for q in decisions:
            if q is d or not q.limited:
                continue
            if (q.tenant.priority < d.tenant.priority and q.error > self.tolerance
                    and q.state.fraction < self.max_frozen):
                return 0.0
            if q.state.fraction > 0.0:
                deficit += self._deficit(q)
        return max(0.0, d.error - deficit)


def random_gpu(rng: random.Random) -> tuple[dict[str, float], dict[str, float | None], dict[str, int]]:
    """Tenants of one GPU: demands, shares (some None) and priorities."""
    count = rng.choice([2, 3, 5, 8, 14, 31])
    names = [f"ns/pod-{i}" for i in range(count)]
    demands = {n: rng.choice([1.0, rng.uniform(0.0, 1.0), rng.uniform(0.0, 0.06)]) for n in names}
    shares = {n: None if rng.random() < 0.15 else rng.uniform(0.01, 1.5 / count) for n in names}
    priorities = {n: rng.choice([-100, 0, 0, 0, 100]) for n in names}
    for name in names[:2]:  # two burners over their shares: someone is throttled
        demands[name], shares[name] = 1.0, rng.uniform(0.01, 0.4)
    return demands, shares, priorities


@pytest.mark.parametrize("seed", range(12))
def test_the_linear_controller_decides_what_the_pairwise_one_did(seed: int) -> None:
    rng = random.Random(seed)
    demands, shares, priorities = random_gpu(rng)
    settings = {"work_conserving": rng.random() < 0.8}
    new, old = ShareController(**settings), PairwiseController(**settings)
    plant = Plant(demands, seed=seed, noise_model=rng.choice(["binomial", "gaussian"]), noise=0.03)
    fractions: dict[str, float] = {}
    engaged = 0
    for n in range(1, 121):
        for _ in range(10):
            plant.run_period(fractions, 0.1)
        _, measured = plant.measure()
        present = [k for k in demands if rng.random() > 0.05]  # now and then a tenant misses a poll
        tenants = [Tenant(k, measured[k], shares[k], priorities[k]) for k in present]
        fractions = new.update(n * 1.0, tenants)
        before = old.update(n * 1.0, tenants)
        assert fractions.keys() == before.keys(), n
        for key, fraction in fractions.items():
            assert fraction == pytest.approx(before[key], abs=1e-12), (n, key)
        for key in demands:
            assert new.achieved(key) == old.achieved(key)
            assert new.noise(key) == pytest.approx(old.noise(key), abs=1e-12)
        engaged += bool(fractions)
    assert engaged, "the case never throttled anyone: it checked nothing"


finite = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_subnormal=True)


@given(st.lists(finite, min_size=1, max_size=40))
def test_sums_of_the_others_are_what_fsum_gives(values: list[float]) -> None:
    sums = _SumsOfOthers(values)
    for index in range(len(values)):
        expected = math.fsum(v for i, v in enumerate(values) if i != index)
        assert sums.without(index) == expected
        assert math.copysign(1.0, sums.without(index)) == math.copysign(1.0, expected) or expected == 0.0


@given(st.lists(st.floats(min_value=0.0, max_value=100.0, allow_subnormal=True), min_size=3, max_size=20),
       st.floats(min_value=0.0, max_value=0.9))
def test_the_noise_without_sorting_is_the_sorted_window_s(diffs: list[float], fraction: float) -> None:
    """A tenant's noise: fsum of the window with its largest difference taken back out, as the sum of the
    sorted window less its last (squared differences of uses of at most 1/(1 - 0.9): up to 100)."""
    state = _TenantState(fraction=fraction)
    state.diffs.extend(diffs)
    squares = sorted(state.diffs)[:-1]
    assert state.noise() == math.sqrt(math.fsum(squares) / len(squares) / 2.0) * (1.0 - fraction)


def test_sums_of_the_others_fall_back_to_fsum_for_infinities_and_nan() -> None:
    sums = _SumsOfOthers([1.0, math.inf, 2.0])
    assert sums.without(1) == 3.0 and sums.without(0) == math.inf
    assert math.isnan(_SumsOfOthers([math.nan, 1.0]).without(1))


# -- remembered limit values ------------------------------------------------------------------------------


@given(st.text(max_size=70))
def test_a_remembered_parse_answers_as_a_fresh_one(text: str) -> None:
    for remembered, fresh in ((parse_share, quantities._parse_share), (parse_memory, quantities._parse_memory)):
        try:
            expected: object = fresh(text)
        except PolicyValueError as error:
            expected = ("error", error.message)
        for _ in range(2):  # the second time from the memo (or raised again)
            try:
                got: object = remembered(text)
            except PolicyValueError as error:
                got = ("error", error.message)
            assert got == expected


def test_only_short_texts_that_parse_are_remembered() -> None:
    quantities._remembered_share.cache_clear()
    assert parse_share("30%") == pytest.approx(0.3)
    padded = "30%" + " " * 100  # parses (spaces are stripped) but is longer than any value needs
    assert parse_share(padded) == pytest.approx(0.3)
    with pytest.raises(PolicyValueError):
        parse_share("30 percent")
    assert quantities._remembered_share.cache_info().currsize == 1
    for n in range(3 * quantities._REMEMBERED):
        parse_memory(f"{n + 1}Mi")
    assert quantities._remembered_memory.cache_info().currsize == quantities._REMEMBERED


# -- the enforcer's remembered limits -------------------------------------------------------------------------


def pod_node(t: float, annotations: dict[str, dict[str, str]], objects: dict[object, object] | None = None
             ) -> NodeSnapshot:
    """One GPU whose processes are pods ``ns/<name>`` (one each), with these annotations. ``objects``: the
    same Workload and the same annotations object for equal ones, from poll to poll (as the attribution
    passes them on)."""
    snapshot = two_gpu_node()
    gpu = snapshot.gpus[0]
    processes, pods = [], []
    for pid, (name, pod_annotations) in enumerate(sorted(annotations.items()), start=7000):
        workload = Workload(kind="pod", name=name, namespace="ns", container="main", pod_uid=f"uid-{name}",
                            names_from="api_server", cgroup=f"/kubepods/pod{pid}")
        if objects is not None:
            workload = objects.setdefault(workload, workload)  # type: ignore[assignment]
            pod_annotations = objects.setdefault((name, *sorted(pod_annotations.items())), pod_annotations)  # type: ignore[assignment]
        processes.append(ProcessSample(pid, "python3", "compute", 2 * 2**30, 40.0, 10.0, workload=workload))
        pods.append(PodUse(name=name, namespace="ns", uid=f"uid-{name}", names_from="api_server",
                           annotations=pod_annotations, containers=(ContainerUse("main", pids=(pid,)),)))
    return replace(snapshot, gpus=(replace(gpu, processes=tuple(processes)),), pods=tuple(pods),
                   taken_at_monotonic=t)


@pytest.mark.parametrize("same_objects", [False, True], ids=["new objects", "the same objects"])
def test_remembered_limits_follow_annotations_and_reloaded_rules(tmp_path: Path, same_objects: bool) -> None:
    config = load_config(None, env={}, overrides={
        "backend": "sim", "mode": "audit", "journal_path": str(tmp_path / "journal.json"),
        "cgroup_root": str(tmp_path / "cgroup"),
    })
    now = [0.0]
    enforcer = build_enforcer(config, monotonic=lambda: now[0])
    assert enforcer is not None
    share, memory = "gpuagent.io/gpu-share", "gpuagent.io/gpu-memory"
    steps = [
        {"a": {share: "30%", memory: "4Gi"}, "b": {share: "20"}},
        {"a": {share: "30%", memory: "4Gi"}, "b": {share: "20"}},  # the same: remembered
        {"a": {share: "45%", memory: "4Gi"}, "b": {share: "twenty"}},  # a changed, b's is now bad
        {"a": {share: "45%", memory: "4Gi"}, "b": {share: "twenty"}, "c": {}, "d": {}},
        {"a": {memory: "1Gi"}, "c": {"gpuagent.io/priorty": "high"}, "d": {}},  # c's key a typo
        {"a": {memory: "1Gi"}, "c": {"gpuagent.io/priorty": "high"}, "d": {}},
    ]
    objects: dict[object, object] | None = {} if same_objects else None
    for step, pods in enumerate(steps):
        if step == 4:
            enforcer.set_rules(parse_rules([{"match_namespace": "ns", "gpu_share": 15}]))
        now[0] = float(step)
        snapshot = pod_node(now[0], pods, objects)
        state = enforcer.update(snapshot)
        expected = {p.name: limits_for_pod(p, NodeDefaults(), enforcer.rules) for p in snapshot.pods}
        assert {s.pod: s.limit_ratio for s in state.shares} == {
            name: limits.share_ratio for name, (limits, _) in expected.items()}, step
        assert {m.pod: m.limit_bytes for m in state.memory} == {
            name: limits.memory_bytes for name, (limits, _) in expected.items()}, step
        assert sorted(state.problems, key=str) == sorted(
            (p for _, problems in expected.values() for p in problems), key=str), step
    reloaded = {s.pod: s.limit_ratio for s in state.shares}
    assert reloaded["a"] == reloaded["d"] == pytest.approx(0.15)  # d's annotations did not change: the rule did
