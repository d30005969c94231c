"""The first scrape after ``/readyz`` turns 200 is whole: it carries every family the node supports.

A real agent process per scenario (the simulated 8xH100 node, with GPM, and the A100 MIG node, without): the
first ``/metrics`` after ready is compared with one taken once every tier has come round (profiling, energy,
network, slow poll). Every family of the later scrape, and every GPU and MIG instance of each ``DCGM_FI_*``
family, must already be in the first: the profiling figures from GPM's first pair (taken at once, not a
profiling interval later), the energy accounting counters from 0.

One exception, on purpose: the network's bytes/s gauges need two reads of the links' counters a real window
apart (many NIC drivers refresh those counters only every 1-2 s, so a short first pair could read 0); they
come with the second read, and the ``_total`` counters that ``rate()`` uses are there from the first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_runner import AgentRunner
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"
# Every tier short, so that "once every tier has come round" is a few seconds.
TIERS = {"poll_interval": 0.5, "profiling_interval": 1.0, "energy_interval": 1.0, "network_interval": 1.0,
         "slow_poll_interval": 2.0,
         # the loopback link only: the host's links are shared with the tests beside this one, which make veth
         # pairs between the two scrapes (a link that appeared brings families the first scrape could not have)
         "network_links": ["lo"], "network_links_exclude": []}
STEADY_AFTER_SECONDS = 4.0
SECOND_READ_ONLY = {"gpuagent_network_receive_bytes_per_second", "gpuagent_network_transmit_bytes_per_second"}
PROF = {f"DCGM_FI_PROF_{name}" for name in (
    "GR_ENGINE_ACTIVE", "SM_ACTIVE", "SM_OCCUPANCY", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PIPE_FP64_ACTIVE",
    "PIPE_FP32_ACTIVE", "PIPE_FP16_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES", "NVLINK_TX_BYTES",
    "NVLINK_RX_BYTES")}


def series(text: str) -> dict[str, set[tuple[str, str]]]:
    """Sample name -> the (gpu, GPU_I_ID) places it is exported for."""
    out: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).add((sample.labels.get("gpu", ""), sample.labels.get("GPU_I_ID", "")))
    return out


@pytest.fixture(scope="module")
def scrapes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the first scrape after ready, one after every tier came round) of an agent on the scenario: one
    agent per scenario, whose two scrapes every test of that scenario reads."""
    config = {"listen": f"127.0.0.1:{free_port()}", "backend": "sim", "hostname": "first-scrape",
              "scenario": str(SCENARIOS / request.param), "pod_resources_socket": None, **TIERS}
    agent = AgentRunner("agent", config, tmp_path_factory.mktemp("first-scrape"))
    try:
        agent.wait_ready()
        first = agent.metrics()
        time.sleep(STEADY_AFTER_SECONDS)
        yield first, agent.metrics()
    finally:
        code = agent.stop()
    assert code == 0, f"not a clean stop:\n{agent.log()}"


@pytest.mark.parametrize("scrapes", ["h100-8x-64proc.yaml", "a100-mig.yaml"], indirect=True)
def test_the_first_scrape_after_ready_has_every_family_and_every_gpu(scrapes: tuple[str, str]) -> None:
    first, steady = (series(text) for text in scrapes)
    missing = sorted(set(steady) - set(first) - SECOND_READ_ONLY)
    assert not missing, f"absent from the first scrape after ready: {missing}"
    for name, places in steady.items():
        if name.startswith("DCGM_FI_"):
            assert places <= first[name], f"{name}: not yet for {sorted(places - first[name])}"


@pytest.mark.parametrize("scrapes", ["h100-8x-64proc.yaml"], indirect=True)
def test_hopper_profiling_figures_are_in_the_first_scrape_for_every_gpu(scrapes: tuple[str, str]) -> None:
    first = series(scrapes[0])
    gpus = {gpu for gpu, _ in first["DCGM_FI_DEV_GPU_UTIL"]}
    assert len(gpus) == 8
    for name in sorted(PROF):
        assert {gpu for gpu, _ in first.get(name, ())} == gpus, name


@pytest.mark.parametrize("scrapes", ["a100-mig.yaml"], indirect=True)
def test_without_gpm_the_profiling_figures_stay_absent(scrapes: tuple[str, str]) -> None:
    first, steady = (series(text) for text in scrapes)
    assert not PROF & (set(first) | set(steady))  # the A100 has no GPM: never faked
    assert {i for _, i in first["DCGM_FI_DEV_FB_USED"] if i}  # the MIG instances are there from the start
