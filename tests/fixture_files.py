"""Where the committed test inputs live (``tests/fixtures/``), and loaders for the Kubernetes bodies.

Every test reads its fixtures from inside the repository, so a clone anywhere runs the whole suite; where the
real-world ones came from is in ``tests/fixtures/README.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CGROUP = FIXTURES / "cgroup"
KUBERNETES = FIXTURES / "kubernetes"
PUBLISHED = FIXTURES / "published"  # GPUNodeState objects as an agent of an earlier version wrote them


def kubernetes_body(name: str) -> Any:
    """A fresh copy of ``tests/fixtures/kubernetes/<name>`` (callers may mutate it)."""
    return json.loads((KUBERNETES / name).read_text())


def filter_request() -> dict[str, Any]:
    """The ExtenderArgs kube-scheduler sends with ``nodeCacheCapable: true``: a full Pod and ``NodeNames``
    (``Nodes`` null)."""
    return kubernetes_body("extender-filter-request.json")
