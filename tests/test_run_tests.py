"""``scripts/run_tests.py``, the two passes of ``make test``, on a small suite of probes: while the serial
pass runs, the parallel pass's workers are kept off the serial pass's CPU and run at a lower priority; they
get every CPU back when it ends; both passes share one port registry; a failure in either pass fails the
run, but a test that failed beside the other pass is rerun alone first and counts as passed when it passes
then; a serial test on an xdist worker fails saying how to run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "scripts" / "run_tests.py"

PROBES = '''
import json, os, time
from pathlib import Path

import pytest

OUT = Path(os.environ["PROBE_OUT"])


def until(name, timeout=90.0):
    deadline = time.monotonic() + timeout
    while not (OUT / name).exists():
        assert time.monotonic() < deadline, f"{name} never came"
        time.sleep(0.05)


def record(name):
    (OUT / name).write_text(json.dumps({
        "cpus": sorted(os.sched_getaffinity(0)), "nice": os.nice(0), "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "registry": os.environ.get("TEST_PORT_REGISTRY")}))


SIDE_BY_SIDE = os.environ.get("PROBE_SIDE_BY_SIDE") == "1"


@pytest.mark.serial
def test_serial():
    record("serial-started")
    if SIDE_BY_SIDE:  # both passes at once: the parallel pass ran while this one held its CPU
        until("parallel-0")
        until("parallel-1")
    record("serial")
    if os.environ.get("PROBE_SERIAL_FLAKY") and not (OUT / "serial-flaky-ran").exists():
        (OUT / "serial-flaky-ran").write_text("")
        raise AssertionError("first run (a share pushed by the other pass's load)")


@pytest.mark.parametrize("n", [0, 1])
def test_parallel(n):
    if SIDE_BY_SIDE:
        until("serial-started")
    record(f"parallel-{n}")
    if n == 1 and SIDE_BY_SIDE:  # after the serial pass, every CPU again
        until("serial")
        deadline = time.monotonic() + 60
        while os.nice(0) != json.loads((OUT / "serial").read_text())["nice"]:
            assert time.monotonic() < deadline, os.nice(0)
            time.sleep(0.05)
        record("parallel-after")
    assert os.environ.get("PROBE_FAIL") != f"parallel-{n}"


def test_flaky():
    """With PROBE_FLAKY: fails its first run only (as a test of timing may at the lowest priority)."""
    if os.environ.get("PROBE_FLAKY") and not (OUT / "flaky-ran").exists():
        (OUT / "flaky-ran").write_text("")
        raise AssertionError("first run")
'''


def run(tmp_path: Path, *args: str, fail: str = "", cpus: set[int] | None = None, flaky: bool = False,
        serial_flaky: bool = False) -> subprocess.CompletedProcess[str]:
    """The runner on the probes; on ``cpus`` (its affinity) if given, else on this process's."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n")
    (suite / "test_probes.py").write_text(PROBES)
    (tmp_path / "out").mkdir()
    env = {k: v for k, v in os.environ.items()  # nothing of the outer run (a runner's own files, its ports)
           if k != "TEST_PORT_REGISTRY" and not k.startswith(("PYTEST_", "GPUAGENT_TESTS_"))}
    side_by_side = len(cpus if cpus is not None else os.sched_getaffinity(0)) > 1
    env.update(PROBE_OUT=str(tmp_path / "out"), PROBE_FAIL=fail, PROBE_SIDE_BY_SIDE="1" if side_by_side else "",
               PROBE_FLAKY="1" if flaky else "", PROBE_SERIAL_FLAKY="1" if serial_flaky else "",
               # the probes need xdist alone: the installed plugins (textual, schemathesis, hypothesis) cost
               # every one of the ~20 pytest processes these tests start 1.4 s of imports
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTEST_PLUGINS="xdist.plugin")
    return subprocess.run([sys.executable, str(RUNNER), *args, "--", "-q", "-p", "no:cacheprovider", str(suite)],
                          capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))


def probe(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "out" / name).read_text())


# Serial: it starts four pytest processes that wait on each other, and needs two CPUs to itself.
@pytest.mark.serial
@pytest.mark.integration
@pytest.mark.timeout(300)  # four pytest processes start (two passes, two workers)
def test_the_serial_pass_owns_the_highest_cpu_while_the_parallel_pass_runs_beside_it(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: on one the passes run one after the other (the next test)")
    done = run(tmp_path, "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    serial, first, second = (probe(tmp_path, n) for n in ("serial", "parallel-0", "parallel-1"))
    assert serial["cpus"] == cpus and serial["worker"] is None
    for parallel in (first, second):  # beside the serial pass: every CPU, the lowest priority
        assert parallel["cpus"] == cpus and parallel["worker"] in ("gw0", "gw1")
        assert parallel["nice"] == 19
        assert parallel["registry"] == serial["registry"] and parallel["registry"]
    assert probe(tmp_path, "parallel-after")["nice"] == serial["nice"]  # its priority back (root)
    assert f"the serial pass's tenants burn on CPU {cpus[-1]}" in done.stdout
    assert "== serial pass: exit 0" in done.stdout and "parallel pass: exit 0" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == "both passes: 4 passed, 0 failed, 0 skipped"
    assert "rerunning" not in done.stdout  # nothing failed: nothing rerun


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_on_one_cpu_the_passes_run_one_after_the_other_and_a_failure_fails_the_run(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    done = run(tmp_path, "-n", "1", fail="parallel-0", cpus={cpu})
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"CPU {cpu}: the parallel pass, then the serial pass" in done.stdout
    assert "1 failed, 2 passed" in done.stdout and "== parallel pass: exit 1" in done.stdout
    assert "== serial pass: exit 0" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == "both passes: 3 passed, 1 failed, 0 skipped"
    serial, parallel = probe(tmp_path, "serial"), probe(tmp_path, "parallel-1")
    assert serial["cpus"] == parallel["cpus"] == [cpu] and parallel["worker"] == "gw0"
    assert serial["registry"] == parallel["registry"] and serial["registry"]
    assert (tmp_path / "out" / "parallel-1").stat().st_mtime <= (tmp_path / "out" / "serial-started").stat().st_mtime


# In the parallel pass: its probes wait on each other's files, not on a CPU of their own.
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_test_that_failed_beside_the_serial_pass_is_rerun_alone_and_a_real_failure_stands(
    tmp_path: Path,
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: the rerun is for the passes side by side")
    done = run(tmp_path, "-n", "2", fail="parallel-0", flaky=True)
    assert done.returncode == 1, done.stdout + done.stderr  # parallel-0 fails alone too
    rerun = next(line for line in done.stdout.splitlines() if line.startswith("== rerunning alone"))
    assert "test_probes.py::test_flaky" in rerun and "test_probes.py::test_parallel[0]" in rerun
    assert "serial" not in rerun.split(":", 1)[1].replace("serial pass", "")  # the serial pass's own: never
    assert "== rerun pass: exit 1" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == (  # the flaky one passed alone; parallel-0 stands
        "both passes: 3 passed, 1 failed, 0 skipped (1 passed on a rerun alone)")
    again = tmp_path / "again"
    again.mkdir()
    done = run(again, "-n", "2", flaky=True, serial_flaky=True)  # each pass's flaky one passes on its rerun
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== the 1 test(s) passed alone: the parallel pass counts as passed" in done.stdout
    assert ("== rerunning alone the 1 test(s) that failed in the serial pass, beside the parallel pass: "
            "test_probes.py::test_serial") in done.stdout.replace(str(again / "suite") + "/", "")
    assert "== serial rerun pass: exit 0" in done.stdout
    assert "== the 1 test(s) passed alone: the serial pass counts as passed" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == (
        "both passes: 4 passed, 0 failed, 0 skipped (2 passed on a rerun alone)")


def test_a_serial_test_on_an_xdist_worker_fails_saying_how_to_run_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                           "tests/test_sim.py::test_follow_cpu_tracks_a_real_process_and_decays_when_frozen"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tests marked serial measure CPU shares" in done.stdout and "-p no:xdist -m serial" in done.stdout
    assert "1 error" in done.stdout  # failed in its setup, before its fixtures started a process


def test_failures_in_many_modules_or_too_many_tests_are_not_rerun(tmp_path: Path) -> None:
    """A module's fixture that fails fails each of its tests: nine errors of one module are still one cause to
    rerun; failures spread over more modules than the cap, or more tests than it, stand without a rerun."""
    sys.path.insert(0, str(RUNNER.parent))
    try:
        import run_tests
    finally:
        sys.path.remove(str(RUNNER.parent))
    failed = tmp_path / "failed"
    never = ["false"]  # a rerun that ran would fail: a (1, 0) without it says nothing was run
    spread = [f"tests/test_m{i}.py::test_x" for i in range(run_tests.MAX_RERUN_MODULES + 1)]
    failed.write_text("\n".join(spread) + "\n")
    assert run_tests._rerun_alone(run_tests.PARALLEL_RERUN, never, {}, failed, tmp_path) == (1, 0)
    assert not (tmp_path / "rerun.only").exists()
    many = [f"tests/test_one.py::test_{i}" for i in range(run_tests.MAX_RERUN + 1)]
    failed.write_text("\n".join(many) + "\n")
    assert run_tests._rerun_alone(run_tests.PARALLEL_RERUN, never, {}, failed, tmp_path) == (1, 0)
    assert not (tmp_path / "rerun.only").exists()
    one_module = [f"tests/test_one.py::test_{i}" for i in range(9)]  # fewer than the cap: it is rerun
    failed.write_text("\n".join(one_module) + "\n")
    assert run_tests._rerun_alone(run_tests.PARALLEL_RERUN, ["true"], dict(os.environ), failed, tmp_path)[0] == 0
    assert (tmp_path / "rerun.only").read_text().splitlines() == sorted(one_module)
