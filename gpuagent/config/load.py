"""``load_config``: a Config from defaults, a YAML file, ``GPUAGENT_*`` env vars and flags, in that order.
Every source is read by the operator's flat key names (``health_taint: fatal``, ``GPUAGENT_HEALTH_TAINT``,
``--health-taint``): each raw value is parsed by its key's parser, a bad one is a ``ConfigError`` naming the
source and the key (with close names for a typo), and the checks that span keys (of one group or of two)
run once every source is in. The groups are built last, by ``Config.from_flat``.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Mapping
from typing import Any

from gpuagent.config.agent import default_hostname
from gpuagent.config.errors import ConfigError
from gpuagent.config.files import key_text, read_yaml_mapping
from gpuagent.config.keys import Key
from gpuagent.config.model import KEYS, KEYS_BY_NAME, Config
from gpuagent.config.values import Ctx, Invalid, describe_value, is_null_text

CONFIG_ENV = "GPUAGENT_CONFIG"  # names the config file when no path is given


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] = os.environ,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Defaults, then the YAML file (``path``, else ``$GPUAGENT_CONFIG``), then env, then ``overrides``.

    ``overrides`` maps key names to flag values: strings are parsed like env values, other values must
    already have the key's type; ``None`` means "not given". Raises ``ConfigError`` on any bad input.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    if path is None:
        path = env.get(CONFIG_ENV) or None
    if path is not None:
        base_dir = os.path.dirname(os.path.abspath(path))
        for name, raw in read_yaml_mapping(path).items():
            key = _lookup(name, path)
            values[key.name] = _parse(key, raw, Ctx(text=False, base_dir=base_dir), path)
            sources[key.name] = path

    for key in KEYS:
        raw = env.get(key.env)
        if raw is not None and raw != "":  # an empty env var (a blank template value) counts as unset
            source = f"env {key.env}"
            values[key.name] = _parse(key, raw, Ctx(text=True), source)
            sources[key.name] = source

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        key = _lookup(name, "flag --" + str(name).replace("_", "-"))
        source = f"flag {key.flag}"
        values[key.name] = _parse(key, raw, Ctx(text=isinstance(raw, str)), source)
        sources[key.name] = source

    if values.get("hostname") is None:
        values["hostname"], sources["hostname"] = default_hostname(env)
    _check_combinations(values, sources)
    return Config.from_flat(values, config_file=path, sources=types.MappingProxyType(sources))


def _lookup(name: Any, source: str) -> Key:
    key = KEYS_BY_NAME.get(name) if isinstance(name, str) else None
    if key is not None:
        return key
    close = difflib.get_close_matches(str(name), list(KEYS_BY_NAME), n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        hint = "known keys: " + ", ".join(KEYS_BY_NAME)
    key_path = key_text(name)
    if source.startswith("flag "):
        raise ConfigError(key_path, f"unknown option; {hint}", source)
    raise ConfigError(key_path, f"unknown key; {hint}", source)


def _parse(key: Key, raw: Any, ctx: Ctx, source: str) -> Any:
    if ctx.text and is_null_text(raw):
        raw, ctx = None, ctx._replace(text=False)  # "null" from env or a flag is YAML's null
    try:
        return key.parse(raw, ctx)
    except Invalid as err:
        got = repr(raw) if ctx.text else describe_value(raw)
        hint = f" ({err.hint})" if err.hint else ""
        raise ConfigError(key.name, f"expected {err.expected}, got {got}{hint}", source) from None


def _check_combinations(values: dict[str, Any], sources: dict[str, str]) -> None:
    poll = values.get("poll_interval", KEYS_BY_NAME["poll_interval"].default)
    if "slow_poll_interval" not in values:
        if poll > KEYS_BY_NAME["slow_poll_interval"].default:
            values["slow_poll_interval"] = poll
            sources["slow_poll_interval"] = "default, raised to poll_interval"
    elif values["slow_poll_interval"] < poll:
        raise ConfigError(
            "slow_poll_interval",
            f"expected a number >= poll_interval ({poll:g}, from {sources.get('poll_interval', 'default')}), "
            f"got {values['slow_poll_interval']:g}",
            sources["slow_poll_interval"],
        )
    if values.get("dra_resource_slices") == "on" and values.get("kubernetes_api") == "off":
        raise ConfigError(
            "dra_resource_slices",
            f"ResourceSlices are read from the API server, but kubernetes_api is 'off' (from "
            f"{sources['kubernetes_api']}); use 'auto', or turn kubernetes_api on",
            sources["dra_resource_slices"],
        )
    if values.get("backend") == "nvml" and values.get("scenario") is not None:
        raise ConfigError(
            "scenario",
            f"a scenario drives the simulator, but backend is 'nvml' (from {sources['backend']}); "
            "use backend 'sim' or 'auto', or drop the scenario",
            sources["scenario"],
        )
