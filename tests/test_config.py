"""gpuagent.config: defaults, file/env/flag precedence, validation messages, and no crash on any input."""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuagent.config import KEYS, KEYS_BY_NAME, Config, ConfigError, describe_keys, load_config, parse_listen


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_of(*args: object, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)  # type: ignore[arg-type]
    return info.value


# --- defaults and the key table -----------------------------------------------------------------------------


def test_defaults_without_file_or_env() -> None:
    config = load_config(env={})
    assert config.server.listen == "0.0.0.0:9402"
    assert (config.server.listen_host, config.server.listen_port) == ("0.0.0.0", 9402)
    assert config.devices.poll_interval == 1.0
    assert config.devices.slow_poll_interval == 30.0
    assert config.devices.nvml_timeout == 5.0
    assert config.server.shutdown_timeout == 10.0
    assert config.devices.backend == "auto"
    assert config.devices.scenario is None
    assert config.devices.xid_window == 300.0
    assert config.agent.log_level == "info"
    assert config.config_file is None
    assert config.agent.hostname  # gethostname()


def test_default_port_is_not_dcgm_exporters() -> None:
    assert Config().server.listen_port != 9400


def test_config_is_frozen_and_hashable() -> None:
    config = load_config(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.devices.poll_interval = 2.0  # type: ignore[misc]
    assert hash(config) == hash(dataclasses.replace(config))


def test_key_table_matches_the_dataclass_defaults() -> None:
    names = [key.name for key in KEYS]
    assert names == [
        "listen",
        "poll_interval",
        "slow_poll_interval",
        "energy_interval",
        "profiling_interval",
        "process_utilization_interval",
        "detail_interval",
        "nvml_timeout",
        "shutdown_timeout",
        "backend",
        "scenario",
        "hostname",
        "xid_window",
        "pod_resources_socket",
        "pod_resources_interval",
        "gpu_resource_names",
        "dra_drivers",
        "cdi_spec_dirs",
        "dra_resource_slices",
        "proc_root",
        "kubernetes_api",
        "kubeconfig",
        "mode",
        "share_scheme",
        "share_period",
        "work_conserving",
        "default_gpu_share",
        "default_gpu_memory",
        "memory_action",
        "memory_term_after",
        "memory_kill_grace",
        "journal_path",
        "cgroup_root",
        "freezable_outside_kubepods",
        "policies",
        "pod_annotations",
        "accounting_retention",
        "efficiency_window",
        "idle_threshold",
        "idle_window",
        "idle_events",
        "publish_state",
        "publish_min_interval",
        "publish_heartbeat",
        "web_config",
        "admin_token_file",
        "admin_socket",
        "network",
        "network_interval",
        "network_links",
        "network_links_exclude",
        "sysfs_root",
        "log_level",
        "health_mode",
        "health_taint",
        "health_no_execute",
        "health_cordon",
        "health_drain",
        "health_drain_namespaces",
        "health_drain_default",
        "health_quarantine_budget",
        "health_budget_namespace",
        "health_clear_after",
        "health_events",
        "health_dra_taints",
    ]
    assert KEYS_BY_NAME["poll_interval"].env == "GPUAGENT_POLL_INTERVAL"
    assert KEYS_BY_NAME["poll_interval"].flag == "--poll-interval"
    defaults = load_config(env={"NODE_NAME": "n1"})
    for key in KEYS:
        if key.name != "hostname":
            assert defaults.as_dict()[key.name] == key.default


def test_each_key_is_a_field_of_the_group_of_the_package_that_reads_it() -> None:
    """``health_taint`` is ``config.health.taint``: the key less its group's name (``network``, the group's
    name alone, is ``config.network.enabled``); each group is declared in the module of its name."""
    assert (KEYS_BY_NAME["health_taint"].group, KEYS_BY_NAME["health_taint"].field) == ("health", "taint")
    assert (KEYS_BY_NAME["network"].group, KEYS_BY_NAME["network"].field) == ("network", "enabled")
    assert (KEYS_BY_NAME["share_scheme"].group, KEYS_BY_NAME["share_scheme"].field) == ("enforce", "share_scheme")
    for key in KEYS:
        assert key.field == ("enabled" if key.name == key.group else key.name.removeprefix(key.group + "_"))
        assert type(getattr(Config(), key.group)).__module__ == f"gpuagent.config.{key.group}"
    config = load_config(env={}, overrides={"health_taint": "fatal", "network": "false", "mode": "audit"})
    assert (config.health.taint, config.network.enabled, config.enforce.mode) == ("fatal", False, "audit")
    assert all(config.as_dict()[key.name] == getattr(getattr(config, key.group), key.field) for key in KEYS)


def test_from_flat_builds_a_config_by_the_operators_key_names() -> None:
    config = load_config(env={"NODE_NAME": "n1"}, overrides={"health_taint": "fatal", "poll_interval": "2"})
    again = Config.from_flat(config.as_dict(), config_file=config.config_file, sources=config.sources)
    assert again == config and again.sources == config.sources
    assert Config.from_flat({"health_taint": "never"}).health.taint == "never"
    assert Config.from_flat({}) == Config()
    with pytest.raises(TypeError, match="not configuration keys: health_tint"):
        Config.from_flat({"health_tint": "never"})
    assert not hasattr(config, "health_taint") and not hasattr(config, "poll_interval")  # no flat attributes


def test_describe_names_every_key_with_its_source(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: 0.5\n")
    config = load_config(path, env={"GPUAGENT_BACKEND": "sim", "NODE_NAME": "node-7"})
    lines = config.describe().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [key.name for key in KEYS]
    text = config.describe()
    assert "poll_interval: 0.5" in text and f"# {path}" in text
    assert "# env GPUAGENT_BACKEND" in text
    assert "hostname: 'node-7'" in text and "# env NODE_NAME" in text
    assert config.as_dict()["backend"] == "sim"
    assert all(key.env in describe_keys() for key in KEYS)


# --- the file -----------------------------------------------------------------------------------------------


def test_file_values_are_read_and_converted(tmp_path: Path) -> None:
    scenario = write(tmp_path, "gpus: []\n", "demo.yaml")
    path = write(
        tmp_path,
        "listen: '[::1]:9500'\npoll_interval: 2\nslow_poll_interval: 60\nnvml_timeout: 0.5\n"
        f"backend: SIM\nscenario: {scenario}\nhostname: gpu-node-3\nxid_window: 60\nlog_level: DEBUG\n",
    )
    config = load_config(path, env={})
    assert config.server.listen == "[::1]:9500"
    assert (config.server.listen_host, config.server.listen_port) == ("::1", 9500)
    assert config.devices.poll_interval == 2.0 and isinstance(config.devices.poll_interval, float)
    assert config.devices.slow_poll_interval == 60.0
    assert config.devices.nvml_timeout == 0.5
    assert config.devices.backend == "sim"
    assert config.devices.scenario == scenario
    assert config.agent.hostname == "gpu-node-3"
    assert config.devices.xid_window == 60.0
    assert config.agent.log_level == "debug"
    assert config.config_file == path
    assert config.sources["poll_interval"] == path


def test_empty_file_means_all_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={})
    assert config == load_config(env={"NODE_NAME": config.agent.hostname})


def test_comment_only_file_means_all_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing\n"), env={}).devices.poll_interval == 1.0


def test_relative_scenario_is_resolved_against_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    write(tmp_path / "etc", "gpus: []\n", "s.yaml")
    config = load_config(write(tmp_path / "etc", "scenario: s.yaml\n"), env={})
    assert config.devices.scenario == str(tmp_path / "etc" / "s.yaml")


def test_relative_scenario_from_env_is_resolved_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "gpus: []\n", "s.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_config(env={"GPUAGENT_SCENARIO": "s.yaml"}).devices.scenario == "s.yaml"


def test_sim_without_scenario_is_allowed() -> None:
    assert load_config(env={"GPUAGENT_BACKEND": "sim"}).devices.scenario is None


def test_slow_poll_interval_default_rises_with_poll_interval() -> None:
    config = load_config(env={"GPUAGENT_POLL_INTERVAL": "60"})
    assert config.devices.slow_poll_interval == 60.0
    assert load_config(env={"GPUAGENT_POLL_INTERVAL": "10"}).devices.slow_poll_interval == 30.0


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("poll_interval: fast\n", "poll_interval", "expected a number > 0 and <= 300, got 'fast'"),
        ("poll_interval: -1\n", "poll_interval", "expected a number > 0 and <= 300, got -1"),
        ("poll_interval: 0\n", "poll_interval", "got 0"),
        ("poll_interval: 301\n", "poll_interval", "got 301"),
        ("poll_interval: true\n", "poll_interval", "got true"),
        ("poll_interval: '0.5'\n", "poll_interval", "got '0.5'"),
        ("poll_interval: .nan\n", "poll_interval", "got nan"),
        ("poll_interval: [1]\n", "poll_interval", "got a list"),
        ("slow_poll_interval: .inf\n", "slow_poll_interval", "expected a number > 0"),
        ("shutdown_timeout: 0\n", "shutdown_timeout", "expected a number > 0 and <= 600, got 0"),
        ("shutdown_timeout: 601\n", "shutdown_timeout", "got 601"),
        ("poll_interval: 10\nslow_poll_interval: 5\n", "slow_poll_interval", ">= poll_interval (10"),
        ("nvml_timeout: 0\n", "nvml_timeout", "expected a number > 0, got 0"),
        ("xid_window: -5\n", "xid_window", "expected a number > 0, got -5"),
        ("backend: cuda\n", "backend", "expected one of auto, nvml, sim, got 'cuda'"),
        ("backend: null\n", "backend", "got null"),
        ("log_level: verbose\n", "log_level", "one of debug, info, warning, error"),
        ("listen: localhost\n", "listen", "no port"),
        ("listen: 9402\n", "listen", "expected HOST:PORT with a port 1-65535, got 9402"),
        ("listen: '0.0.0.0:70000'\n", "listen", "port '70000' is not 1-65535"),
        ("listen: '0.0.0.0:0'\n", "listen", "port '0' is not 1-65535"),
        ("listen: 'host:http'\n", "listen", "port 'http'"),
        ("listen: '::1:9402'\n", "listen", "IPv6 address needs brackets"),
        ("listen: '[::1]'\n", "listen", "needs a port"),
        ("listen: '[nope]:80'\n", "listen", "not an IPv6 address"),
        ("listen: '999.1.1.1:80'\n", "listen", "not an IPv4 address"),
        ("listen: ':9402'\n", "listen", "no host"),
        ("listen: 'bad host:80'\n", "listen", "not a host name"),
        ("hostname: 123\n", "hostname", "quote it"),
        ("hostname: ''\n", "hostname", "non-empty"),
        ("scenario: missing.yaml\n", "scenario", "no such file"),
        ("scenario: .\n", "scenario", "a directory"),
        ("scenario: 5\n", "scenario", "got 5"),
        ("pol_interval: 1\n", "pol_interval", "unknown key; did you mean 'poll_interval'"),
        ("poll-interval: 1\n", "poll-interval", "did you mean 'poll_interval'"),
        ("zzz: 1\n", "zzz", "unknown key; known keys: listen, poll_interval"),
        ("1: 2\n", "1", "unknown key"),
    ],
)
def test_bad_file_values_name_the_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, text)
    err = error_of(path, env={})
    assert err.key_path == key
    assert err.source == path
    assert fragment in err.message
    assert str(err).startswith(f"{path}: {key}: ")


def test_nvml_backend_with_a_scenario_is_an_error(tmp_path: Path) -> None:
    scenario = write(tmp_path, "gpus: []\n", "s.yaml")
    path = write(tmp_path, f"backend: nvml\nscenario: {scenario}\n")
    err = error_of(path, env={})
    assert err.key_path == "scenario"
    assert "backend is 'nvml'" in err.message and path in err.message


def test_scenario_with_auto_backend_is_allowed(tmp_path: Path) -> None:
    scenario = write(tmp_path, "gpus: []\n", "s.yaml")
    assert load_config(env={"GPUAGENT_SCENARIO": scenario}).devices.scenario == scenario


def test_error_message_format_matches_the_contract(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: -1\n")
    assert str(error_of(path, env={})) == f"{path}: poll_interval: expected a number > 0 and <= 300, got -1"
    assert str(error_of(env={"GPUAGENT_POLL_INTERVAL": "fast"})) == (
        "env GPUAGENT_POLL_INTERVAL: expected a number > 0 and <= 300, got 'fast'"
    )
    assert str(error_of(env={}, overrides={"poll_interval": "0"})) == (
        "flag --poll-interval: expected a number > 0 and <= 300, got '0'"
    )


def test_config_error_pickles() -> None:
    err = ConfigError("poll_interval", "bad", "config.yaml")
    again = pickle.loads(pickle.dumps(err))
    assert (again.key_path, again.message, again.source) == ("poll_interval", "bad", "config.yaml")
    assert str(again) == "config.yaml: poll_interval: bad"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("poll_interval: [1\n", "invalid YAML at line 2"),
        ("a: b\n  c: d\n", "invalid YAML at line 2"),
        ("poll_interval: 1\n\tlisten: x\n", "invalid YAML at line 2"),
        ("poll_interval: 1\npoll_interval: 2\n", "duplicate key 'poll_interval'"),
        ("- poll_interval\n- listen\n", "expected a mapping of keys to values, got a list"),
        ("just a string\n", "expected a mapping of keys to values, got a string of 13 character(s)"),
        ("42\n", "got a number"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    err = error_of(path, env={})
    assert err.key_path == ""
    assert fragment in str(err)
    assert str(err).startswith(f"{path}: ")


def test_duplicate_key_error_names_its_line(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "listen: 'a:1'\npoll_interval: 1\npoll_interval: 2\n"), env={})
    assert "line 3" in err.message


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    # Not a duplicate: a key given next to a '<<' merge overrides the merged one.
    path = write(tmp_path, "<<: {poll_interval: 2, backend: sim}\npoll_interval: 3\n")
    config = load_config(path, env={})
    assert (config.devices.poll_interval, config.devices.backend) == (3.0, "sim")


def test_unreadable_files(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    err = error_of(missing, env={})
    assert err.source == missing and "cannot read the config file" in err.message
    assert "cannot read" in str(error_of(str(tmp_path), env={}))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in str(error_of(str(binary), env={}))


# --- env and flags ------------------------------------------------------------------------------------------


def test_env_beats_file_and_flag_beats_env(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: 2\nlisten: '127.0.0.1:9000'\nbackend: sim\n")
    env = {"GPUAGENT_POLL_INTERVAL": "0.5", "GPUAGENT_LISTEN": "127.0.0.1:9001"}
    config = load_config(path, env=env, overrides={"listen": "127.0.0.1:9002", "backend": None})
    assert config.devices.poll_interval == 0.5  # env over file
    assert config.server.listen == "127.0.0.1:9002"  # flag over env
    assert config.devices.backend == "sim"  # a None override is "not given": the file's value stands
    assert config.sources["poll_interval"] == "env GPUAGENT_POLL_INTERVAL"
    assert config.sources["listen"] == "flag --listen"


def test_overrides_accept_typed_values() -> None:
    config = load_config(env={}, overrides={"poll_interval": 0.25, "backend": "sim"})
    assert (config.devices.poll_interval, config.devices.backend) == (0.25, "sim")
    assert "got true" in str(error_of(env={}, overrides={"poll_interval": True}))


def test_unknown_override_is_an_error() -> None:
    err = error_of(env={}, overrides={"pol_interval": "1"})
    assert err.key_path == "pol_interval" and "did you mean 'poll_interval'" in str(err)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("GPUAGENT_POLL_INTERVAL", "fast", "got 'fast'"),
        ("GPUAGENT_POLL_INTERVAL", "1e400", "<= 300"),
        ("GPUAGENT_SLOW_POLL_INTERVAL", "nan", "got 'nan'"),
        ("GPUAGENT_LISTEN", "0.0.0.0", "no port"),
        ("GPUAGENT_BACKEND", "gpu", "one of auto, nvml, sim"),
        ("GPUAGENT_SCENARIO", "/does/not/exist.yaml", "no such file"),
        ("GPUAGENT_HOSTNAME", "a b", "without spaces"),
        ("GPUAGENT_LOG_LEVEL", "loud", "one of debug"),
    ],
)
def test_bad_env_value_names_the_env_var(name: str, value: str, fragment: str) -> None:
    err = error_of(env={name: value})
    assert err.source == f"env {name}"
    assert str(err).startswith(f"env {name}: expected ")
    assert fragment in str(err)


def test_env_numbers_are_parsed() -> None:
    env = {"GPUAGENT_POLL_INTERVAL": " 0.5 ", "GPUAGENT_NVML_TIMEOUT": "2", "GPUAGENT_XID_WINDOW": "1e2"}
    config = load_config(env=env)
    assert (config.devices.poll_interval, config.devices.nvml_timeout, config.devices.xid_window) == (0.5, 2.0, 100.0)


def test_empty_env_var_counts_as_unset() -> None:
    assert load_config(env={"GPUAGENT_POLL_INTERVAL": "", "GPUAGENT_SCENARIO": ""}).devices.poll_interval == 1.0


def test_gpuagent_config_env_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: 3\n")
    other = write(tmp_path, "poll_interval: 4\n", "other.yaml")
    assert load_config(env={"GPUAGENT_CONFIG": path}).devices.poll_interval == 3.0
    assert load_config(other, env={"GPUAGENT_CONFIG": path}).devices.poll_interval == 4.0  # the argument wins


def test_nvml_with_scenario_across_sources_names_both(tmp_path: Path) -> None:
    scenario = write(tmp_path, "gpus: []\n", "s.yaml")
    path = write(tmp_path, "backend: nvml\n")
    err = error_of(path, env={}, overrides={"scenario": scenario})
    assert err.source == "flag --scenario" and path in err.message


def test_slow_below_poll_across_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "slow_poll_interval: 30\n")
    err = error_of(path, env={}, overrides={"poll_interval": "60"})
    assert err.key_path == "slow_poll_interval" and err.source == path
    assert "from flag --poll-interval" in err.message


# --- hostname -----------------------------------------------------------------------------------------------


def test_hostname_precedence(tmp_path: Path) -> None:
    assert load_config(env={"NODE_NAME": "from-downward-api"}).agent.hostname == "from-downward-api"
    env = {"NODE_NAME": "n", "GPUAGENT_HOSTNAME": "explicit"}
    assert load_config(env=env).agent.hostname == "explicit"
    assert load_config(write(tmp_path, "hostname: f\n"), env={"NODE_NAME": "n"}).agent.hostname == "f"
    assert load_config(write(tmp_path, "hostname: null\n"), env={"NODE_NAME": "n"}).agent.hostname == "n"


def test_hostname_falls_back_to_gethostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "box-1")
    config = load_config(env={"NODE_NAME": ""})
    assert config.agent.hostname == "box-1"


# --- listen -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("0.0.0.0:9402", "0.0.0.0", 9402),
        ("localhost:1", "localhost", 1),
        ("gpu-node.example.com:65535", "gpu-node.example.com", 65535),
        ("[::]:9402", "::", 9402),
        ("[fe80::1%eth0]:80", "fe80::1%eth0", 80),
    ],
)
def test_parse_listen(text: str, host: str, port: int) -> None:
    assert parse_listen(text) == (host, port)
    config = load_config(env={}, overrides={"listen": text})
    assert (config.server.listen_host, config.server.listen_port) == (host, port)


def test_listen_is_normalised() -> None:
    assert load_config(env={}, overrides={"listen": " 127.0.0.1:09402 "}).server.listen == "127.0.0.1:9402"


# --- anything in, Config or ConfigError out -----------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    _text,
    st.sampled_from(["0.0.0.0:9402", "[::1]:80", "sim", "nvml", "auto", "debug", ".", "/", "", "\x00"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_key_names = st.sampled_from([key.name for key in KEYS] + ["pol_interval", "", "LISTEN"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(_key_names, _values, max_size=6))
def test_any_yaml_mapping_loads_or_raises_config_error(tmp_path: Path, data: dict[str, object]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        config = load_config(str(path), env={})
    except ConfigError as err:
        assert str(err).startswith(f"{path}: ")
    else:
        assert config.devices.poll_interval > 0 and math.isfinite(config.devices.poll_interval)
        assert config.devices.slow_poll_interval >= config.devices.poll_interval
        assert 1 <= config.server.listen_port <= 65535


@settings(max_examples=200, deadline=None)
@given(
    env=st.dictionaries(st.sampled_from([key.env for key in KEYS]), st.text(max_size=20), max_size=5),
    overrides=st.dictionaries(st.sampled_from([key.name for key in KEYS]), _values, max_size=4),
)
def test_any_env_or_override_loads_or_raises_config_error(
    env: dict[str, str], overrides: dict[str, object]
) -> None:
    try:
        load_config(env=env, overrides=overrides)
    except ConfigError as err:
        assert err.source.startswith(("env GPUAGENT_", "flag --"))


def test_config_built_directly_resolves_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(os.environ, "NODE_NAME", "direct")
    assert Config().agent.hostname == "direct"


def test_gpu_resource_names_from_yaml_env_and_flag(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gpu_resource_names: [nvidia.com/gpu, nvidia.com/gpu.shared]\n")
    assert load_config(str(path), env={}).pods.gpu_resource_names == ("nvidia.com/gpu", "nvidia.com/gpu.shared")
    env = {"GPUAGENT_GPU_RESOURCE_NAMES": "nvidia.com/a100, nvidia.com/gpu"}
    assert load_config(None, env=env).pods.gpu_resource_names == ("nvidia.com/a100", "nvidia.com/gpu")
    with pytest.raises(ConfigError, match=r"--gpu-resource-names: .* not a domain/name"):
        load_config(None, env={}, overrides={"gpu_resource_names": "gpu"})


def test_pod_resources_socket_can_be_turned_off(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pod_resources_socket: null\n")
    assert load_config(str(path), env={}).pods.pod_resources_socket is None
    assert load_config(None, env={}).pods.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_enforcement_keys(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "mode: audit\nwork_conserving: false\ndefault_gpu_share: 25\ndefault_gpu_memory: 8Gi\n"
        "freezable_outside_kubepods: [/system.slice/ollama.service]\n"
        "policies:\n  - {match_namespace: research-*, gpu_share: 20}\n"
    )
    config = load_config(str(path), env={"GPUAGENT_WORK_CONSERVING": "true"}, overrides={"mode": "enforce"})
    assert (config.enforce.mode, config.enforce.work_conserving, config.enforce.default_gpu_share) == ("enforce", True, 25)
    assert config.enforce.default_gpu_memory == "8Gi" and config.enforce.policies == ({"match_namespace": "research-*",
                                                                       "gpu_share": 20},)
    for key, bad, fragment in [
        ("mode", "strict", "one of off, audit, enforce"),
        ("default_gpu_share", 130, "<= 100"),
        ("default_gpu_memory", "lots", "memory quantity"),
        ("work_conserving", "maybe", "true or false"),
        ("freezable_outside_kubepods", ["system.slice"], "starting with '/'"),
    ]:
        path.write_text(yaml.safe_dump({key: bad}))
        with pytest.raises(ConfigError, match=key) as info:
            load_config(str(path), env={})
        assert fragment in str(info.value)
    with pytest.raises(ConfigError, match="only the config file can give"):
        load_config(None, env={"GPUAGENT_POLICIES": "x"})


def test_dra_keys_from_yaml_env_and_flags(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("dra_drivers: [gpu.nvidia.com, gpu.example.com]\ncdi_spec_dirs: [/host/etc/cdi]\n"
                    "dra_resource_slices: 'on'\n")
    config = load_config(str(path), env={})
    assert config.pods.dra_drivers == ("gpu.nvidia.com", "gpu.example.com")
    assert (config.pods.cdi_spec_dirs, config.pods.dra_resource_slices) == (("/host/etc/cdi",), "on")
    defaults = load_config(None, env={})
    assert defaults.pods.dra_drivers == ("gpu.nvidia.com",) and defaults.pods.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")
    env = {"GPUAGENT_DRA_DRIVERS": "none", "GPUAGENT_CDI_SPEC_DIRS": "/host/etc/cdi, /host/var/run/cdi"}
    config = load_config(None, env=env, overrides={"dra_resource_slices": "off"})
    assert (config.pods.dra_drivers, config.pods.cdi_spec_dirs) == ((), ("/host/etc/cdi", "/host/var/run/cdi"))
    assert load_config(None, env={}, overrides={"cdi_spec_dirs": "null"}).pods.cdi_spec_dirs == ()
    path.write_text("dra_drivers: []\ncdi_spec_dirs: null\n")
    assert load_config(str(path), env={}).pods.cdi_spec_dirs == ()
    for key, bad, fragment in [
        ("dra_drivers", ["GPU_nvidia"], "'GPU_nvidia' is not a DNS subdomain"),
        ("dra_drivers", "gpu.nvidia.com", "a list of DRA driver names"),
        ("cdi_spec_dirs", ["etc/cdi"], "'etc/cdi' is not an absolute path"),
        ("dra_resource_slices", "sometimes", "one of auto, on, off"),
    ]:
        path.write_text(yaml.safe_dump({key: bad}))
        with pytest.raises(ConfigError, match=key) as info:
            load_config(str(path), env={})
        assert fragment in str(info.value)


def test_resource_slices_on_needs_the_api_server() -> None:
    with pytest.raises(ConfigError, match=r"--dra-resource-slices: ResourceSlices .*kubernetes_api is 'off'"):
        load_config(None, env={"GPUAGENT_KUBERNETES_API": "off"}, overrides={"dra_resource_slices": "on"})


# --- null from env and flags ----------------------------------------------------------------------------------


def _outcome(load: object) -> tuple[str, object]:
    """("ok", the key's value) or ("error", the message after the source) of one way of giving null."""
    try:
        return "ok", load()  # type: ignore[operator]
    except ConfigError as err:
        return "error", err.message


@pytest.mark.parametrize("key", [k for k in KEYS if k.name != "policies"], ids=lambda k: k.name)
@pytest.mark.parametrize("word", ["null", "NULL", " ~ "])
def test_null_means_the_same_from_file_env_and_flag(tmp_path: Path, key: object, word: str) -> None:
    """Every key: the word null from env or a flag is YAML's null, accepted (with the same value) where
    the file accepts ``key: null`` and rejected with the same message where it does not."""
    name = key.name  # type: ignore[attr-defined]
    path = write(tmp_path, f"{name}: null\n")
    base = {"NODE_NAME": "n1"}
    from_file = _outcome(lambda: load_config(path, env=base).as_dict()[name])
    from_env = _outcome(lambda: load_config(env={**base, key.env: word}).as_dict()[name])  # type: ignore[attr-defined]
    from_flag = _outcome(lambda: load_config(env=base, overrides={name: word}).as_dict()[name])
    assert from_env == from_file and from_flag == from_file


def test_null_turns_the_kubelet_socket_off_from_flags_and_env() -> None:
    """The issue's case: --pod-resources-socket null was read as a relative path named "null"."""
    assert load_config(env={}, overrides={"pod_resources_socket": "null"}).pods.pod_resources_socket is None
    assert load_config(env={"GPUAGENT_POD_RESOURCES_SOCKET": "null"}).pods.pod_resources_socket is None
    config = load_config(env={}, overrides={"pod_resources_socket": "null"})
    assert config.sources["pod_resources_socket"] == "flag --pod-resources-socket"
    # the other keys null turns off or back to their default, from a flag
    flags = {"scenario": "null", "kubeconfig": "Null", "admin_socket": "~", "default_gpu_share": "null",
             "default_gpu_memory": "null", "web_config": "null", "admin_token_file": "null"}
    config = load_config(env={}, overrides=flags)
    assert all(config.as_dict()[name] is None for name in flags)
    assert load_config(env={"NODE_NAME": "n1"}, overrides={"hostname": "null"}).agent.hostname == "n1"


@pytest.mark.parametrize("name", ["proc_root", "cgroup_root", "sysfs_root", "journal_path"])
def test_roots_do_not_take_null(tmp_path: Path, name: str) -> None:
    """A root the agent reads or writes under has no "off": null is an error naming the key, from the file,
    env and flags alike (it used to be accepted and crash the agent later)."""
    for err in (
        error_of(write(tmp_path, f"{name}: null\n"), env={}),
        error_of(env={f"GPUAGENT_{name.upper()}": "null"}),
        error_of(env={}, overrides={name: "null"}),
    ):
        assert err.key_path == name and err.message == "expected a path, got null"


def test_a_file_named_null_is_given_as_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "null").write_text("gpus: []\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(env={}, overrides={"scenario": "./null"}).devices.scenario == "./null"
    assert load_config(env={}, overrides={"scenario": "null"}).devices.scenario is None


def test_bare_on_and_off_in_yaml_mean_the_words(tmp_path: Path) -> None:
    """YAML 1.1 reads ``off``/``on`` as booleans: where a key's choices hold the word, it means the word."""
    config = load_config(write(tmp_path, "mode: off\nkubernetes_api: on\nidle_events: OFF\n"), env={})
    assert (config.enforce.mode, config.kubeapi.kubernetes_api, config.accounting.idle_events) == ("off", "on", "off")
    with pytest.raises(ConfigError, match="mode: expected one of off, audit, enforce, got true"):
        load_config(write(tmp_path, "mode: on\n", "on.yaml"), env={})
    with pytest.raises(ConfigError, match=r"log_level: expected one of debug.*got false"):
        load_config(write(tmp_path, "log_level: off\n", "level.yaml"), env={})
