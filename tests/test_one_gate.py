"""Only ``gpuagent/enforce/actions/`` acts on the node: no other module of the agent sends a signal or names a
freezer's control file, and an Eviction is built in one place, ``gpuagent.kubeapi.eviction_request``, which
the enforcer's gate and the GPU health drain both call (the house rule in docs/architecture.md).

Read from the source: import-linter cannot tell ``signal.SIGTERM`` (a constant the enforcer names) from
``signal.pidfd_send_signal``, and a cgroupfs write is an ``os.open`` like any other. The same scan must find
each kind of act inside the package, so that a scanner gone blind fails too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpuagent"
GATE = PACKAGE / "enforce" / "actions"
EVICTIONS = PACKAGE / "kubeapi.py"  # eviction_request: the one Eviction, for the enforcer and the health drain
SIGNALLING = {"os": {"kill", "killpg"}, "signal": {"pidfd_send_signal", "pthread_kill"}}
CONTROL_FILES = ("cgroup.freeze", "freezer.state", "cgroup.kill")
EVICTION_URL = "/eviction"


def acts(tree: ast.AST) -> Iterator[tuple[str, int, str]]:
    """(kind, line, what) for each signal sent, control file named or Eviction URL built in ``tree``."""
    modules: dict[str, str] = {}  # local name -> "os" | "signal"
    functions: dict[str, str] = {}  # local name -> "os.kill", ...
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SIGNALLING:
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in SIGNALLING:
            for alias in node.names:
                if alias.name in SIGNALLING[node.module]:
                    functions[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.attr in SIGNALLING.get(modules.get(func.value.id, ""), ())):
                yield "signal", node.lineno, f"{modules[func.value.id]}.{func.attr}"
            elif isinstance(func, ast.Name) and func.id in functions:
                yield "signal", node.lineno, functions[func.id]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings):
            if node.value.endswith(CONTROL_FILES):
                yield "cgroupfs", node.lineno, node.value
            if node.value.endswith(EVICTION_URL):
                yield "eviction", node.lineno, node.value


def scan(paths: list[Path]) -> list[tuple[str, str, int, str]]:
    return [(kind, str(path.relative_to(PACKAGE.parent)), line, what)
            for path in paths for kind, line, what in acts(ast.parse(path.read_text(), str(path)))]


def test_nothing_outside_the_gate_signals_freezes_or_evicts() -> None:
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if GATE not in path.parents]
    assert len(outside) > 100
    acts_outside = scan(outside)
    assert [a for a in acts_outside if a[0] != "eviction"] == []
    assert {(kind, file) for kind, file, _, _ in acts_outside} == {("eviction", "gpuagent/kubeapi.py")}


def test_the_scan_sees_the_gate_act() -> None:
    where: dict[str, set[str]] = {}
    for kind, file, _, _ in scan(sorted(GATE.glob("*.py"))):
        where.setdefault(kind, set()).add(Path(file).name)
    assert where == {"signal": {"signals.py"}, "cgroupfs": {"mounts.py", "freezer.py"}}
    assert {kind for kind, *_ in scan([EVICTIONS])} == {"eviction"}


def test_the_scan_sees_aliases_and_f_strings() -> None:
    source = ('"""docstring naming cgroup.freeze"""\n'
              "import signal as s\nfrom os import kill as k\n"
              "s.pidfd_send_signal(3, 9)\nk(42, 15)\nopen(f'{d}/cgroup.freeze', 'w')\n"
              "url = f'api/v1/namespaces/{n}/pods/{p}/eviction'\ns.SIGTERM\n")
    assert sorted(acts(ast.parse(source))) == [
        ("cgroupfs", 6, "/cgroup.freeze"), ("eviction", 7, "/eviction"), ("signal", 4, "signal.pidfd_send_signal"),
        ("signal", 5, "os.kill")]
