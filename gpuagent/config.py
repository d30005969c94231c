"""The agent's configuration: one frozen ``Config``, loaded from defaults, a YAML file, env and flags.

Precedence, highest first: flag (``overrides``) > env (``GPUAGENT_<KEY>``) > file > default. Every key is
declared once, as a field of ``Config`` whose metadata carries its parser and help; ``KEYS`` (derived from
those fields) is what the CLI flags, the env names, ``--help`` and ``check-config`` are built from.

Every bad input raises ``ConfigError`` naming where it came from and the key, e.g.
``config.yaml: poll_interval: expected a number > 0 and <= 300, got -1``.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import socket
import stat
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

from gpuagent.untrusted import shown

ENV_PREFIX = "GPUAGENT_"
CONFIG_ENV = "GPUAGENT_CONFIG"  # names the config file when no path is given
NODE_NAME_ENV = "NODE_NAME"  # the Kubernetes downward-API node name, preferred over gethostname()

BACKENDS = ("auto", "nvml", "sim")
LOG_LEVELS = ("debug", "info", "warning", "error")
KUBERNETES_API_MODES = ("auto", "on", "off")
MODES = ("off", "audit", "enforce")
MEMORY_ACTIONS = ("warn", "kill", "evict")
HEALTH_DRA_TAINT_MODES = ("off", "report", "classify")  # gpuagent.health.table.DRA_TAINT_MODES
HEALTH_THRESHOLDS = ("degraded", "fatal", "never")  # the least severity that gets an action (gpuagent.health)
DRAIN_MODES = ("evict", "wait", "skip")
# What a pod's gpuagent.io/* limit annotations may do (gpuagent.enforce.policy, docs/isolation.md): nothing,
# only make the operator's limit stricter, or anything (the operator trusts every pod author).
POD_ANNOTATION_MODES = ("ignore", "lower-only", "any")
# Network links left out by default: the loopback and what a node has one of per pod or per CNI.
NETWORK_LINK_EXCLUDE = (
    "lo", "veth*", "cali*", "cni*", "flannel*", "docker*", "br-*", "lxc*", "cilium_*", "weave*", "vxlan*",
    "tunl*", "kube-ipvs*", "nodelocaldns", "genev_sys_*", "virbr*", "ifb*", "tap*", "nerdctl*", "podman*",
)


class ConfigError(ValueError):
    """A bad configuration value (or file), with where it came from.

    ``source`` is a file path, ``env NAME`` or ``flag --name``; env and flag sources already name the
    key, so ``str()`` leaves the key path out for them.
    """

    def __init__(self, key_path: str, message: str, source: str) -> None:
        super().__init__(key_path, message, source)
        self.key_path = key_path
        self.message = message
        self.source = source

    def __str__(self) -> str:
        if not self.key_path or self.source.startswith(("env ", "flag ")):
            return f"{self.source}: {self.message}"
        return f"{self.source}: {self.key_path}: {self.message}"


# --- parsers ------------------------------------------------------------------------------------------------
# A parser turns one raw value into the typed value or raises _Invalid. ``ctx.text`` is true when the raw
# value is a string that stands for any type (env and flags); false for YAML values, whose type counts.


# In env and flags a value is text: these words stand for YAML's null there, for every key (a key that does
# not take null then rejects it, naming the key, exactly as it rejects ``key: null`` in the file).
NULL_WORDS = ("null", "~")


def is_null_text(value: Any) -> bool:
    """Whether an env or flag value is the word for null (``null``, ``Null``, ``NULL`` or ``~``)."""
    return isinstance(value, str) and value.strip().lower() in NULL_WORDS


class _Ctx(NamedTuple):
    text: bool
    base_dir: str | None = None  # where relative paths in a file are resolved from


class _Invalid(Exception):
    def __init__(self, expected: str, hint: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.hint = hint


Parser = Callable[[Any, _Ctx], Any]


def _number(low: float, *, high: float | None = None) -> Parser:
    """A finite number > low (and <= high); booleans are not numbers."""
    expected = f"a number > {low:g}" + (f" and <= {high:g}" if high is not None else "")

    def parse(value: Any, ctx: _Ctx) -> float:
        if ctx.text and isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise _Invalid(expected) from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                raise _Invalid(expected) from None
        else:
            raise _Invalid(expected)
        if not math.isfinite(number) or number <= low or (high is not None and number > high):
            raise _Invalid(expected)
        return number

    return parse


def _number_or_null(low: float, *, high: float | None = None) -> Parser:
    """A number as ``_number`` says, or null for the default."""
    number = _number(low, high=high)
    expected = f"a number > {low:g}" + (f" and <= {high:g}" if high is not None else "") + ", or null"

    def parse(value: Any, ctx: _Ctx) -> float | None:
        if value is None or (ctx.text and is_null_text(value)):
            return None
        try:
            return number(value, ctx)
        except _Invalid:
            raise _Invalid(expected) from None

    return parse


SHARE_SCHEMES = ("rotation", "duty")


def choice_word(value: Any, choices: tuple[str, ...]) -> str | None:
    """``value`` as one of ``choices`` (case and spaces ignored), or None. YAML 1.1 reads a bare ``off``
    or ``on`` as a boolean: where the choices hold that word, the boolean is taken as the word, so
    ``mode: off`` means what it says."""
    if isinstance(value, bool):
        value = "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in choices:
        return value.strip().lower()
    return None


def _choice(*choices: str) -> Parser:
    expected = "one of " + ", ".join(choices)

    def parse(value: Any, ctx: _Ctx) -> str:
        word = choice_word(value, choices)
        if word is None:
            raise _Invalid(expected)
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


def _listen(value: Any, ctx: _Ctx) -> str:
    if not isinstance(value, str):
        raise _Invalid(_LISTEN_EXPECTED)
    try:
        host, port = parse_listen(value.strip())
    except ValueError as err:
        raise _Invalid(_LISTEN_EXPECTED, str(err)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _existing_file(what: str) -> Parser:
    """A path to a file that must exist (relative paths in a config file are resolved from its directory);
    null (in the file) for none."""
    expected = f"a path to an existing {what} file, or null"

    def parse(value: Any, ctx: _Ctx) -> str | None:
        if value is None and not ctx.text:
            return None
        if not isinstance(value, str) or not value:
            raise _Invalid(expected)
        path = os.path.expanduser(value)
        if ctx.base_dir is not None and not os.path.isabs(path):
            path = os.path.join(ctx.base_dir, path)
        if not os.path.isfile(path):  # isfile() is False (never raises) for NUL bytes, overlong names, ...
            hint = "a directory" if os.path.isdir(path) else "no such file"
            raise _Invalid(expected, f"{path}: {hint}" if path != value else hint)
        return path

    return parse


_scenario = _existing_file("scenario")


def _optional_path(value: Any, ctx: _Ctx) -> str | None:
    """A path that may not exist yet (a socket the kubelet creates later); null or "" turns it off."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or "\x00" in value:
        raise _Invalid("a path, or null to turn it off")
    path = os.path.expanduser(value)
    if ctx.base_dir is not None and not os.path.isabs(path):
        path = os.path.join(ctx.base_dir, path)
    return path


def _path(value: Any, ctx: _Ctx) -> str:
    """A path that must be given (a root the agent reads or writes under): null is not allowed."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _Invalid("a path")
    path = os.path.expanduser(value)
    if ctx.base_dir is not None and not os.path.isabs(path):
        path = os.path.join(ctx.base_dir, path)
    return path


_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _resource_names(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """Kubernetes extended resource names: a YAML list, or comma-separated in env and flags."""
    expected = "a list of resource names like nvidia.com/gpu (comma-separated in env and flags)"
    if ctx.text and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise _Invalid(expected)
    for name in value:
        if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
            raise _Invalid(expected, f"{name!r} is not a domain/name resource name")
    return tuple(value)


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _text_list(value: Any, ctx: _Ctx) -> Any:
    """Env and flags give a list comma-separated, "none" (or "") for an empty one (null, read as YAML's
    null before this, too); YAML gives a list."""
    if ctx.text and isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", ""):
            return []
        return [part.strip() for part in text.split(",") if part.strip()]
    return [] if value is None else value


def _driver_names(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """DRA driver names (DNS subdomains like gpu.nvidia.com); [] (none in env and flags) for none."""
    expected = ("a list of DRA driver names like gpu.nvidia.com (comma-separated in env and flags, none for "
                "none)")
    value = _text_list(value, ctx)
    if not isinstance(value, (list, tuple)):
        raise _Invalid(expected)
    for name in value:
        if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise _Invalid(expected, f"{name!r} is not a DNS subdomain")
    return tuple(value)


def _dirs(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """Absolute directory paths; [] (none in env and flags) for none."""
    expected = "a list of absolute directory paths (comma-separated in env and flags, none for none)"
    value = _text_list(value, ctx)
    if not isinstance(value, (list, tuple)):
        raise _Invalid(expected)
    for path in value:
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise _Invalid(expected, f"{path!r} is not an absolute path")
    return tuple(value)


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _bool(value: Any, ctx: _Ctx) -> bool:
    if isinstance(value, bool):
        return value
    if ctx.text and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _Invalid("true or false")


def _percent_or_null(value: Any, ctx: _Ctx) -> float | None:
    """A share of a GPU in percent (0, 100], or null for none."""
    if value is None or (ctx.text and value.strip().lower() in ("", "none")):
        return None
    return _number(0, high=100)(value, ctx)


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


def _quantity_or_null(value: Any, ctx: _Ctx) -> str | None:
    """A Kubernetes memory quantity ("8Gi", "512Mi", plain bytes), or null for none."""
    if value is None or (ctx.text and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if not isinstance(value, str) or not _QUANTITY.match(value.strip()) or float(
        re.sub(r"[A-Za-z]+$", "", value.strip())
    ) <= 0:
        raise _Invalid("a memory quantity like 8Gi, 512Mi or plain bytes, or null")
    return value.strip()


def _globs(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """Cgroup path globs: a YAML list, or comma-separated in env and flags; [] for none."""
    if ctx.text and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v[:1] == "/" for v in value):
        raise _Invalid("a list of cgroup path globs starting with '/'")
    return tuple(value)


def _link_globs(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """Network interface name globs: a YAML list ([] for none), or comma-separated in env and flags
    ("none" for none)."""
    expected = "a list of interface name globs like eth* (comma-separated in env and flags, none for none)"
    if ctx.text and isinstance(value, str):
        value = [] if value.strip().lower() == "none" else [p.strip() for p in value.split(",") if p.strip()]
    if not isinstance(value, (list, tuple)):
        raise _Invalid(expected)
    for glob in value:
        if not isinstance(glob, str) or not glob or len(glob) > 64 or "/" in glob or any(
            c.isspace() for c in glob
        ):
            raise _Invalid(expected, f"{glob!r} is not an interface name glob")
    return tuple(value)


_K8S_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


def _drain_namespaces(value: Any, ctx: _Ctx) -> tuple[str, ...]:
    """Namespace -> drain mode, as ``namespace=mode`` words: a YAML mapping or list, or ``a=skip,b=wait``."""
    expected = "a mapping of namespace to " + "|".join(DRAIN_MODES) + " (or namespace=mode, comma-separated)"
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, str) and ctx.text:
        pairs = [item.partition("=")[::2] for item in value.split(",") if item.strip()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        pairs = [item.partition("=")[::2] for item in value]
    else:
        raise _Invalid(expected)
    out = []
    for namespace, mode in pairs:
        namespace, mode = str(namespace).strip(), choice_word(mode, DRAIN_MODES)
        if not _K8S_NAME.fullmatch(namespace) or mode is None:
            raise _Invalid(expected, f"{namespace!r}: not a namespace name with one of "
                           + ", ".join(DRAIN_MODES))
        out.append(f"{namespace}={mode}")
    return tuple(out)


def _count(value: Any, ctx: _Ctx) -> int:
    if ctx.text and isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _Invalid("a whole number >= 0")


def _namespace(value: Any, ctx: _Ctx) -> str:
    if isinstance(value, str) and _K8S_NAME.fullmatch(value.strip()):
        return value.strip()
    raise _Invalid("a Kubernetes namespace name")


def _rules(value: Any, ctx: _Ctx) -> tuple[Mapping[str, Any], ...]:
    """The raw ``policies`` list; each item's keys and values are checked by the enforcer's policy parser."""
    if ctx.text:
        raise _Invalid("a list of rules, which only the config file can give")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _Invalid("a list of mappings (match_* keys and the limits they set)")
    return tuple(value)


def _hostname(value: Any, ctx: _Ctx) -> str | None:
    if value is None and not ctx.text:
        return None  # null: resolved from NODE_NAME or gethostname() at load time
    if not isinstance(value, str) or not value or len(value) > 253 or not value.isprintable() or " " in value:
        raise _Invalid("a non-empty string without spaces (quote it if it looks like a number), or null")
    return value


# --- the key table ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One configuration key: the YAML name, its parser, default, help and the names derived from it."""

    name: str
    default: Any
    parse: Parser
    help: str
    metavar: str
    default_doc: str | None = None  # how --help states a default computed at load time

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        return self.default_doc if self.default_doc is not None else _yaml_scalar(self.default)


def _key(default: Any, parse: Parser, help: str, metavar: str, default_doc: str | None = None) -> Any:
    return field(default=default, metadata={"key": (parse, help, metavar, default_doc)})


@dataclass(frozen=True)
class Config:
    """The agent's effective configuration. Build it with ``load_config``, which validates every key."""

    listen: str = _key("0.0.0.0:9402", _listen, "address the HTTP server listens on", "HOST:PORT")
    poll_interval: float = _key(
        1.0, _number(0, high=300), "seconds between polls of utilization, memory and processes", "SECONDS"
    )
    slow_poll_interval: float = _key(
        30.0,
        _number(0),
        "seconds between polls of ECC, remapped rows, static info and MIG layout; >= poll_interval",
        "SECONDS",
        default_doc="30, or poll_interval when that is longer",
    )
    energy_interval: float = _key(
        30.0,
        _number(0),
        "seconds between reads of each GPU's energy counter (about 3 ms a read on an H100); "
        "<= poll_interval: every poll",
        "SECONDS",
    )
    profiling_interval: float = _key(
        10.0,
        _number(0),
        "seconds between GPM samples for the DCGM_FI_PROF_* figures, averaged over that interval (about "
        "1.7 ms of NVML a GPU on an H100); <= poll_interval: every poll",
        "SECONDS",
    )
    process_utilization_interval: float = _key(
        10.0,
        _number(0),
        "seconds between reads of per-process utilization (about 2 ms a read on an H100) on GPUs where the "
        "share controller does not act (there: every poll); the figures average over the interval; "
        "<= poll_interval: every poll",
        "SECONDS",
    )
    detail_interval: float = _key(
        10.0,
        _number(0),
        "seconds between reads of the memory and graphics clocks, encoder/decoder utilization, PCIe and "
        "NVLink counters and memory temperature; <= poll_interval: every poll",
        "SECONDS",
    )
    nvml_timeout: float = _key(
        5.0, _number(0), "seconds one GPU's read may take before that GPU is marked stale", "SECONDS"
    )
    shutdown_timeout: float = _key(
        10.0, _number(0, high=600),
        "seconds from SIGTERM to exit: thaw, stop, close; what is left then is logged with its stack and "
        "the agent exits with code 3", "SECONDS",
    )
    backend: str = _key(
        "auto",
        _choice(*BACKENDS),
        "where GPU data comes from: real NVML, the simulator, or auto",
        "{" + ",".join(BACKENDS) + "}",
    )
    scenario: str | None = _key(
        None,
        _scenario,
        "simulator scenario file (backend sim or auto; sim without one runs the packaged demo)",
        "FILE",
    )
    hostname: str = _key(
        None,
        _hostname,
        "node name reported in metrics and the API",
        "NAME",
        default_doc=f"${NODE_NAME_ENV}, else the host name",
    )
    xid_window: float = _key(300.0, _number(0), "seconds an XID error counts as recent", "SECONDS")
    pod_resources_socket: str | None = _key(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        _optional_path,
        "kubelet pod-resources socket (GPU allocations per pod); null turns it off",
        "PATH",
    )
    pod_resources_interval: float = _key(
        5.0, _number(0, high=300), "seconds between reads of the kubelet's allocations", "SECONDS"
    )
    gpu_resource_names: tuple[str, ...] = _key(
        ("nvidia.com/gpu",),
        _resource_names,
        "resource names counted as GPUs besides nvidia.com/mig-* (add e.g. nvidia.com/gpu.shared)",
        "NAMES",
    )
    dra_drivers: tuple[str, ...] = _key(
        ("gpu.nvidia.com",), _driver_names,
        "DRA drivers whose ResourceClaim devices are GPUs (other drivers' claims are ignored); none: no DRA",
        "NAMES",
    )
    cdi_spec_dirs: tuple[str, ...] = _key(
        ("/etc/cdi", "/var/run/cdi"), _dirs,
        "CDI spec directories (the host's) that map DRA devices to GPUs without the API server; none: unused",
        "DIRS",
    )
    dra_resource_slices: str = _key(
        "auto", _choice(*KUBERNETES_API_MODES),
        "map DRA devices through the drivers' ResourceSlices: auto (with the API server, once a DRA GPU "
        "device is on the node), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    proc_root: str = _key("/proc", _path, "where /proc is (the host's, mounted elsewhere)", "PATH")
    kubernetes_api: str = _key(
        "auto",
        _choice(*KUBERNETES_API_MODES),
        "name pods through the API server: auto (in a cluster, with a service account), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    kubeconfig: str | None = _key(
        None, _optional_path, "kubeconfig for the API server (default: in-cluster, then $KUBECONFIG)", "PATH"
    )
    mode: str = _key(
        "off", _choice(*MODES), "enforcement: off, audit (decide and export, act on nothing) or enforce",
        "{" + ",".join(MODES) + "}",
    )
    share_scheme: str = _key(
        "rotation", _choice(*SHARE_SCHEMES),
        "how throttled pods share a GPU: rotation (exclusive turns, docs/shares.md) or duty (the older duty "
        "cycle)", "{" + ",".join(SHARE_SCHEMES) + "}",
    )
    share_period: float | None = _key(
        None, _number_or_null(0.01, high=10),
        "mean seconds of one rotation (or duty cycle), dithered; null: the scheme's (rotation 1.0, duty 0.1)",
        "SECONDS", "null",
    )
    work_conserving: bool = _key(
        True, _bool, "let a pod use what idle tenants leave (throttle only when another tenant is active)",
        "BOOL",
    )
    default_gpu_share: float | None = _key(
        None, _percent_or_null,
        "GPU share (percent) of workloads no annotation or policies rule sets; the most a pod's "
        "gpuagent.io/gpu-share may ask under pod_annotations: lower-only",
        "PERCENT",
    )
    default_gpu_memory: str | None = _key(
        None, _quantity_or_null,
        "GPU memory limit of workloads no annotation or policies rule sets; the most a pod's "
        "gpuagent.io/gpu-memory may ask under pod_annotations: lower-only",
        "QUANTITY",
    )
    memory_action: str = _key(
        "kill", _choice(*MEMORY_ACTIONS), "over the GPU memory limit: warn, kill (TERM, then KILL) or evict",
        "{" + ",".join(MEMORY_ACTIONS) + "}",
    )
    memory_term_after: float = _key(
        10.0, _number(0), "seconds over the memory limit before SIGTERM (or the eviction)", "SECONDS"
    )
    memory_kill_grace: float = _key(30.0, _number(0), "seconds after SIGTERM before SIGKILL", "SECONDS")
    journal_path: str = _key(
        "/var/lib/gpuagent/freeze-journal.json", _path,
        "file naming every cgroup the agent may have frozen, so a restart thaws them", "PATH",
    )
    cgroup_root: str = _key("/sys/fs/cgroup", _path, "where cgroupfs is mounted", "PATH")
    freezable_outside_kubepods: tuple[str, ...] = _key(
        (), _globs, "cgroup path globs outside kubepods the enforcer may act on (off Kubernetes)", "GLOBS"
    )
    policies: tuple[Mapping[str, Any], ...] = _key(
        (), _rules,
        "limits (and the latency class) for workloads matched by namespace, pod, kind, name or cgroup "
        "(config file only)",
        "RULES",
    )
    pod_annotations: str = _key(
        "lower-only", _choice(*POD_ANNOTATION_MODES),
        "what pods' gpuagent.io/gpu-share, gpu-memory, priority and latency-sensitive annotations may do "
        "where no policies rule says: ignore, lower-only (only make the operator's limit stricter) or any; "
        "exempt is never a pod's",
        "{" + ",".join(POD_ANNOTATION_MODES) + "}",
    )
    accounting_retention: float = _key(
        300.0, _number(0), "seconds an ended workload's accounting counters are kept before its series go",
        "SECONDS",
    )
    efficiency_window: float = _key(
        3600.0, _number(0), "seconds over which gpuagent_pod_gpu_efficiency_ratio (busy/allocated) is taken",
        "SECONDS",
    )
    idle_threshold: float = _key(
        0.05, _number(0, high=1), "SM use (0-1) of what a workload holds under which it counts as idle",
        "RATIO",
    )
    idle_window: float = _key(
        1800.0, _number(0), "seconds a workload must stay idle before it is flagged (metric, Event, state)",
        "SECONDS",
    )
    idle_events: str = _key(
        "auto", _choice(*KUBERNETES_API_MODES),
        "post a Kubernetes Event on a pod flagged idle: auto (when the API server is reachable), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    publish_state: str = _key(
        "auto", _choice(*KUBERNETES_API_MODES),
        "publish this node's GPU state as a GPUNodeState object for the scheduler extender: auto (when the "
        "API server is reachable), on, or off",
        "{" + ",".join(KUBERNETES_API_MODES) + "}",
    )
    publish_min_interval: float = _key(
        10.0, _number(0, high=3600), "seconds between two writes of the GPUNodeState when it changed",
        "SECONDS",
    )
    publish_heartbeat: float = _key(
        300.0, _number(1, high=86400),
        "seconds after which an unchanged GPUNodeState is written again (the extender's staleness clock)",
        "SECONDS",
    )
    web_config: str | None = _key(
        None,
        _existing_file("web config"),
        "TLS settings for the HTTP listener, as Prometheus exporters' web config (tls_server_config)",
        "FILE",
    )
    admin_token_file: str | None = _key(
        None, _existing_file("admin token"),
        "file holding the bearer token of the admin endpoints (thaw, reload-policies) on the listener; "
        "unset: no admin endpoint there", "FILE",
    )
    admin_socket: str | None = _key(
        None, _optional_path,
        "unix socket (mode 0600) serving the admin endpoints without a token; unset: no admin socket", "PATH",
    )
    network: bool = _key(
        True, _bool, "read node links, RDMA ports and the traffic of GPU pods' network namespaces", "BOOL"
    )
    network_interval: float = _key(
        5.0, _number(0, high=300), "seconds between reads of the network (links, RDMA, pods' traffic)",
        "SECONDS",
    )
    network_links: tuple[str, ...] = _key(
        ("*",), _link_globs, "network links reported: interface name globs (see network_links_exclude)",
        "GLOBS",
    )
    network_links_exclude: tuple[str, ...] = _key(
        NETWORK_LINK_EXCLUDE, _link_globs,
        "network links left out even when matched by network_links (none: report every link)", "GLOBS",
        default_doc="lo, veth*, cali*, cni*, flannel*, docker*, br-*, and other per-pod/CNI links",
    )
    sysfs_root: str = _key(
        "/sys", _path, "where sysfs is (link speeds, /sys/class/infiniband)", "PATH"
    )
    log_level: str = _key("info", _choice(*LOG_LEVELS), "log level", "{" + ",".join(LOG_LEVELS) + "}")
    health_mode: str = _key(
        "audit", _choice(*MODES),
        "GPU faults on the Node: off, audit (classify and report in /v1/state and metrics, write nothing) or "
        "enforce (node conditions, Events, taints, cordon, drain, remediation annotation)",
        "{" + ",".join(MODES) + "}",
    )
    health_taint: str = _key(
        "degraded", _choice(*HEALTH_THRESHOLDS),
        "least fault severity that taints the node gpuagent.io/gpu-unhealthy:NoSchedule",
        "{degraded,fatal,never}",
    )
    health_no_execute: bool = _key(
        False, _bool, "also taint NoExecute for a fatal fault (pods without a toleration are evicted)", "BOOL"
    )
    health_cordon: str = _key(
        "fatal", _choice(*HEALTH_THRESHOLDS), "least fault severity that cordons the node",
        "{degraded,fatal,never}",
    )
    health_drain: str = _key(
        "fatal", _choice(*HEALTH_THRESHOLDS),
        "least fault severity that drains the pods on the faulty GPUs (Eviction API)",
        "{degraded,fatal,never}",
    )
    health_drain_namespaces: tuple[str, ...] = _key(
        ("kube-system=skip",), _drain_namespaces,
        "drain mode by namespace: evict, wait (for the pod to finish) or skip; others: health_drain_default",
        "NS=MODE,...",
    )
    health_drain_default: str = _key(
        "evict", _choice(*DRAIN_MODES), "drain mode of namespaces not in health_drain_namespaces",
        "{" + ",".join(DRAIN_MODES) + "}",
    )
    health_quarantine_budget: int = _key(
        1, _count, "nodes that agents may taint, cordon or drain at once, cluster-wide (a shared Lease)", "N"
    )
    health_budget_namespace: str = _key(
        "gpuagent", _namespace, "namespace of the quarantine budget's Lease (the agents' own)", "NAMESPACE"
    )
    health_clear_after: float = _key(
        300.0, _number(0), "seconds a fault must be gone before its condition and taint clear (hysteresis); "
        "faults needing a GPU reset are held until one is seen", "SECONDS",
    )
    health_events: bool = _key(
        True, _bool, "post an Event on the node and its pods for each new fault (enforce)", "BOOL"
    )
    health_dra_taints: str = _key(
        "report", _choice(*HEALTH_DRA_TAINT_MODES),
        "a DRA driver's NoSchedule/NoExecute device taints (ResourceSlices): off; report (a fault, the GPU "
        "not offered, the Node untouched); classify (also the Node's conditions and quarantine, by severity)",
        "{" + ",".join(HEALTH_DRA_TAINT_MODES) + "}",
    )

    config_file: str | None = field(default=None, compare=False)  # the YAML file read, None when none
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # key -> where from

    def __post_init__(self) -> None:
        if self.hostname is None:  # a Config() built directly: resolve the way load_config does
            object.__setattr__(self, "hostname", _default_hostname(os.environ)[0])

    @property
    def listen_host(self) -> str:
        """The host to bind, IPv6 without brackets."""
        return parse_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return parse_listen(self.listen)[1]

    def as_dict(self) -> dict[str, Any]:
        """The effective value of every key, by key name."""
        return {key.name: getattr(self, key.name) for key in KEYS}

    def summary(self) -> str:
        """The start-up log line: what an operator checks first (where it serves, the backend and its
        scenario, the enforcement mode, the poll interval, the node's name) and the names of the keys set away
        from their defaults (file, env, flag); every value, with its source, is :meth:`describe`'s."""
        shown = [f"{name}={getattr(self, name)}" for name in STARTUP_KEYS
                 if name != "scenario" or self.backend == "sim"]
        changed = [key.name for key in KEYS if key.name not in STARTUP_KEYS
                   and not self.sources.get(key.name, "default").startswith("default")]
        return ", ".join(shown) + (f"; set: {', '.join(changed)}" if changed else "")

    def describe(self) -> str:
        """The effective values as YAML lines, each with where it came from (``# default``, ``# env ...``)."""
        lines = [f"{name}: {_yaml_scalar(value)}" for name, value in self.as_dict().items()]
        width = max(len(line) for line in lines if len(line) <= 72)  # a long list does not push every comment
        return "\n".join(
            f"{line:<{width}}  # {self.sources.get(key.name, 'default')}"
            for line, key in zip(lines, KEYS, strict=True)
        )


# What the start-up line shows (Config.summary); the rest is logged at debug.
STARTUP_KEYS = ("listen", "backend", "scenario", "mode", "poll_interval", "hostname")

KEYS: tuple[Key, ...] = tuple(
    Key(f.name, f.default, *f.metadata["key"]) for f in dataclasses.fields(Config) if "key" in f.metadata
)
KEYS_BY_NAME: Mapping[str, Key] = types.MappingProxyType({key.name: key for key in KEYS})


def describe_keys() -> str:
    """Every key with its env name, default and help: for ``--help`` epilogs and the docs."""
    return "\n".join(f"  {key.name} ({key.env}, default {key.default_text}): {key.help}" for key in KEYS)


# --- loading ------------------------------------------------------------------------------------------------


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
            values[key.name] = _parse(key, raw, _Ctx(text=False, base_dir=base_dir), path)
            sources[key.name] = path

    for key in KEYS:
        raw = env.get(key.env)
        if raw is not None and raw != "":  # an empty env var (a blank template value) counts as unset
            source = f"env {key.env}"
            values[key.name] = _parse(key, raw, _Ctx(text=True), source)
            sources[key.name] = source

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        key = _lookup(name, "flag --" + str(name).replace("_", "-"))
        source = f"flag {key.flag}"
        values[key.name] = _parse(key, raw, _Ctx(text=isinstance(raw, str)), source)
        sources[key.name] = source

    if values.get("hostname") is None:
        values["hostname"], sources["hostname"] = _default_hostname(env)
    _check_combinations(values, sources)
    return Config(**values, config_file=path, sources=types.MappingProxyType(sources))


MAX_FILE_BYTES = 4 << 20  # a config, web config or agents file: a long policies list is some kilobytes


def read_regular_file(path: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes``; a ``ConfigError`` (source ``path``)
    for anything else. Opened without blocking (a FIFO would wait for a writer for ever) and checked on the
    descriptor: a device (``/dev/zero`` reads without end), a FIFO, a socket or a directory is refused by
    kind, and a file longer than the bound is refused without reading the rest."""
    cannot = "cannot read the config file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError("", f"{cannot}: {err.strerror or err}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError("", f"{cannot}: expected a regular file, got {_file_kind(mode)}", path)
        with os.fdopen(os.dup(fd), "rb") as stream:
            data = stream.read(max_bytes + 1)
    except OSError as err:
        raise ConfigError("", f"{cannot}: {err.strerror or err}", path) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError("", f"{cannot}: expected at most {max_bytes} bytes, it holds more", path)
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


# A key as a config key is written: a name (and dots, dashes). Only such a key is named in an error; any
# other "key" is a line of some other file (``root:*:20228:...:`` of a shadow file read as a web config).
_KEY_SHAPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def key_text(key: Any) -> str:
    """A key read from a file, as an error message may name it: itself when it has the shape of a config
    key (a typo to correct), else only its length: the file may be any file the caller can read, and the
    message goes to terminals and logs."""
    if isinstance(key, str) and _KEY_SHAPE.fullmatch(key):
        return key
    if isinstance(key, bool | int | float) or key is None:
        return repr(key)
    return f"(a key of {len(str(key))} characters, not a config key)"


def _quoted_parts_hidden(problem: str) -> str:
    """PyYAML's words for a syntax problem, each quoted part of the file (an alias, a tag, a duplicate key)
    kept only where it is a single character or has a config key's shape."""
    def one(match: re.Match[str]) -> str:
        inner = match.group()[1:-1]
        return match.group() if len(inner) <= 2 or _KEY_SHAPE.fullmatch(inner) else "'...'"

    return re.sub(r"'[^']*'|\"[^\"]*\"", one, problem)


def read_yaml_mapping(path: str) -> dict[Any, Any]:
    """A YAML file that must hold a mapping, read strictly (a key given twice is an error); every problem
    is a ``ConfigError`` whose source is ``path``. A file that is not such a mapping is named with what kind
    of problem it has and where, never with its content: the path may be any file the caller can read
    (``/etc/passwd`` as a ``web_config``), and the message goes to logs and terminals. What is read is
    bounded (:func:`read_regular_file`)."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("", f"not UTF-8 text (byte {err.start})", path) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = shown(_quoted_parts_hidden(str(err.problem or err.context or "a syntax error")))
        raise ConfigError("", f"invalid YAML{where}: {problem[:100]}", path) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow (a control, say)
        char = err.character if isinstance(err.character, int) else -1
        raise ConfigError("", f"invalid YAML at character {err.position + 1}: character #x{char:04x} is not "
                              f"allowed", path) from None
    except yaml.YAMLError as err:
        raise ConfigError("", f"invalid YAML: {type(err).__name__}", path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"expected a mapping of keys to values, got {_kind_of(data)}", path)
    return data


def _kind_of(value: Any) -> str:
    """What kind of YAML value ``value`` is, without any of its content."""
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, str):
        return f"a string of {len(value)} character(s) (not YAML keys and values)"
    return "a boolean" if isinstance(value, bool) else "a number" if isinstance(value, int | float) else (
        f"a {type(value).__name__}")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: list[Any] = []
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<" merges may be overridden by the mapping's own keys
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


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


def _parse(key: Key, raw: Any, ctx: _Ctx, source: str) -> Any:
    if ctx.text and is_null_text(raw):
        raw, ctx = None, ctx._replace(text=False)  # "null" from env or a flag is YAML's null
    try:
        return key.parse(raw, ctx)
    except _Invalid as err:
        got = repr(raw) if ctx.text else _describe_value(raw)
        hint = f" ({err.hint})" if err.hint else ""
        raise ConfigError(key.name, f"expected {err.expected}, got {got}{hint}", source) from None


def _check_combinations(values: dict[str, Any], sources: dict[str, str]) -> None:
    poll = values.get("poll_interval", Config.poll_interval)
    if "slow_poll_interval" not in values:
        if poll > Config.slow_poll_interval:
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


def _default_hostname(env: Mapping[str, str]) -> tuple[str, str]:
    node_name = env.get(NODE_NAME_ENV)
    if node_name:
        return node_name, f"env {NODE_NAME_ENV}"
    return socket.gethostname(), "default (socket.gethostname())"


def _describe_value(value: Any) -> str:
    """A YAML value as an error message shows it: scalars as written, collections by kind."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = _yaml_scalar(value)
    return text if len(text) <= 80 else text[:77] + "..."


describe_value = _describe_value  # for the other readers of YAML and JSON files (pods.dra.cdi)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    return repr(value)
