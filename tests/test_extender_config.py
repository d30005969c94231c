"""The extender's options (``gpuagent.hints.extender_config``) and the ``gpuagent extender`` verb."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuagent.cli import main
from gpuagent.config import ConfigError
from gpuagent.hints.extender_config import OPTION_KEYS, ExtenderOptions, load_options


def test_defaults() -> None:
    options = load_options(None, env={})
    assert options == ExtenderOptions()
    assert (options.listen_host, options.listen_port) == ("0.0.0.0", 9403)
    assert options.agent_url == "http://{node}:9402"
    assert options.agent_urls == {}


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("max_age: 60\nrefresh_interval: 10\ntimeout: 2\n")
    env = {"GPUAGENT_EXTENDER_MAX_AGE": "45", "GPUAGENT_LISTEN": "1.2.3.4:1"}  # the agent's env: not ours
    options = load_options(str(config), env=env, overrides={"max_age": "50", "timeout": None})
    assert (options.max_age, options.refresh_interval, options.timeout) == (50.0, 10.0, 2.0)
    assert options.listen == "0.0.0.0:9403"
    assert options.sources == {"max_age": "flag --max-age", "refresh_interval": str(config),
                               "timeout": str(config)}


def test_agents_file_alone_turns_the_template_off(tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text("node-a: http://10.0.0.1:9402/\nnode-b.example.com: https://10.0.0.2:9402\n")
    options = load_options(None, env={"GPUAGENT_EXTENDER_AGENTS": str(agents)})
    assert options.agent_urls == {"node-a": "http://10.0.0.1:9402", "node-b.example.com": "https://10.0.0.2:9402"}
    assert options.agent_url is None
    both = load_options(None, env={"GPUAGENT_EXTENDER_AGENTS": str(agents),
                                   "GPUAGENT_EXTENDER_AGENT_URL": "http://{node}.nodes:9402"})
    assert both.agent_url == "http://{node}.nodes:9402"


@pytest.mark.parametrize(
    ("env", "key", "words"),
    [
        ({"GPUAGENT_EXTENDER_AGENT_URL": "http://node:9402"}, "agent_url", "{node}"),
        ({"GPUAGENT_EXTENDER_AGENT_URL": "ftp://{node}"}, "agent_url", "http:// or https://"),
        ({"GPUAGENT_EXTENDER_AGENT_URL": "http://{node}:{port}"}, "agent_url", "no other braces"),
        ({"GPUAGENT_EXTENDER_LISTEN": "9403"}, "listen", "HOST:PORT"),
        ({"GPUAGENT_EXTENDER_MAX_AGE": "-1"}, "max_age", "> 0"),
        ({"GPUAGENT_EXTENDER_MAX_AGE": "4"}, "refresh_interval", "less than max_age"),
        ({"GPUAGENT_EXTENDER_URL_PREFIX": "gpu"}, "url_prefix", 'starting with "/"'),
        ({"GPUAGENT_EXTENDER_MAX_CONCURRENT_FETCHES": "0"}, "max_concurrent_fetches", "from 1 to"),
        ({"GPUAGENT_EXTENDER_AGENT_CA_FILE": "/nonexistent/ca.pem"}, "agent_ca_file", "no such file"),
        ({"GPUAGENT_EXTENDER_AGENT_CERT_FILE": "/etc/hostname"}, "agent_key_file", "go together"),
        ({"GPUAGENT_EXTENDER_LOG_LEVEL": "loud"}, "log_level", "one of"),
    ],
)
def test_bad_values_name_the_key_and_source(env: dict[str, str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_options(None, env=env)
    assert info.value.key_path == key
    assert words in str(info.value)


def test_bad_agents_file_entries_name_the_node(tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text("node-a: 10.0.0.1:9402\n")
    with pytest.raises(ConfigError, match=r"agents.yaml: node-a: expected an http:// or https:// URL"):
        load_options(None, env={"GPUAGENT_EXTENDER_AGENTS": str(agents)})
    agents.write_text("Node_A: http://10.0.0.1:9402\n")
    with pytest.raises(ConfigError, match="Node_A: expected a node name"):
        load_options(None, env={"GPUAGENT_EXTENDER_AGENTS": str(agents)})


def test_unknown_file_key(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("poll_interval: 1\n")
    with pytest.raises(ConfigError, match="poll_interval: unknown key"):
        load_options(str(config), env={})


def test_cli_bad_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extender", "--max-age", "soon"]) == 2
    assert "flag --max-age: expected a number > 0" in capsys.readouterr().err
    assert main(["extender", "--help"]) == 0
    assert "GPUAGENT_EXTENDER_AGENT_URL" in capsys.readouterr().out


def test_dra_options(tmp_path: Path) -> None:
    options = load_options(None, env={})
    assert (options.kubernetes_api, options.kubeconfig) == ("auto", None)
    assert (options.gpu_device_classes, options.mig_device_classes) == (("gpu.nvidia.com",), ("mig.nvidia.com",))
    options = load_options(None, env={"GPUAGENT_EXTENDER_GPU_DEVICE_CLASSES": "gpu.nvidia.com, gpu.example.com",
                                      "GPUAGENT_EXTENDER_MIG_DEVICE_CLASSES": "none",
                                      "GPUAGENT_EXTENDER_KUBERNETES_API": "OFF"})
    assert options.gpu_device_classes == ("gpu.nvidia.com", "gpu.example.com")
    assert (options.mig_device_classes, options.kubernetes_api) == ((), "off")
    config = tmp_path / "extender.yaml"
    config.write_text("mig_device_classes: [mig.nvidia.com, mig.example.com]\n")
    assert load_options(str(config), env={}).mig_device_classes == ("mig.nvidia.com", "mig.example.com")
    for key, value, words in (("GPU_DEVICE_CLASSES", "GPU/Class", "DeviceClass names like gpu.nvidia.com"),
                              ("KUBERNETES_API", "maybe", "expected one of auto, on, off"),
                              ("KUBECONFIG", str(tmp_path / "absent"), "no such file")):
        with pytest.raises(ConfigError) as info:
            load_options(None, env={f"GPUAGENT_EXTENDER_{key}": value})
        assert info.value.key_path == key.lower() and words in str(info.value)


@pytest.mark.parametrize("name", [k.name for k in OPTION_KEYS])
def test_null_means_the_same_from_file_env_and_flag(tmp_path: Path, name: str) -> None:
    """As for the agent's options: null from env or a flag is YAML's null, accepted or rejected alike."""
    key = next(k for k in OPTION_KEYS if k.name == name)
    path = tmp_path / "extender.yaml"
    path.write_text(f"{name}: null\n")

    def outcome(load: object) -> tuple[str, object]:
        try:
            return "ok", getattr(load(), name)  # type: ignore[operator]
        except ConfigError as err:
            return "error", err.message

    from_file = outcome(lambda: load_options(str(path), env={}))
    assert outcome(lambda: load_options(None, env={key.env: "null"})) == from_file
    assert outcome(lambda: load_options(None, env={}, overrides={name: "NULL"})) == from_file


def test_null_agent_url_from_a_flag_turns_the_template_off(tmp_path: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text("node-a: http://10.0.0.1:9402\n")
    options = load_options(None, env={}, overrides={"agent_url": "null", "agents": str(agents)})
    assert options.agent_url is None and options.agent_ca_file is None
    assert load_options(None, env={}, overrides={"agent_ca_file": "null"}).agent_ca_file is None


def test_bare_off_in_yaml_means_off(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("kubernetes_api: off\n")
    assert load_options(str(config), env={}).kubernetes_api == "off"
