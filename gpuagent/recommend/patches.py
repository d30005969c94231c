"""``--patch DIR``: one YAML patch per workload whose recommendation changes what it asks for.

Each patch is a strategic-merge patch of the workload's own object (``apiVersion``, ``kind``, ``metadata``
name and namespace, then only what changes), so it works both ways::

    kubectl patch deployment llm-api -n serving --type strategic --patch-file serving.deployment.llm-api.yaml
    # or, with kustomize: the directory is a Component (its kustomization.yaml lists every patch)

What a patch sets, on the pod template (``spec.template``; a CronJob's ``spec.jobTemplate.spec.template``;
a bare Pod's own metadata):

- share: the ``gpuagent.io/gpu-share`` and ``gpuagent.io/gpu-memory`` annotations;
- MPS: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in each GPU
  container's environment, and ``gpuagent.io/gpu-memory``;
- MIG: each GPU container's limits and requests: ``nvidia.com/mig-<profile>`` instead of ``nvidia.com/gpu``
  (``null`` removes a key in a strategic merge);
- needs more: the raised annotation, or the larger MIG profile.

None for: keep, release (a process change, not a field), too little history, workloads outside Kubernetes,
owners that are not built-in kinds (their pod template is theirs to say), workloads grouped by pod name
(their kind is unknown), and container changes without the containers' names or on a bare Pod (whose
containers cannot change). :func:`write_patches` says why for each.

Every name in a patch comes from Prometheus label values, which any scrape target can set: the namespace,
the owner's name, the containers' and the MIG profile's. Each is checked as the API server would check it
(``gpuagent.untrusted``) before it names a file or goes into a patch; a workload with one that fails is
refused (:class:`Refused`), never written under some other name, and listed (:func:`refused`: on stderr
and in the JSON). File names are built from the checked names only; the YAML, the header comment included,
is written by the serializer alone.

DIR may be shared, or writable by someone else: a path checked and then opened again follows whatever link
was put there in between (11 of 3,000 writes of ``kustomization.yaml`` landed outside with a link flipping
beside them). So DIR is opened once, and every file is written relative to that descriptor: created under
a new temporary name (``O_CREAT | O_EXCL | O_NOFOLLOW``: never through a link, never over a file), then
renamed over its name in the same directory, which replaces a link there rather than following it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuagent.prom.errors import ReportError
from gpuagent.recommend.model import Action, Row
from gpuagent.untrusted import (
    NAME_MAX_BYTES,
    k8s_name_problem,
    qualified_name_problem,
    yaml_comment,
    yaml_text,
)

API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
                "ReplicaSet": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1", "Pod": "v1"}
KUSTOMIZATION = "kustomization.yaml"


@dataclass(frozen=True)
class Patch:
    row: Row
    file_name: str
    text: str


class Refused(str):
    """Why a workload gets no patch when the reason is a name Kubernetes would refuse (counted apart: one
    warning for them all, not one line each)."""


def patch_for(row: Row) -> Patch | str:
    """The patch of ``row``'s workload, or why there is none."""
    key, rec = row.stats.key, row.recommendation
    changes = bool(rec.annotations or rec.env or rec.resources)
    if rec.action not in (Action.SHARE, Action.MPS, Action.MIG, Action.NEEDS_MORE) or not changes:
        return f"nothing to set ({rec.short})"
    if not key.is_pod:
        return f"not a Kubernetes workload ({key.kind})"
    if not key.kind:
        return "grouped by pod name: its owner's kind is unknown"
    if key.kind not in API_VERSIONS:
        return f"a {key.kind} is not a built-in kind: set {_what(row)} on its pod template"
    containers = row.stats.containers
    if (rec.env or rec.resources) and key.kind == "Pod":
        return f"a bare Pod's containers cannot change: recreate it with {_what(row)}"
    if (rec.env or rec.resources) and not containers:
        return f"no container names in Prometheus: set {_what(row)} by hand"
    problem = names_problem(row)
    if problem is not None:
        return Refused(problem)
    body = {"apiVersion": API_VERSIONS[key.kind], "kind": key.kind,
            "metadata": {"name": key.name, "namespace": key.namespace}}
    template: dict[str, Any] = {}
    if rec.annotations:
        template["metadata"] = {"annotations": dict(rec.annotations)}
    if rec.env or rec.resources:
        template["spec"] = {"containers": [_container(name, row) for name in containers]}
    if key.kind == "Pod":
        body["metadata"]["annotations"] = dict(rec.annotations)
    elif key.kind == "CronJob":
        body["spec"] = {"jobTemplate": {"spec": {"template": template}}}
    else:
        body["spec"] = {"template": template}
    file_name = _file_name(key.namespace, key.kind, key.name)
    header = {"gpuagent recommend": str(key), "recommendation": rec.short, "why": rec.reason,
              "apply": f"kubectl patch {key.kind.lower()} {key.name} -n {key.namespace} --type strategic "
                       f"--patch-file {file_name}"}
    return Patch(row, file_name, yaml_comment(header, width=100) + yaml_text(body))


def names_problem(row: Row) -> str | None:
    """The first name in ``row``'s patch that Kubernetes would refuse, and why; None when all pass."""
    key, rec = row.stats.key, row.recommendation
    containers = row.stats.containers if (rec.env or rec.resources) else ()
    checks = [k8s_name_problem("Namespace", key.namespace), k8s_name_problem(key.kind, key.name),
              *(k8s_name_problem("Container", c) for c in containers),
              *(qualified_name_problem(k) for k in (*rec.annotations, *rec.resources))]
    return next((problem for problem in checks if problem is not None), None)


def _file_name(namespace: str, kind: str, name: str) -> str:
    """``<namespace>.<kind>.<name>.yaml`` of checked names (no '/', no '..' component: a DNS-1123 name has
    neither); when a 253-character name would pass the file system's limit, its hash stands for it."""
    file_name = f"{namespace}.{kind.lower()}.{name}.yaml"
    if len(file_name.encode()) <= NAME_MAX_BYTES:
        return file_name
    return f"{namespace}.{kind.lower()}.{hashlib.sha256(name.encode()).hexdigest()[:32]}.yaml"


def _what(row: Row) -> str:
    rec = row.recommendation
    parts = [f"{k}={v}" for k, v in rec.annotations.items()] + [f"{k}={v}" for k, v in rec.env.items()]
    parts += [f"limits {k}: {'(removed)' if v is None else v}" for k, v in rec.resources.items()]
    return ", ".join(parts)


def _container(name: str, row: Row) -> dict[str, Any]:
    rec = row.recommendation
    container: dict[str, Any] = {"name": name}
    if rec.env:
        container["env"] = [{"name": k, "value": v} for k, v in rec.env.items()]
    if rec.resources:  # quantities as strings, as the API server writes them back; None removes a key
        quantities = {k: None if v is None else str(v) for k, v in rec.resources.items()}
        container["resources"] = {"limits": quantities, "requests": dict(quantities)}
    return container


def refused(rows: Iterable[Row]) -> list[tuple[Row, Refused]]:
    """The workloads that get no patch because Kubernetes would refuse one of their names, with why."""
    out = []
    for row in rows:
        patch = patch_for(row)
        if isinstance(patch, Refused):
            out.append((row, patch))
    return out


def write_patches(rows: Iterable[Row], directory: Path) -> tuple[list[Patch], list[tuple[Row, str]]]:
    """Every patch written under ``directory`` (created if missing) with a kustomize Component listing
    them; and the workloads without one, with the reason. Every file goes through one descriptor of the
    directory, without following links (:func:`_write_at`)."""
    written: list[Patch] = []
    skipped: list[tuple[Row, str]] = []
    patches = []
    for row in rows:
        patch = patch_for(row)
        if isinstance(patch, str):
            skipped.append((row, patch))
        else:
            patches.append(patch)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _opened(directory) as dir_fd:
            names: set[str] = set()
            for patch in patches:
                if patch.file_name in names or patch.file_name == KUSTOMIZATION:  # one workload, one file
                    skipped.append((patch.row, f"a second workload named as {patch.file_name}"))
                    continue
                _write_at(dir_fd, patch.file_name, patch.text)
                names.add(patch.file_name)
                written.append(patch)
            component = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
                         "patches": [{"path": p.file_name} for p in written]}
            _write_at(dir_fd, KUSTOMIZATION,
                      "# gpuagent recommend's patches: add this directory under `components:` of a "
                      "kustomization\n" + yaml_text(component))
    except ValueError as err:
        raise ReportError(f"--patch: {err}") from None
    except OSError as err:
        raise ReportError(f"--patch: cannot write in {directory}: {err.strerror or err}") from None
    return written, skipped


@contextlib.contextmanager
def _opened(directory: Path) -> Iterator[int]:
    """A descriptor of ``directory`` (the operator's path, links in it followed once, here), closed after."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _write_at(dir_fd: int, name: str, text: str) -> None:
    """``text`` as the file ``name`` of the directory ``dir_fd``: written to a new temporary file there
    (created exclusively, no link followed), then renamed over ``name`` (a link named so is replaced, not
    followed). ``name`` is one plain name: it was built from checked names."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a plain file name")
    temporary = f".gpuagent-patch-{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                 dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
