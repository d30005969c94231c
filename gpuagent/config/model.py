"""``Config``, the agent's effective configuration: one frozen group of keys per package that reads them.
``Config`` holds the groups (``config.devices``, ``config.enforce``, ``config.health``, ...), each a frozen
dataclass declared in the module of the same name; the key table (``KEYS``) is derived from their fields,
in the order the operator has always seen the keys (``--help``, ``check-config``, the start-up log), which
predates the groups and so is listed here once. ``Config.from_flat`` builds a Config from the operator's
flat key names: the loader's last step, and the one way a test builds a Config without parsing.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from gpuagent.config.accounting import AccountingConfig
from gpuagent.config.agent import AgentConfig
from gpuagent.config.devices import DevicesConfig
from gpuagent.config.enforce import EnforceConfig
from gpuagent.config.health import HealthConfig
from gpuagent.config.keys import Key, field_name
from gpuagent.config.kubeapi import KubeApiConfig
from gpuagent.config.network import NetworkConfig
from gpuagent.config.pods import PodsConfig
from gpuagent.config.publish import PublishConfig
from gpuagent.config.server import ServerConfig
from gpuagent.config.values import yaml_scalar


@dataclass(frozen=True)
class Config:
    """The agent's effective configuration. Build it with ``load_config``, which validates every key."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    pods: PodsConfig = field(default_factory=PodsConfig)
    kubeapi: KubeApiConfig = field(default_factory=KubeApiConfig)
    enforce: EnforceConfig = field(default_factory=EnforceConfig)
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    config_file: str | None = field(default=None, compare=False)  # the YAML file read, None when none
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # key -> where from

    @classmethod
    def from_flat(cls, values: Mapping[str, Any], *, config_file: str | None = None,
                  sources: Mapping[str, str] | None = None) -> Config:
        """A Config from values by the operator's key names (``{"health_taint": "fatal"}``), already of the
        keys' types (nothing is parsed: ``load_config`` parses); keys not given keep their defaults."""
        unknown = sorted(set(values) - set(KEYS_BY_NAME))
        if unknown:
            raise TypeError(f"not configuration keys: {', '.join(unknown)}")
        groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        for name, value in values.items():
            key = KEYS_BY_NAME[name]
            groups[key.group][key.field] = value
        return cls(**{name: GROUPS[name](**fields) for name, fields in groups.items()},
                   config_file=config_file, sources=types.MappingProxyType(dict(sources or {})))

    def as_dict(self) -> dict[str, Any]:
        """The effective value of every key, by the operator's key name."""
        return {key.name: getattr(getattr(self, key.group), key.field) for key in KEYS}

    def summary(self) -> str:
        """The start-up log line: what an operator checks first (where it serves, the backend and its
        scenario, the enforcement mode, the poll interval, the node's name) and the names of the keys set away
        from their defaults (file, env, flag); every value, with its source, is :meth:`describe`'s."""
        values = self.as_dict()
        shown = [f"{name}={values[name]}" for name in STARTUP_KEYS
                 if name != "scenario" or self.devices.backend == "sim"]
        changed = [key.name for key in KEYS if key.name not in STARTUP_KEYS
                   and not self.sources.get(key.name, "default").startswith("default")]
        return ", ".join(shown) + (f"; set: {', '.join(changed)}" if changed else "")

    def describe(self) -> str:
        """The effective values as YAML lines, each with where it came from (``# default``, ``# env ...``)."""
        lines = [f"{name}: {yaml_scalar(value)}" for name, value in self.as_dict().items()]
        width = max(len(line) for line in lines if len(line) <= 72)  # a long list does not push every comment
        return "\n".join(
            f"{line:<{width}}  # {self.sources.get(key.name, 'default')}"
            for line, key in zip(lines, KEYS, strict=True)
        )


# The groups by their attribute on Config.
GROUPS: Mapping[str, type] = types.MappingProxyType(
    {f.name: cast(type, f.default_factory) for f in dataclasses.fields(Config)
     if dataclasses.is_dataclass(f.default_factory)}
)

# The keys in the order --help, check-config and describe() list them: the order of the flat key table
# that predates the groups (where it serves, the GPU reads, the node, pods, enforcement, accounting, the
# publisher, TLS and admin, the network, the log level, health), kept so that no operator's listing moves.
LISTING = (
    "listen",
    "poll_interval", "slow_poll_interval", "energy_interval", "profiling_interval",
    "process_utilization_interval", "detail_interval", "nvml_timeout", "shutdown_timeout", "backend",
    "scenario", "hostname", "xid_window",
    "pod_resources_socket", "pod_resources_interval", "gpu_resource_names", "dra_drivers", "cdi_spec_dirs",
    "dra_resource_slices", "proc_root", "kubernetes_api", "kubeconfig",
    "mode", "share_scheme", "share_period", "work_conserving", "default_gpu_share", "default_gpu_memory",
    "memory_action", "memory_term_after", "memory_kill_grace", "journal_path", "cgroup_root",
    "freezable_outside_kubepods", "policies", "pod_annotations",
    "accounting_retention", "efficiency_window", "idle_threshold", "idle_window", "idle_events",
    "publish_state", "publish_min_interval", "publish_heartbeat",
    "web_config", "admin_token_file", "admin_socket",
    "network", "network_interval", "network_links", "network_links_exclude", "sysfs_root",
    "log_level",
    "health_mode", "health_taint", "health_no_execute", "health_cordon", "health_drain",
    "health_drain_namespaces", "health_drain_default", "health_quarantine_budget", "health_budget_namespace",
    "health_clear_after", "health_events", "health_dra_taints",
)

# What the start-up line shows (Config.summary); the rest is logged at debug.
STARTUP_KEYS = ("listen", "backend", "scenario", "mode", "poll_interval", "hostname")


def _declared_keys() -> Iterator[Key]:
    """Every group's keys, each told its group and field; a field not named by the rule is a TypeError."""
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            declared: Key = f.metadata["key"]
            if f.name != field_name(group, declared.name):
                raise TypeError(f"{cls.__name__}.{f.name}: key {declared.name} must be the field "
                                f"{field_name(group, declared.name)}")
            yield dataclasses.replace(declared, group=group, field=f.name)


def _key_table() -> tuple[Key, ...]:
    by_name = {key.name: key for key in _declared_keys()}
    if sorted(by_name) != sorted(LISTING) or len(set(LISTING)) != len(LISTING):
        raise TypeError(f"LISTING and the groups' keys differ: {sorted(set(by_name) ^ set(LISTING))}")
    return tuple(by_name[name] for name in LISTING)


KEYS: tuple[Key, ...] = _key_table()
KEYS_BY_NAME: Mapping[str, Key] = types.MappingProxyType({key.name: key for key in KEYS})


def describe_keys() -> str:
    """Every key with its env name, default and help: for ``--help`` epilogs and the docs."""
    return "\n".join(f"  {key.name} ({key.env}, default {key.default_text}): {key.help}" for key in KEYS)
