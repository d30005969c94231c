"""One configuration key (``Key``) and the helper that declares a key as a field of its group (``key``).
A key is declared once, as a field of the frozen dataclass of the group that reads it
(:mod:`gpuagent.config.devices`, :mod:`gpuagent.config.health`, ...); the field's metadata carries the
operator's flat name (``health_taint``), its parser, help and metavar. The operator's names are flat (YAML
keys, ``GPUAGENT_<KEY>`` env vars, ``--key`` flags); inside the program a key is its group's field, named as
the key less the group's name and an underscore (``health_taint`` is ``config.health.taint``; a key that is
the group's name alone, ``network``, is the field ``enabled``). This module holds only what every group
needs to declare its keys, so the groups import nothing of one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuagent.config.values import Parser, yaml_scalar

ENV_PREFIX = "GPUAGENT_"


@dataclass(frozen=True)
class Key:
    """One configuration key: the operator's name, its parser, default, help and the names derived from it;
    ``group`` and ``field`` say where its value is (``config.<group>.<field>``)."""

    name: str
    default: Any
    parse: Parser
    help: str
    metavar: str
    default_doc: str | None = None  # how --help states a default computed at load time
    group: str = ""
    field: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        return self.default_doc if self.default_doc is not None else yaml_scalar(self.default)


def key(
    name: str, default: Any, parse: Parser, help: str, metavar: str, default_doc: str | None = None
) -> Any:
    """A group's field for the key ``name``: its default, and the rest of the key in the field's metadata
    (``group`` and ``field`` are filled in when the key table is built)."""
    return field(default=default, metadata={"key": Key(name, default, parse, help, metavar, default_doc)})


def field_name(group: str, name: str) -> str:
    """The field of key ``name`` in group ``group``: ``name`` less the prefix ``<group>_``; ``enabled`` for
    the key that is the group's name alone."""
    return "enabled" if name == group else name.removeprefix(group + "_")
