"""What ``gpuagent run`` checks before it starts, and ``gpuagent check-config`` checks through the same calls.

A config can be well-formed key by key and still fail at start: a ``policies`` rule the enforcer's parser
refuses, a scenario that fails its schema, a web config whose key does not match its certificate, an admin
token file no request could authenticate against. ``check(config)`` runs every one of these, in the order
``run`` meets them; each raises ``ConfigError`` naming the key and where its value came from, so
``check-config`` says ``ok`` exactly when ``run`` would start.

Light by design: the scenario loader and the TLS module are imported only when the config names a scenario
or a web config (``check-config`` must not load the agent, aiohttp or NVML).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuagent.api.tokens import TokenFile
from gpuagent.config import Config, ConfigError
from gpuagent.enforce.rules import NodeDefaults, PolicyRule, node_defaults, parse_rules
from gpuagent.quantities import PolicyValueError


def check(config: Config) -> None:
    """Every start-up check of ``run``; raises ``ConfigError`` on the first that fails."""
    policies(config)
    scenario(config)
    web_config(config)
    admin_token(config)


def policies(
    config: Config, raw: Sequence[Mapping[str, Any]] | None = None, source: str | None = None
) -> tuple[tuple[PolicyRule, ...], NodeDefaults]:
    """The enforcer's rules and node defaults from ``config`` (or the ``raw`` policies a reload read from
    ``source``), checked whatever the mode: a rule that ``mode: audit`` would refuse is refused in ``off``
    too, so turning enforcement on never meets a config error."""
    rules = config.enforce.policies if raw is None else raw
    try:
        parsed = parse_rules(list(rules))
    except PolicyValueError as exc:
        where = source or config.sources.get("policies") or config.config_file or "config"
        raise ConfigError(exc.key_path or "policies", exc.message, where) from exc
    for key, share, memory in (("default_gpu_share", config.enforce.default_gpu_share, None),
                               ("default_gpu_memory", None, config.enforce.default_gpu_memory)):
        try:
            node_defaults(share, memory)
        except PolicyValueError as exc:
            raise ConfigError(key, exc.message, config.sources.get(key, "config")) from exc
    defaults = node_defaults(config.enforce.default_gpu_share, config.enforce.default_gpu_memory,
                             pod_annotations=config.enforce.pod_annotations)
    return parsed, defaults


def scenario(config: Config) -> None:
    """The simulated node's scenario, loaded and validated exactly as the simulator loads it (whatever the
    backend: ``auto`` serves it the day NVML fails to load)."""
    if config.devices.scenario is None:
        return
    from gpuagent.devices.sim import ScenarioError, load_scenario

    try:
        load_scenario(config.devices.scenario)
    except ScenarioError as exc:
        problems = "; ".join(f"{path}: {message}" if path else message for path, message in exc.errors)
        raise ConfigError("scenario", f"{exc.source}: {problems}", config.sources.get("scenario", "config")) \
            from None


def web_config(config: Config) -> None:
    """The listener's TLS: the web config parsed and its certificate and key loaded (a bad key or a
    cert/key mismatch fails here, not at the first connection)."""
    if not config.server.web_config:
        return
    from gpuagent.api.tls import load_web_config, server_ssl_context

    server_ssl_context(load_web_config(config.server.web_config))


def admin_token(config: Config) -> None:
    """The admin token file holds a token: an empty or unreadable one would refuse every admin request."""
    if not config.server.admin_token_file:
        return
    token, problem = TokenFile(config.server.admin_token_file).read()
    if not token:
        raise ConfigError(
            "admin_token_file",
            f"{config.server.admin_token_file} {problem}: no admin request could authenticate; write the "
            "token in it",
            config.sources.get("admin_token_file", "config"),
        )
