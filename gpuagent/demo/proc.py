"""The ``/proc`` tree of a simulated node's pods: ``<pid>/cgroup`` and ``<pid>/environ`` of each process.

The agent reads a GPU process's pod from ``<proc_root>/<pid>/cgroup`` and the evidence of its environment
from ``<proc_root>/<pid>/environ``; the simulator's made-up PIDs have neither in the real ``/proc``. This tree
gives each process of a pod's container its container's cgroup (one cgroup v2 line) and the environment a
container runtime and the NVIDIA device plugin set (``HOSTNAME`` the pod's name, ``NVIDIA_VISIBLE_DEVICES``
the UUIDs allocated), under the scenario's own ``environ:`` (an MPS client's limits, or
``NVIDIA_VISIBLE_DEVICES=all`` for a privileged container). Processes outside any pod get no entry: the
agent reads them as it reads a process whose cgroup it cannot see.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuagent.demo.node import DemoNode

Environ = Callable[[int], bytes | None]  # the simulated NVML's process_environ


def write_proc(root: Path, node: DemoNode, environ: Environ) -> Path:
    """Write the tree under ``root`` (created), returning it."""
    root.mkdir(parents=True, exist_ok=True)
    for pod in node.pods:
        for container in pod.containers:
            visible = ",".join(dict.fromkeys(d.visible_uuid for d in container.devices)) or "void"
            for pid in container.pids:
                directory = root / str(pid)
                directory.mkdir(exist_ok=True)
                (directory / "cgroup").write_text(f"0::{pod.cgroup_path(container)}\n")
                variables = {b"HOSTNAME": pod.name.encode(), b"NVIDIA_VISIBLE_DEVICES": visible.encode()}
                for entry in (environ(pid) or b"").split(b"\0"):  # the scenario's own come last and win
                    name, sep, value = entry.partition(b"=")
                    if sep:
                        variables[name] = value
                text = b"".join(name + b"=" + value + b"\0" for name, value in variables.items())
                (directory / "environ").write_bytes(text)
    return root
