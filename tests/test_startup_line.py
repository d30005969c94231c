"""The agent's "starting:" log line (``Config.summary``): what an operator checks first, in one short line;
every value, with where it came from, at debug (``Config.describe``). It was every key's value, about 2,500
characters on the demo node (issue 30)."""

from __future__ import annotations

from gpuagent.config import KEYS, load_config


def test_the_starting_line_names_the_essentials_and_the_keys_set() -> None:
    config = load_config(None, overrides={"backend": "sim", "mode": "audit", "listen": "127.0.0.1:9999",
                                          "journal_path": "/tmp/j.json"},
                         env={"GPUAGENT_POLL_INTERVAL": "0.5", "GPUAGENT_HOSTNAME": "node-7"})
    line = config.summary()
    assert line.startswith("listen=127.0.0.1:9999, backend=sim, scenario=")
    assert "mode=audit, poll_interval=0.5, hostname=node-7; set: journal_path" in line
    assert "/tmp/j.json" not in line  # a value beyond the essentials is describe()'s, at debug
    assert len(line) < 300
    assert all(f"{key.name}: " in config.describe() for key in KEYS)


def test_without_changes_or_the_simulator_it_is_the_essentials_alone() -> None:
    config = load_config(None, overrides={}, env={"GPUAGENT_HOSTNAME": "node-7"})
    assert config.summary() == f"listen={config.server.listen}, backend={config.devices.backend}, mode=off, " \
                               f"poll_interval={config.devices.poll_interval}, hostname=node-7"
