"""Strings from the driver reach label values free of control characters (issue 28, item 13).

GPU names, UUIDs, serials, PCI bus IDs and the driver's versions enter the snapshot in one place
(``gpuagent.devices.slow.text``): a name with an escape sequence, a bidi override or a line break reached
``gpuagent_gpu_info``'s label values, the API and ``top`` raw. The simulated NVML, behind pynvml's own
interface, returns hostile strings here; every label value of the exposition shows them as escapes.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuagent.agent import Agent
from gpuagent.config import load_config
from gpuagent.devices.sim import SimulatedNvml, load_scenario
from gpuagent.export import build_registry
from gpuagent.export.exposition import generate_openmetrics, generate_text
from gpuagent.untrusted import has_unsafe

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "h100-8x-64proc.yaml"
NAME = "NVIDIA H100\x1b]0;pwned\x07\u202e\r\nfake_metric 1"
DRIVER = b"550.90\x1b[2J\x00\x00"  # bytes, NUL-padded, as some pynvml structs give them


class HostileNvml(SimulatedNvml):
    """The simulated NVML with a driver that names its GPUs and itself with controls."""

    def nvmlDeviceGetName(self, handle: object) -> str:
        return NAME

    def nvmlSystemGetDriverVersion(self) -> bytes:  # type: ignore[override]
        return DRIVER


async def test_driver_strings_reach_the_snapshot_and_the_labels_as_escapes() -> None:
    config = load_config(None, env={}, overrides={"backend": "sim", "scenario": str(SCENARIO),
                                                  "poll_interval": 0.05, "slow_poll_interval": 0.05})
    agent = Agent(config, nvml=HostileNvml(load_scenario(SCENARIO)), backend="sim")
    try:
        snap = await agent.poll_once()
    finally:
        await agent.devices.close()
    names = {g.info.name for g in snap.gpus}
    assert names == {"NVIDIA H100\\x1b]0;pwned\\x07\\u202e\\r\\nfake_metric 1"}
    assert snap.driver_version == "550.90\\x1b[2J"
    registry = build_registry(lambda: snap, clock=lambda: 0.0)
    text = generate_text(registry).decode()
    assert "fake_metric" not in {line.split("{")[0].split(" ")[0] for line in text.splitlines()}
    values = [v for family in text_string_to_metric_families(text) for sample in family.samples
              for v in sample.labels.values()]
    assert any("pwned" in v for v in values) and any("550.90" in v for v in values)
    assert [v for v in values if has_unsafe(v)] == []
    assert not has_unsafe(generate_openmetrics(registry).decode().replace("\n", ""))
