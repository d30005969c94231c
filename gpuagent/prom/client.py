"""A small client of Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``), which Thanos,
Mimir, Cortex and VictoriaMetrics speak too.

Queries are POSTed as forms (no URL length limit on long selectors). Every failure becomes a
:class:`ReportError` whose message names the server and what went wrong: not reachable, a timeout, a TLS
problem, an answer that is not the API's JSON, or the API's own ``errorType``/``error``.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuagent.prom.errors import ReportError
from gpuagent.untrusted import encodable

_ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and (unix time, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Auth:
    """How to reach the server: basic auth or a bearer token, a CA file or no verification, extra headers
    (``X-Scope-OrgID`` for Mimir/Cortex tenants)."""

    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)


class PrometheusClient:
    def __init__(self, base_url: str, *, timeout_seconds: float = 60.0, auth: Auth | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ReportError(f"--prometheus: expected an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.auth = auth or Auth()
        self._ssl = self._ssl_context(parsed.scheme)

    def _ssl_context(self, scheme: str) -> ssl.SSLContext | None:
        if scheme != "https":
            return None
        try:
            context = ssl.create_default_context(cafile=self.auth.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ReportError(f"--ca-file: cannot load {self.auth.ca_file}: {err}") from None
        if self.auth.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def query(self, expr: str, at_unix: float) -> list[Sample]:
        """An instant query at ``at_unix``; its result must be a vector."""
        data = self._call("query", {"query": expr, "time": f"{at_unix:.3f}"})
        if data.get("resultType") != "vector":
            raise ReportError(f"{self.base_url}: expected a vector from {expr!r}, "
                              f"got {data.get('resultType')!r}")
        return [Sample(_labels(item["metric"]), float(item["value"][1])) for item in data["result"]]

    def query_range(self, expr: str, start_unix: float, end_unix: float, step_seconds: float) -> list[Series]:
        """A range query; its result must be a matrix."""
        data = self._call("query_range", {"query": expr, "start": f"{start_unix:.3f}",
                                          "end": f"{end_unix:.3f}", "step": f"{step_seconds:g}"})
        if data.get("resultType") != "matrix":
            raise ReportError(f"{self.base_url}: expected a matrix from {expr!r}, "
                              f"got {data.get('resultType')!r}")
        return [Series(_labels(item["metric"]), tuple((float(t), float(v)) for t, v in item["values"]))
                for item in data["result"]]

    def _call(self, endpoint: str, form: Mapping[str, str]) -> dict[str, Any]:
        url = f"{self.base_url}/api/v1/{endpoint}"
        request = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(), method="POST",
                                         headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds, context=self._ssl) as response:
                status, body = response.status, response.read()
                content_type = response.headers.get_content_type()
        except urllib.error.HTTPError as err:  # the API answers errors with 4xx/5xx and its JSON
            status, body, content_type = err.code, err.read(), err.headers.get_content_type()
        except TimeoutError:
            raise ReportError(f"Prometheus at {self.base_url} did not answer within "
                              f"{self.timeout_seconds:g} s (a long range? try a shorter --chunk, or a "
                              f"longer --timeout)") from None
        except urllib.error.URLError as err:
            raise ReportError(f"cannot reach Prometheus at {self.base_url}: {_reason(err.reason)}") from None
        except OSError as err:
            raise ReportError(f"cannot reach Prometheus at {self.base_url}: {err}") from None
        return self._decode(url, status, body, content_type, form.get("query", ""))

    def _decode(self, url: str, status: int, body: bytes, content_type: str, expr: str) -> dict[str, Any]:
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or "status" not in reply:
            snippet = body[:_ERROR_BODY_CHARS].decode("utf-8", "replace").strip()
            hint = " (wrong credentials?)" if status in (401, 403) else ""
            raise ReportError(f"{url} did not answer like Prometheus's HTTP API: HTTP {status} {content_type}"
                              f"{hint}: {snippet!r}")
        if reply["status"] != "success":
            error_type = reply.get("errorType", "unknown")
            hint = ""
            if "too many samples" in str(reply.get("error", "")):
                hint = " (split the range into smaller pieces with --chunk, e.g. --chunk 6h)"
            raise ReportError(f"Prometheus at {self.base_url} refused a query ({error_type}: "
                              f"{reply.get('error', '')}){hint}\n  query: {expr}")
        data = reply.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise ReportError(f"{url}: a success without a result: {str(reply)[:_ERROR_BODY_CHARS]!r}")
        return data

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json",
                   "User-Agent": "gpuagent-report"}
        if self.auth.bearer_token:
            headers["Authorization"] = f"Bearer {self.auth.bearer_token}"
        elif self.auth.username is not None:
            pair = f"{self.auth.username}:{self.auth.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        headers.update(self.auth.headers)
        return headers


def _reason(reason: object) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out while connecting"
    if isinstance(reason, ssl.SSLError):
        return f"TLS: {reason} (--ca-file, or --insecure-skip-verify)"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is it running, on that port?)"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason})"
    return str(reason)


def parse_headers(values: Sequence[str]) -> dict[str, str]:
    """``--header 'Name: value'`` arguments as a dict."""
    headers = {}
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not name.strip():
            raise ReportError(f"--header: expected 'Name: value', got {value!r}")
        headers[name.strip()] = text.strip()
    return headers


def _labels(metric: Mapping[str, str]) -> Mapping[str, str]:
    """A series' labels as read: any target sets them, and a JSON ``\\udcff`` escape decodes to a lone
    surrogate that no output could encode; those become U+FFFD (``gpuagent.untrusted.encodable``)."""
    return {name: encodable(value) for name, value in metric.items()}
