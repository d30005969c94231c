"""The exporter's fast paths say exactly what a fresh rendering says: Kept families, dcgm's source columns,
label texts kept across snapshots, value formatting, and no snapshot kept alive.

Each scrape of a long sequence of changing snapshots (GPU figures, XIDs, ECC, profiling, processes, pods with
odd names, accounting, enforcement) through one registry must be byte for byte what a registry that never
saw the earlier snapshots renders, in both formats, plain and gzipped.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import random
import sys
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString
from snapshots import GIB, ODD_COMM, TAKEN_AT, two_gpu_node

from gpuagent.export import build_registry, scrape
from gpuagent.export.exposition import generate_openmetrics, generate_text, sample_value
from gpuagent.export.families import Kept, TextCache, gauge, put
from gpuagent.export.guard import SnapshotCollector
from gpuagent.snapshot.accounting import AccountingState, GpuAccounting, WorkloadGpuUsage
from gpuagent.snapshot.enforcement import EnforcementState, MemoryState, ShareState
from gpuagent.snapshot.gpu import EccCounts, ProfilingSample, RemappedRows, XidRecord
from gpuagent.snapshot.node import NodeSnapshot, SourceStatus
from gpuagent.snapshot.pods import ContainerUse, PodUse
from gpuagent.snapshot.processes import ProcessSample, Workload

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
ODD_NAMES = ('web-0', 'a"quote', 'back\\slash', 'new\nline', 'wörker ✓', '{brace}=,"')


def clock() -> float:
    return TAKEN_AT + 2.0


def fresh(snapshot: NodeSnapshot) -> list[bytes]:
    """What a registry that never saw another snapshot renders: text and OpenMetrics."""
    registry = build_registry(lambda: snapshot, clock=clock, timer=lambda: 0.0)
    return [generate_text(registry), generate_openmetrics(registry)]


def served(registry, snapshot_holder: dict, snapshot: NodeSnapshot) -> list[bytes]:
    snapshot_holder["snapshot"] = snapshot
    bodies = []
    for accept in (None, OPENMETRICS):
        plain = scrape(registry, accept, None).body
        assert gzip.decompress(scrape(registry, accept, "gzip").body) == plain
        bodies.append(plain)
    return bodies


def pod_node(rng: random.Random, step: int) -> NodeSnapshot:
    """two_gpu_node's GPUs with pods (odd names among them), their processes, accounting and enforcement,
    every figure drawn from ``rng``: some change from one step to the next, some do not."""
    base = two_gpu_node()
    pods = [(rng.choice(("ml", 'team"x', "ns\\1")), rng.choice(ODD_NAMES) + f"-{i}") for i in range(rng.randint(1, 5))]
    gpus = []
    for index, gpu in enumerate(base.gpus):
        processes = tuple(
            ProcessSample(9000 + index * 100 + i, rng.choice(("python3", ODD_COMM, "")), "compute",
                          rng.choice((1 * GIB, 2 * GIB, None)), rng.choice((12.5, 40.0, None, 0.0)),
                          rng.uniform(0, 100),
                          workload=Workload("pod", name, namespace, container=rng.choice(("main", 'c"1', None)),
                                            names_from="api_server"))
            for i, (namespace, name) in enumerate(pods) if rng.random() < 0.7
        )
        gpus.append(dataclasses.replace(
            gpu,
            temperature_celsius=rng.choice((gpu.temperature_celsius, 55.0 + step % 3)),
            power_watts=rng.choice((gpu.power_watts, rng.uniform(100, 700))),
            energy_joules_total=rng.choice((gpu.energy_joules_total, 1e6 + step * 123.456)),
            pcie_tx_bytes_total=rng.choice((gpu.pcie_tx_bytes_total, 10**9 + step)),
            clock_event_reasons=rng.choice((gpu.clock_event_reasons, 0x4, None)),
            ecc=rng.choice((gpu.ecc, EccCounts(step % 2, 0, 1, 0, 0, 0, 0), None)),
            remapped_rows=rng.choice((gpu.remapped_rows, RemappedRows(1, step % 3, step % 2 == 0, False), None)),
            profiling=rng.choice((gpu.profiling, ProfilingSample(sm_active_ratio=rng.random()), None)),
            xid=rng.choice((gpu.xid, XidRecord(last_code=79, totals={79: step}, recent={79: 1}))),
            processes=processes,
        ))
    uuids = [g.info.uuid for g in gpus]
    pod_uses = tuple(
        PodUse(name, namespace, uid=f"uid-{i}", qos="burstable", names_from="api_server",
               containers=(ContainerUse("main", allocated_devices=(f"{uuids[i % 2]}::{i}",)),),
               allocated_gpus=(uuids[i % 2],), used_gpus=tuple(rng.sample(uuids, rng.randint(0, 2))),
               owner_kind=rng.choice((None, "Deployment")), owner_name=rng.choice((None, 'web"1')))
        for i, (namespace, name) in enumerate(pods)
    )
    usage = tuple(
        WorkloadGpuUsage(level, "pod", name, namespace, "main" if level == "container" else None,
                         uuids[i % 2] if rng.random() < 0.9 else "GPU-gone", i % 2, None, None,
                         float(step + i), rng.choice((None, step * 0.5)), step * 1e9 + 0.25, rng.choice((None, 3.5)),
                         0.0, efficiency_ratio=rng.choice((None, 0.5)), idle_seconds=float(step % 4),
                         ended_at_unix=rng.choice((None, TAKEN_AT)))
        for i, (namespace, name) in enumerate(pods) for level in ("pod", "container")
    )
    accounting = AccountingState(usage=usage, gpus=tuple(
        GpuAccounting(u, i, rng.choice((None, step * 10.0)), 0.0, float(step % 2)) for i, u in enumerate(uuids)))
    enforcement = EnforcementState(
        mode="audit",
        shares=tuple(ShareState(name, namespace, uuids[i % 2], i % 2, rng.choice((None, 0.5)), rng.random(), 0.0,
                                float(step), latency_standing=rng.choice((None, "exempt", "over", "capped")),
                                preemptions_total=step) for i, (namespace, name) in enumerate(pods)),
        memory=tuple(MemoryState(name, namespace, rng.choice((None, 4 * GIB)), GIB,
                                 rng.choice(("ok", "warned", "killed"))) for namespace, name in pods),
        actions_total={("freeze", "audit"): step},
    )
    sources = (*base.sources, SourceStatus("pod_resources", True, 0.001))
    return dataclasses.replace(base, gpus=tuple(gpus), pods=pod_uses, accounting=accounting,
                               enforcement=enforcement, sources=sources, polls_total=step)


@pytest.mark.parametrize("seed", range(6))
def test_every_scrape_of_a_changing_node_is_what_a_fresh_registry_renders(seed: int) -> None:
    rng = random.Random(seed)
    holder: dict = {}
    registry = build_registry(lambda: holder["snapshot"], clock=clock, timer=lambda: 0.0)
    previous = None
    for step in range(25):
        snapshot = pod_node(rng, step) if previous is None or rng.random() < 0.8 else previous
        assert served(registry, holder, snapshot) == fresh(snapshot), f"seed {seed}, step {step}"
        previous = snapshot


def test_odd_label_values_round_trip_through_every_kept_text() -> None:
    rng = random.Random(7)
    holder: dict = {}
    registry = build_registry(lambda: holder["snapshot"], clock=clock, timer=lambda: 0.0)
    for step in range(5):
        snapshot = pod_node(rng, step)
        text = served(registry, holder, snapshot)[0].decode()
        pods = {s.labels["pod"] for f in text_string_to_metric_families(text) for s in f.samples if "pod" in s.labels}
        assert pods == {p.name for p in snapshot.pods} | {s.pod for s in snapshot.enforcement.shares}


def test_a_family_whose_inputs_did_not_change_is_served_again_the_same_object() -> None:
    snapshot = two_gpu_node()
    hotter = dataclasses.replace(snapshot, gpus=(
        dataclasses.replace(snapshot.gpus[0], temperature_celsius=99.0), *snapshot.gpus[1:]))
    holder = {"snapshot": snapshot}
    registry = build_registry(lambda: holder["snapshot"], clock=clock, timer=lambda: 0.0)
    first = {m.name: m for m in registry.families()}
    holder["snapshot"] = hotter
    second = {m.name: m for m in registry.families()}
    changed = {name for name in second if second[name] is not first.get(name)}
    # The temperature and the collectors' durations (made every scrape): nothing else was made anew.
    assert changed == {"DCGM_FI_DEV_GPU_TEMP", "gpuagent_collector_duration_seconds"}
    assert scrape(registry, None, None).body == fresh(hotter)[0]


def test_kept_makes_a_family_only_when_its_rows_change() -> None:
    kept = Kept()
    one = kept.family("x", "Help.", "gauge", ["{a=\"1\"}"], [1.0])
    assert kept.family("x", "Help.", "gauge", ["{a=\"1\"}"], [1]) is one  # 1 == 1.0: the same text
    assert kept.known("x", "Help.", "gauge", ["{a=\"1\"}", "{a=\"2\"}"], [1.0, None]) is one
    two = kept.family("x", "Help.", "gauge", ["{a=\"1\"}"], [2.0])
    assert two is not one and kept.last("x") is two
    assert kept.family("x", "Other help.", "gauge", ["{a=\"1\"}"], [2.0]) is not two


def test_text_cache_is_emptied_once_as_many_texts_are_dead_as_alive() -> None:
    built = []
    cache = TextCache(lambda key: built.append(key) or f"text-{key}", minimum=4)
    sizes = []
    for step in range(50):  # 10 live keys a snapshot, 2 of them new each time (churn)
        cache.rotate()
        for key in range(step * 2, step * 2 + 10):
            assert cache[key] == f"text-{key}"
        sizes.append(len(cache))
    assert max(sizes[5:]) <= 2 * 10 + 2
    assert len(built) < 50 * 10  # most lookups found their text


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10**20, max_value=10**20),
                 st.booleans(), st.integers(min_value=10**6, max_value=2**53).map(float)))
def test_values_are_written_as_client_python_writes_them(value: float) -> None:
    assert sample_value(value) == floatToGoString(float(value) + 0.0)


@pytest.mark.parametrize(("value", "text"), [
    (-0.0, "0.0"), (0, "0.0"), (True, "1.0"), (7, "7.0"), (999_999, "999999.0"), (1_000_000, "1e+06"),
    (1234567.25, "1.23456725e+06"), (2**53, "9.007199254740992e+15"), (9999999999999998.0, "9.999999999999998e+15"),
    (1e16, "1e+16"), (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (float("nan"), "NaN"), (-12345678.5, "-12345678.5"),
])
def test_value_edge_cases(value: float, text: str) -> None:
    assert sample_value(value) == text


def test_a_value_that_is_no_number_costs_its_family_alone(caplog: pytest.LogCaptureFixture) -> None:
    class Odd:
        name = "odd"

        def render(self, snapshot):
            bad, good = gauge("odd_bad", "A string value."), gauge("odd_good", "Fine.")
            put(bad, ['{a="1"}'], ["not a number"])  # type: ignore[list-item]
            put(good, ['{a="1"}'], [2])
            return [bad, good]

    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: None, [Odd()]))
    for _ in range(2):
        body = generate_text(registry).decode()
        assert "odd_bad" not in body and 'odd_good{a="1"} 2.0' in body
        assert 'gpuagent_collector_success{collector="odd"} 1.0' in body
    assert sum("odd_bad cannot be encoded" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.skipif(sys.version_info < (3, 11), reason="NodeSnapshot takes weak references from Python 3.11")
def test_the_exporter_keeps_no_snapshot_alive() -> None:
    holder = {"snapshot": two_gpu_node()}
    registry = build_registry(lambda: holder["snapshot"], clock=clock, timer=lambda: 0.0)
    scrape(registry, None, "gzip")
    gone = weakref.ref(holder["snapshot"])
    holder["snapshot"] = two_gpu_node()  # the next poll's: the first is nobody's any more
    scrape(registry, None, None)
    gc.collect()
    assert gone() is None
    # A second scrape of the same snapshot is still served from what the first one made.
    first = {m.name: m for m in registry.families()}
    second = {m.name: m for m in registry.families()}
    assert {name for name in second if second[name] is not first[name]} == {
        "gpuagent_collector_duration_seconds"}  # made every scrape
