"""Real agent processes for the items (``python -m gpuagent run``, as a node runs it) and what they serve.

The agent reads the real driver (``backend: nvml``) or, on the simulator, a scenario naming the tenants' real
PIDs, whose simulated GPU use follows their CPU progress. Pods are known by their UID (no API server, no
kubelet socket); the network source is off (not what is proven here, and pyroute2 may not be installed on a
lent machine).
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpucheck.tenants import QUEUE_SECONDS, Tenant

Samples = list[tuple[str, dict[str, str], float]]
WAITING = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})  # the XID thread's wait: not lock time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_config(backend: str, workdir: Path, name: str, tenants: list[Tenant],
                 memory: dict[str, str] | None = None, **settings: Any) -> dict[str, Any]:
    """The config of one agent run; on the simulator, with a scenario of ``tenants`` (GPU memory from
    ``memory`` by tenant name, 1 GiB otherwise)."""
    config: dict[str, Any] = {
        "backend": backend, "listen": f"127.0.0.1:{free_port()}", "hostname": "gpu-check",
        "journal_path": str(workdir / f"journal-{name}.json"), "network": False, "kubernetes_api": "off",
        "pod_resources_socket": None, "idle_events": "off",
    }
    if backend == "sim":
        scenario = workdir / f"scenario-{name}.yaml"
        scenario.write_text(yaml.safe_dump({
            "version": 1, "name": f"gpu-check-{name}", "gpus": [{"model": "H100-SXM5-80GB"}],
            "processes": [
                {"pid": t.pid, "name": t.name, "gpu": 0, "memory": (memory or {}).get(t.name, "1Gi"),
                 "sm_util": {"follow_cpu": {"scale": 1.0, "queue_seconds": QUEUE_SECONDS.get(t.kind, 0.2)}}}
                for t in tenants
            ],
        }))
        config["scenario"] = str(scenario)
    return {**config, **settings}


def share_policies(tenants: list[Tenant], shares: list[int]) -> list[dict[str, Any]]:
    return [{"match_pod": t.uid, "gpu_share": share} for t, share in zip(tenants, shares, strict=True)]


def get_json(runner: Any, path: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(f"http://{runner.target}{path}", timeout=timeout) as response:
        return json.loads(response.read())


def parse_metrics(text: str) -> Samples:
    """(name, labels, value) of every sample of a Prometheus text exposition."""
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels``; None when there is none."""
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None


def nvml_seconds(samples: Samples) -> dict[str, tuple[float, float]]:
    """function -> (seconds, calls) inside NVML so far, the XID thread's wait left out."""
    sums = {lab.get("function", ""): v for n, lab, v in samples
            if n == "gpuagent_nvml_call_duration_seconds_sum"}
    counts = {lab.get("function", ""): v for n, lab, v in samples
              if n == "gpuagent_nvml_call_duration_seconds_count"}
    return {f: (s, counts.get(f, 0.0)) for f, s in sums.items() if f not in WAITING}
