"""pytest plugin of ``scripts/run_tests.py`` (loaded with ``-p rerun_plugin``): records the node IDs of the
tests that fail (setup, call or teardown) in the file ``$GPUAGENT_TESTS_FAILED`` names, from the process that
sees every report (xdist's controller, or pytest alone), and with ``$GPUAGENT_TESTS_ONLY`` keeps only the
tests that file lists. The runner reruns, alone, the tests of the parallel pass that failed while it ran at
the lowest priority beside the serial pass, and says so."""

from __future__ import annotations

import os

import pytest

FAILED_ENV = "GPUAGENT_TESTS_FAILED"
ONLY_ENV = "GPUAGENT_TESTS_ONLY"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(FAILED_ENV)
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(report.nodeid + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(ONLY_ENV)
    if not path:
        return
    with open(path, encoding="utf-8") as listed:
        wanted = {line for line in listed.read().splitlines() if line}
    keep = [item for item in items if item.nodeid in wanted]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = keep
