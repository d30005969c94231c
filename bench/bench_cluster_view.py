"""Benchmark the extender's cluster view at fleet scale: published GPUNodeStates read with one list and watch.

Usage: .venv/bin/python bench/bench_cluster_view.py [--nodes 5000,20000,100000] [--calls 40]
                                                     [--call-names 5000] [--memory-max 20000]
       .venv/bin/python bench/bench_cluster_view.py --decode [--baseline main] [--fleet 3000]

- A fake API server (``tests/fake_apiserver.py``: list in pages, watch with resourceVersions, server-side
  apply) runs in a child process holding N GPUNodeStates, each the projection of a real ``/v1/hints`` body
  (``poll_once`` of the simulated 8xH100/64-process, A100-MIG and laptop nodes, in turn) under its own node
  name. The fake keeps each object's JSON once encoded, as the real watch cache keeps its serialisations,
  so its side of a list is mostly the bytes.
- ready: a fresh view from its first request until the last page is in (``ClusterView.synced``): seconds,
  pages, and the API server's side of that list (answers, their largest and total bytes, the seconds the
  fake spent building them); the bench process's RSS then and its peak over the list (VmHWM, reset before).
- cold: a fresh extender's first filter over all N nodes: its time (the list, decoding every object,
  judging every node) and how many nodes it could judge (the goal: all of them).
- memory (N up to ``--memory-max``): what the view keeps, by tracemalloc, in this process: the N objects
  read page by page into a fresh view, then the bytes still held, per node and per distinct state.
- decode: one object into ``NodeHints`` and its verdict key (``hints.published.decode_state``), per node
  kind, and the two parts of it (``bench/decode_costs.py``). ``--decode`` runs this part alone; with
  ``--baseline REF`` it measures ``published.py`` at git revision REF beside the working tree's in
  alternating rounds, and counts the distinct verdict keys each gives a modelled fleet of ``--fleet`` nodes.
- filter: the warm extender, in process (``Extender.filter``: parse, judge every node named, build the
  reply), p50 and p99 over ``--calls``: a never-seen pod (a new memory request each call, every node scored
  again) and a seen pod (the per-node memo answers); each call names every node, or ``--call-names`` of
  them drawn once (kube-scheduler's adaptive percentageOfNodesToScore hands about 5,000 at 100,000 nodes).
  The same calls over HTTP, end to end and with the extender's CPU per call, before and after a change:
  ``bench_extender.py --judging`` (the same fleet, ``--call-names``).
- restart: while a writer in the child changes 2 % of the nodes' states every second (at most
  ``MAX_CHURN_WRITES`` a second), a second extender starts from scratch; once both have caught up, their
  verdicts over all N nodes must be the same.
- writes: the agents' write rate, from ``PublishPolicy`` itself in virtual time (no API server): 20
  simulated nodes for an hour of 1 s polls each, steady (utilisation and memory noise only) and churning
  (a pod arrives or leaves every 10 minutes per node), scaled to 5,000 and 20,000 nodes; with the object's
  size. NFD's defaults for comparison: nfd-worker and nfd-topology-updater rewrite every 60 s.

Results go to ``bench/results/cluster_view_<time>.json`` (the folder is made if missing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import psutil  # noqa: E402
from bench_extender import free_port, pod_args, real_hints, wait_for_port  # noqa: E402
from decode_costs import decode_costs, distinct_states, side_by_side  # noqa: E402

from gpuagent.hints.cluster_view import ClusterView  # noqa: E402
from gpuagent.hints.codec import hints_from_jsonable  # noqa: E402
from gpuagent.hints.extender import Extender  # noqa: E402
from gpuagent.hints.published import Generation, project, state_object  # noqa: E402
from gpuagent.hints.publisher import PublishPolicy  # noqa: E402
from gpuagent.kubeapi import ApiConnection  # noqa: E402

try:  # since snapshot.py was split into a package; a bench_extender --baseline tree from before has it there
    from gpuagent.snapshot.hints import NodeHints
except ImportError:
    from gpuagent.snapshot import NodeHints  # type: ignore[attr-defined,no-redef]

try:  # since hints/extender.py was split; a bench_extender --baseline tree from before has it there
    from gpuagent.hints.extender_serve import tune_garbage_collector
except ImportError:
    from gpuagent.hints.extender import tune_garbage_collector  # type: ignore[attr-defined,no-redef]

GiB = 2**30
CHURN_FRACTION = 0.02  # of the nodes changed every second during the restart check
MAX_CHURN_WRITES = 500  # a second: above the 400 a second the churning write budget gives 100,000 nodes


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
        "runs": len(ordered),
    }


def node_objects(count: int, bodies: list[dict[str, Any]], busy: float) -> list[dict[str, Any]]:
    """N nodes of the three kinds in turn; a fraction ``busy`` of them in a state of their own (their first
    GPU's free memory and share set by a draw of their own), the rest as their kind is (idle nodes of one
    model schedule alike)."""
    return list(iter_node_objects(count, bodies, busy))


def iter_node_objects(count: int, bodies: list[dict[str, Any]], busy: float) -> Iterator[dict[str, Any]]:
    """``node_objects`` one at a time (at 100,000 nodes the whole list is gigabytes of Python objects)."""
    kinds = [project(hints_from_jsonable(body), None) for body in bodies]
    rng = random.Random(7)
    now = time.time()
    for i in range(count):
        hints = dataclasses.replace(kinds[i % len(kinds)], hostname=f"node-{i:05d}")
        if i < busy * count and hints.gpus:
            first = hints.gpus[0]
            first = dataclasses.replace(
                first, memory_free_bytes=rng.randrange(0, max(1, first.memory_free_bytes), 2**28),
                schedulable_share_ratio=round(rng.uniform(0.0, 1.0), 2))
            hints = dataclasses.replace(hints, gpus=(first, *hints.gpus[1:]))
        yield state_object(hints.hostname, hints, Generation(1, 1), now)


def serve_api(port: int, count: int, bodies: list[dict[str, Any]], busy: float,
              churn: multiprocessing.Event, served: Any) -> None:
    """Child process: the fake API server with N states; while ``churn`` is set, 2 % of them change every
    second (a GPU of each taken, then given back), as agents' writes would. Asked on ``served`` (a pipe), it
    sends what its list answers cost since the last time asked."""
    from fake_apiserver import FakeApiServer

    async def main() -> None:
        objects = node_objects(count, bodies, busy)
        server = FakeApiServer(token=None, port=port)
        for obj in objects:
            server.put_state(obj, notify=False)
        del objects
        server.list_pages.clear()
        await server.start()
        sequence = 1
        rng = random.Random(1)
        names = [f"node-{i:05d}" for i in range(count)]
        next_churn = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            if served.poll():
                served.recv()
                served.send([dataclasses.asdict(page) for page in server.list_pages])
                server.list_pages.clear()
            if not churn.is_set() or time.monotonic() < next_churn:
                continue
            next_churn = time.monotonic() + 1.0
            sequence += 1
            changes = min(MAX_CHURN_WRITES, max(1, int(count * CHURN_FRACTION)))
            for name in rng.sample(names, changes):
                changed = json.loads(json.dumps(server.states["state-" + name]))
                gpus = changed["hints"]["gpus"]
                if gpus:
                    first = gpus[0]
                    first["memory_free_bytes"] = 0 if first["memory_free_bytes"] else 40 * GiB
                changed["agent"]["sequence"] = sequence
                server.put_state(changed)

    asyncio.run(main())


def served_lists(pipe: Any) -> dict[str, Any]:
    """The API server's side of the lists since the last call: answers, bytes, seconds to build them."""
    pipe.send("report")
    pages = pipe.recv()
    sizes = [page["bytes"] for page in pages]
    return {"answers": len(pages), "items": sum(page["items"] for page in pages),
            "bytes_total": sum(sizes), "largest_answer_bytes": max(sizes, default=0),
            "serve_seconds": round(sum(page["seconds"] for page in pages), 3)}


def rss_mib() -> float:
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def reset_peak_rss() -> None:
    """VmHWM back to the current RSS (Linux: ``5`` to ``/proc/self/clear_refs``), where allowed."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def view_memory(count: int, bodies: list[dict[str, Any]], busy: float, page_size: int) -> dict[str, Any]:
    """What a view keeps of N nodes, by tracemalloc: the objects read page by page, as from the API server
    (each page's JSON made just before it is read), then the bytes still held once the pages are gone."""
    import tracemalloc

    objects = node_objects(count, bodies, busy)
    for i, obj in enumerate(objects):
        obj["metadata"]["resourceVersion"] = str(1000 + i)
    view = ClusterView()
    gc.collect()
    tracemalloc.start()
    try:
        items: list[Any] = []
        for start in range(0, count, page_size):
            page = json.dumps({"metadata": {"resourceVersion": "1"},
                               "items": objects[start:start + page_size]}).encode()
            decode, _, _ = view._decode_page(page)
            del page
            items.extend(decode())
        view._replace(items)
        del items
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    states = len({entry.key for entry in view.entries()})
    return {"nodes": len(view), "distinct_states": states, "kept_mib": round(kept / 2**20, 1),
            "bytes_per_node": round(kept / count), "peak_traced_mib": round(peak / 2**20, 1)}


def kubeconfig_for(port: int) -> Any:
    from lightkube import KubeConfig
    from lightkube.config.models import Cluster, User

    return KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{port}"), user=User(token="x"))


async def started_view(port: int) -> tuple[ClusterView, asyncio.Event, asyncio.Task[None]]:
    view = ClusterView(connection=ApiConnection(config=kubeconfig_for(port), request_timeout=120.0),
                       sync_timeout=120.0)
    stop = asyncio.Event()
    return view, stop, asyncio.create_task(view.run(stop))


async def stopped(view: ClusterView, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await task
    await view.close()


async def caught_up(*views: ClusterView, timeout: float = 120.0) -> None:
    """Until the views stand at the same resourceVersion and it has not moved for a second (the writer is
    stopped: the watches have delivered its last write)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        versions = {view._rv for view in views}
        if len(versions) == 1 and versions == last:
            return
        last = versions
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the views did not catch up within {timeout:g}s")


async def bench_nodes(count: int, bodies: list[dict[str, Any]], calls: int, busy: float,
                      call_names: int = 0) -> dict[str, Any]:
    port = free_port()
    churn = multiprocessing.Event()
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve_api, args=(port, count, bodies, busy, churn, theirs),
                                     daemon=True)
    server.start()
    out: dict[str, Any] = {"nodes": count, "busy_fraction": busy}
    nodes = [f"node-{i:05d}" for i in range(count)]
    named = sorted(random.Random(3).sample(nodes, call_names)) if 0 < call_names < count else nodes
    try:
        wait_for_port(port, timeout=600)
        tune_garbage_collector()  # as the extender's process does when it starts
        gc.collect()
        rss_before = rss_mib()
        reset_peak_rss()
        view, stop, task = await started_view(port)
        started = time.perf_counter()
        while not view.synced:
            await asyncio.sleep(0.005)
        ready = time.perf_counter() - started
        out["ready"] = {"seconds": round(ready, 3), "pages": view.pages, "page_size": view.page_size,
                        "rss_mib_before": rss_before, "rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib(),
                        "api_server": served_lists(ours)}
        extender = Extender(view, max_age_seconds=900.0)
        started = time.perf_counter()
        reply = await extender.filter(pod_args(nodes))
        elapsed = time.perf_counter() - started
        judged = len(reply["NodeNames"]) + len(reply["FailedNodes"])
        out["cold_first_filter"] = {"seconds": round(ready + elapsed, 3), "filter_seconds": round(elapsed, 3),
                                    "nodes_judged": judged,
                                    "nodes_unjudged": len(reply["FailedAndUnresolvableNodes"]),
                                    "lists": view.lists}
        out["distinct_states"] = len({entry.key for entry in view.entries()})
        out["extender_rss_mib"] = rss_mib()
        gc.collect()  # what the cold start left behind, before the timed calls

        filter_new, filter_seen, cpu_new, cpu_seen = [], [], [], []
        seen = pod_args(named)
        for i in range(calls):
            fresh = pod_args(named, memory_gib=1 + i)  # a request never seen: every node scored again
            started, cpu = time.perf_counter(), time.thread_time()
            await extender.filter(fresh)
            filter_new.append(time.perf_counter() - started)
            cpu_new.append(time.thread_time() - cpu)
            started, cpu = time.perf_counter(), time.thread_time()
            await extender.filter(seen)
            filter_seen.append(time.perf_counter() - started)
            cpu_seen.append(time.thread_time() - cpu)
        out["filter_in_process"] = {
            "names_per_call": len(named),
            "never_seen_pod": quantiles(filter_new), "seen_pod": quantiles(filter_seen),
            "never_seen_pod_cpu": quantiles(cpu_new), "seen_pod_cpu": quantiles(cpu_seen),
        }

        churn.set()  # restart mid-run: a second extender starts while the states change
        await asyncio.sleep(2.5)
        second, stop2, task2 = await started_view(port)
        restarted = Extender(second, max_age_seconds=900.0)
        await restarted.filter(pod_args(nodes))
        churn.clear()
        await caught_up(view, second)
        probe = pod_args(nodes, memory_gib=50)
        first_reply, second_reply = await extender.filter(probe), await restarted.filter(probe)
        out["restart_mid_run"] = {"same_verdicts": first_reply == second_reply,
                                  "passing": len(first_reply["NodeNames"]),
                                  "lists_by_the_restarted_view": second.lists,
                                  "pages_read_by_the_restarted_view": second.pages}
        await stopped(second, stop2, task2)
        await stopped(view, stop, task)
    finally:
        server.terminate()
        server.join(10)
    del view, second, extender, restarted
    gc.unfreeze()  # the views froze what they listed: let the next size start from what this one leaves
    gc.collect()
    return out


LONG_WINDOW = 300.0  # the hints' long SM-use average, which the schedulable share follows (seconds)


def _noisy(hints: NodeHints, rng: random.Random, drift: dict[str, float]) -> NodeHints:
    """One poll of a node at work: each GPU's memory jitters by up to 128 MiB around its level (allocator
    churn), its SM use swings 30 points around its mean every second, and the schedulable share follows
    the 5-minute average of that use (an AR(1) drift, its standard deviation ~1 point); the SM use itself
    is not published."""
    gpus = []
    for gpu in hints.gpus:
        jitter = rng.randint(-128, 128) * 2**20
        d = drift.get(gpu.uuid, 0.0)
        d = drift[gpu.uuid] = d * (1 - 1 / LONG_WINDOW) + rng.uniform(-0.3, 0.3) / LONG_WINDOW
        gpus.append(dataclasses.replace(
            gpu, memory_used_bytes=max(0, (gpu.memory_used_bytes or 0) + jitter),
            memory_free_bytes=max(0, gpu.memory_free_bytes - jitter),
            sm_util_ratio=rng.uniform(0.2, 0.8), sm_util_short_ratio=rng.uniform(0.4, 0.6),
            schedulable_share_ratio=max(0.0, min(1.0, gpu.schedulable_share_ratio - d)),
        ))
    return dataclasses.replace(hints, gpus=tuple(gpus))


def _held(hints: NodeHints) -> NodeHints:
    """The node with one more pod: its first GPU's memory and share taken."""
    first = hints.gpus[0]
    first = dataclasses.replace(first, memory_free_bytes=max(0, first.memory_free_bytes - 20 * GiB),
                                schedulable_share_ratio=max(0.0, first.schedulable_share_ratio - 0.5))
    return dataclasses.replace(hints, gpus=(first, *hints.gpus[1:]))


def write_rates(bodies: list[dict[str, Any]], *, nodes: int = 20, seconds: int = 3600) -> dict[str, Any]:
    kinds = [hints_from_jsonable(body) for body in bodies]
    out: dict[str, Any] = {"simulated_nodes": nodes, "simulated_seconds": seconds, "poll_seconds": 1}
    for mode in ("steady", "churn"):
        writes = 0
        for n in range(nodes):
            rng = random.Random(n)
            base = kinds[n % len(kinds)]
            policy = PublishPolicy(min_interval=10.0, heartbeat=300.0)
            drift: dict[str, float] = {}
            busy = False
            next_event = rng.expovariate(1 / 600)
            for t in range(seconds):
                if mode == "churn" and t >= next_event:
                    busy = not busy
                    next_event = t + rng.expovariate(1 / 600)
                hints = _noisy(_held(base) if busy else base, rng, drift)
                due = policy.decide(hints, float(t))
                if due is not None:
                    policy.tried(float(t))
                    policy.written(due, float(t))
                    writes += 1
        per_node_hour = writes / nodes * 3600 / seconds
        out[mode] = {
            "writes_per_node_per_hour": round(per_node_hour, 2),
            "writes_per_second_at_5000_nodes": round(per_node_hour * 5000 / 3600, 2),
            "writes_per_second_at_20000_nodes": round(per_node_hour * 20000 / 3600, 2),
        }
    out["nfd_every_60s_writes_per_second"] = {"5000": round(5000 / 60, 1), "20000": round(20000 / 60, 1)}
    return out


async def main(bodies: list[dict[str, Any]]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,5000,20000")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--call-names", type=int, default=0,
                        help="nodes named in each timed call (drawn once); 0: all of them")
    parser.add_argument("--memory-max", type=int, default=20000,
                        help="measure what the view keeps (tracemalloc) at node counts up to this")
    parser.add_argument("--busy", default="0.5,1.0",
                        help="fractions of the nodes in a state of their own (the rest idle, alike)")
    parser.add_argument("--skip-writes", action="store_true", help="leave out the write-rate model (~2 min)")
    parser.add_argument("--write-nodes", type=int, default=20, help="nodes the write-rate model simulates")
    parser.add_argument("--write-seconds", type=int, default=3600, help="seconds it simulates")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    parser.add_argument("--decode", action="store_true", help="measure decoding alone (no fleet, no writes)")
    parser.add_argument("--baseline", help="with --decode: a git revision to measure beside")
    parser.add_argument("--rounds", type=int, default=21, help="with --baseline: alternating rounds")
    parser.add_argument("--fleet", type=int, default=3000, help="with --baseline: modelled nodes")
    args = parser.parse_args()
    results_dir = args.out
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"bench_cluster_view: cannot make the results folder {results_dir}: {exc}") from None
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                           "load_average": os.getloadavg()}}
    results["decode"] = decode_costs(bodies)
    print(json.dumps(results["decode"]), flush=True)
    if args.decode:
        if args.baseline:
            results["decode_side_by_side"] = side_by_side(bodies, args.baseline, rounds=args.rounds)
            print(json.dumps(results["decode_side_by_side"]), flush=True)
            results["distinct_states"] = distinct_states(bodies, args.baseline, args.fleet)
            print(json.dumps(results["distinct_states"]), flush=True)
        write_results(results_dir, "cluster_view_decode", results)
        return
    results["extender"] = []
    for count in (int(n) for n in args.nodes.split(",")):
        for busy in (float(b) for b in args.busy.split(",")):
            result = await bench_nodes(count, bodies, args.calls, busy, args.call_names)
            if count <= args.memory_max:
                result["view_memory"] = view_memory(count, bodies, busy, ClusterView.page_size)
            results["extender"].append(result)
            print(json.dumps(result), flush=True)
    if not args.skip_writes:
        results["writes"] = write_rates(bodies, nodes=args.write_nodes, seconds=args.write_seconds)
        print(json.dumps(results["writes"]), flush=True)
    write_results(results_dir, "cluster_view", results)


def write_results(folder: Path, name: str, results: dict[str, Any]) -> None:
    out = folder / f"{name}_{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    asyncio.run(main(real_hints()))  # poll_once runs its own event loop: before ours
