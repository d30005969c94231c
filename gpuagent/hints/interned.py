"""One object for each repeated string of a decoded state: what the cluster view keeps of a state is smaller.

msgspec gives every string of every object it decodes its own copy. A state the cluster view keeps
(``hints.cluster_view``: one decoded copy per distinct state) repeats many: an 8-GPU node's NVLink peers
repeat its GPUs' UUIDs 56 times (5.7 of its 14.8 KB of hints), and models, modes, MIG profiles and tenants'
names repeat across GPUs and across states. ``shared_strings`` makes each one object (``sys.intern``), so
the view's memory is bounded per distinct state as docs/scheduling.md measures it. Apart from the view
because it is one job (a decoded state's strings) and the view's another (the list and watch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from gpuagent.snapshot.hints import GpuHints, NodeHints


def shared_strings(hints: NodeHints) -> NodeHints:
    """``hints`` (just decoded, referenced nowhere else yet) with their repeated strings made one object
    each: msgspec gives every string of every object its own copy, and an 8-GPU node's NVLink peers repeat
    its GPUs' UUIDs 56 times (5.7 of its 14.8 KB), its models, modes, MIG profiles and tenants' names and
    kinds repeat across GPUs and nodes. The values are the same, so are the hints (equal, same hash); the
    decoded objects are changed in place (``object.__setattr__``, as a frozen dataclass's own
    ``__post_init__`` would) because copying each of them would cost a distinct state several times this."""
    intern, put = sys.intern, object.__setattr__
    for gpu in hints.gpus:
        _gpu_strings(gpu, intern, put)
    return hints


def _gpu_strings(gpu: GpuHints, intern: Callable[[str], str], put: Callable[[object, str, object], None]
                 ) -> None:
    for name in ("uuid", "model", "health", "sharing_mode", "compute_mode", "fault"):
        value = getattr(gpu, name)
        if type(value) is str:
            put(gpu, name, intern(value))
    put(gpu, "nvlink_peers", tuple(map(intern, gpu.nvlink_peers)))
    for tenant in gpu.tenants:
        put(tenant, "name", intern(tenant.name))
        put(tenant, "kind", intern(tenant.kind))
        if type(tenant.mig_instance) is str:
            put(tenant, "mig_instance", intern(tenant.mig_instance))
    for instance in gpu.mig_instances:
        put(instance, "uuid", intern(instance.uuid))
        put(instance, "profile", intern(instance.profile))
        put(instance, "tenants", tuple(map(intern, instance.tenants)))
    for profile in gpu.free_mig_profiles:
        put(profile, "profile", intern(profile.profile))
        put(profile, "idle_instances", tuple(map(intern, profile.idle_instances)))
