"""The GPU request of a Pod, from the full v1 Pod JSON kube-scheduler sends an extender.

Count: per resource name, the pod's effective request as kube-scheduler computes it: the sum over
``spec.containers`` (plus restartable init containers, i.e. sidecars), or the largest single init container
(plus the sidecars started before it) when that is larger. A container's count is its ``requests`` entry,
else its ``limits`` entry (the API server defaults requests from limits for extended resources).

- The configured GPU resource names (default ``nvidia.com/gpu``) count whole GPUs.
- ``nvidia.com/mig-<profile>`` (MIG "mixed" strategy) counts MIG instances of that profile.
- GPUs asked for through DRA ResourceClaims (``gpuagent.hints.claims``, read by the extender) are added by
  the caller as ``claims``: whole GPUs, or MIG devices of a profile, counted like the resources above.

Annotations (only those the placement depends on; the agent reports the others):

- ``gpuagent.io/gpu-share`` (``30`` or ``30%``): the share of one GPU's SM time the pod needs; without it
  the pod wants its GPUs exclusively.
- ``gpuagent.io/gpu-memory`` (``8Gi``): the GPU memory it needs free on each GPU.
- ``gpuagent.io/placement`` (``binpack`` or ``spread``): prefer the node whose GPUs are fullest (the
  default: keeps whole GPUs free for exclusive pods) or emptiest (less contention for a latency-bound pod).

The values are parsed by the parsers the enforcer uses (``gpuagent.quantities``), so the extender and the
agent read an annotation the same way. A bad value raises ``PodRequestError`` naming the annotation: the
extender then filters the pod from every node with that reason (reported, never guessed). A Pod whose
structure is not a Pod (``spec.containers`` missing, a container's ``resources`` not a mapping) raises
``MalformedPod``: that is a malformed request, answered with a 400.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuagent.hints.fitrequest import FitRequest, RequestError, parse_fit_request
from gpuagent.hints.malformed import MalformedPod, json_kind
from gpuagent.quantities import PolicyValueError, parse_memory, parse_share

# The annotation contract (DESIGN.md); the enforcer reads the first two with the same parsers.
ANNOTATION_SHARE = "gpuagent.io/gpu-share"
ANNOTATION_MEMORY = "gpuagent.io/gpu-memory"
ANNOTATION_PLACEMENT = "gpuagent.io/placement"
PLACEMENTS = ("binpack", "spread")
DEFAULT_GPU_RESOURCE_NAMES = ("nvidia.com/gpu",)
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

if TYPE_CHECKING:
    from gpuagent.hints.claims import ClaimGpus

_COUNT_RE = re.compile(r"\+?[0-9]{1,9}", re.ASCII)  # extended resources are whole numbers


class PodRequestError(RequestError):
    """A pod whose GPU request cannot be read: a bad annotation value or resource count."""


@dataclass(frozen=True, slots=True)
class PodGpuCount:
    """The pod's effective GPU count per resource name (only names with a count above zero)."""

    by_resource: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_resource.values())


def pod_fit_request(
    pod: Any, *, gpu_resource_names: Sequence[str] = DEFAULT_GPU_RESOURCE_NAMES, field: str = "Pod",
    claims: ClaimGpus | None = None,
) -> FitRequest | None:
    """The ``FitRequest`` of ``pod`` (a v1 Pod as JSON), or None when it requests no GPU. ``claims``: the
    GPUs its ResourceClaims ask for, when they were read.

    Raises ``MalformedPod`` for a body that is not a Pod and ``PodRequestError`` for a bad value.
    """
    if not isinstance(pod, Mapping):
        raise MalformedPod(field, f"expected a Pod object, got {json_kind(pod)}")
    counts = gpu_counts(pod, gpu_resource_names=gpu_resource_names, field=field)
    dra = {kind: n for kind, n in (claims.by_kind.items() if claims is not None else ()) if n > 0}
    if not counts.by_resource and not dra:
        return None
    gpus, mig_profile = _one_kind(counts, gpu_resource_names, field, dra)
    annotations = _annotations(pod, field)
    share = _annotation(annotations, ANNOTATION_SHARE, parse_share, field)
    memory = _annotation(annotations, ANNOTATION_MEMORY, parse_memory, field)
    placement = _annotation(annotations, ANNOTATION_PLACEMENT, _parse_placement, field)
    body: dict[str, Any] = {"gpus": gpus, "policy": placement or "binpack"}
    if mig_profile is not None:
        body["mig_profile"] = mig_profile
    elif share is None:
        body["exclusive"] = True
    if share is not None:
        body["share"] = share
    if memory is not None:
        body["memory"] = memory
    try:  # the scorer's own checks, so a pod and a /v1/hints/score body are held to the same rules
        return parse_fit_request(body)
    except RequestError as err:
        raise PodRequestError(_request_field(err.field, field, counts), err.message) from None


def gpu_counts(
    pod: Mapping[str, Any],
    *,
    gpu_resource_names: Sequence[str] = DEFAULT_GPU_RESOURCE_NAMES,
    field: str = "Pod",
) -> PodGpuCount:
    """The pod's effective count of every GPU resource (configured names and ``nvidia.com/mig-*``)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise MalformedPod(f"{field}.spec", f"expected a PodSpec object, got {json_kind(spec)}")
    containers = _containers(spec, "containers", f"{field}.spec", required=True)
    init_containers = _containers(spec, "initContainers", f"{field}.spec", required=False)
    names = frozenset(gpu_resource_names)

    total: dict[str, int] = {}
    for path, container in containers:
        _add(total, _container_counts(container, names, path))
    sidecars: dict[str, int] = {}
    largest_init: dict[str, int] = {}
    for path, container in init_containers:
        counts = _container_counts(container, names, path)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside the app containers
            _add(sidecars, counts)
            _add(total, counts)
        else:  # runs alone (with the sidecars started so far)
            for name in set(counts) | set(sidecars):
                largest_init[name] = max(
                    largest_init.get(name, 0), counts.get(name, 0) + sidecars.get(name, 0)
                )
    effective = {
        name: max(total.get(name, 0), largest_init.get(name, 0)) for name in set(total) | set(largest_init)
    }
    return PodGpuCount({name: count for name, count in sorted(effective.items()) if count > 0})


def is_gpu_resource(name: str, gpu_resource_names: Iterable[str] = DEFAULT_GPU_RESOURCE_NAMES) -> bool:
    return name in gpu_resource_names or (
        name.startswith(MIG_RESOURCE_PREFIX) and len(name) > len(MIG_RESOURCE_PREFIX)
    )


def pod_name(pod: Any) -> str:
    """``namespace/name`` of a Pod JSON, for logs; ``?`` for what is missing."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"


# --- helpers ------------------------------------------------------------------------------------------------


def _containers(
    spec: Mapping[str, Any], key: str, field: str, *, required: bool
) -> list[tuple[str, Mapping]]:
    value = spec.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise MalformedPod(f"{field}.{key}",
                           f"expected a non-empty list of containers, got {json_kind(value)}")
    out = []
    for index, container in enumerate(value):
        if not isinstance(container, Mapping):
            raise MalformedPod(
                f"{field}.{key}[{index}]", f"expected a container object, got {json_kind(container)}"
            )
        out.append((f"{field}.{key}[{index}]", container))
    return out


def _container_counts(container: Mapping[str, Any], names: frozenset[str], path: str) -> dict[str, int]:
    resources = container.get("resources")
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise MalformedPod(
            f"{path}.resources", f"expected a ResourceRequirements object, got {json_kind(resources)}"
        )
    found: dict[str, dict[str, int]] = {}
    for kind in ("requests", "limits"):
        amounts = resources.get(kind)
        if amounts is None:
            continue
        if not isinstance(amounts, Mapping):
            raise MalformedPod(
                f"{path}.resources.{kind}", f"expected a map of quantities, got {json_kind(amounts)}"
            )
        for name, value in amounts.items():
            if isinstance(name, str) and is_gpu_resource(name, names):
                found.setdefault(name, {})[kind] = _count(value, f'{path}.resources.{kind}["{name}"]')
    counts = {}
    for name, by_kind in found.items():
        request, limit = by_kind.get("requests"), by_kind.get("limits")
        if request is not None and limit is not None and request != limit:
            raise PodRequestError(
                f'{path}.resources.requests["{name}"]',
                f"request {request} differs from limit {limit}; an extended resource's must be equal",
            )
        counts[name] = request if request is not None else limit  # type: ignore[assignment]
    return counts


def _count(value: Any, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9:
        return value
    if isinstance(value, str) and _COUNT_RE.fullmatch(value.strip()):
        return int(value.strip())
    raise PodRequestError(field, f'expected a whole number of devices like "1", got {value!r}'[:200])


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, count in counts.items():
        into[name] = into.get(name, 0) + count


def _one_kind(
    counts: PodGpuCount, gpu_resource_names: Sequence[str], field: str,
    dra: Mapping[str | None, int] | None = None,
) -> tuple[int, str | None]:
    """(count, MIG profile or None): the scorer places one kind of device per pod. A kind asked for both as
    a resource and through ResourceClaims adds up."""
    by_kind: dict[str | None, int] = {}
    names: dict[str | None, list[str]] = {}
    for name, count in counts.by_resource.items():
        kind = None if name in gpu_resource_names else name[len(MIG_RESOURCE_PREFIX) :]
        by_kind[kind] = by_kind.get(kind, 0) + count
        names.setdefault(kind, []).append(name)
    for kind, count in (dra or {}).items():
        by_kind[kind] = by_kind.get(kind, 0) + count
        names.setdefault(kind, []).append(f"ResourceClaims: {kind or 'whole GPUs'}")
    if len(by_kind) > 1 or len(counts.by_resource) > 1:
        kinds = ", ".join(n for kind_names in names.values() for n in kind_names)
        raise PodRequestError(
            f"{field}.spec",
            f"requests more than one kind of GPU device ({kinds}); gpuagent places one kind per pod",
        )
    ((kind, count),) = by_kind.items()
    return count, kind


def _annotations(pod: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise MalformedPod(f"{field}.metadata", f"expected an ObjectMeta object, got {json_kind(meta)}")
    annotations = meta.get("annotations")
    if annotations is None:
        return {}
    if not isinstance(annotations, Mapping):
        raise MalformedPod(
            f"{field}.metadata.annotations", f"expected a map of strings, got {json_kind(annotations)}"
        )
    return annotations


def _annotation(annotations: Mapping[str, Any], key: str, parse: Any, field: str) -> Any:
    value = annotations.get(key)
    if value is None:
        return None
    where = f'{field}.metadata.annotations["{key}"]'
    if not isinstance(value, str):
        raise PodRequestError(where, f"expected a string, got {json_kind(value)}")
    try:
        return parse(value)
    except PolicyValueError as err:
        raise PodRequestError(where, err.message) from None


def _parse_placement(value: str) -> str:
    text = value.strip().lower()
    if text not in PLACEMENTS:
        raise PolicyValueError(f"expected binpack or spread, got {value[:64]!r}")
    return text


def _request_field(request_field: str, field: str, counts: PodGpuCount) -> str:
    """Where the scorer's complaint about a request field came from in the pod."""
    annotation = {"share": ANNOTATION_SHARE, "memory": ANNOTATION_MEMORY, "policy": ANNOTATION_PLACEMENT}
    if request_field in annotation:
        return f'{field}.metadata.annotations["{annotation[request_field]}"]'
    if not counts.by_resource:
        return f"{field}.spec.resourceClaims"
    return f"{field}.spec (resources {', '.join(counts.by_resource)})"
