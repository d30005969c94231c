"""The repository stands on its own: what each make target installs, CI's command, the package metadata, and
no test input from outside the clone (issue 15). ``test_docs.py`` checks the documents' links."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: import-linter (a test extra) brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def planned(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make <target>`` would run from scratch (``-n -B``: nothing is run, every step planned),
    with a throwaway virtual environment path."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed: `make test` itself needs it")
    venv = tmp_path / "venv"
    # Not as a sub-make of `make test` (which this suite runs under): no "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, f"VENV={venv}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True)
    return [line.replace(str(venv), "$VENV") for line in done.stdout.splitlines()]


UV_THEN_PIP = re.compile(
    r"\(\$VENV/bin/python -m pip install -q uv && \$VENV/bin/uv pip install -q --python \$VENV/bin/python (?P<uv>.+)\)"
    r" \|\| \(\$VENV/bin/python -m pip install -q --upgrade pip && \$VENV/bin/python -m pip install -q (?P<pip>.+)\)")


def pip_installs(commands: list[str]) -> list[str]:
    """What each install line installs: with uv (taken from PyPI into the venv), else the same with pip."""
    found = []
    for line in commands:
        if " install " not in line:
            continue
        matched = UV_THEN_PIP.fullmatch(line)
        assert matched and matched["uv"] == matched["pip"], f"an install without uv or its pip fallback: {line}"
        found.append(matched["uv"])
    return found


def test_make_run_installs_the_runtime_and_top(tmp_path: Path) -> None:
    commands = planned("run", tmp_path)
    assert pip_installs(commands) == ["-e '.[top]'"]  # the README's next command is `gpuagent top`
    # the demo: a simulated Kubernetes node whose pods `gpuagent top` names from the first screen
    assert commands[-1].startswith("$VENV/bin/gpuagent demo --scenario examples/scenarios/demo-k8s-node.yaml ")


def test_make_demo_runs_the_demo_beside_a_prometheus_with_its_history(tmp_path: Path) -> None:
    commands = planned("demo", tmp_path)
    assert pip_installs(commands) == ["-e '.[top]'"]  # the runtime and top; Prometheus is Debian's
    assert commands[-1] == "BIN=$VENV/bin LISTEN=127.0.0.1:9402 ./scripts/demo.sh"
    script = (ROOT / "scripts" / "demo.sh").read_text()
    steps = ["-m gpuagent.demo.history", "promtool tsdb create-blocks-from openmetrics", "prometheus --config.file",
             '"$BIN/gpuagent" demo --listen']
    assert [script.index(step) for step in steps] == sorted(script.index(step) for step in steps)


def test_make_pictures_draws_the_readme_pictures_from_the_demo(tmp_path: Path) -> None:
    commands = planned("pictures", tmp_path)
    assert commands[-2:] == ["$VENV/bin/python tests/fixtures/top/record.py demo",
                             "$VENV/bin/python -m pytest -q tests/test_top_snapshots.py -k readme --snapshot-update"]
    readme = (ROOT / "README.md").read_text()
    assert "make pictures" in readme and "(docs/top-node.svg)" in readme


def test_make_test_adds_the_test_extras_and_the_system_packages(tmp_path: Path) -> None:
    commands = planned("test", tmp_path)
    assert pip_installs(commands) == ["-e '.[test]'"]  # the runtime with them, at once
    assert "./scripts/install-system-deps.sh" in commands
    assert re.fullmatch(r"\$VENV/bin/python scripts/run_tests\.py -n \d+ -- -q", commands[-1]), commands[-1]


def test_ci_runs_exactly_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == "make test"
    assert [c for c in commands if "make" in c or "pytest" in c] == ["make test"]


def test_the_license_is_an_spdx_expression_setuptools_accepts_without_a_warning() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"  # the table form is deprecated (a warning per install)
    assert not any("License ::" in c for c in meta["project"].get("classifiers", ()))  # not both forms
    setuptools = next(r for r in meta["build-system"]["requires"] if r.startswith("setuptools"))
    assert int(re.fullmatch(r"setuptools>=(\d+).*", setuptools).group(1)) >= 77  # SPDX strings from 77
    assert meta["tool"]["setuptools"]["package-dir"] == {"": "."}  # editable install: a .pth, no warning


# Strings by which a file would reach outside the clone: the workspace's shared/ directory beside it.
OUTSIDE = re.compile(r"\.\./shared|shared/fixtures|shared/DESIGN|parents\[2\]|parent\.parent\.parent")


def tracked_text_files() -> list[Path]:
    """Files of the checkout (git's list where there is one, else every file but caches and the venv)."""
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        names = subprocess.run([git, "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split()
        paths = [ROOT / name for name in names]
    else:
        skip = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "build"}
        paths = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in paths if p.is_file() and p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ""}]


def test_nothing_reads_or_links_outside_the_repository() -> None:
    offenders = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
