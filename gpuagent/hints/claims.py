"""A pod's GPUs asked for through DRA ResourceClaims, as far as the extender can judge them.

A pod names its claims in ``spec.resourceClaims``: each an existing ResourceClaim (``resourceClaimName``) or a
ResourceClaimTemplate the control plane instantiates for it (``resourceClaimTemplateName``). A claim's
``spec.devices.requests`` (``resource.k8s.io/v1``) ask for devices of a DeviceClass, ``exactly`` (a count, or
all that match) or the ``firstAvailable`` of several alternatives. Only requests of the configured GPU device
classes count (NVIDIA's ``gpu.nvidia.com`` for whole GPUs and ``mig.nvidia.com`` for MIG devices by default):
another driver's claim (a NIC) is none of the extender's business.

What is understood: an ``exactly`` request of a GPU class with ``allocationMode: ExactCount`` (``count``,
default 1) is that many whole GPUs; of a MIG class, that many MIG devices of the profile its CEL selectors
name (``device.attributes['gpu.nvidia.com'].profile == '1g.10gb'``). Other selectors (product name, memory,
PCIe root) are left to kube-scheduler's DRA plugin, which has filtered the candidate nodes on them before the
extender is called. ``adminAccess`` requests (monitoring, not allocation) are not counted.

What cannot be judged raises :class:`Unjudged` with the reason, and the extender then passes the pod on every
node (kube-scheduler's DRA plugin still allocates it): ``allocationMode: All`` (as many as match on the node),
``firstAvailable`` among GPU alternatives (the plugin picks), a MIG request without a recognisable profile, a
claim that is already allocated (its devices, and so its node, are fixed), a claim that cannot be read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuagent.hints.malformed import MalformedPod, json_kind

DEFAULT_GPU_CLASSES = ("gpu.nvidia.com",)
DEFAULT_MIG_CLASSES = ("mig.nvidia.com",)
CLAIM = "resourceclaims"
TEMPLATE = "resourceclaimtemplates"
# device.attributes['gpu.nvidia.com'].profile == '1g.10gb' (either quote, either order of the comparison)
_PROFILE = re.compile(r"""\.profile\s*==\s*["']([0-9]+g\.[0-9]+gb(?:\+[a-z]+)?)["']"""
                      r"""|["']([0-9]+g\.[0-9]+gb(?:\+[a-z]+)?)["']\s*==\s*[^=]*\.profile\b""")


class Unjudged(Exception):
    """The pod's GPU claims cannot be judged here; ``category`` is a short label for the metric."""

    def __init__(self, category: str, reason: str) -> None:
        super().__init__(reason)
        self.category = category
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One entry of ``spec.resourceClaims``: which object to read."""

    kind: str  # CLAIM or TEMPLATE (the API's plural resource names)
    namespace: str
    name: str
    field: str  # where in the ExtenderArgs, for messages

    @property
    def label(self) -> str:
        what = "ResourceClaim" if self.kind == CLAIM else "ResourceClaimTemplate"
        return f"{what} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimGpus:
    """GPU devices asked for: count by kind (None: whole GPUs; a MIG profile such as "1g.10gb")."""

    by_kind: Mapping[str | None, int]

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def claim_refs(pod: Mapping[str, Any], field: str = "Pod") -> tuple[ClaimRef, ...]:
    """The claims ``pod`` names; raises MalformedPod for a ``spec.resourceClaims`` that is not one."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    entries = spec.get("resourceClaims")
    if entries is None:
        return ()
    where = f"{field}.spec.resourceClaims"
    if not isinstance(entries, list):
        raise MalformedPod(where, f"expected a list of PodResourceClaims, got {json_kind(entries)}")
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    refs = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise MalformedPod(at, f"expected a PodResourceClaim object, got {json_kind(entry)}")
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if (claim is None) == (template is None):
            raise MalformedPod(at, "expected exactly one of resourceClaimName and resourceClaimTemplateName")
        name = claim if claim is not None else template
        if not isinstance(name, str) or not name:
            raise MalformedPod(at, f"expected a claim or template name, got {json_kind(name)}")
        if not namespace:
            raise MalformedPod(f"{field}.metadata.namespace", "a pod with resourceClaims needs its namespace")
        refs.append(ClaimRef(CLAIM if claim is not None else TEMPLATE, namespace, name, at))
    return tuple(refs)


def object_gpus(
    ref: ClaimRef, obj: Mapping[str, Any], *, gpu_classes: Sequence[str] = DEFAULT_GPU_CLASSES,
    mig_classes: Sequence[str] = DEFAULT_MIG_CLASSES,
) -> ClaimGpus:
    """The GPUs a ResourceClaim or ResourceClaimTemplate (as the API server returns it) asks for."""
    if ref.kind == CLAIM:
        status = obj.get("status")
        if isinstance(status, Mapping) and status.get("allocation"):
            raise Unjudged("allocated", f"{ref.label} is already allocated: its devices, and so its node, "
                           "are fixed (kube-scheduler's DRA plugin keeps the pod with them)")
        spec = obj.get("spec")
    else:
        outer = obj.get("spec")
        spec = outer.get("spec") if isinstance(outer, Mapping) else None
    if not isinstance(spec, Mapping):
        raise Unjudged("unreadable", f"{ref.label}: no claim spec in what the API server returned")
    return spec_gpus(spec, ref.label, gpu_classes=gpu_classes, mig_classes=mig_classes)


def spec_gpus(
    spec: Mapping[str, Any], label: str, *, gpu_classes: Sequence[str] = DEFAULT_GPU_CLASSES,
    mig_classes: Sequence[str] = DEFAULT_MIG_CLASSES,
) -> ClaimGpus:
    """The GPUs of a ResourceClaimSpec's device requests; raises Unjudged for what cannot be judged."""
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    by_kind: dict[str | None, int] = {}
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        if not isinstance(request, Mapping):
            continue
        name = request.get("name") or f"requests[{i}]"
        where = f"{label} request {name}"
        alternatives = request.get("firstAvailable")
        if isinstance(alternatives, list):
            classes = [a.get("deviceClassName") for a in alternatives if isinstance(a, Mapping)]
            if any(c in gpu_classes or c in mig_classes for c in classes):
                raise Unjudged("first_available", f"{where}: firstAvailable among GPU alternatives: "
                               "kube-scheduler's DRA plugin picks which one")
            continue
        exactly = request.get("exactly")
        body = exactly if isinstance(exactly, Mapping) else request  # v1beta1 put the fields on the request
        kind = _request_kind(body, where, gpu_classes, mig_classes)
        if kind is _NOT_A_GPU or body.get("adminAccess") is True:
            continue
        mode = body.get("allocationMode") or "ExactCount"
        if mode != "ExactCount":
            raise Unjudged("all_devices", f"{where}: allocationMode {mode}: as many GPUs as match on the "
                           "node, which kube-scheduler's DRA plugin decides")
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise Unjudged("unreadable", f"{where}: count {count!r} is not a whole number >= 1")
        by_kind[kind] = by_kind.get(kind, 0) + count
    return ClaimGpus(by_kind)


_NOT_A_GPU: Any = object()


def _request_kind(
    body: Mapping[str, Any], where: str, gpu_classes: Sequence[str], mig_classes: Sequence[str]
) -> str | None:
    """None for whole GPUs, a MIG profile, or _NOT_A_GPU."""
    device_class = body.get("deviceClassName")
    if device_class in gpu_classes:
        return None
    if device_class not in mig_classes:
        return _NOT_A_GPU
    profiles = set()
    for selector in body.get("selectors") or ():
        expression = selector.get("cel", {}).get("expression") if isinstance(selector, Mapping) else None
        if isinstance(expression, str):
            profiles.update(a or b for a, b in _PROFILE.findall(expression))
    if len(profiles) != 1:
        found = f"{len(profiles)} profiles ({', '.join(sorted(profiles))})" if profiles else "no profile"
        raise Unjudged("mig_profile", f"{where}: a {device_class} request whose selectors name {found}; "
                       "the profile must be one, as device.attributes['gpu.nvidia.com'].profile == '1g.10gb'")
    return profiles.pop()
