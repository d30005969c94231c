#!/usr/bin/env python3
"""The whole test suite in two passes, as ``make test`` runs it (``tests/README.md`` has the rules).

- The parallel pass: every test not marked ``serial``, on pytest-xdist workers (``--dist loadfile``: a
  module's tests share one worker, so its module-scoped agents and Prometheus start once; the modules that
  start processes go first, so that no long one is left for the end).
- The serial pass: the ``serial`` tests (they measure CPU shares of real processes), one at a time in one
  pytest process, without xdist.

On two CPUs or more the passes run side by side (the default): the serial pass's tenants burn on the highest
CPU (``BURN_CPU``, ``agent_off_the_burn_cpu``) at a high priority in cgroups of the highest CPU weight
(``CgroupSandbox.favour_cpu``, the GPU check's sandbox alike), and the parallel pass runs on every CPU at the
lowest priority (``nice 19``, inherited by every process it starts). The kernel shares a CPU between cgroups
by their weights before nice values count, so the weight is what keeps a parallel test's burner, in a cgroup
of its own, off the tenants' CPU (before it, 70/30 came out 0.61/0.39 in two full runs of five); whatever the
serial pass runs wins each CPU it wants, and the parallel pass uses the rest, the burn CPU too whenever no
tenant burns there. (Keeping the parallel pass off the burn CPU instead left it one CPU for the whole serial
pass, in which its Prometheus-backed tests timed out.) When the serial pass ends, the parallel pass's
processes get their priority back. A test of the parallel pass that failed at that priority (a bound on time,
a subprocess slow to start) is rerun alone at the end, at the runner's priority, and the run says so: one that
passes then counts as passed, one that fails again fails the run (more than ``MAX_RERUN`` failures, or
failures in more than ``MAX_RERUN_MODULES`` modules, are not rerun). A test of the serial pass that failed is
rerun alone likewise, once the parallel pass has ended (at most ``MAX_SERIAL_RERUN``: each is minutes long):
its tenants' work is its judge, and the weight keeps the parallel pass's burners off their CPU but not the
machine's memory, caches and interrupts. ``--one-after-the-other`` runs the parallel pass first and then the
serial pass alone (a minute or two longer on two CPUs), as one CPU always does. Both passes share one registry
of loopback ports (``tests/ports.py``). The serial pass's output is printed when it ends; the exit status is
the first failing pass's.

    .venv/bin/python scripts/run_tests.py                          # both passes at once, 4 workers
    .venv/bin/python scripts/run_tests.py --one-after-the-other    # the parallel pass, then the serial one
    .venv/bin/python scripts/run_tests.py -n 2 -- -x        # 2 workers; pytest arguments after --
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rerun_plugin  # beside this script: its environment variables' names

ROOT = Path(__file__).resolve().parent.parent
PARALLEL_NICE = 19  # while the serial pass runs: whatever it runs goes first on every CPU
NO_TESTS = 5  # pytest's exit status when a pass selects no test (a filter matching only the other pass's)
MAX_RERUN = 30  # more failures than this beside the serial pass is not the priority: no rerun
MAX_RERUN_MODULES = 5  # nor in more modules than this (a module's fixture that fails fails all its tests)
MAX_SERIAL_RERUN = 3  # a serial test is a measurement of minutes: more failures than this stand


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--workers", type=int, default=int(os.environ.get("PYTEST_WORKERS", "4")),
                        help="pytest-xdist workers of the parallel pass (default: $PYTEST_WORKERS or 4)")
    parser.add_argument("--one-after-the-other", action="store_true",
                        help="the parallel pass, then the serial pass alone (slower; one CPU always does)")
    parser.add_argument("pytest_args", nargs="*", help="passed to both passes (after --)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers: expected at least 1, got {args.workers}")
    pytest = [sys.executable, "-m", "pytest", "-p", "rerun_plugin"]
    # in collection order, where conftest.py puts the modules that start processes first
    parallel_cmd = [*pytest, "-m", "not serial", "-n", str(args.workers), "--dist", "loadfile",
                    "--no-loadscope-reorder", *args.pytest_args]
    serial_cmd = [*pytest, "-m", "serial", "-p", "no:xdist", *args.pytest_args]
    rerun_cmd = [*pytest, "-m", "not serial", "-p", "no:xdist", *args.pytest_args]  # its failures, alone
    serial_rerun_cmd = [*serial_cmd]  # the serial pass's failures, alone once the parallel pass has ended
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="gpuagent-tests-") as scratch:
        reports = [Path(scratch) / "parallel.xml", Path(scratch) / "serial.xml"]
        parallel_cmd += ["--junitxml", str(reports[0])]
        serial_cmd += ["--junitxml", str(reports[1])]
        failed_file, serial_failed_file = Path(scratch) / "parallel.failed", Path(scratch) / "serial.failed"
        path = os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))
        ours = (rerun_plugin.FAILED_ENV, rerun_plugin.ONLY_ENV)  # an outer run's (a test of this runner)
        inherited = {k: v for k, v in os.environ.items() if k not in ours}
        env = {**inherited, "TEST_PORT_REGISTRY": str(Path(scratch) / "ports"), "PYTHONPATH": path}
        # Bytecode is cached (in the checkout's __pycache__, ignored by git): with PYTHONDONTWRITEBYTECODE
        # set, every xdist worker rewrote and compiled every test module again (~7 s of CPU each) and every
        # agent or CLI process a test starts compiled the gpuagent package again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        recovered = 0
        if len(cpus) < 2 or args.one_after_the_other:
            print(f"{_cpu_list(cpus)}: the parallel pass, then the serial pass", flush=True)
            codes = [_run("parallel", parallel_cmd, env), _run("serial", serial_cmd, env)]
        else:
            recording = {**env, rerun_plugin.FAILED_ENV: str(failed_file)}  # the parallel pass's failures
            codes = _side_by_side(parallel_cmd, serial_cmd, env, cpus, Path(scratch) / "serial.log",
                                  parallel_env=recording,
                                  serial_env={**env, rerun_plugin.FAILED_ENV: str(serial_failed_file)})
            if codes[0] == 1:  # tests failed (not an interrupted or broken run)
                codes[0], recovered = _rerun_alone(PARALLEL_RERUN, rerun_cmd, env, failed_file, Path(scratch))
            if codes[1] == 1:
                codes[1], more = _rerun_alone(SERIAL_RERUN, serial_rerun_cmd, env, serial_failed_file,
                                              Path(scratch))
                recovered += more
        print(_closing_line(reports, recovered), flush=True)
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


@dataclass(frozen=True)
class _Rerun:
    """Which pass's failures a rerun takes, how many at most (tests, and the modules they lie in), and its
    words."""

    name: str  # the rerun's files and its "== NAME pass" line
    most: int
    most_modules: int
    beside: str  # what the failures ran beside
    counts: str  # what a rerun that passes counts as passed


PARALLEL_RERUN = _Rerun("rerun", MAX_RERUN, MAX_RERUN_MODULES, "beside the serial pass", "the parallel pass")
SERIAL_RERUN = _Rerun("serial rerun", MAX_SERIAL_RERUN, MAX_SERIAL_RERUN,
                      "in the serial pass, beside the parallel pass", "the serial pass")


def _rerun_alone(rerun: _Rerun, rerun_cmd: list[str], env: dict[str, str], failed_file: Path, scratch: Path
                 ) -> tuple[int, int]:
    """Rerun alone, at the runner's own priority, the tests of one pass that failed while the other pass ran
    beside it (a test of timing or of a subprocess's start can miss there what it meets on a machine of its
    own; a share measured by tenants' work can be pushed by the other pass's load); the pass's exit status
    after it, and how many passed. More than ``rerun.most`` failures, or failures in more than
    ``rerun.most_modules`` modules, is not a matter of load: they stand. (Modules, since a module's fixture
    that fails, an agent not ready in time, fails each of its tests: nine errors of one module in one run.)"""
    failed = sorted(set(failed_file.read_text().splitlines())) if failed_file.exists() else []
    modules = {nodeid.split("::", 1)[0] for nodeid in failed}
    if not failed or len(failed) > rerun.most or len(modules) > rerun.most_modules:
        return 1, 0
    print(f"\n== rerunning alone the {len(failed)} test(s) that failed {rerun.beside}: "
          f"{', '.join(failed)}", flush=True)
    stem = rerun.name.replace(" ", "-")
    only = scratch / f"{stem}.only"
    only.write_text("\n".join(failed) + "\n")
    code = _run(rerun.name, [*rerun_cmd, "--junitxml", str(scratch / f"{stem}.xml")],
                {**env, rerun_plugin.ONLY_ENV: str(only)})
    passed = _counts([scratch / f"{stem}.xml"])[0]
    if code != 0:
        return 1, passed
    print(f"== the {passed} test(s) passed alone: {rerun.counts} counts as passed", flush=True)
    return 0, passed


def _closing_line(reports: Sequence[Path], recovered: int = 0) -> str:
    """Both passes' counts in one line, pytest's words (each pass printed its own above): the run's last
    line, so whoever reads only the end of the log reads the whole suite's result. ``recovered``: tests of
    either pass that failed beside the other and passed when rerun alone, counted as passed."""
    passed, failed, skipped = _counts(reports)
    line = f"both passes: {passed + recovered} passed, {failed - recovered} failed, {skipped} skipped"
    return line + (f" ({recovered} passed on a rerun alone)" if recovered else "")


def _counts(reports: Sequence[Path]) -> tuple[int, int, int]:
    """Passed, failed (errors included) and skipped tests of the JUnit XML ``reports`` (a missing or broken
    one, a pass that selected nothing or died before writing, counts nothing: its exit status says so)."""
    passed = failed = skipped = 0
    for report in reports:
        try:
            root = ElementTree.parse(report).getroot()
        except (OSError, ElementTree.ParseError):
            continue
        for suite in root.iter("testsuite"):
            tests, skips = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            fails = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            passed += tests - skips - fails
            failed += fails
            skipped += skips
    return passed, failed, skipped


def _run(name: str, cmd: list[str], env: dict[str, str]) -> int:
    started = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    print(f"== {name} pass: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def _side_by_side(parallel_cmd: list[str], serial_cmd: list[str], env: dict[str, str], cpus: list[int],
                  serial_log: Path, *, parallel_env: dict[str, str] | None = None,
                  serial_env: dict[str, str] | None = None) -> list[int]:
    serial_cpu = cpus[-1]
    print(f"the serial pass's tenants burn on CPU {serial_cpu}; the parallel pass runs on {_cpu_list(cpus)} "
          f"at nice {PARALLEL_NICE} until the serial pass ends", flush=True)
    own_nice = os.nice(0)

    def lower() -> None:  # in the parallel pass's pytest, before it starts anything
        os.nice(PARALLEL_NICE - os.nice(0))

    started = time.monotonic()
    with serial_log.open("wb") as log:
        serial = subprocess.Popen(serial_cmd, cwd=ROOT, env=serial_env or env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            parallel = subprocess.Popen(parallel_cmd, cwd=ROOT, env=parallel_env or env, preexec_fn=lower)
        except BaseException:
            serial.kill()
            serial.wait()
            raise
        try:
            serial_code = serial.wait()
            serial_seconds = time.monotonic() - started
            _restore(parallel.pid, own_nice)
            parallel_code = parallel.wait()
        except BaseException:
            for proc in (serial, parallel):
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
            raise
    print(f"\n== serial pass (tenants on CPU {serial_cpu}), its output:", flush=True)
    sys.stdout.write(serial_log.read_text(errors="replace"))
    print(f"== serial pass: exit {serial_code} after {serial_seconds:.0f} s; parallel pass: exit "
          f"{parallel_code} after {time.monotonic() - started:.0f} s", flush=True)
    return [parallel_code, serial_code]


def _restore(pid: int, nice: int) -> None:
    """``nice`` again for ``pid`` and the processes under it: parents first, so a child started meanwhile
    inherits it; twice, for any started between the listing and the change. Lowering a nice value needs
    root (CAP_SYS_NICE): without it the pass finishes at the low priority."""
    for _ in range(2):
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.nice(nice)


def _cpu_list(cpus: set[int] | list[int]) -> str:
    return "CPU " + ",".join(str(c) for c in sorted(cpus))


if __name__ == "__main__":
    sys.exit(main())
