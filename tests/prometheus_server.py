"""A real Prometheus for tests: Debian's ``prometheus`` binary as a subprocess on a free loopback port.

It scrapes the given targets every second (one job, ``gpuagent`` by default), can load rule files
(evaluated every second), keeps its TSDB under the test's temporary directory, and is always stopped
(SIGTERM, then SIGKILL) when the ``with`` block or the fixture ends::

    with PrometheusServer(["127.0.0.1:9402"], tmp_path / "prom", rule_files=[rules]) as prom:
        prom.wait_for_samples("gpuagent_up", 12)      # twelve scrapes of the agent so far
        prom.query("sum(DCGM_FI_DEV_GPU_UTIL)")         # QueryResult(result_type, result, warnings)
        prom.query_range("up", start, end, step=1)
        prom.rules()                                    # /api/v1/rules: health and lastError per rule
        # a query Prometheus rejects raises PrometheusQueryError(error_type="bad_data" | "execution", ...)

Tests that only need one, function-scoped, take the :func:`prometheus` fixture (a factory)::

    pytest_plugins = ["prometheus_server"]  # in the test module: the fixture, without an unused import

    def test_x(prometheus):
        prom = prometheus(["127.0.0.1:9402"], rule_files=[...])

Backfilled data instead of scrapes: ``with backfill(workdir, days, openmetrics, "report") as filled:`` writes
``openmetrics(start_unix)`` into a TSDB with ``promtool tsdb create-blocks-from openmetrics`` and serves it;
``filled.run(*args)`` runs ``gpuagent report`` over exactly that range (``filled.json(...)`` its JSON).

Without the binary the caller is skipped with the way to install it (``scripts/install-system-deps.sh``,
which ``make test`` and so ``.ci/run`` runs); with ``GPUAGENT_REQUIRE_PROMETHEUS=1`` it fails instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port

INSTALL_HINT = ("run scripts/install-system-deps.sh (Debian's prometheus package: prometheus and promtool); "
                "`make test` does")


def prometheus_binary() -> str:
    """The ``prometheus`` executable, or skip the calling test saying how to get it."""
    return _binary("prometheus")


def promtool_binary() -> str:
    """The ``promtool`` executable, or skip the calling test saying how to get it."""
    return _binary("promtool")


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"`{name}` is not installed: {INSTALL_HINT}"
        if os.environ.get("GPUAGENT_REQUIRE_PROMETHEUS"):
            pytest.fail(message)
        pytest.skip(message)
    return path


class PrometheusQueryError(Exception):
    """Prometheus refused or failed a query: ``error_type`` is its ``errorType`` (``bad_data`` for a query
    that does not parse, ``execution`` for one that fails while evaluated, ``timeout``, ...)."""

    def __init__(self, error_type: str, error: str, status: int) -> None:
        super().__init__(f"{error_type}: {error}")
        self.error_type = error_type
        self.error = error
        self.status = status


@dataclass(frozen=True)
class QueryResult:
    result_type: str  # vector | matrix | scalar | string
    result: Any
    warnings: tuple[str, ...] = ()

    @property
    def has_data(self) -> bool:
        """A non-empty vector or matrix, a scalar that is a number (``scalar()`` of nothing is NaN), a string."""
        if self.result_type in ("vector", "matrix"):
            return bool(self.result)
        if self.result_type == "scalar":
            return not math.isnan(float(self.result[1]))
        return self.result_type == "string"

    @property
    def series(self) -> int:
        return len(self.result) if self.result_type in ("vector", "matrix") else int(self.has_data)


@dataclass
class PrometheusServer:
    """One Prometheus process; see the module docstring."""

    targets: Sequence[str]
    workdir: Path
    rule_files: Sequence[Path] = ()
    job: str = "gpuagent"
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    extra_args: Sequence[str] = ()
    binary: str | None = None
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / "prometheus.log"

    @property
    def config_path(self) -> Path:
        return Path(self.workdir) / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.evaluation_interval},
            "scrape_configs": [{"job_name": self.job, "static_configs": [{"targets": list(self.targets)}]}],
        }
        if self.rule_files:
            config["rule_files"] = [str(Path(p).resolve()) for p in self.rule_files]
        return config

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> PrometheusServer:
        binary = self.binary or prometheus_binary()
        workdir = Path(self.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = self.port or free_port()
        log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                 "--log.level=warn", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
            )
        finally:
            log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/-/ready", timeout=2) as ready:
                if ready.status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"prometheus not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- HTTP API -------------------------------------------------------------------------------------

    def api(self, path: str, params: dict[str, Any] | None = None, *, timeout: float = 30) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, else :class:`PrometheusQueryError`."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        try:
            reply = json.loads(body)
        except ValueError as exc:
            raise PrometheusQueryError("bad_response", f"HTTP {status}: {body[:200]!r}", status) from exc
        if reply.get("status") != "success":
            raise PrometheusQueryError(reply.get("errorType", "unknown"), reply.get("error", ""), status)
        data = reply.get("data")
        if isinstance(data, dict) and "resultType" in data:
            return QueryResult(data["resultType"], data["result"], tuple(reply.get("warnings", ())))
        return data

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", params)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> QueryResult:
        return self.api("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                        "step": step})

    def targets_health(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule group Prometheus evaluates, as ``/api/v1/rules`` gives them."""
        return self.api("rules")["groups"]

    def wait_for(self, expr: str, ok: Callable[[QueryResult], bool], timeout: float, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        last: QueryResult | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            last = self.query(expr)
            if ok(last):
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what or expr}: last {last}; targets "
                             f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in self.targets_health()]}")

    def wait_for_samples(self, metric: str, samples: int, timeout: float = 40) -> None:
        """Until every target has given ``samples`` scrapes of ``metric`` (within the last minute)."""
        expr = f"count_over_time({metric}[1m])"

        def enough(result: QueryResult) -> bool:
            values = [float(s["value"][1]) for s in result.result]
            return len(values) >= len(self.targets) and min(values) >= samples

        self.wait_for(expr, enough, timeout, f"{samples} scrapes of {metric} from {len(self.targets)} target(s)")


@dataclass
class Backfilled:
    """A Prometheus serving ``days`` of backfilled data ending at ``end_unix`` (whole hours, an hour ago)."""

    prometheus: PrometheusServer
    start_unix: int
    end_unix: int
    workdir: Path
    command: str  # the gpuagent command run over the range
    defaults: tuple[str, ...] = ()  # its arguments before any given

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        from agent_runner import run_gpuagent

        return run_gpuagent(self.command, "--prometheus", self.prometheus.url, "--start", str(self.start_unix),
                            "--end", str(self.end_unix), *self.defaults, *args)

    def json(self, *args: str) -> Any:
        done = self.run("--format", "json", *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@contextlib.contextmanager
def backfill(workdir: Path, days: int, openmetrics: Callable[[int], str], command: str,
             defaults: Sequence[str] = ()) -> Iterator[Backfilled]:
    """``openmetrics(start_unix)`` (the text, ``# EOF`` ended) backfilled into a TSDB, served."""
    prometheus_binary()
    end = int(time.time()) // 3600 * 3600 - 3600  # whole hours, an hour ago
    start = end - days * 86400
    source = workdir / "backfill.om"
    source.write_text(openmetrics(start))
    data = workdir / "prometheus" / "data"
    data.mkdir(parents=True)
    done = subprocess.run([promtool_binary(), "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                           str(source), str(data)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with PrometheusServer([], workdir / "prometheus") as prom:
        yield Backfilled(prom, start, end, workdir, command, tuple(defaults))


@contextlib.contextmanager
def run_prometheus(targets: Sequence[str], workdir: Path, **kwargs: Any) -> Iterator[PrometheusServer]:
    server = PrometheusServer(targets, workdir, **kwargs)
    with server:
        yield server


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """A factory: ``prometheus(targets, rule_files=..., ...)`` gives a started server, stopped at teardown."""
    started: list[PrometheusServer] = []

    def start(targets: Sequence[str], **kwargs: Any) -> PrometheusServer:
        server = PrometheusServer(targets, tmp_path / f"prometheus-{len(started)}", **kwargs)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
