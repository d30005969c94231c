"""The extender's options: a small key table of its own, loaded like the agent's config.

The extender is a separate cluster-side service, so it does not share the agent's keys (``poll_interval``,
``mode``, ``policies`` ... mean nothing to it) nor their env names: its env vars are
``GPUAGENT_EXTENDER_<KEY>``, so an agent's ``GPUAGENT_LISTEN`` in the same shell or pod template never
configures the extender. Precedence is the agent's: flag > env > file (``--config``) > default, and every bad
value raises ``gpuagent.config.ConfigError`` naming the key and where it came from.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gpuagent.config import ConfigError, choice_word, is_null_text, key_text, parse_listen, read_yaml_mapping

ENV_PREFIX = "GPUAGENT_EXTENDER_"
CONFIG_ENV = "GPUAGENT_EXTENDER_CONFIG"
DEFAULT_PORT = 9403  # next to the agent's 9402
LOG_LEVELS = ("debug", "info", "warning", "error")
API_MODES = ("auto", "on", "off")
NODE_PLACEHOLDER = "{node}"
DEFAULT_AGENT_URL = "http://{node}:9402"
# A node name is a DNS subdomain (RFC 1123): checked before it goes into a URL.
_NODE_NAME_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*", re.ASCII
)


class AgentDirectoryError(ValueError):
    """A bad agent URL template or agents-file entry; ``field`` names which."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_template(template: str, field: str = "agent_url") -> str:
    """An agent URL template: http(s)://, with ``{node}`` and no other braces."""
    if not template.startswith(("http://", "https://")):
        raise AgentDirectoryError(field, f"expected an http:// or https:// URL, got {template[:80]!r}")
    rest = template.replace(NODE_PLACEHOLDER, "")
    if rest == template or "{" in rest or "}" in rest:
        raise AgentDirectoryError(
            field,
            f"expected a URL with {NODE_PLACEHOLDER} where the node name goes (and no other braces), "
            f"like {DEFAULT_AGENT_URL}, got {template[:80]!r}",
        )
    return template.rstrip("/")


def check_node_urls(urls: Mapping[Any, Any], field: str = "agents") -> dict[str, str]:
    """The agents file's map node -> agent base URL, checked."""
    out: dict[str, str] = {}
    for node, url in urls.items():
        if not isinstance(node, str) or not valid_node_name(node):
            raise AgentDirectoryError(f"{field}.{node}", "expected a node name (an RFC 1123 DNS subdomain)")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise AgentDirectoryError(
                f"{field}.{node}", f"expected an http:// or https:// URL, got {url!r}"[:200]
            )
        out[node] = url.rstrip("/")
    return out


def valid_node_name(node: str) -> bool:
    return len(node) <= 253 and _NODE_NAME_RE.fullmatch(node) is not None


Parser = Callable[[Any, bool, str | None], Any]  # (raw, from text, base dir) -> value; raises ValueError


def _number(low: float, high: float) -> Parser:
    def parse(value: Any, text: bool, base_dir: str | None) -> float:
        if text and isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                value = None
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not (low < value <= high)
        ):
            raise ValueError(f"expected a number > {low:g} and <= {high:g}")
        return float(value)

    return parse


def _integer(low: int, high: int) -> Parser:
    def parse(value: Any, text: bool, base_dir: str | None) -> int:
        if text and isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return value

    return parse


def _listen(value: Any, text: bool, base_dir: str | None) -> str:
    if not isinstance(value, str):
        raise ValueError("expected HOST:PORT")
    try:
        host, port = parse_listen(value.strip())
    except ValueError as err:
        raise ValueError(f"expected HOST:PORT with a port 1-65535 ({err})") from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _prefix(value: Any, text: bool, base_dir: str | None) -> str:
    if not isinstance(value, str) or (value and (not value.startswith("/") or "{" in value or " " in value)):
        raise ValueError('expected a URL path starting with "/" (e.g. /gpuagent), or "" for none')
    return value.rstrip("/")


def _template(value: Any, text: bool, base_dir: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("expected a URL template like " + DEFAULT_AGENT_URL)
    try:
        return check_template(value.strip())
    except AgentDirectoryError as err:
        raise ValueError(err.message) from None


def _file(value: Any, text: bool, base_dir: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("expected a path to an existing file")
    path = os.path.expanduser(value)
    if base_dir is not None and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    if not os.path.isfile(path):
        raise ValueError(f"expected a path to an existing file ({path}: no such file)")
    return path


def _names(value: Any, text: bool, base_dir: str | None) -> tuple[str, ...]:
    if text and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(name, str) and "/" in name and " " not in name for name in value)
    ):
        raise ValueError(
            "expected a list of resource names like nvidia.com/gpu (comma-separated in env/flags)"
        )
    return tuple(value)


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


def _class_names(value: Any, text: bool, base_dir: str | None) -> tuple[str, ...]:
    if text and isinstance(value, str):
        empty = value.strip().lower() in ("none", "null")
        value = [] if empty else [p.strip() for p in value.split(",") if p.strip()]
    if value is None:
        value = []
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) for name in value
    ):
        raise ValueError("expected a list of DeviceClass names like gpu.nvidia.com (comma-separated in "
                         "env/flags, none for none)")
    return tuple(value)


def _mode(value: Any, text: bool, base_dir: str | None) -> str:
    word = choice_word(value, API_MODES)
    if word is None:
        raise ValueError("expected one of " + ", ".join(API_MODES))
    return word


def _level(value: Any, text: bool, base_dir: str | None) -> str:
    if not isinstance(value, str) or value.strip().lower() not in LOG_LEVELS:
        raise ValueError("expected one of " + ", ".join(LOG_LEVELS))
    return value.strip().lower()


def _key(default: Any, parse: Parser, help: str, metavar: str) -> Any:
    return field(default=default, metadata={"parse": parse, "help": help, "metavar": metavar})


@dataclass(frozen=True)
class ExtenderOptions:
    """The extender's effective options; build them with ``load_options``."""

    listen: str = _key(f"0.0.0.0:{DEFAULT_PORT}", _listen, "address the extender listens on", "HOST:PORT")
    url_prefix: str = _key(
        "", _prefix, "path before /filter and /prioritize (the scheduler's urlPrefix path)", "PATH"
    )
    agent_url: str | None = _key(
        DEFAULT_AGENT_URL, _template, "a node's agent URL, {node} replaced by the node name", "TEMPLATE"
    )
    agents: str | None = _key(
        None, _file, "YAML file mapping node name -> agent URL (wins over agent_url)", "FILE"
    )
    max_age: float = _key(
        30.0,
        _number(0, 86400),
        "seconds since its agent last answered after which a node is filtered out",
        "SECONDS",
    )
    refresh_interval: float = _key(
        5.0,
        _number(0, 3600),
        "seconds between refreshes of every agent's hints (conditional GETs)",
        "SECONDS",
    )
    timeout: float = _key(
        1.0,
        _number(0, 60),
        "seconds one agent request may take; also the bound on fetching nodes never seen before",
        "SECONDS",
    )
    forget_after: float = _key(
        3600.0,
        _number(0, 10**7),
        "seconds a node nobody asks about stays cached (not agents-file nodes)",
        "SECONDS",
    )
    max_concurrent_fetches: int = _key(128, _integer(1, 10000), "agent requests in flight at once", "N")
    gpu_resource_names: tuple[str, ...] = _key(
        ("nvidia.com/gpu",),
        _names,
        "resource names counted as whole GPUs (nvidia.com/mig-* are MIG)",
        "NAMES",
    )
    kubernetes_api: str = _key(
        "auto", _mode, "read pods' DRA ResourceClaims from the API server: auto (a service account token or "
        "a kubeconfig), on, or off (pods with claims then pass unjudged)", "{" + ",".join(API_MODES) + "}",
    )
    kubeconfig: str | None = _key(None, _file, "kubeconfig for the API server (default: in-cluster)", "FILE")
    cluster_view: str = _key(
        "auto", _mode, "judge nodes by the GPUNodeState objects the agents publish, read with one list and "
        "watch: auto (a service account token or a kubeconfig), on, or off (fetch every agent's /v1/hints)",
        "{" + ",".join(API_MODES) + "}",
    )
    published_max_age: float = _key(
        900.0, _number(0, 10**7),
        "seconds since a node's GPUNodeState was last confirmed (its heartbeat) after which the node is "
        "filtered out (three of the agents' default 300 s heartbeats)", "SECONDS",
    )
    gpu_device_classes: tuple[str, ...] = _key(
        ("gpu.nvidia.com",), _class_names, "DRA DeviceClasses whose devices are whole GPUs", "NAMES"
    )
    mig_device_classes: tuple[str, ...] = _key(
        ("mig.nvidia.com",), _class_names,
        "DRA DeviceClasses whose devices are MIG devices (the profile from the request's CEL selector)",
        "NAMES",
    )
    agent_ca_file: str | None = _key(None, _file, "CA bundle that signs the agents' certificates", "FILE")
    agent_cert_file: str | None = _key(None, _file, "client certificate presented to the agents", "FILE")
    agent_key_file: str | None = _key(None, _file, "key of agent_cert_file", "FILE")
    web_config: str | None = _key(
        None, _file, "TLS for the extender's listener, as the agent's web_config (tls_server_config)", "FILE"
    )
    max_body_bytes: int = _key(
        8 * 1024 * 1024, _integer(64 * 1024, 256 * 1024 * 1024),
        "largest scheduler call body, once inflated (up to about 10x this in memory per call, two at a "
        "time: raise its memory limit with it)", "BYTES",
    )
    log_level: str = _key("info", _level, "log level", "{" + ",".join(LOG_LEVELS) + "}")

    agent_urls: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # from ``agents``
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The effective value of every option, by key name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if "parse" in f.metadata}

    @property
    def listen_host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return parse_listen(self.listen)[1]


@dataclass(frozen=True)
class OptionKey:
    name: str
    default: Any
    parse: Parser
    help: str
    metavar: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTION_KEYS: tuple[OptionKey, ...] = tuple(
    OptionKey(f.name, f.default, f.metadata["parse"], f.metadata["help"], f.metadata["metavar"])
    for f in fields(ExtenderOptions)
    if "parse" in f.metadata
)
_BY_NAME = types.MappingProxyType({key.name: key for key in OPTION_KEYS})


def load_options(
    path: str | None = None,
    *,
    env: Mapping[str, str] = os.environ,
    overrides: Mapping[str, Any] | None = None,
) -> ExtenderOptions:
    """Defaults < the YAML file (``path``, else ``$GPUAGENT_EXTENDER_CONFIG``) < env < ``overrides`` (flags;
    None: not given). Raises ``ConfigError``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = path or env.get(CONFIG_ENV) or None
    if path is not None:
        base_dir = os.path.dirname(os.path.abspath(path))
        for name, raw in read_yaml_mapping(path).items():
            key = _BY_NAME.get(name) if isinstance(name, str) else None
            if key is None:
                raise ConfigError(key_text(name), "unknown key; known keys: " + ", ".join(_BY_NAME), path)
            values[key.name] = _parse(key, raw, False, base_dir, path)
            sources[key.name] = path
    for key in OPTION_KEYS:
        raw = env.get(key.env)
        if raw:
            values[key.name] = _parse(key, raw, True, None, f"env {key.env}")
            sources[key.name] = f"env {key.env}"
    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        key = _BY_NAME[name]
        values[key.name] = _parse(key, raw, isinstance(raw, str), None, f"flag {key.flag}")
        sources[key.name] = f"flag {key.flag}"

    def source(name: str) -> str:
        return sources.get(name, "default")

    refresh = values.get("refresh_interval", ExtenderOptions.refresh_interval)
    max_age = values.get("max_age", ExtenderOptions.max_age)
    if refresh >= max_age:
        raise ConfigError(
            "refresh_interval",
            f"expected less than max_age ({max_age:g}, from {source('max_age')}), got {refresh:g}: "
            "every node would go stale between two refreshes",
            source("refresh_interval"),
        )
    if bool(values.get("agent_cert_file")) != bool(values.get("agent_key_file")):
        missing = "agent_key_file" if values.get("agent_cert_file") else "agent_cert_file"
        raise ConfigError(missing, "agent_cert_file and agent_key_file go together", source(missing))
    agent_urls: dict[str, str] = {}
    if values.get("agents"):
        agents_file = values["agents"]
        try:
            agent_urls = check_node_urls(read_yaml_mapping(agents_file))
        except AgentDirectoryError as err:
            raise ConfigError(err.field.removeprefix("agents."), err.message, agents_file) from None
    if "agent_url" not in values and agent_urls:
        values["agent_url"] = None  # an agents file alone: its nodes only, no guessing other nodes' URLs
        sources["agent_url"] = "null, as an agents file is given"
    return ExtenderOptions(
        **values, agent_urls=types.MappingProxyType(agent_urls), sources=types.MappingProxyType(sources)
    )


def _parse(key: OptionKey, raw: Any, text: bool, base_dir: str | None, source: str) -> Any:
    if text and is_null_text(raw):
        raw, text = None, False  # "null" from env or a flag is YAML's null, as in the agent's options
    try:
        return key.parse(raw, text, base_dir)
    except ValueError as err:
        shown = repr(raw) if isinstance(raw, (str, int, float, bool)) or raw is None else type(raw).__name__
        raise ConfigError(key.name, f"{err}, got {shown[:80]}", source) from None


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--config`` and one flag per option (no type: ``load_options`` validates, naming the flag)."""
    parser.add_argument("--config", metavar="FILE", help=f"YAML file of the options below (env {CONFIG_ENV})")
    for key in OPTION_KEYS:
        default = (
            "null"
            if key.default is None
            else ",".join(key.default)
            if isinstance(key.default, tuple)
            else (key.default)
        )
        parser.add_argument(
            key.flag,
            dest=key.name,
            metavar=key.metavar,
            default=None,
            help=f"{key.help} (key {key.name}, env {key.env}, default {default})",
        )


def options_from_args(args: argparse.Namespace) -> ExtenderOptions:
    """The options of a command line built by ``add_flags``."""
    return load_options(args.config, overrides={key.name: getattr(args, key.name) for key in OPTION_KEYS})
