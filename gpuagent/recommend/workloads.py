"""Which workload a pod belongs to: its owner from ``gpuagent_pod_info``, else its name without the suffix
Kubernetes generated (pure functions).

The agents put the top of a pod's controller chain on ``gpuagent_pod_info`` (``owner_kind``,
``owner_name``: Deployment, StatefulSet, CronJob, Notebook, ..., or ``Pod`` for a bare pod) when they read
the API server. Without it, the pod name is all there is, and Kubernetes builds pod names the same way
every time: a Deployment's pods are ``<deployment>-<pod-template-hash>-<5 random>``, a Job's (a DaemonSet's)
``<job>-<5 random>``, a CronJob's jobs ``<cronjob>-<scheduled minute>``, a StatefulSet's pods
``<statefulset>-<ordinal>``; the random and hash parts are drawn from an alphabet without vowels, so a word
is rarely mistaken for one. What is left is the workload's name; its kind stays unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeVar

from gpuagent.recommend.model import WorkloadKey

_Pod = TypeVar("_Pod")
# How surely a key names its workload, surest first: the owner the agents read, the one above it read from
# its name, the pod's own name, a unit (units never meet pods in one group: their namespace is "").
_SURENESS = ("api_server", "owner_name", "pod_name", "unit")

# k8s.io/apimachinery's rand.String alphabet (no vowels, no 0/1/3): generated names and template hashes
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_RANDOM_RE = re.compile(rf"^(.+)-{_SAFE}{{5}}$")
_HASH_RE = re.compile(rf"^(.+)-{_SAFE}{{6,10}}$")
_SCHEDULED_RE = re.compile(r"^(.+)-\d{8,10}$")  # a CronJob's job: minutes since the epoch
_ORDINAL_RE = re.compile(r"^(.+)-\d+$")
# Owners the agents walk past when they may: where they could not (RBAC), the name still tells the owner
# above (a Deployment's ReplicaSet is <deployment>-<hash>, a CronJob's Job <cronjob>-<minute>).
_WALKED_PAST = {"ReplicaSet": ("Deployment", _HASH_RE), "Job": ("CronJob", _SCHEDULED_RE)}


def name_without_suffix(pod: str) -> str:
    """``web-7d9c6b8f5d-x2k4p`` -> ``web``; ``nightly-29412000-h7x2k`` -> ``nightly``; ``db-2`` -> ``db``;
    a name without a generated part is kept."""
    random = _RANDOM_RE.match(pod)
    if random:
        rest = random.group(1)
        for pattern in (_HASH_RE, _SCHEDULED_RE):
            inner = pattern.match(rest)
            if inner:
                return inner.group(1)
        return rest
    ordinal = _ORDINAL_RE.match(pod)
    return ordinal.group(1) if ordinal else pod


def pod_workload(namespace: str, pod: str, owners: Iterable[tuple[str, str]] = ()) -> WorkloadKey:
    """The workload of a pod given the (owner_kind, owner_name) pairs ``gpuagent_pod_info`` had for it
    over the range (several: its owner became known during the range, or the agent's walk was refused)."""
    known = sorted({(k, n) for k, n in owners if k and n}, key=_owner_rank)
    if known:
        kind, name = known[0]
        if kind in _WALKED_PAST:
            above, pattern = _WALKED_PAST[kind]
            named = pattern.match(name)
            if named:
                return WorkloadKey(namespace, above, named.group(1), "owner_name")
        return WorkloadKey(namespace, kind, name, "api_server")
    return WorkloadKey(namespace, "", name_without_suffix(pod), "pod_name")


def _owner_rank(owner: tuple[str, str]) -> tuple[int, str, str]:
    """The walked owner before an intermediate one the walk stopped at (RBAC refused it, say)."""
    return (1 if owner[0] in _WALKED_PAST else 0, *owner)


def unit_workload(workload_kind: str, workload: str) -> WorkloadKey:
    """A workload outside Kubernetes, by its unit, container or job name as the agents found it."""
    return WorkloadKey("", workload_kind, workload, "unit")


def group_by_workload(pods: Iterable[tuple[str, WorkloadKey, _Pod]]) -> dict[WorkloadKey, dict[str, _Pod]]:
    """Pods (name, its key, what is known of it) grouped by what docs/recommend.md says a workload is:
    ``(namespace, owner kind, owner name)``. Where the owner was read from does not split a workload: one pod
    read as ``Deployment/web`` and another only as its ReplicaSet ``web-<hash>`` (the walk refused for it) are
    one Deployment, one row and one patch. The group's key is its surest (``grouped_by``: ``api_server`` when
    any pod's owner was read as that)."""
    groups: dict[tuple[bool, str, str, str], dict[str, _Pod]] = {}
    keys: dict[tuple[bool, str, str, str], WorkloadKey] = {}
    for name, key, pod in pods:
        workload = (key.is_pod, key.namespace, key.kind, key.name)
        groups.setdefault(workload, {})[name] = pod
        known = keys.get(workload)
        if known is None or _SURENESS.index(key.source) < _SURENESS.index(known.source):
            keys[workload] = key
    return {keys[workload]: members for workload, members in groups.items()}
