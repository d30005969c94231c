"""The keys of the agent's HTTP server (``gpuagent.serving``, ``gpuagent.api``): where it listens, its TLS,
its admin endpoints, and how long a shutdown may take.
``shutdown_timeout`` is here because the server runs the shutdown (``serve_until_stopped``) and gives its
requests in flight a quarter of it; the agent arms its backstop with the same figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuagent.config.keys import key
from gpuagent.config.values import existing_file, listen_address, number, optional_path, parse_listen


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the agent serves HTTP (``config.server``)."""

    listen: str = key(
        "listen", "0.0.0.0:9402", listen_address,
        "address the HTTP server listens on", "HOST:PORT",
    )
    web_config: str | None = key(
        "web_config", None, existing_file("web config"),
        "TLS settings for the HTTP listener, as Prometheus exporters' web config (tls_server_config)", "FILE",
    )
    admin_token_file: str | None = key(
        "admin_token_file", None, existing_file("admin token"),
        "file holding the bearer token of the admin endpoints (thaw, reload-policies) on the listener; "
        "unset: no admin endpoint there",
        "FILE",
    )
    admin_socket: str | None = key(
        "admin_socket", None, optional_path,
        "unix socket (mode 0600) serving the admin endpoints without a token; unset: no admin socket", "PATH",
    )
    shutdown_timeout: float = key(
        "shutdown_timeout", 10.0, number(0, high=600),
        "seconds from SIGTERM to exit: thaw, stop, close; what is left then is logged with its stack and "
        "the agent exits with code 3",
        "SECONDS",
    )

    @property
    def listen_host(self) -> str:
        """The host to bind, IPv6 without brackets."""
        return parse_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return parse_listen(self.listen)[1]
