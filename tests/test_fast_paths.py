"""The per-poll work made linear in the pods of a node (``bench/bench_scale.py``) decides what it decided before.

Each faster path is checked against the code it replaced, kept here as the reference, on random inputs:
the share controller's allowances and excesses (once pairwise over a GPU's tenants, quadratic), the
memos that spare re-parsing every pod's annotations on every poll, and the ledger's busy settled with the
interval a reading covers instead of through the pending busy, and its energy split in one pass.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from snapshots import two_gpu_node
from test_poll_caches import Alloc
from test_timeslice import Plant

from gpuagent import quantities
from gpuagent.accounting.busy import PendingBusy
from gpuagent.accounting.ledger import (
    GpuTotals,
    Ledger,
    _energy_estimate,
    _Increment,
    _PendingEnergy,
    _split_energy,
    _trapezoid,
)
from gpuagent.accounting.rates import UNATTRIBUTED, GpuRates, Owner, Rate, _use, owner_of
from gpuagent.assembly import build_enforcer
from gpuagent.config import load_config
from gpuagent.enforce.policy import limits_for_pod
from gpuagent.enforce.rules import NodeDefaults, parse_rules
from gpuagent.enforce.timeslice.controller import (
    ShareController,
    Tenant,
    _Decision,
    _SumsOfOthers,
    _TenantState,
)
from gpuagent.pods.attribution import Attributor, PodName, _index_allocations, _index_names
from gpuagent.quantities import PolicyValueError, parse_memory, parse_share
from gpuagent.snapshot.gpu import GpuSample
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import (
    MPS_CLIENT,
    MPS_SERVER,
    MpsLimits,
    ProcessSample,
    Workload,
    combined_mps_limits,
    sm_share_ratio,
)

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


# -- the attribution's pods from rows of processes ------------------------------------------------------------


def pods_before(gpus: list[GpuSample], index: Any, names: Any) -> tuple[PodUse, ...]:
    """``Attributor._pods`` as it was, summing each pod's processes into objects per pod and container, no
    cache (the reference the rows-based one must agree with)."""
    used: dict[tuple[str | None, str], dict[str, Any]] = {}
    for gpu in gpus:
        for process in gpu.processes:
            w = process.workload
            if w is None or w.kind != "pod" or process.kind == MPS_SERVER:
                continue
            totals = used.setdefault((w.namespace, w.name), {"containers": {}, "used_gpus": []})
            totals["uid"], totals["qos"], totals["names_from"] = w.pod_uid, w.qos, w.names_from
            container = w.container or (w.container_id or "")[:12] or "unknown"
            figures = totals["containers"].setdefault(container, {"pids": [], "memory": 0, "sm": None})
            figures["pids"].append(process.pid)
            figures["memory"] += process.used_memory_bytes or 0
            if process.sm_util_percent is not None:
                figures["sm"] = (figures["sm"] or 0.0) + process.sm_util_percent
            if gpu.info.uuid not in totals["used_gpus"]:
                totals["used_gpus"].append(gpu.info.uuid)
    keys = list(index.allocated)
    keys.extend(k for k in used if k not in index.allocated)
    keys.sort(key=lambda k: (k[0] or "", k[1]))
    out = []
    for key in keys:
        allocated, totals, known = index.allocated.get(key), used.get(key), names.known.get(key)
        devices, allocated_gpus = allocated if allocated is not None else ({}, ())
        running = totals["containers"] if totals is not None else {}
        containers = tuple(
            ContainerUse(name=name, allocated_devices=devices.get(name, ()),
                         pids=tuple(sorted(running[name]["pids"])) if name in running else (),
                         gpu_memory_used_bytes=running[name]["memory"] if name in running else 0,
                         sm_util_percent=running[name]["sm"] if name in running else None)
            for name in sorted(set(devices) | set(running)))
        sm_values = [c.sm_util_percent for c in containers if c.sm_util_percent is not None]
        uid, qos, names_from = None, None, "pod_resources" if allocated is not None else "cgroup"
        if totals is not None:
            uid, qos, names_from = totals["uid"], totals["qos"], totals["names_from"]
        annotations: dict[str, str] = {}
        owner_kind = owner_name = None
        if known is not None:
            uid, name = known
            qos, names_from, annotations = name.qos or qos, "api_server", dict(name.annotations)
            owner_kind, owner_name = name.owner_kind, name.owner_name
        out.append(PodUse(
            name=key[1], namespace=key[0], uid=uid, qos=qos, names_from=names_from, annotations=annotations,
            containers=containers, allocated_gpus=allocated_gpus,
            used_gpus=tuple(totals["used_gpus"]) if totals is not None else (),
            gpu_memory_used_bytes=sum(c.gpu_memory_used_bytes for c in containers),
            sm_util_percent=sum(sm_values) if sm_values else None,
            process_count=sum(len(c.pids) for c in containers), owner_kind=owner_kind, owner_name=owner_name))
    return tuple(out)


@pytest.mark.parametrize("seed", range(40))
def test_the_pods_from_rows_are_the_pods_summed_as_before(seed: int) -> None:
    """Random nodes (pods of one or two containers with processes on several GPUs, unknown figures, MPS
    servers, workloads off Kubernetes, pods only allocated, names known or not), polled in a row through one
    Attributor (its remembered pods and order in play), each poll against the reference."""
    rng = random.Random(seed)
    uuids = ["GPU-0", "GPU-1", "GPU-2"]
    pods = [(rng.choice(["ns", "ml", None]), f"p{i}") for i in range(rng.randint(1, 8))]
    workloads = {
        pod: [Workload(kind="pod", name=pod[1], namespace=pod[0], pod_uid=f"uid-{pod[1]}",
                       container=rng.choice(["main", "side", None]), container_id=rng.choice(["c" * 64, None]),
                       qos=rng.choice(["burstable", None]), names_from=rng.choice(["api_server", "cgroup"]))
              for _ in range(rng.randint(1, 2))]
        for pod in pods
    }
    others = [Workload(kind="systemd_service", name="train.service"), None]
    allocations = [Alloc(ns or "default", name, rng.choice(["main", "side"]), f"{rng.choice(uuids)}::{n}")
                   for n, (ns, name) in enumerate(pods) if rng.random() < 0.7]
    index = _index_allocations(allocations, {})
    names = _index_names({f"uid-{name}": PodName(ns or "default", name, {}, {"gpuagent.io/gpu-share": "30%"})
                          for ns, name in pods if rng.random() < 0.5})
    attributor = Attributor()
    for _ in range(5):
        gpus = []
        pid = 100
        for uuid in uuids:
            processes = []
            for _ in range(rng.randint(0, 6)):
                pid += 1
                pool = [w for ws in workloads.values() for w in ws] + others
                processes.append(ProcessSample(
                    pid, "python3", rng.choice(["compute", "compute", MPS_SERVER]),
                    rng.choice([None, 2**30, 3 * 2**30]), rng.choice([None, 0.0, 12.5, 40.0, 7.25]), None,
                    workload=rng.choice(pool)))
            gpus.append(replace(two_gpu_node().gpus[0], info=replace(two_gpu_node().gpus[0].info, uuid=uuid),
                                processes=tuple(processes), migs=()))
        assert attributor._pods(gpus, index, names) == pods_before(gpus, index, names)


# -- the accounting's rates: one process on a whole GPU -------------------------------------------------------


def use_before(gpu: GpuSample, rates: GpuRates, pods_by_allocation: bool) -> None:
    """``rates._use`` as it was, every place through the general sums (the reference)."""
    by_place: dict[Any, list[ProcessSample]] = {}
    for process in gpu.processes:
        if process.kind != MPS_SERVER:
            by_place.setdefault((owner_of(process), process.gpu_instance_id), []).append(process)
    for (owner, instance), processes in by_place.items():
        assert instance is None  # (these nodes have no MIG)
        rate = Rate(memory_bytes=float(sum([p.used_memory_bytes or 0 for p in processes])))
        known = [share for share in map(sm_share_ratio, processes) if share is not None]
        rate.busy = min(1.0, sum(known)) if known else None
        mps = combined_mps_limits(processes) if owner is not UNATTRIBUTED else None
        if mps is not None and mps.active_thread_percent is not None:
            rate.mps_held = 1.0 * mps.active_thread_percent / 100.0
        if owner is not UNATTRIBUTED and not (pods_by_allocation and owner.kind == "pod"):
            rate.allocated = 1.0
        rates.units[(owner, instance)] = rate


@pytest.mark.parametrize("seed", range(40))
def test_one_process_on_a_whole_gpu_is_rated_as_the_sums_rate_it(seed: int) -> None:
    rng = random.Random(seed)
    workloads = [Workload(kind="pod", name=f"p{i}", namespace="ns", container="main") for i in range(4)]
    workloads += [Workload(kind="systemd_service", name="train.service"), None]
    processes = tuple(
        ProcessSample(pid, "python3", rng.choice(["compute", MPS_CLIENT, MPS_SERVER]),
                      rng.choice([None, 0, 2**30]), rng.choice([None, 0.0, 37.5, 100.0, 250.0]), None,
                      workload=rng.choice(workloads),
                      mps=rng.choice([None, MpsLimits(), MpsLimits(30.0, 2**30), MpsLimits(None, 2**29)]))
        for pid in range(rng.randint(0, 8)))
    gpu = replace(two_gpu_node().gpus[0], processes=processes, migs=())
    for by_allocation in (False, True):
        new, old = (GpuRates(gpu.info.uuid, 0, True, None) for _ in range(2))
        _use(gpu, new, by_allocation)
        use_before(gpu, old, by_allocation)
        assert new.units == old.units


# -- the ledger: a reading that covers one interval settles with it -------------------------------------------


class LedgerThroughPending(Ledger):
    """The ledger as it was: every interval's busy waits in ``PendingBusy`` for ``_settle_busy`` (the
    reference)."""

    def _integrate(self, previous: GpuRates, current: GpuRates, dt: float, totals: GpuTotals,
                   pending: _PendingEnergy) -> bool:
        increments: dict[Any, _Increment] = {}
        for place in previous.units.keys() | current.units.keys():
            increments[place] = _trapezoid(previous.units.get(place), current.units.get(place), dt)
        estimate = _energy_estimate(previous, current, dt) if pending.anchor is not None else None
        if estimate is not None:
            pending.unattributed += _split_energy(increments, estimate, dt)
            pending.total += estimate
        if current.busy_read_at is not None:
            waiting = self._busy.setdefault(current.uuid, PendingBusy(read_at=previous.busy_read_at))
            for place, increment in increments.items():
                present = ((place in previous.units) + (place in current.units)) / 2 * dt
                waiting.add(place, present, increment.allocated)
                increment.busy = None
        for key, increment in self._by_series(current.uuid, increments, _Increment).items():
            if increment.energy is not None:
                pending.shares[key] = pending.shares.get(key, 0.0) + increment.energy
            self._add(self._series(key, current), increment)
        return False


def random_ledger_polls(rng: random.Random, polls: int) -> list[tuple[float, dict[str, GpuRates]]]:
    """Polls of two GPUs whose places come and go: pods of one to three containers (or none named), a
    workload off Kubernetes, unattributed processes, MIG instances; per-process use read every poll, every
    few polls or never (GPM's per-poll rates); unknown busy, unusable polls, gaps, counters read now and
    then, reset or absent."""
    owners = [Owner("pod", "ns", f"p{i}", f"c{j}") for i in range(5) for j in range(rng.randint(1, 3))]
    owners += [Owner("pod", "ns", "bare", None), Owner("slurm_job", None, "job-7", None), UNATTRIBUTED]
    cadence = {uuid: rng.choice([1, 1, 1, 2, 3, None]) for uuid in ("GPU-a", "GPU-b")}
    counter = {uuid: 0.0 for uuid in cadence}
    out, t = [], 1000.0
    for n in range(polls):
        t += rng.choice([1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 5.0])
        rates = {}
        for index, uuid in enumerate(cadence):
            every = cadence[uuid] if rng.random() < 0.9 else rng.choice([1, 2, None])
            counter[uuid] = (counter[uuid] + rng.uniform(0, 400)) if rng.random() < 0.95 else 0.0
            gpu = GpuRates(uuid, index, usable=rng.random() < 0.93,
                           energy_joules_total=counter[uuid] if rng.random() < 0.9 else None,
                           energy_read_at_unix=float(n // rng.choice([1, 3])) if rng.random() < 0.8 else None,
                           power_watts=rng.choice([None, rng.uniform(50, 700)]),
                           busy_read_at=None if every is None else float(n // every),
                           profiles={1: "1g.10gb", 2: "3g.40gb"})
            for owner in rng.sample(owners, rng.randint(0, len(owners))):
                instance = None if rng.random() < 0.85 else rng.choice([1, 2])
                gpu.units[(owner, instance)] = Rate(
                    rng.choice([0.0, 0.25, 1 / 3, 1.0]), rng.choice([None, 0.0, 0.01, rng.random()]),
                    float(rng.randint(0, 2**34)))
            rates[uuid] = gpu
        out.append((t, rates))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_busy_settled_with_its_interval_is_what_pending_it_gave(seed: int) -> None:
    rng = random.Random(seed)
    settings = {"retention_seconds": rng.choice([3.0, 300.0]), "idle_threshold_ratio": 0.05}
    new, old = Ledger(**settings), LedgerThroughPending(**settings)
    for now, rates in random_ledger_polls(rng, 80):
        assert new.update(rates, now, 1.0) == old.update(rates, now, 1.0)
        assert list(new.series.items()) == list(old.series.items())  # the same series, in the same order
        assert new.gpus == old.gpus
        assert new._busy == old._busy and new._energy == old._energy


def test_busy_read_every_poll_settles_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case the shortcut is for (the reference test above runs it too): no round trip through
    ``PendingBusy.settle``, yet busy is counted."""
    settles: list[object] = []
    monkeypatch.setattr(PendingBusy, "settle", lambda self, read_at: settles.append(read_at) or {})
    ledger, owner = Ledger(), Owner("pod", "ns", "p", "c")
    for n in range(5):
        gpu = GpuRates("GPU-a", 0, True, None, busy_read_at=float(n))
        gpu.units[(owner, None)] = Rate(1.0, 0.5, 0.0)
        ledger.update({"GPU-a": gpu}, float(n), 1.0)
    assert settles == []
    assert [s.busy_gpu_seconds for _, s in ledger] == [2.0, 2.0]  # four intervals of a second at 0.5


def split_energy_before(increments: dict[Any, _Increment], energy: float, dt: float) -> float:
    """``ledger._split_energy`` as it was, in dictionaries (the reference)."""
    busy = {k: max(0.0, i.busy or 0.0) for k, i in increments.items()}
    held = {k: max(0.0, i.allocated) for k, i in increments.items() if k[0] is not UNATTRIBUTED}
    total_busy, total_held = sum(busy.values()), sum(held.values())
    busy_energy = energy * min(1.0, total_busy / dt) if total_busy > 0 else 0.0
    idle_energy = energy - busy_energy
    shares = {k: busy_energy * b / total_busy for k, b in busy.items() if b > 0}
    if total_held > 0:
        for k, h in held.items():
            shares[k] = shares.get(k, 0.0) + idle_energy * h / total_held
    elif total_busy > 0:
        for k, b in busy.items():
            shares[k] = shares.get(k, 0.0) + idle_energy * b / total_busy
    unattributed = 0.0 if total_held > 0 or total_busy > 0 else idle_energy
    for k, share in shares.items():
        if k[0] is UNATTRIBUTED:
            unattributed += share
        else:
            increments[k].energy = share
    return unattributed


@pytest.mark.parametrize("seed", range(200))
def test_energy_split_in_one_pass_is_the_dictionaries_split(seed: int) -> None:
    rng = random.Random(seed)
    owners = [Owner("pod", "ns", f"p{i}", "c") for i in range(6)] + [UNATTRIBUTED]
    places = rng.sample([(o, rng.choice([None, None, 1, 2])) for o in owners], rng.randint(0, len(owners)))
    figures = [(rng.choice([0.0, 0.0, 0.5, 1.0, rng.random(), -0.1]),
                rng.choice([None, 0.0, 0.0, rng.random(), rng.uniform(0, 3), -0.2]), 0.0) for _ in places]
    dt, energy = rng.choice([0.5, 1.0, 5.0]), rng.choice([0.0, 1.0, rng.uniform(0, 3000)])
    new = {place: _Increment(*f) for place, f in zip(places, figures, strict=True)}
    old = {place: _Increment(*f) for place, f in zip(places, figures, strict=True)}
    assert _split_energy(new, energy, dt) == split_energy_before(old, energy, dt)
    assert new == old  # every share the same float; a place without one keeps None
