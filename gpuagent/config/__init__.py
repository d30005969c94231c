"""The agent's configuration: one frozen ``Config`` of groups of keys, loaded from defaults, a YAML file, env
and flags.

Precedence, highest first: flag (``overrides``) > env (``GPUAGENT_<KEY>``) > file > default. The operator's
keys are flat (``health_taint``, ``GPUAGENT_HEALTH_TAINT``, ``--health-taint``); the program reads each as a
field of the group of the package that reads it, named as the key less the group's prefix
(``config.health.taint``, ``config.enforce.share_scheme``, ``config.network.enabled`` for ``network``).
The modules: ``values`` (the parsers), ``files`` (bounded, strict YAML reading), ``keys`` (what a key is),
one module per group (``agent``, ``server``, ``devices``, ``pods``, ``kubeapi``, ``enforce``,
``accounting``, ``publish``, ``network``, ``health``), ``model`` (``Config`` and the key table ``KEYS``,
from which the CLI flags, the env names, ``--help`` and ``check-config`` are built) and ``load``
(``load_config``: the sources, their precedence and the checks across keys).

Every bad input raises ``ConfigError`` naming where it came from and the key, e.g.
``config.yaml: poll_interval: expected a number > 0 and <= 300, got -1``.
"""

from gpuagent.config.accounting import AccountingConfig
from gpuagent.config.agent import NODE_NAME_ENV, AgentConfig
from gpuagent.config.devices import DevicesConfig
from gpuagent.config.enforce import POD_ANNOTATION_MODES, EnforceConfig
from gpuagent.config.errors import ConfigError
from gpuagent.config.files import key_text, read_regular_file, read_yaml_mapping
from gpuagent.config.health import HealthConfig
from gpuagent.config.keys import Key
from gpuagent.config.kubeapi import KubeApiConfig
from gpuagent.config.load import CONFIG_ENV, load_config
from gpuagent.config.model import KEYS, KEYS_BY_NAME, Config, describe_keys
from gpuagent.config.network import NETWORK_LINK_EXCLUDE, NetworkConfig
from gpuagent.config.pods import PodsConfig
from gpuagent.config.publish import PublishConfig
from gpuagent.config.server import ServerConfig
from gpuagent.config.values import choice_word, describe_value, is_null_text, parse_listen

__all__ = [
    "CONFIG_ENV",
    "KEYS",
    "KEYS_BY_NAME",
    "NETWORK_LINK_EXCLUDE",
    "NODE_NAME_ENV",
    "POD_ANNOTATION_MODES",
    "AccountingConfig",
    "AgentConfig",
    "Config",
    "ConfigError",
    "DevicesConfig",
    "EnforceConfig",
    "HealthConfig",
    "Key",
    "KubeApiConfig",
    "NetworkConfig",
    "PodsConfig",
    "PublishConfig",
    "ServerConfig",
    "choice_word",
    "describe_keys",
    "describe_value",
    "is_null_text",
    "key_text",
    "load_config",
    "parse_listen",
    "read_regular_file",
    "read_yaml_mapping",
]
