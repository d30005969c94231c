"""The value parsers of the configuration keys, and how a value is written back (``yaml_scalar``).
A parser turns one raw value (from the YAML file, an env var or a flag) into the key's typed value, or raises
``Invalid`` saying what it expected; the loader (:mod:`gpuagent.config.load`) turns that into a
``ConfigError`` naming the key and the source. The parsers are shared by every group of keys (a number, a
choice, a path is parsed the same way whichever package reads it), so they live here once, apart from the
groups that declare the keys.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

# Choices that more than one group of keys offers.
KUBERNETES_API_MODES = ("auto", "on", "off")
MODES = ("off", "audit", "enforce")  # enforcement's mode and the health monitor's
DRAIN_MODES = ("evict", "wait", "skip")  # health_drain_default and each namespace of health_drain_namespaces

# In env and flags a value is text: these words stand for YAML's null there, for every key (a key that does
# not take null then rejects it, naming the key, exactly as it rejects ``key: null`` in the file).
NULL_WORDS = ("null", "~")


def is_null_text(value: Any) -> bool:
    """Whether an env or flag value is the word for null (``null``, ``Null``, ``NULL`` or ``~``)."""
    return isinstance(value, str) and value.strip().lower() in NULL_WORDS


class Ctx(NamedTuple):
    """Where a raw value is from: ``text`` for env and flags (a string standing for any type), else YAML,
    whose type counts."""

    text: bool
    base_dir: str | None = None  # where relative paths in a file are resolved from


def _resolved(value: str, ctx: Ctx) -> str:
    """A path as given, ``~`` expanded; a relative one in a config file is taken from the file's directory."""
    path = os.path.expanduser(value)
    if ctx.base_dir is not None and not os.path.isabs(path):
        path = os.path.join(ctx.base_dir, path)
    return path


def _comma_list(text: str) -> list[str]:
    """An env or flag list: comma-separated, each item stripped, empty items dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _is_none_word(value: Any, ctx: Ctx) -> bool:
    """Null, or (in env and flags) "" or "none": the keys that take "none" for no value."""
    return value is None or (ctx.text and value.strip().lower() in ("", "none"))


class Invalid(Exception):
    """A parser's refusal: what it expected, and a hint; the loader names the key and the source."""

    def __init__(self, expected: str, hint: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.hint = hint


Parser = Callable[[Any, Ctx], Any]


def number(low: float, *, high: float | None = None) -> Parser:
    """A finite number > low (and <= high); booleans are not numbers."""
    expected = f"a number > {low:g}" + (f" and <= {high:g}" if high is not None else "")

    def parse(value: Any, ctx: Ctx) -> float:
        if ctx.text and isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise Invalid(expected) from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                raise Invalid(expected) from None
        else:
            raise Invalid(expected)
        if not math.isfinite(number) or number <= low or (high is not None and number > high):
            raise Invalid(expected)
        return number

    return parse


def number_or_null(low: float, *, high: float | None = None) -> Parser:
    """A number as ``number`` says, or null for the default."""
    parse_number = number(low, high=high)

    def parse(value: Any, ctx: Ctx) -> float | None:
        if value is None or (ctx.text and is_null_text(value)):
            return None
        try:
            return parse_number(value, ctx)
        except Invalid as err:
            raise Invalid(err.expected + ", or null") from None

    return parse


def choice_word(value: Any, choices: tuple[str, ...]) -> str | None:
    """``value`` as one of ``choices`` (case and spaces ignored), or None. YAML 1.1 reads a bare ``off``
    or ``on`` as a boolean: where the choices hold that word, the boolean is taken as the word, so
    ``mode: off`` means what it says."""
    if isinstance(value, bool):
        value = "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in choices:
        return value.strip().lower()
    return None


def choice(*choices: str) -> Parser:
    expected = "one of " + ", ".join(choices)

    def parse(value: Any, ctx: Ctx) -> str:
        word = choice_word(value, choices)
        if word is None:
            raise Invalid(expected)
        return word

    return parse


_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")
_LISTEN_EXPECTED = "HOST:PORT with a port 1-65535"


def parse_listen(value: str) -> tuple[str, int]:
    """``"HOST:PORT"`` or ``"[IPv6]:PORT"`` -> (host without brackets, port); ValueError when bad."""
    if value.startswith("["):
        inner, sep, port_text = value[1:].partition("]:")
        if not sep:
            raise ValueError("an IPv6 address in brackets needs a port after it, e.g. [::1]:9402")
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"{inner!r} is not an IPv6 address") from None
        host = inner
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            raise ValueError("no port")
        if ":" in host:
            raise ValueError("an IPv6 address needs brackets, e.g. [::1]:9402")
        if not host:
            raise ValueError("no host; use 0.0.0.0:PORT or [::]:PORT for every interface")
        if not _HOSTNAME.match(host):
            raise ValueError(f"{host!r} is not a host name or IPv4 address")
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv4 address") from None
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not 1-65535")
    return host, int(port_text)


def listen_address(value: Any, ctx: Ctx) -> str:
    if not isinstance(value, str):
        raise Invalid(_LISTEN_EXPECTED)
    try:
        host, port = parse_listen(value.strip())
    except ValueError as err:
        raise Invalid(_LISTEN_EXPECTED, str(err)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def existing_file(what: str) -> Parser:
    """A path to a file that must exist (relative paths in a config file are resolved from its directory);
    null (in the file) for none."""
    expected = f"a path to an existing {what} file, or null"

    def parse(value: Any, ctx: Ctx) -> str | None:
        if value is None and not ctx.text:
            return None
        if not isinstance(value, str) or not value:
            raise Invalid(expected)
        path = _resolved(value, ctx)
        if not os.path.isfile(path):  # isfile() is False (never raises) for NUL bytes, overlong names, ...
            hint = "a directory" if os.path.isdir(path) else "no such file"
            raise Invalid(expected, f"{path}: {hint}" if path != value else hint)
        return path

    return parse


def optional_path(value: Any, ctx: Ctx) -> str | None:
    """A path that may not exist yet (a socket the kubelet creates later); null or "" turns it off."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or "\x00" in value:
        raise Invalid("a path, or null to turn it off")
    path = _resolved(value, ctx)
    return path


def required_path(value: Any, ctx: Ctx) -> str:
    """A path that must be given (a root the agent reads or writes under): null is not allowed."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise Invalid("a path")
    path = _resolved(value, ctx)
    return path


_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def resource_names(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """Kubernetes extended resource names: a YAML list, or comma-separated in env and flags."""
    expected = "a list of resource names like nvidia.com/gpu (comma-separated in env and flags)"
    if ctx.text and isinstance(value, str):
        value = _comma_list(value)
    if not isinstance(value, (list, tuple)) or not value:
        raise Invalid(expected)
    for name in value:
        if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
            raise Invalid(expected, f"{name!r} is not a domain/name resource name")
    return tuple(value)


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _text_list(value: Any, ctx: Ctx) -> Any:
    """Env and flags give a list comma-separated, "none" (or "") for an empty one (null, read as YAML's
    null before this, too); YAML gives a list."""
    if ctx.text and isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", ""):
            return []
        return _comma_list(text)
    return [] if value is None else value


def driver_names(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """DRA driver names (DNS subdomains like gpu.nvidia.com); [] (none in env and flags) for none."""
    expected = ("a list of DRA driver names like gpu.nvidia.com (comma-separated in env and flags, none for "
                "none)")
    value = _text_list(value, ctx)
    if not isinstance(value, (list, tuple)):
        raise Invalid(expected)
    for name in value:
        if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise Invalid(expected, f"{name!r} is not a DNS subdomain")
    return tuple(value)


def directories(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """Absolute directory paths; [] (none in env and flags) for none."""
    expected = "a list of absolute directory paths (comma-separated in env and flags, none for none)"
    value = _text_list(value, ctx)
    if not isinstance(value, (list, tuple)):
        raise Invalid(expected)
    for path in value:
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise Invalid(expected, f"{path!r} is not an absolute path")
    return tuple(value)


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def boolean(value: Any, ctx: Ctx) -> bool:
    if isinstance(value, bool):
        return value
    if ctx.text and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise Invalid("true or false")


def percent_or_null(value: Any, ctx: Ctx) -> float | None:
    """A share of a GPU in percent (0, 100], or null for none."""
    if _is_none_word(value, ctx):
        return None
    return number(0, high=100)(value, ctx)


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


def quantity_or_null(value: Any, ctx: Ctx) -> str | None:
    """A Kubernetes memory quantity ("8Gi", "512Mi", plain bytes), or null for none."""
    if _is_none_word(value, ctx):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if not isinstance(value, str) or not _QUANTITY.match(value.strip()) or float(
        re.sub(r"[A-Za-z]+$", "", value.strip())
    ) <= 0:
        raise Invalid("a memory quantity like 8Gi, 512Mi or plain bytes, or null")
    return value.strip()


def cgroup_globs(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """Cgroup path globs: a YAML list, or comma-separated in env and flags; [] for none."""
    if ctx.text and isinstance(value, str):
        value = _comma_list(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v[:1] == "/" for v in value):
        raise Invalid("a list of cgroup path globs starting with '/'")
    return tuple(value)


def link_globs(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """Network interface name globs: a YAML list ([] for none), or comma-separated in env and flags
    ("none" for none)."""
    expected = "a list of interface name globs like eth* (comma-separated in env and flags, none for none)"
    if ctx.text and isinstance(value, str):
        value = [] if value.strip().lower() == "none" else _comma_list(value)
    if not isinstance(value, (list, tuple)):
        raise Invalid(expected)
    for glob in value:
        if not isinstance(glob, str) or not glob or len(glob) > 64 or "/" in glob or any(
            c.isspace() for c in glob
        ):
            raise Invalid(expected, f"{glob!r} is not an interface name glob")
    return tuple(value)


_K8S_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


def namespace_drain_modes(value: Any, ctx: Ctx) -> tuple[str, ...]:
    """Namespace -> drain mode, as ``namespace=mode`` words: a YAML mapping or list, or ``a=skip,b=wait``."""
    expected = "a mapping of namespace to " + "|".join(DRAIN_MODES) + " (or namespace=mode, comma-separated)"
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, str) and ctx.text:
        pairs = [item.partition("=")[::2] for item in value.split(",") if item.strip()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        pairs = [item.partition("=")[::2] for item in value]
    else:
        raise Invalid(expected)
    out = []
    for namespace, mode in pairs:
        namespace, mode = str(namespace).strip(), choice_word(mode, DRAIN_MODES)
        if not _K8S_NAME.fullmatch(namespace) or mode is None:
            raise Invalid(expected, f"{namespace!r}: not a namespace name with one of "
                           + ", ".join(DRAIN_MODES))
        out.append(f"{namespace}={mode}")
    return tuple(out)


def whole_number(value: Any, ctx: Ctx) -> int:
    if ctx.text and isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise Invalid("a whole number >= 0")


def namespace_name(value: Any, ctx: Ctx) -> str:
    if isinstance(value, str) and _K8S_NAME.fullmatch(value.strip()):
        return value.strip()
    raise Invalid("a Kubernetes namespace name")


def policy_rules(value: Any, ctx: Ctx) -> tuple[Mapping[str, Any], ...]:
    """The raw ``policies`` list; each item's keys and values are checked by the enforcer's policy parser."""
    if ctx.text:
        raise Invalid("a list of rules, which only the config file can give")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise Invalid("a list of mappings (match_* keys and the limits they set)")
    return tuple(value)


def node_name(value: Any, ctx: Ctx) -> str | None:
    if value is None and not ctx.text:
        return None  # null: resolved from NODE_NAME or gethostname() at load time
    if not isinstance(value, str) or not value or len(value) > 253 or not value.isprintable() or " " in value:
        raise Invalid("a non-empty string without spaces (quote it if it looks like a number), or null")
    return value


def describe_value(value: Any) -> str:
    """A YAML value as an error message shows it: scalars as written, collections by kind."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = yaml_scalar(value)
    return text if len(text) <= 80 else text[:77] + "..."


def yaml_scalar(value: Any) -> str:
    """A value as YAML writes it: ``--help``'s defaults and ``check-config``'s listing."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    return repr(value)
