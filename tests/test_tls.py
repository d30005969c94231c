"""TLS and client certificates on the agent's HTTP listener (``web_config``, exporter-toolkit's format).

The certificates are made here with the ``openssl`` command: a CA, a server certificate for
127.0.0.1/localhost, a client certificate from that CA and one from another CA. The agent runs in-process
on the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from ports import free_port

from gpuagent.agent import Agent
from gpuagent.api.tls import load_web_config, server_ssl_context
from gpuagent.cli import main
from gpuagent.config import ConfigError, load_config

# --- certificates -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    """A key and certificate ``<directory>/<name>.key`` and ``.pem``, and the certificate's serial."""

    directory: Path
    name: str
    serial: int

    @property
    def cert(self) -> Path:
        return self.directory / f"{self.name}.pem"

    @property
    def key(self) -> Path:
        return self.directory / f"{self.name}.key"


def openssl(directory: Path, *args: str) -> None:
    subprocess.run(("openssl", *args), cwd=directory, check=True, capture_output=True)


def issue(directory: Path, name: str, issuer: Issued | None = None, *, server: bool = False) -> Issued:
    """A CA (no issuer: self-signed) or a leaf signed by ``issuer`` (server: SANs for 127.0.0.1, localhost)."""
    made = Issued(directory, name, random.getrandbits(62) + 1)
    openssl(directory, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", made.key.name)
    if issuer is None:
        openssl(directory, "req", "-x509", "-new", "-key", made.key.name, "-out", made.cert.name, "-subj",
                f"/CN={name}", "-days", "1", "-set_serial", str(made.serial),
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return made
    extensions = directory / f"{name}.ext"
    extensions.write_text(
        "basicConstraints=CA:FALSE\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
        + ("extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n" if server
           else "extendedKeyUsage=clientAuth\n")
    )
    openssl(directory, "req", "-new", "-key", made.key.name, "-subj", f"/CN={name}", "-out", f"{name}.csr")
    openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", str(issuer.cert), "-CAkey", str(issuer.key),
            "-set_serial", str(made.serial), "-days", "1", "-extfile", extensions.name, "-out", made.cert.name)
    return made


@dataclass(frozen=True)
class PKI:
    directory: Path
    ca: Issued
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate from another CA

    def client_context(self, who: Issued | None = None, *, pin_ca: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert) if pin_ca else None)
        if who is not None:
            context.load_cert_chain(who.cert, who.key)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = issue(directory, "ca"), issue(directory, "other-ca")
    return PKI(directory, ca, issue(directory, "server", ca, server=True), issue(directory, "client", ca),
               issue(directory, "stranger", other_ca))


# --- the agent over HTTPS -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def agent_over_tls(pki: PKI, tmp_path: Path, **tls: str) -> AsyncIterator[int]:
    """The agent serving with a web config beside copies of the server's files (relative paths); its port."""
    for name in ("ca.pem", "server.pem", "server.key"):
        shutil.copy(pki.directory / name, tmp_path / name)
    web_config = tmp_path / "web.yml"
    web_config.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": "server.pem", "key_file": "server.key", **tls,
    }}))
    port = free_port()
    config = load_config(None, env={}, overrides={
        "backend": "sim", "listen": f"127.0.0.1:{port}", "poll_interval": 0.2, "web_config": str(web_config),
        "pod_resources_socket": None, "kubernetes_api": "off", "hostname": "tls-node",
        "journal_path": str(tmp_path / "journal.json"),
    })
    stop = asyncio.Event()
    serving = asyncio.create_task(Agent(config).serve(stop))
    try:
        for _ in range(100):  # until the listener and the first poll are up
            with contextlib.suppress(OSError, ssl.SSLError, ConnectionError):
                if (await fetch(port, pki.client_context(pki.client)))[0] == 200:
                    break
            assert not serving.done(), serving.exception()
            await asyncio.sleep(0.05)
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)


async def fetch(port: int, context: ssl.SSLContext, server_hostname: str | None = None) -> tuple[int, int]:
    """GET /metrics over TLS: (HTTP status, the server certificate's serial). Raises when refused."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_hostname), 5)
    try:
        serial = int(writer.get_extra_info("peercert")["serialNumber"], 16)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not status_line:
        raise ConnectionError("closed without a response")
    return int(status_line.split()[1]), serial


REFUSED = (ssl.SSLError, ConnectionError)


async def assert_refused(port: int, context: ssl.SSLContext) -> None:
    """No response over TLS 1.3 (the server checks the client's certificate after the client's handshake
    is done, so the alert or close comes on the first read); and in TLS 1.2 the handshake itself fails."""
    with pytest.raises(REFUSED):
        await fetch(port, context)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(REFUSED):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=context), 5)


async def test_plain_tls_needs_the_ca_pinned(pki: PKI, tmp_path: Path) -> None:
    async with agent_over_tls(pki, tmp_path) as port:
        assert await fetch(port, pki.client_context()) == (200, pki.server.serial)
        assert (await fetch(port, pki.client_context(), server_hostname="localhost"))[0] == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            await fetch(port, pki.client_context(pin_ca=False))


async def test_require_and_verify_client_cert(pki: PKI, tmp_path: Path) -> None:
    async with agent_over_tls(pki, tmp_path, client_ca_file="ca.pem",
                              client_auth_type="RequireAndVerifyClientCert") as port:
        await assert_refused(port, pki.client_context())
        await assert_refused(port, pki.client_context(pki.stranger))
        assert (await fetch(port, pki.client_context(pki.client)))[0] == 200


async def test_verify_client_cert_if_given(pki: PKI, tmp_path: Path) -> None:
    async with agent_over_tls(pki, tmp_path, client_ca_file="ca.pem",
                              client_auth_type="VerifyClientCertIfGiven") as port:
        assert (await fetch(port, pki.client_context()))[0] == 200
        await assert_refused(port, pki.client_context(pki.stranger))
        assert (await fetch(port, pki.client_context(pki.client)))[0] == 200


async def test_rotated_certificates_are_served_without_a_restart(
    pki: PKI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with agent_over_tls(pki, tmp_path) as port:
        assert (await fetch(port, pki.client_context()))[1] == pki.server.serial

        (tmp_path / "new").mkdir()
        renewed = issue(tmp_path / "new", "renewed", pki.ca, server=True)
        shutil.copy(renewed.cert, tmp_path / "server.pem")
        shutil.copy(renewed.key, tmp_path / "server.key")
        await asyncio.sleep(1.1)  # reloads are checked at most once a second
        assert (await fetch(port, pki.client_context()))[1] == renewed.serial
        assert (await fetch(port, pki.client_context(), "localhost"))[1] == renewed.serial

        # A rotation caught half-way: the new certificate, the key half written. The renewed one stays.
        caplog.set_level(logging.WARNING, logger="gpuagent.api.tls")
        third = issue(tmp_path / "new", "third", pki.ca, server=True)
        shutil.copy(third.cert, tmp_path / "server.pem")
        key_pem = third.key.read_bytes()
        (tmp_path / "server.key").write_bytes(key_pem[: len(key_pem) // 2])
        await asyncio.sleep(1.1)
        for _ in range(2):
            assert (await fetch(port, pki.client_context()))[1] == renewed.serial
        failures = [r for r in caplog.records if "cannot reload" in r.getMessage()]
        assert len(failures) == 1 and "still serving the previous certificate" in failures[0].getMessage()

        (tmp_path / "server.key").write_bytes(key_pem)  # the rotation completes
        await asyncio.sleep(1.1)
        assert (await fetch(port, pki.client_context()))[1] == third.serial


# --- config errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tls", "top", "key_path", "message"),
    [
        ({}, {"tls_extra": 1}, "tls_extra", "unknown key"),
        ({}, {"basic_auth_users": {"prom": "$2y$10$x"}}, "basic_auth_users", "not supported by gpuagent yet"),
        ({}, {"http_server_config": {"http2": False}}, "http_server_config", "not supported by gpuagent yet"),
        ({"cipher_suites": ["TLS_AES_128_GCM_SHA256"]}, {}, "tls_server_config.cipher_suites",
         "not supported by gpuagent yet"),
        ({"certfile": "server.pem"}, {}, "tls_server_config.certfile", "unknown key"),
        ({"client_auth_type": "RequireValidCert", "client_ca_file": "ca.pem"}, {},
         "tls_server_config.client_auth_type", "expected one of NoClientCert, RequestClientCert"),
        ({"key_file": None}, {}, "tls_server_config.key_file", "cert_file and key_file are both required"),
        ({"client_ca_file": "ca.pem"}, {}, "tls_server_config.client_auth_type",
         "client_ca_file is set without a client_auth_type"),
        ({"client_ca_file": "ca.pem", "client_auth_type": "NoClientCert"}, {},
         "tls_server_config.client_auth_type", "NoClientCert never asks"),
        ({"client_auth_type": "RequireAnyClientCert"}, {}, "tls_server_config.client_auth_type",
         "needs client_ca_file (Python's ssl cannot require a certificate without verifying it)"),
        ({"client_auth_type": "RequireAndVerifyClientCert"}, {}, "tls_server_config.client_auth_type",
         "needs client_ca_file"),
        ({"key_file": "missing.key"}, {}, "tls_server_config.key_file", "missing.key: no such file"),
        ({"min_version": "TLS10"}, {}, "tls_server_config.min_version", "expected TLS12 or TLS13"),
        ({"min_version": "TLS13", "max_version": "TLS12"}, {}, "tls_server_config.min_version",
         "above max_version"),
    ],
)
def test_web_config_errors_name_the_key(
    pki: PKI, tmp_path: Path, tls: dict, top: dict, key_path: str, message: str
) -> None:
    for name in ("ca.pem", "server.pem", "server.key"):
        shutil.copy(pki.directory / name, tmp_path / name)
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": "server.pem", "key_file": "server.key", **tls}, **top,
    }))
    with pytest.raises(ConfigError) as caught:
        load_web_config(str(path))
    assert caught.value.key_path == key_path
    assert message in caught.value.message
    assert caught.value.source == str(path)


def test_web_config_is_parsed_with_paths_relative_to_it(pki: PKI) -> None:
    path = pki.directory / "mtls.yml"
    path.write_text("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
                    "  client_ca_file: ca.pem\n  client_auth_type: RequireClientCert\n  min_version: TLS13\n")
    config = load_web_config(str(path))
    assert config.cert_file == str(pki.directory / "server.pem")
    assert config.client_ca_file == str(pki.directory / "ca.pem")
    assert config.verify_mode == ssl.CERT_REQUIRED  # required *and* verified: Python cannot do less
    assert config.min_version == ssl.TLSVersion.TLSv1_3
    assert config.max_version == ssl.TLSVersion.TLSv1_3
    context = server_ssl_context(config)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.sni_callback is not None


def test_a_mismatched_pair_fails_at_start_naming_both_files(pki: PKI, tmp_path: Path) -> None:
    shutil.copy(pki.directory / "server.pem", tmp_path / "server.pem")
    shutil.copy(pki.directory / "client.key", tmp_path / "server.key")
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config: {cert_file: server.pem, key_file: server.key}\n")
    with pytest.raises(ConfigError) as caught:
        server_ssl_context(load_web_config(str(path)))
    assert caught.value.key_path == "tls_server_config"
    assert str(tmp_path / "server.pem") in caught.value.message
    assert str(tmp_path / "server.key") in caught.value.message


def test_the_web_config_key_needs_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"GPUAGENT_WEB_CONFIG": str(tmp_path / "web.yml")})
    assert caught.value.source == "env GPUAGENT_WEB_CONFIG"
    assert "a path to an existing web config file" in caught.value.message


def test_check_config_checks_the_web_config(
    pki: PKI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: {pki.directory}/server.pem, "
                   f"key_file: {pki.directory}/server.key}}\n")
    config = tmp_path / "gpuagent.yaml"
    config.write_text("web_config: web.yml\n")
    assert main(["check-config", str(config)]) == 0
    assert str(web) in capsys.readouterr().out
    web.write_text("tls_server_config: {}\nbasic_auth_users: {}\n")
    assert main(["check-config", str(config)]) == 2
    assert "basic_auth_users: not supported by gpuagent yet" in capsys.readouterr().err
