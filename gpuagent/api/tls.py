"""TLS for the HTTP listener, configured like Prometheus exporters' web config (exporter-toolkit).

Only ``tls_server_config`` is supported; its file keys mean what they mean in exporter-toolkit and relative
paths are resolved from the web-config file's directory. The keys are checked strictly: exporter-toolkit's
other keys are errors saying gpuagent does not support them yet, anything else is an unknown key.

``client_auth_type`` maps onto Python's ``ssl`` verify modes (Python cannot express two of them exactly):

- ``NoClientCert`` (the default) -> ``CERT_NONE``: exact.
- ``RequestClientCert`` -> ``CERT_NONE``. Go asks for a certificate and never checks it; Python cannot ask
  without verifying (``CERT_OPTIONAL`` would refuse an untrusted one). Nothing in gpuagent reads the client's
  certificate, so not asking accepts exactly the clients Go accepts.
- ``RequireAnyClientCert`` (alias ``RequireClientCert``) -> ``CERT_REQUIRED``. Go requires a certificate but
  never verifies it; Python cannot require without verifying. We fail closed: the certificate is required
  *and* verified against ``client_ca_file``, which is therefore mandatory.
- ``VerifyClientCertIfGiven`` -> ``CERT_OPTIONAL``, ``RequireAndVerifyClientCert`` -> ``CERT_REQUIRED``:
  exact, but ``client_ca_file`` is mandatory (Go falls back to the system roots, trusting any public CA).

As in exporter-toolkit, a ``client_ca_file`` without a ``client_auth_type`` (or with ``NoClientCert``) is an
error. Unlike it, a web config without a certificate is an error rather than plain HTTP: leave
``web_config`` unset for that.

Certificates are reloaded without a restart (exporter-toolkit re-reads them on every handshake): the
context's ``sni_callback`` hands each new connection a context rebuilt when the cert, key or CA files'
contents changed (checked at most once a second). A rebuild that fails, e.g. on a key file half written
during a rotation, keeps the previous certificate and logs one line per bad state of the files.
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuagent.config import ConfigError, key_text, read_yaml_mapping

log = logging.getLogger(__name__)

TLS = "tls_server_config"
RELOAD_CHECK_SECONDS = 1.0

# exporter-toolkit's keys that gpuagent does not implement yet: named in the error rather than "unknown".
_UNSUPPORTED_TOP = ("http_server_config", "basic_auth_users", "rate_limit")
_UNSUPPORTED_TLS = (
    "cert", "key", "client_ca", "client_allowed_sans", "cipher_suites", "prefer_server_cipher_suites",
    "curve_preferences",
)
_TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version")

# client_auth_type -> (verify mode, whether a client CA is required)
CLIENT_AUTH: Mapping[str, tuple[ssl.VerifyMode, bool]] = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_NONE, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "RequireClientCert": (ssl.CERT_REQUIRED, True),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
VERSIONS: Mapping[str, ssl.TLSVersion] = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class WebConfig:
    """A checked web config: absolute file paths, the verify mode and the TLS version range."""

    source: str  # the web-config file, for error messages
    cert_file: str
    key_file: str
    client_ca_file: str | None
    client_auth_type: str
    verify_mode: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion

    @property
    def files(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())


def load_web_config(path: str) -> WebConfig:
    """Parse and check the web-config YAML at ``path``; raises ``ConfigError`` (source ``path``)."""
    data = read_yaml_mapping(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    for key in data:  # a key is named only if it has a key's shape: the file may be any file (key_text)
        if key in _UNSUPPORTED_TOP:
            raise ConfigError(str(key), "not supported by gpuagent yet (only tls_server_config is)", path)
        if key != TLS:
            raise ConfigError(key_text(key), "unknown key; the only key supported is tls_server_config", path)
    tls = data.get(TLS)
    if not isinstance(tls, dict):
        raise ConfigError(TLS, "expected a mapping with at least cert_file and key_file", path)
    for key in tls:
        if key in _UNSUPPORTED_TLS:
            raise ConfigError(f"{TLS}.{key}", "not supported by gpuagent yet", path)
        if key not in _TLS_KEYS:
            raise ConfigError(f"{TLS}.{key_text(key)}", "unknown key; known keys: " + ", ".join(_TLS_KEYS),
                              path)

    def file(key: str) -> str | None:
        value = tls.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{TLS}.{key}", "expected a file path", path)
        resolved = os.path.join(base_dir, os.path.expanduser(value))  # join keeps an absolute value
        if not os.path.isfile(resolved):
            raise ConfigError(f"{TLS}.{key}", f"{resolved}: no such file", path)
        return resolved

    cert_file, key_file, client_ca_file = file("cert_file"), file("key_file"), file("client_ca_file")
    if cert_file is None or key_file is None:
        missing = "key_file" if cert_file else "cert_file"
        raise ConfigError(f"{TLS}.{missing}", "cert_file and key_file are both required", path)

    auth = tls.get("client_auth_type")
    auth_key = f"{TLS}.client_auth_type"
    if auth is None or auth == "":
        if client_ca_file:
            raise ConfigError(auth_key, "client_ca_file is set without a client_auth_type", path)
        auth = "NoClientCert"
    if not isinstance(auth, str) or auth not in CLIENT_AUTH:
        raise ConfigError(auth_key, f"got {auth!r}, expected one of " + ", ".join(CLIENT_AUTH), path)
    verify_mode, needs_ca = CLIENT_AUTH[auth]
    if client_ca_file and auth == "NoClientCert":
        raise ConfigError(auth_key, "NoClientCert never asks for a certificate, yet client_ca_file is set",
                          path)
    if needs_ca and not client_ca_file:
        why = " (Python's ssl cannot require a certificate without verifying it)" if auth in (
            "RequireAnyClientCert", "RequireClientCert") else ""
        raise ConfigError(auth_key, f"{auth} needs client_ca_file{why}", path)

    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = tls.get(key) or default
        if value not in VERSIONS:
            raise ConfigError(f"{TLS}.{key}", f"got {value!r}, expected TLS12 or TLS13", path)
        versions[key] = VERSIONS[value]
    if versions["min_version"] > versions["max_version"]:
        raise ConfigError(f"{TLS}.min_version", "is above max_version", path)
    return WebConfig(
        source=path, cert_file=cert_file, key_file=key_file, client_ca_file=client_ca_file,
        client_auth_type=auth, verify_mode=verify_mode, **versions,
    )


def build_context(config: WebConfig) -> ssl.SSLContext:
    """One server context from the files as they are now; ``ssl.SSLError``/``OSError`` when they are bad."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = config.min_version
    context.maximum_version = config.max_version
    context.load_cert_chain(config.cert_file, config.key_file)
    if config.client_ca_file:
        context.load_verify_locations(cafile=config.client_ca_file)
    context.verify_mode = config.verify_mode
    return context


def server_ssl_context(
    config: WebConfig, *, clock: Callable[[], float] = time.monotonic,
    check_every: float = RELOAD_CHECK_SECONDS,
) -> ssl.SSLContext:
    """The listener's context: the files are loaded now (a bad pair is a ``ConfigError``), and reloaded
    for new connections when they change."""
    fingerprint = _fingerprint(config)
    try:
        base = build_context(config)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            TLS, f"cannot load cert_file {config.cert_file} with key_file {config.key_file}"
            + (f" and client_ca_file {config.client_ca_file}" if config.client_ca_file else "")
            + f": {exc}", config.source,
        ) from None
    base.sni_callback = _Reloader(config, base, fingerprint, clock, check_every)
    return base


def _fingerprint(config: WebConfig) -> bytes:
    """A hash of the files' contents (mtimes can repeat within their granularity; the files are small)."""
    digest = hashlib.sha256()
    for path in config.files:
        try:
            with open(path, "rb") as stream:
                digest.update(hashlib.sha256(stream.read()).digest())
        except OSError as exc:
            digest.update(f"unreadable: {exc.errno}".encode())
    return digest.digest()


class _Reloader:
    """The ``sni_callback``: switch each new connection to the context built from the current files."""

    def __init__(
        self, config: WebConfig, base: ssl.SSLContext, fingerprint: bytes, clock: Callable[[], float],
        check_every: float,
    ) -> None:
        self._config = config
        self._base = base
        self._current = base
        self._built_from = fingerprint  # the files' state the current context (or last failure) came from
        self._clock = clock
        self._check_every = check_every
        self._checked_at = clock()
        self._lock = threading.Lock()

    def __call__(self, ssl_object: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        try:
            current = self._context()
            if current is not self._base:
                ssl_object.context = current
        except Exception:  # an exception here aborts the handshake: log it, serve the base certificate
            log.exception("TLS: switching to the reloaded certificate failed")
        return None

    def _context(self) -> ssl.SSLContext:
        with self._lock:
            now = self._clock()
            if now - self._checked_at < self._check_every:
                return self._current
            self._checked_at = now
            fingerprint = _fingerprint(self._config)
            if fingerprint == self._built_from:
                return self._current
            self._built_from = fingerprint  # a failed state is reported once, retried when the files change
            try:
                self._current = build_context(self._config)
            except (ssl.SSLError, OSError) as exc:
                log.warning("TLS: cannot reload %s / %s (%s); still serving the previous certificate",
                            self._config.cert_file, self._config.key_file, exc)
            else:
                log.info("TLS: reloaded the certificate from %s", self._config.cert_file)
            return self._current
