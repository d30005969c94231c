"""The exporter: golden /metrics per scenario, dcgm-exporter compatibility, isolation of failures, escaping.

Regenerate the golden files with ``GPUAGENT_UPDATE_GOLDEN=1 pytest tests/test_export.py`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.openmetrics.exposition import generate_latest as stock_openmetrics_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from snapshots import (
    LOST_UUID,
    MIG_UUID,
    ODD_COMM,
    REF_UUID,
    SCENARIOS,
    STALE_UUID,
    TAKEN_AT,
    laptop_node,
    lost_gpu_node,
    mig_node,
    two_gpu_node,
)

from gpuagent import __version__
from gpuagent.export import build_registry, choose_encoder
from gpuagent.export.dcgm import FIELDS, DcgmCollector
from gpuagent.export.exposition import generate_openmetrics, generate_text
from gpuagent.export.guard import SnapshotCollector
from gpuagent.snapshot.node import NodeSnapshot
from gpuagent.snapshot.processes import ProcessSample

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUAGENT_UPDATE_GOLDEN") == "1"
CLOCK = lambda: TAKEN_AT + 1.5  # noqa: E731
NONDETERMINISTIC = "gpuagent_collector_duration_seconds{"

# A sample line quoted in the reference (dcgm-exporter.md §2) with today's labels (pci_bus_id, host, driver).
REFERENCE_GPU_TEMP = (
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-15704b32-f531-14ce-0530-1ac21e4b68e6",pci_bus_id="00000000:53:00.0",'
    'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="ip-10-0-180-136.ec2.internal",'
    'DCGM_FI_DRIVER_VERSION="580.105.08"} 31'
)
DCGM_ORDER = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
MIG_ORDER = [*DCGM_ORDER, "GPU_I_PROFILE", "GPU_I_ID"]


def registry_for(snapshot: NodeSnapshot | None, **kwargs):
    return build_registry(lambda: snapshot, clock=CLOCK, **kwargs)


def text(registry) -> str:
    """What /metrics serves in text 0.0.4: our encoder, labels in dcgm-exporter's order."""
    return generate_text(registry).decode()


def openmetrics(registry) -> str:
    return generate_openmetrics(registry).decode()


def stock_text(registry) -> str:
    """client_python's own encoders: the registry must render with them too (labels sorted)."""
    return generate_latest(registry).decode()


def stock_openmetrics(registry) -> str:
    return stock_openmetrics_encoder(registry).decode()


def parsed(exposition: str, parse) -> list[tuple]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value) for m in parse(exposition) for s in m.samples
    )


def strip(exposition: str) -> str:
    lines = exposition.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith(NONDETERMINISTIC))


def samples(registry) -> list:
    return [s for metric in registry.collect() for s in metric.samples]


def families(registry) -> dict:
    return {metric.name: metric for metric in registry.collect()}


def series(registry, name: str, **labels) -> list:
    """The samples named ``name`` whose labels include ``labels``."""
    return [s for s in samples(registry) if s.name == name and labels.items() <= s.labels.items()]


def values(registry, name: str, **labels) -> list[float]:
    return [s.value for s in series(registry, name, **labels)]


# --- golden files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("fmt", ["prom", "om"])
def test_golden(scenario, fmt):
    registry = registry_for(SCENARIOS[scenario]())
    rendered = strip(text(registry) if fmt == "prom" else openmetrics(registry))
    path = GOLDEN / f"export_{scenario}.{fmt}"
    if UPDATE:
        path.write_text(rendered, encoding="utf-8")
    assert path.exists(), f"{path} is missing: run with GPUAGENT_UPDATE_GOLDEN=1"
    assert rendered == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_encoder_parses_to_the_same_samples(scenario):
    snapshot = SCENARIOS[scenario]()
    registry = build_registry(lambda: snapshot, clock=CLOCK, timer=lambda: 0.0)
    expected = parsed(stock_text(registry), parse_text)
    assert any(name == "gpuagent_up" for name, _, _ in expected)
    assert parsed(text(registry), parse_text) == expected
    assert parsed(openmetrics(registry), parse_openmetrics) == expected
    assert parsed(stock_openmetrics(registry), parse_openmetrics) == expected


def test_encoders_match_client_python_byte_for_byte_where_order_cannot_differ():
    registry = CollectorRegistry()
    Counter("jobs", "Jobs done.", ["kind"], registry=registry).labels("a\\b").inc(3)
    Gauge("temp_celsius", 'A "quoted"\nhelp \\ text.', registry=registry).set(1e-7)
    Histogram("latency_seconds", "Latency.", registry=registry, buckets=(0.1, 1)).observe(0.5)
    Summary("size_bytes", "Size.", registry=registry).observe(1234567890)
    Info("build", "Build.", registry=registry).info({"version": "1"})
    Enum("state", "State.", states=["up", "down"], registry=registry).state("down")
    assert text(registry) == stock_text(registry)  # _created included: moved to its own gauge in 0.0.4
    assert openmetrics(registry) == stock_openmetrics(registry)


def test_choose_encoder():
    encoder, content_type = choose_encoder("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert encoder is generate_openmetrics and content_type.startswith("application/openmetrics-text")
    encoder, content_type = choose_encoder("text/plain")
    assert encoder is generate_text and content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert choose_encoder(None)[0] is generate_text


# promtool lints dcgm-exporter's own choices: the camelCase ``modelName`` label (on DCGM_* and on
# gpuagent_gpu_info, which carries dcgm's descriptive labels for group_left) and "counter" in a dcgm name.
ACCEPTED_LINT = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_promtool_check_metrics(scenario):
    golden = GOLDEN / f"export_{scenario}.prom"
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=golden.read_bytes(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    problems = [line for line in (result.stdout + result.stderr).decode().splitlines() if line.strip()]
    assert result.returncode in (0, 3), problems  # 3: lint problems only, 1: the exposition does not parse
    unexpected = [
        p for p in problems
        if not (p.startswith(("DCGM_", "gpuagent_gpu_info ")) and p.endswith(ACCEPTED_LINT))
    ]
    assert not unexpected


# --- dcgm-exporter compatibility ----------------------------------------------------------------------------


def test_reference_sample_line_reproduced():
    labels, value = REFERENCE_GPU_TEMP.rsplit(" ", 1)
    lines = text(registry_for(two_gpu_node())).splitlines()
    [line] = [line for line in lines if line.startswith(labels + " ")]
    assert float(line.rsplit(" ", 1)[1]) == float(value)
    assert line in openmetrics(registry_for(two_gpu_node())).splitlines()
    # the same sample for client_python's parser, whatever the order
    [expected] = [s for m in parse_text(REFERENCE_GPU_TEMP + "\n") for s in m.samples]
    assert expected in [s for m in parse_text(stock_text(registry_for(two_gpu_node()))) for s in m.samples]


def test_labels_in_dcgm_order():
    for sample in samples(registry_for(two_gpu_node())):
        if sample.name.startswith("DCGM_"):
            names = list(sample.labels)
            assert names[:5] == DCGM_ORDER
            assert names[5:7] == ["Hostname", "DCGM_FI_DRIVER_VERSION"]
    for sample in samples(registry_for(mig_node())):
        if sample.name == "DCGM_FI_DEV_FB_USED":
            assert list(sample.labels) == [*MIG_ORDER, "Hostname", "DCGM_FI_DRIVER_VERSION"]
    xid = [s for s in samples(registry_for(two_gpu_node())) if s.name == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert list(xid[0].labels)[-2:] == ["window_size_in_ms", "xid"]
    last = [s for s in samples(registry_for(two_gpu_node())) if s.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert list(last[0].labels)[-2:] == ["err_code", "err_msg"]


def test_dcgm_counters_keep_their_exact_names_in_both_formats():
    registry = registry_for(two_gpu_node())
    for exposition, typ in ((text(registry), "untyped"), (openmetrics(registry), "unknown")):
        assert f"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION {typ}\n" in exposition
        assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in exposition
        assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in exposition
        assert "\nDCGM_EXP_XID_ERRORS_COUNT{" in exposition


def test_dcgm_units():
    registry = registry_for(two_gpu_node())
    gpu0 = {"UUID": REF_UUID}
    assert values(registry, "DCGM_FI_DEV_SM_CLOCK", **gpu0) == [1980.0]  # MHz
    assert values(registry, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **gpu0) == [123_456_789_012.0]  # mJ
    assert values(registry, "DCGM_FI_DEV_FB_USED", **gpu0) == [41472.0]  # whole MiB
    assert values(registry, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", **gpu0) == [0.91]  # ratio
    assert values(registry, "DCGM_FI_DEV_GPU_UTIL", **gpu0) == [87.0]  # percent
    assert values(registry, "gpuagent_gpu_graphics_clock_hertz", **gpu0) == [1.98e9]


def test_every_listed_field_rendered_for_a_full_gpu():
    names = {s.name for s in samples(registry_for(two_gpu_node()))}
    missing = {f.name for f in FIELDS} - names
    assert not missing
    assert not any("VGPU" in n for n in names)


def test_xid_gauge_and_window_count():
    registry = build_registry(lambda: two_gpu_node(), clock=CLOCK, xid_window_seconds=60)
    by_gpu = {s.labels["gpu"]: s for s in samples(registry) if s.name == "DCGM_FI_DEV_XID_ERRORS"}
    assert (by_gpu["0"].value, by_gpu["0"].labels["err_code"]) == (31.0, "31")
    assert by_gpu["0"].labels["err_msg"] == "GPU memory page fault"
    none = by_gpu["1"]
    assert (none.value, none.labels["err_code"], none.labels["err_msg"]) == (0, "0", "No Error")
    counts = series(registry, "DCGM_EXP_XID_ERRORS_COUNT")
    assert {(s.labels["gpu"], s.labels.get("xid"), s.value) for s in counts} == {
        ("0", "31", 1.0),
        ("1", None, 0.0),
    }
    assert {s.labels["window_size_in_ms"] for s in counts} == {"60000"}


def test_unknown_xid_code_reads_unknown_error():
    snap = two_gpu_node()
    gpu = dataclasses.replace(snap.gpus[0], xid=dataclasses.replace(snap.gpus[0].xid, last_code=999))
    snap = dataclasses.replace(snap, gpus=(gpu,))
    [sample] = [s for s in samples(registry_for(snap)) if s.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert sample.labels["err_msg"] == "Unknown Error"


def test_hostname_label_spelling_and_absence():
    lower = samples(registry_for(two_gpu_node(), hostname_label="hostname"))
    assert all("Hostname" not in s.labels for s in lower)
    assert any(s.labels.get("hostname") == "ip-10-0-180-136.ec2.internal" for s in lower)
    none = samples(registry_for(two_gpu_node(), hostname_label=""))
    assert all("Hostname" not in s.labels and "hostname" not in s.labels for s in none)


# --- None, MIG, lost GPUs -----------------------------------------------------------------------------------


def test_none_gives_no_series():
    registry = registry_for(laptop_node())
    names = {s.name for s in samples(registry)}
    for absent in (
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gpuagent_gpu_power_limit_watts",
        "gpuagent_gpu_pcie_tx_bytes_total",
        "gpuagent_gpu_remapped_rows_pending",
        "gpuagent_process_memory_utilization_ratio",
    ):
        assert absent not in names
    assert "DCGM_FI_DEV_GPU_TEMP" in names
    # Xorg reports no memory and no utilization: no process series, yet it is counted.
    assert not [s for s in samples(registry) if s.labels.get("pid") == "1200"]
    assert values(registry, "gpuagent_gpu_processes") == [2.0]
    # A process that exited before its name was read has no comm label, never comm="".
    [memory] = [s for s in samples(registry) if s.name == "gpuagent_process_gpu_memory_used_bytes"]
    assert "comm" not in memory.labels
    assert all(v != "" for s in samples(registry) for v in s.labels.values())
    assert "serial" not in next(s for s in samples(registry) if s.name == "gpuagent_gpu_info").labels


def test_mig_series_per_instance():
    registry = registry_for(mig_node())
    used = {s.labels.get("GPU_I_ID"): s for s in samples(registry) if s.name == "DCGM_FI_DEV_FB_USED"}
    assert set(used) == {"1", "5", "13"}  # no GPU-wide FB_USED next to the instances': sums stay right
    assert used["1"].value == 30 * 1024 and used["1"].labels["GPU_I_PROFILE"] == "3g.40gb"
    assert used["1"].labels["UUID"] == MIG_UUID and used["1"].labels["device"] == "nvidia0"
    gr = {s.labels.get("GPU_I_ID"): s.value for s in series(registry, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
    assert gr == {"1": 0.75, "5": 0.2}
    # No instance reports PCIe bytes: the GPU-wide figure stays on the GPU series.
    [pcie] = [s for s in samples(registry) if s.name == "DCGM_FI_PROF_PCIE_TX_BYTES"]
    assert "GPU_I_ID" not in pcie.labels and pcie.value == 1e8
    # Physical fields stay on the GPU series; no device utilization on MIG.
    [temp] = [s for s in samples(registry) if s.name == "DCGM_FI_DEV_GPU_TEMP"]
    assert "GPU_I_ID" not in temp.labels
    assert not values(registry, "DCGM_FI_DEV_GPU_UTIL")
    memory = series(registry, "gpuagent_process_gpu_memory_used_bytes")
    processes = {s.labels["pid"]: s.labels for s in memory}
    assert processes["7001"]["GPU_I_ID"] == "1" and processes["7002"]["GPU_I_PROFILE"] == "2g.20gb"
    assert not values(registry, "gpuagent_process_sm_utilization_ratio")  # None on MIG
    info = {s.labels["GPU_I_ID"]: s.labels for s in samples(registry) if s.name == "gpuagent_mig_info"}
    assert set(info) == {"1", "5", "13"} and info["13"]["mig_uuid"].startswith("MIG-")
    assert values(registry, "gpuagent_mig_slice_ratio", GPU_I_ID="1") == [3 / 7]


def test_process_in_an_unlisted_instance_keeps_its_id():
    snap = mig_node()
    stray = ProcessSample(7100, "stray", "compute", 1024, None, None, gpu_instance_id=9)
    gpu = dataclasses.replace(snap.gpus[0], processes=(*snap.gpus[0].processes, stray))
    registry = registry_for(dataclasses.replace(snap, gpus=(gpu,)))
    [labels] = [s.labels for s in samples(registry) if s.labels.get("pid") == "7100"]
    assert labels["GPU_I_ID"] == "9" and "GPU_I_PROFILE" not in labels


def test_lost_gpu_has_no_device_series_but_keeps_its_health():
    registry = registry_for(lost_gpu_node())
    lost = [s for s in samples(registry) if s.labels.get("UUID") == LOST_UUID]
    assert {s.name for s in lost} == {
        "gpuagent_gpu_health",
        "gpuagent_gpu_stale",
        "gpuagent_gpu_xid_errors_total",
        "gpuagent_gpu_info",
    }
    health = {s.labels["state"]: s.value for s in lost if s.name == "gpuagent_gpu_health"}
    assert health == {"ok": 0.0, "lost": 1.0, "unresponsive": 0.0, "error": 0.0}
    assert values(registry, "gpuagent_gpu_xid_errors_total", UUID=LOST_UUID, xid="79") == [1.0]
    # The unresponsive GPU keeps serving its last values, flagged stale.
    assert values(registry, "DCGM_FI_DEV_GPU_TEMP", UUID=STALE_UUID) == [60.0]
    assert values(registry, "gpuagent_gpu_stale", UUID=STALE_UUID) == [1.0]
    assert values(registry, "gpuagent_snapshot_stale") == [1.0]
    assert values(registry, "gpuagent_up") == [0.0]  # the nvml source failed


def test_agent_health_families():
    registry = registry_for(two_gpu_node())
    assert values(registry, "gpuagent_up") == [1.0]
    assert values(registry, "gpuagent_snapshot_age_seconds") == [1.5]
    assert values(registry, "gpuagent_poll_duration_seconds_bucket", le="+Inf") == [100.0]
    assert values(registry, "gpuagent_poll_duration_seconds_bucket", le="0.01") == [40.0]
    calls = "gpuagent_nvml_call_duration_seconds"
    assert values(registry, f"{calls}_count", function="nvmlDeviceGetFieldValues") == [200]
    assert values(registry, f"{calls}_sum", function="nvmlDeviceGetFieldValues") == [0.05]
    assert values(registry, "gpuagent_nvml_errors_total", code="FUNCTION_NOT_FOUND") == [1.0]
    assert values(registry, "gpuagent_source_success", source="xid") == [1.0]
    assert values(registry, "gpuagent_polls_total") == [100.0]


def test_no_snapshot_yet():
    registry = registry_for(None)
    names = {s.name for s in samples(registry)}
    meta = {"gpuagent_collector_success", "gpuagent_collector_duration_seconds"}
    assert names == {"gpuagent_up", "gpuagent_build_info", *meta}
    assert values(registry, "gpuagent_up") == [0.0]


def test_a_simulated_node_says_so_on_every_scrape():
    """The backend on gpuagent_build_info and gpuagent_simulated: 1 for the simulator (before its first
    poll too), 0 for NVML, so simulated figures never pass for a real GPU's."""
    simulated = registry_for(two_gpu_node())  # backend sim
    assert [s.labels for s in series(simulated, "gpuagent_build_info")] == [
        {"version": __version__, "backend": "sim"}]
    assert values(simulated, "gpuagent_simulated") == [1.0]
    real = registry_for(laptop_node())  # backend nvml
    assert values(real, "gpuagent_build_info", backend="nvml") == [1.0]
    assert values(real, "gpuagent_simulated") == [0.0]
    starting = registry_for(None, backend="sim")
    assert values(starting, "gpuagent_simulated") == [1.0]
    assert values(starting, "gpuagent_build_info", backend="sim") == [1.0]


# --- isolation of failures ----------------------------------------------------------------------------------


def test_failing_collector_does_not_fail_the_scrape(monkeypatch, caplog):
    def boom(self, snapshot):
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(DcgmCollector, "render", boom)
    registry = registry_for(two_gpu_node())
    with caplog.at_level(logging.INFO, logger="gpuagent.export.guard"):
        for _ in range(3):
            exposition = text(registry)
    assert "DCGM_FI_" not in exposition
    assert 'gpuagent_collector_success{collector="dcgm"} 0.0' in exposition
    assert 'gpuagent_collector_success{collector="health"} 1.0' in exposition
    assert "gpuagent_process_gpu_memory_used_bytes{" in exposition
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1  # once per state change
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="gpuagent.export.guard"):
        assert 'gpuagent_collector_success{collector="dcgm"} 1.0' in text(registry)
    assert [r for r in caplog.records if "recovered" in r.getMessage()]


class _BadLabels:
    name = "bad"

    def render(self, snapshot):
        from gpuagent.export.families import add, gauge

        metric = gauge("bad_metric", "A label value that is not a string.")
        add(metric, {"gpu": 0}, 1)  # would make generate_latest raise outside any collector
        return [metric]


class _Half:
    name = "half"

    def render(self, snapshot):
        from gpuagent.export.families import add, gauge

        metric = gauge("half_metric", "Yields one family, then raises.")
        add(metric, {}, 1)
        yield metric
        raise RuntimeError("halfway")


def test_guard_catches_unrenderable_and_partial_output(caplog):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: None, [_BadLabels(), _Half()]))
    with caplog.at_level(logging.ERROR):
        for render in (text, openmetrics, text):
            exposition = render(registry)
            # The renderer that raised halfway: none of its families, and its success reads 0.
            assert "half_metric{" not in exposition
            assert 'gpuagent_collector_success{collector="half"} 0.0' in exposition
            # The family the encoder cannot encode: left out alone, the rest of the scrape is served.
            assert "bad_metric" not in exposition
            assert 'gpuagent_collector_success{collector="bad"}' in exposition
    assert sum("bad_metric cannot be encoded" in r.getMessage() for r in caplog.records) == 1


def test_latest_that_raises_reads_as_no_snapshot():
    def latest():
        raise RuntimeError("poller state broken")

    registry = build_registry(latest, clock=CLOCK)
    assert values(registry, "gpuagent_up") == [0.0]


def test_registration_renders_nothing_and_a_scrape_reads_the_snapshot_once():
    calls = []

    def latest():
        calls.append(1)
        return two_gpu_node()

    registry = build_registry(latest, clock=CLOCK)
    assert calls == []
    text(registry)
    assert calls == [1]
    assert "gpuagent_up" in text(registry.restricted_registry(["gpuagent_up"]))


# --- escaping -----------------------------------------------------------------------------------------------


def test_odd_comm_escaped_in_both_formats():
    registry = registry_for(two_gpu_node())
    escaped = 'comm="py\\"th\\\\on\\nwörker ✓"'
    for render in (text, openmetrics, stock_text, stock_openmetrics):
        assert escaped in render(registry)
    for parse, exposition in ((parse_text, text(registry)), (parse_openmetrics, openmetrics(registry))):
        comms = {s.labels.get("comm") for m in parse(exposition) for s in m.samples}
        assert ODD_COMM in comms


@settings(max_examples=60, deadline=None)
@given(comm=st.text(min_size=1, max_size=40))
def test_any_comm_round_trips(comm):
    snap = two_gpu_node()
    process = ProcessSample(99, comm, "compute", 4096, 1.0, 1.0)
    gpu = dataclasses.replace(snap.gpus[0], processes=(process,))
    registry = registry_for(dataclasses.replace(snap, gpus=(gpu,)))
    for parse, exposition in ((parse_text, text(registry)), (parse_openmetrics, openmetrics(registry))):
        comms = [
            s.labels["comm"]
            for m in parse(exposition)
            if m.name == "gpuagent_process_gpu_memory_used_bytes"
            for s in m.samples
        ]
        assert comms == [comm]


def test_duplicate_process_entries_give_one_series_each():
    snap = two_gpu_node()
    gpu1 = snap.gpus[1]
    gpu = dataclasses.replace(gpu1, processes=(*gpu1.processes, gpu1.processes[0]))
    registry = registry_for(dataclasses.replace(snap, gpus=(snap.gpus[0], gpu)))
    xorg = series(registry, "gpuagent_process_gpu_memory_used_bytes", pid="5151")
    assert sorted(s.labels["kind"] for s in xorg) == ["compute", "graphics"]
    assert values(registry, "gpuagent_gpu_processes", gpu="1") == [1.0]
