"""The admin endpoints' bearer token, read from ``admin_token_file`` (no aiohttp here: ``check-config`` and
the agent's start-up check read the file through this same class without loading the HTTP stack).

The token is the file's content, surrounding whitespace stripped, re-read when the file's identity, size or
mtime changes (rotation needs no restart). An unreadable or empty file refuses everyone at run time; at
start the agent refuses it outright (``gpuagent.preflight``), since no request could ever authenticate.
"""

from __future__ import annotations

import hmac
import logging
import os

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 4096


class TokenFile:
    """The bearer token in a file, re-read when the file's identity, size or mtime changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._token: bytes = b""
        self._problem = ""

    def read(self) -> tuple[bytes, str]:
        """The current token and what is wrong with the file ("" when nothing): the token is empty when
        the file is missing, unreadable or holds only whitespace. Logs nothing."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp != self._stamp:
                with open(self.path, "rb") as stream:
                    self._token = stream.read(MAX_TOKEN_BYTES).strip()
                self._stamp = stamp
        except OSError as exc:
            self._token, self._stamp = b"", None
            return b"", f"cannot be read ({exc.strerror or exc})"
        return self._token, "" if self._token else "is empty"

    def token(self) -> bytes:
        """The current token; empty (nobody gets in) when the file is missing, unreadable or empty. A change
        of the file's state is logged once."""
        token, problem = self.read()
        self._report(f"{problem}: admin requests are refused" if problem else "")
        return token

    def _report(self, problem: str) -> None:
        """One log line per change of the file's state, not one per request."""
        if problem != self._problem:
            if problem:
                log.warning("admin token file %s %s", self.path, problem)
            elif self._problem:
                log.info("admin token file %s is usable again", self.path)
            self._problem = problem

    def accepts(self, header: str | None) -> bool:
        token = self.token()
        if not header or not token:
            return False
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"), token)
