"""What decoding one published ``GPUNodeState`` costs the extender, per node kind, and where the time goes.

Used by ``bench_cluster_view.py`` (every run prints the per-kind cost; ``--decode`` runs this part alone).
With a baseline (``--baseline REF``), ``gpuagent/hints/published.py`` as it is at that git revision is
loaded beside the working tree's and the two decode the same objects in alternating rounds (the order
flips every round), so a shared machine's load falls on both alike; each figure is the median of the
rounds' microseconds per object. It also counts the distinct verdict keys each version gives modelled
fleets (``fleet_objects``): nodes of the three kinds, each with its own name and GPU and MIG UUIDs, then also
its own memory use, then also its own pods (``VARIATIONS``), half of them with their first GPU's free
memory and share drawn.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuagent.hints import published
from gpuagent.hints.codec import hints_from_jsonable
from gpuagent.hints.published import Generation, decode_state, project, state_object
from gpuagent.hints.verdict_key import kind_keys, verdict_key

try:  # since snapshot.py was split into a package; a bench_extender --baseline tree from before has it there
    from gpuagent.snapshot.hints import GpuHints, NodeHints
except ImportError:
    from gpuagent.snapshot import GpuHints, NodeHints  # type: ignore[attr-defined,no-redef]

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("8xH100, 64 processes", "A100 MIG", "laptop 1 GPU")
STEP = 256 * 2**20  # the published memory step (``published.Steps``)


def encoded(hints: NodeHints, node: str = "n") -> bytes:
    """The object as the API server sends it (compact JSON)."""
    body = state_object(node, hints, Generation(1, 1), time.time())
    return json.dumps(body, separators=(",", ":")).encode()


def kind_objects(bodies: list[dict[str, Any]]) -> dict[str, bytes]:
    return {name: encoded(project(hints_from_jsonable(body), None))
            for name, body in zip(KINDS, bodies, strict=True)}


def per_object_us(decode: Callable[[bytes], object], raw: bytes, count: int) -> float:
    """Wall microseconds per call."""
    return timed(decode, raw, count)[0]


def timed(decode: Callable[[bytes], object], raw: bytes, count: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call: the CPU time is this thread's, so time spent descheduled on a
    busy machine is left out of it."""
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(count):
        decode(raw)
    return (time.perf_counter() - started) / count * 1e6, (time.thread_time() - cpu) / count * 1e6


def decode_costs(bodies: list[dict[str, Any]], rounds: int = 2000) -> dict[str, Any]:
    """The working tree's cost per object and kind, with the two parts of it: msgspec's pass over the
    object (``published._wire``) and the verdict key."""
    wire = published._wire()
    out = {}
    for name, raw in kind_objects(bodies).items():
        hints = decode_state(raw).hints
        key = per_object_us(lambda _, hints=hints: verdict_key(hints), raw, rounds)  # type: ignore[misc]
        out[name] = {"us_per_object": round(per_object_us(decode_state, raw, rounds), 1),
                     "msgspec_us": round(per_object_us(wire.obj.decode, raw, rounds), 1),
                     "verdict_key_us": round(key, 1),
                     "object_bytes": len(raw)}
    return out


def baseline_module(ref: str) -> types.ModuleType:
    """``gpuagent/hints/published.py`` at git revision ``ref``, loaded as a module of its own (its imports
    resolve against the working tree)."""
    path = "gpuagent/hints/published.py"
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cannot read {path} at {ref!r}: {done.stderr.strip()}")
    module = types.ModuleType(f"published_at_{ref}")
    module.__file__ = f"{ref}:{path}"
    sys.modules[module.__name__] = module  # dataclasses look their module up by name
    exec(compile(done.stdout, module.__file__, "exec"), module.__dict__)  # our own file, as it was at ``ref``
    return module


def side_by_side(bodies: list[dict[str, Any]], ref: str, *, rounds: int = 21, count: int = 300
                 ) -> dict[str, Any]:
    """Median microseconds per object (wall, and this thread's CPU) at ``ref`` and in the working tree,
    alternating rounds."""
    old = baseline_module(ref)
    out: dict[str, Any] = {}
    for name, raw in kind_objects(bodies).items():
        if old.decode_state(raw).hints != decode_state(raw).hints:
            raise SystemExit(f"{name}: the two versions decode the object differently")
        wall: dict[str, list[float]] = {"baseline": [], "now": []}
        cpu: dict[str, list[float]] = {"baseline": [], "now": []}
        pairs = [("baseline", old.decode_state), ("now", decode_state)]
        for r in range(rounds):
            for label, decode in pairs if r % 2 == 0 else reversed(pairs):
                spent = timed(decode, raw, count)
                wall[label].append(spent[0])
                cpu[label].append(spent[1])
        row = {f"{label}_{what}": round(statistics.median(figures[label]), 1)
               for what, figures in (("us", wall), ("cpu_us", cpu)) for label in ("baseline", "now")}
        out[name] = {**row, "ratio": round(row["baseline_us"] / row["now_us"], 2),
                     "cpu_ratio": round(row["baseline_cpu_us"] / row["now_cpu_us"], 2),
                     "object_bytes": len(raw)}
    return {"baseline": ref, "rounds": rounds, "objects_per_round": count, "kinds": out}


@dataclasses.dataclass(frozen=True)
class Variation:
    """How the nodes of a modelled fleet differ, beyond their names and GPU and MIG UUIDs."""

    memory: bool  # memory use of their GPUs, tenants (within their limits) and MIG instances
    pods: bool  # their own pods on their GPUs


VARIATIONS = {
    "names and UUIDs only": Variation(memory=False, pods=False),
    "and memory use": Variation(memory=True, pods=False),
    "and pods of their own": Variation(memory=True, pods=True),
}


def _node_variant(hints: NodeHints, i: int, rng: random.Random, busy: bool, how: Variation) -> NodeHints:
    """Node ``i`` of the fleet: its own names and UUIDs, and what ``how`` says; when ``busy``, its first
    GPU's free memory and share drawn (on the published steps)."""
    uuid = {g.uuid: f"GPU-{i:05d}-{pos}" for pos, g in enumerate(hints.gpus)}
    gpus: list[GpuHints] = []
    for pos, gpu in enumerate(hints.gpus):
        instances = tuple(dataclasses.replace(
            m, uuid=f"MIG-{i:05d}-{pos}-{k}",
            memory_used_bytes=rng.randrange(0, 8) * STEP if how.memory else m.memory_used_bytes)
            for k, m in enumerate(gpu.mig_instances))
        renamed = {m.uuid: n.uuid for m, n in zip(gpu.mig_instances, instances, strict=True)}
        tenants = tuple(dataclasses.replace(
            t, name=f"team-{i % 7}/job-{i:05d}-{pos}-{k}" if how.pods else t.name,
            memory_used_bytes=rng.randrange(1, 16) * STEP if how.memory else t.memory_used_bytes,
            mig_instance=renamed.get(t.mig_instance or "", t.mig_instance))
            for k, t in enumerate(gpu.tenants))
        profiles = tuple(
            dataclasses.replace(p, idle_instances=tuple(renamed.get(u, u) for u in p.idle_instances))
            for p in gpu.free_mig_profiles)
        used = (gpu.memory_used_bytes or 0) + (rng.randrange(0, 4) * STEP if how.memory else 0)
        gpu = dataclasses.replace(
            gpu, uuid=uuid[gpu.uuid], nvlink_peers=tuple(uuid.get(p, p) for p in gpu.nvlink_peers),
            memory_used_bytes=used, tenants=tenants, mig_instances=instances, free_mig_profiles=profiles)
        if busy and pos == 0:
            draw = random.Random(i)  # the same draw whatever else varies
            free = draw.randrange(0, max(1, gpu.memory_free_bytes), STEP)
            gpu = dataclasses.replace(gpu, memory_free_bytes=free,
                                      schedulable_share_ratio=round(draw.uniform(0.0, 1.0), 2))
        gpus.append(gpu)
    return dataclasses.replace(hints, hostname=f"node-{i:05d}", gpus=tuple(gpus), taken_at_unix=1e9 + i)


def fleet_objects(bodies: list[dict[str, Any]], count: int, how: Variation, busy: float = 0.5
                  ) -> list[bytes]:
    """``count`` nodes of the three kinds in turn, the first ``busy`` fraction of them busy."""
    kinds = [project(hints_from_jsonable(body), None) for body in bodies]
    rng = random.Random(11)
    return [encoded(h, h.hostname) for h in
            (_node_variant(kinds[i % len(kinds)], i, rng, i < busy * count, how) for i in range(count))]


def distinct_states(bodies: list[dict[str, Any]], ref: str, count: int) -> dict[str, Any]:
    """Distinct verdict keys in modelled fleets (each ``VARIATIONS``, half the nodes busy), by ``ref``'s
    key and by the working tree's (the state's, and those of shared and MIG requests), per node kind."""
    old = baseline_module(ref)
    out: dict[str, Any] = {"nodes": count, "busy_fraction": 0.5}
    for label, how in VARIATIONS.items():
        objects = fleet_objects(bodies, count, how)
        states = [decode_state(raw) for raw in objects]
        per_kind = [kind_keys(state.hints, state.key) for state in states]
        keys = {"baseline": [old.decode_state(raw).key for raw in objects],
                "now": [state.key for state in states],  # the view's: what an exclusive request reads
                "now_shared": [k.shared for k in per_kind], "now_mig": [k.mig for k in per_kind]}
        row: dict[str, Any] = {}
        for k, name in enumerate((*KINDS, "all")):
            row[name] = {version: len(set(found if name == "all" else found[k::len(KINDS)]))
                         for version, found in keys.items()}
        out[label] = row
    return out
