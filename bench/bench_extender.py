"""Benchmark the scheduler extender at cluster scale, and an agent's ``POST /v1/hints/score``.

Usage: .venv/bin/python bench/bench_extender.py [--nodes 100,1000,5000] [--calls 30] [--score-calls 300]
       .venv/bin/python bench/bench_extender.py --judging [--nodes 5000,20000] [--busy 1.0] [--calls 30]
                                                [--baseline REF] [--rounds 3]

- Virtual agents: one child process serves N agents' ``GET /n/<node>/v1/hints`` (ETag, 304 on
  ``If-None-Match``, as the agent does). Their bodies are real hints: ``poll_once`` of the simulated
  8xH100/64-process, A100-MIG and laptop nodes, taken in turn.
- cold: a fresh extender's first filter over N never-seen nodes (all fetched concurrently, then cached):
  the time until every node is cached, and how many the default 1 s bound lets in.
- refresh: one background round over N cached agents (conditional GETs, all 304).
- filter / prioritize (cache warm), medians over ``--calls`` calls of the ExtenderArgs kube-scheduler
  sends (full Pod, NodeNames): ``in-process`` is ``Extender.filter`` itself (parse, judge every node,
  build the reply); ``http`` is the whole POST on loopback (JSON both ways). ``same pod`` repeats one pod
  (the per-node memo of the last scoring hits, as for a prioritize after its filter); ``new pod`` changes
  the request each call (every node is scored again).
- score: a real ``gpuagent run`` process (8xH100 simulated), ``POST /v1/hints/score`` over keep-alive.
Medians and p95; this machine is small and shared, single timings mean nothing. Results go to
``bench/results/extender_<time>.json``.

``--judging``: the judging alone, against the cluster view's fleet (``bench_cluster_view.node_objects``: the
three kinds in turn, the ``--busy`` fraction with a state of its own) read into a ``ClusterView`` in process
page by page (no API server), each call naming every node or ``--call-names`` of them (drawn once), per
call p50 / p99 of: a never-seen pod's filter and prioritize (a new memory request each call: every state of
the call judged again) and a seen pod's (the one asked before), in process (``Extender.filter``/
``prioritize``: parse, judge, the reply's objects; and this thread's CPU) and over HTTP on loopback end to
end (the extender's own app served by the child's event loop, as ``serve`` runs it: the body read and
parsed, the call judged, the reply written and read back by a client in a process of its own; and the
extender's CPU for the call, ``served_over_http``). With ``--baseline REF`` the same measurement runs on
``gpuagent/`` as it is at git revision REF and on the working tree's (or at ``--now REF``), in alternating
child processes (``--rounds`` each, the order flipping every round), so the machine's load falls on both
alike; the ratios are baseline over now, and each row has the 1-minute load average seen as its children
started and ended. ``--per-state-too`` adds the working tree with every state judged by ``fit_node`` (no
columns): what the columns alone buy. Results go to
``bench/results/judging_<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# ``--tree PATH`` (a judging child): gpuagent as it is in PATH, imported before anything else imports it
TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else str(ROOT)
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, TREE)

from aiohttp import ClientSession, TCPConnector, web  # noqa: E402

from gpuagent.hints.agents import AgentCache, AgentDirectory  # noqa: E402
from gpuagent.hints.extender import Extender  # noqa: E402

try:  # the extender's app, split out of hints/extender.py; a --baseline tree from before has it there
    from gpuagent.hints.extender_app import build_app, build_registry
except ImportError:
    from gpuagent.hints.extender import build_app, build_registry  # type: ignore[attr-defined,no-redef]

SCENARIOS = ("h100-8x-64proc.yaml", "a100-mig.yaml", "laptop-1gpu.yaml")


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000, 3),
        "min_ms": round(ordered[0] * 1000, 3),
        "runs": len(ordered),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def real_hints() -> list[dict[str, Any]]:
    """The /v1/hints bodies of the three simulated nodes after one poll."""
    from gpuagent import agent
    from gpuagent.config import load_config
    from gpuagent.hints.codec import hints_to_jsonable

    bodies = []
    for scenario in SCENARIOS:
        config = load_config(None, env={}, overrides={
            "backend": "sim", "scenario": str(ROOT / "examples" / "scenarios" / scenario),
            "pod_resources_socket": None, "kubernetes_api": "off", "hostname": scenario.split(".")[0],
        })
        snapshot = agent.poll_once(config)
        assert snapshot.hints is not None, f"{scenario}: no hints"
        bodies.append(hints_to_jsonable(snapshot.hints))
    return bodies


def serve_virtual_agents(port: int, nodes: int, bodies: list[dict[str, Any]]) -> None:
    """Child process: N agents' /v1/hints on one port, bodies pre-serialised with their ETags."""
    encoded = []
    for i in range(nodes):
        body = dict(bodies[i % len(bodies)], hostname=f"node-{i:05d}")
        raw = json.dumps(body, separators=(",", ":")).encode()
        encoded.append((raw, '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'))

    async def hints(request: web.Request) -> web.Response:
        index = int(request.match_info["node"].removeprefix("node-"))
        raw, etag = encoded[index]
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        return web.Response(body=raw, content_type="application/json", headers={"ETag": etag})

    app = web.Application()
    app.router.add_get("/n/{node}/v1/hints", hints)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


def wait_for_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def pod_args(nodes: list[str], memory_gib: int | None = None) -> dict[str, Any]:
    from fixture_files import filter_request

    args = filter_request()
    annotations = args["Pod"]["metadata"]["annotations"]
    annotations["gpuagent.io/gpu-share"] = "30%"
    if memory_gib is not None:
        annotations["gpuagent.io/gpu-memory"] = f"{memory_gib}Gi"
    args["NodeNames"] = nodes
    return args


async def bench_nodes(count: int, bodies: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    port = free_port()
    server = multiprocessing.Process(target=serve_virtual_agents, args=(port, count, bodies), daemon=True)
    server.start()
    out: dict[str, Any] = {"nodes": count}
    try:
        wait_for_port(port)
        nodes = [f"node-{i:05d}" for i in range(count)]
        directory = AgentDirectory(template=f"http://127.0.0.1:{port}/n/{{node}}")
        known = frozenset(nodes)  # the cluster's node list

        # cold: every node never seen; generous bound so all are cached, and the default 1 s bound
        for deadline, key in ((60.0, "cold_all_cached"), (1.0, "cold_within_1s")):
            cache = AgentCache(directory, timeout_seconds=deadline, max_concurrent_fetches=128, known=known)
            await cache.start()
            extender = Extender(cache)
            started = time.perf_counter()
            reply = await extender.filter(pod_args(nodes))
            elapsed = time.perf_counter() - started
            judged = len(reply["NodeNames"]) + len(reply["FailedNodes"])
            out[key] = {"seconds": round(elapsed, 3), "nodes_judged": judged,
                        "nodes_unreachable": len(reply["FailedAndUnresolvableNodes"])}
            await cache.close()
        cache = AgentCache(directory, timeout_seconds=10.0, max_concurrent_fetches=128, known=known)
        await cache.start()
        extender = Extender(cache)
        await cache.lookup(nodes, deadline_seconds=300)  # warm: every node cached
        assert all(cache.get(n) and cache.get(n).hints for n in nodes), "not every node was cached"  # type: ignore[union-attr]

        refresh = []
        for _ in range(3):
            started = time.perf_counter()
            await cache.refresh_all()
            refresh.append(time.perf_counter() - started)
        out["refresh_round_all_304"] = quantiles(refresh)

        same = pod_args(nodes)
        filter_same, prio_same, filter_new = [], [], []
        for i in range(calls):
            started = time.perf_counter()
            reply = await extender.filter(same)
            filter_same.append(time.perf_counter() - started)
            started = time.perf_counter()
            await extender.prioritize(same)
            prio_same.append(time.perf_counter() - started)
            started = time.perf_counter()
            await extender.filter(pod_args(nodes, memory_gib=1 + i % 40))
            filter_new.append(time.perf_counter() - started)
        out["passing_nodes"] = len(reply["NodeNames"])
        out["in_process"] = {
            "filter_same_pod": quantiles(filter_same),
            "prioritize_same_pod": quantiles(prio_same),
            "filter_new_pod": quantiles(filter_new),
        }

        registry = build_registry(extender)
        runner = web.AppRunner(build_app(extender, registry), access_log=None)
        await runner.setup()
        http_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", http_port).start()
        body_same = json.dumps(same).encode()
        http_same, http_new, http_prio = [], [], []
        async with ClientSession(connector=TCPConnector(limit=1)) as session:
            url = f"http://127.0.0.1:{http_port}"
            headers = {"Content-Type": "application/json"}
            for i in range(calls):
                for samples, path, body in (
                    (http_same, "/filter", body_same),
                    (http_prio, "/prioritize", body_same),
                    (http_new, "/filter", json.dumps(pod_args(nodes, memory_gib=100 + i)).encode()),
                ):
                    started = time.perf_counter()
                    async with session.post(url + path, data=body, headers=headers) as response:
                        await response.read()
                        assert response.status == 200
                    samples.append(time.perf_counter() - started)
        out["http"] = {"filter_same_pod": quantiles(http_same), "prioritize_same_pod": quantiles(http_prio),
                       "filter_new_pod": quantiles(http_new), "request_body_bytes": len(body_same)}
        await runner.cleanup()
        await cache.close()
    finally:
        server.terminate()
        server.join(10)
    return out


async def bench_score(calls: int) -> dict[str, Any]:
    """POST /v1/hints/score on a real agent process (simulated 8xH100, 64 processes)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUAGENT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "run", "--backend", "sim", "--scenario",
         str(ROOT / "examples" / "scenarios" / SCENARIOS[0]), "--listen", f"127.0.0.1:{port}",
         "--kubernetes-api", "off", "--pod-resources-socket", "",
         "--journal-path", "/tmp/bench-extender-journal.json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        async with ClientSession(connector=TCPConnector(limit=1)) as session:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with session.get(url + "/v1/hints") as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not serve /v1/hints in time")
                await asyncio.sleep(0.1)
            samples = []
            body = {"gpus": 1, "share": "30%", "memory": "8Gi"}
            for _ in range(calls):
                started = time.perf_counter()
                async with session.post(url + "/v1/hints/score", json=body) as response:
                    await response.read()
                    assert response.status == 200
                samples.append(time.perf_counter() - started)
        return {"score_http": quantiles(samples)}
    finally:
        proc.terminate()
        proc.wait(10)



def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
            "runs": len(ordered)}


def fleet_view(count: int, busy: float, bodies: list[dict[str, Any]]) -> Any:
    """A ClusterView holding ``count`` published states, read as its reflector reads a LIST: in pages of
    ``PAGE_SIZE`` objects, each page's JSON made just before it is read (at 100,000 nodes one answer would
    be 0.64 GB, and the objects as Python dicts several GB)."""
    from itertools import islice

    from bench_cluster_view import iter_node_objects

    from gpuagent.hints.cluster_view import PAGE_SIZE, ClusterView

    view = ClusterView(wall_clock=time.time)
    objects = iter_node_objects(count, bodies, busy)
    items: list[Any] = []
    while page := list(islice(objects, PAGE_SIZE)):
        decode, _, _ = view._decode_page(json.dumps({"metadata": {"resourceVersion": "1"}, "items": page},
                                                    separators=(",", ":")).encode())
        items.extend(decode())
    view._replace(items)
    return view


def http_client(port: int, plan: list[tuple[str, bytes]], results: Any) -> None:
    """Child process: kube-scheduler's side of the calls, one at a time on one keep-alive connection (as it
    makes them), each timed from its request's first byte sent to its reply's last byte read; then one
    ``GET /healthz``, which closes the last call's CPU interval on the extender's side."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    walls = []
    for path, body in plan:
        started = time.perf_counter()
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        walls.append(time.perf_counter() - started)
        assert response.status == 200, response.status
    connection.request("GET", "/healthz")
    connection.getresponse().read()
    results.send(walls)


async def served_over_http(extender: Any, plan: list[tuple[str, bytes]]) -> tuple[list[float], list[float]]:
    """The calls of ``plan`` (path, body) over HTTP on loopback, the extender's app served by this process's
    event loop alone (as ``serve`` runs it) and the client in a process of its own (``http_client``), so
    neither waits on the other's interpreter: each call's seconds end to end, and the extender's CPU for
    it (this thread's CPU time from the call's arrival to the next one's: reading and parsing the body,
    judging, writing the reply, and whatever the loop did before the next call)."""
    arrivals: list[float] = []

    @web.middleware
    async def arrival(request: web.Request, handler: Any) -> web.StreamResponse:
        arrivals.append(time.thread_time())
        return await handler(request)

    app = build_app(extender, build_registry(extender))
    app.middlewares.append(arrival)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    client = multiprocessing.get_context("fork").Process(target=http_client, args=(port, plan, theirs))
    client.start()
    try:
        walls = await asyncio.get_running_loop().run_in_executor(None, ours.recv)
    finally:
        client.join(60)
        await runner.cleanup()
    return walls, [later - earlier for earlier, later in pairwise(arrivals)][: len(plan)]


async def judging_child(count: int, busy: float, calls: int, bodies: list[dict[str, Any]],
                        call_names: int = 0) -> dict[str, Any]:
    """One tree's judging figures (see the module docstring), as lists of seconds per call."""
    import gc
    import random

    try:  # where a --baseline tree from before the split has it: hints/extender.py
        from gpuagent.hints.extender_serve import tune_garbage_collector
    except ImportError:
        from gpuagent.hints.extender import tune_garbage_collector  # type: ignore[attr-defined,no-redef]

    view = fleet_view(count, busy, bodies)
    nodes = [f"node-{i:05d}" for i in range(count)]
    if 0 < call_names < count:  # drawn once, in name order, as the bench of the cluster view draws them
        nodes = sorted(random.Random(3).sample(nodes, call_names))
    extender = Extender(view, max_age_seconds=900.0)
    tune_garbage_collector()
    gc.collect()
    gc.freeze()  # what the list left behind, as the view freezes it
    out: dict[str, Any] = {"distinct_states": len({e.key for e in view.entries()}),
                           "names_per_call": len(nodes)}
    seen = pod_args(nodes)
    await extender.filter(seen)
    samples: dict[str, list[float]] = {}
    asked = 0

    def fresh() -> dict[str, Any]:
        """A request never seen: a memory figure not among the last 32 asked (the extender's memo)."""
        nonlocal asked
        asked += 1
        return pod_args(nodes, memory_gib=1 + asked % 79)

    def timed(name: str, started: float, cpu: float) -> None:
        samples.setdefault(name, []).append(time.perf_counter() - started)
        samples.setdefault(name + "_cpu", []).append(time.thread_time() - cpu)

    for _ in range(calls):
        for verb in ("filter", "prioritize"):
            answer = extender.filter if verb == "filter" else extender.prioritize
            for name, body in ((f"in_process_{verb}_never_seen", fresh()), (f"in_process_{verb}_seen", seen)):
                started, cpu = time.perf_counter(), time.thread_time()
                await answer(body)
                timed(name, started, cpu)
    seen_body = json.dumps(seen).encode()
    plan, names = [], []
    for _ in range(calls):
        for verb in ("filter", "prioritize"):
            fresh_body = json.dumps(fresh()).encode()
            for name, body in ((f"http_{verb}_never_seen", fresh_body), (f"http_{verb}_seen", seen_body)):
                plan.append((f"/{verb}", body))
                names.append(name)
    warm = [("/filter", seen_body), ("/filter", json.dumps(fresh()).encode())]  # the app's first calls
    walls, cpu = await served_over_http(extender, [*warm, *plan])
    walls, cpu = walls[len(warm):], cpu[len(warm):]
    for name, wall, used in zip(names, walls, cpu, strict=True):
        samples.setdefault(name, []).append(wall)
        samples.setdefault(name + "_cpu", []).append(used)  # the CPU: the extender's thread alone
    out["seconds"] = samples
    out["states_judged"] = getattr(extender, "states_judged", None)
    return out


def tree_at(ref: str, into: Path) -> Path:
    """``gpuagent/`` as it is at git revision ``ref``, extracted under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "gpuagent"], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def judging(args: argparse.Namespace) -> dict[str, Any]:
    """Each tree's figures over ``--rounds`` alternating child processes; ratios baseline / now."""
    import tempfile

    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                           "load_average_before": os.getloadavg()},
                               "baseline": args.baseline, "now": args.now or "the working tree",
                               "rounds": args.rounds, "sizes": []}
    with tempfile.TemporaryDirectory() as scratch:
        trees: dict[str, tuple[Path, list[str]]] = {}  # label -> the tree, the child's other arguments
        if args.baseline:
            trees["baseline"] = (tree_at(args.baseline, Path(scratch) / "baseline"), [])
        trees["now"] = (tree_at(args.now, Path(scratch) / "now") if args.now else ROOT, [])
        if args.per_state_too:
            trees["now_per_state"] = (trees["now"][0], ["--per-state"])
        for count in (int(n) for n in args.nodes.split(",")):
            for busy in (float(b) for b in args.busy.split(",")):
                merged: dict[str, dict[str, list[float]]] = {label: {} for label in trees}
                states: dict[str, Any] = {}
                loads: list[float] = []  # the 1-minute load average as each child started and ended
                names = count
                order = list(trees)
                for r in range(args.rounds):
                    for label in order if r % 2 == 0 else reversed(order):
                        loads.append(os.getloadavg()[0])
                        done = subprocess.run(
                            [sys.executable, str(Path(__file__).resolve()), "--judging-child", "--tree",
                             str(trees[label][0]), "--nodes", str(count), "--busy", str(busy), "--calls",
                             str(args.calls), "--call-names", str(args.call_names), *trees[label][1]],
                            check=True, capture_output=True, text=True)
                        loads.append(os.getloadavg()[0])
                        child = json.loads(done.stdout.strip().splitlines()[-1])
                        names = child.get("names_per_call", count)
                        states[label] = (child["distinct_states"], child["states_judged"])
                        for name, values in child["seconds"].items():
                            merged[label].setdefault(name, []).extend(values)
                row: dict[str, Any] = {"nodes": count, "busy": busy, "names_per_call": names,
                                       "distinct_states": states, "load_average_1m": [min(loads), max(loads)]}
                for label, figures in merged.items():
                    row[label] = {name: percentiles(values) for name, values in figures.items()}
                row["samples_ms"] = {label: {name: [round(v * 1000, 3) for v in values]
                                             for name, values in figures.items()}
                                     for label, figures in merged.items()}
                for label in merged.keys() - {"now"}:
                    for at in ("p50", "p99"):
                        row[f"ratio_{at}_{label}_over_now"] = {
                            name: round(row[label][name][f"{at}_ms"] / row["now"][name][f"{at}_ms"], 2)
                            for name in row["now"]}
                print(json.dumps(row), flush=True)
                results["sizes"].append(row)
    results["machine"]["load_average_after"] = os.getloadavg()
    return results

def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--score-calls", type=int, default=300)
    parser.add_argument("--judging", action="store_true", help="the judging alone, on a cluster view's fleet")
    parser.add_argument("--busy", default="1.0", help="with --judging: fractions of busy nodes")
    parser.add_argument("--baseline", help="with --judging: a git revision measured beside the working tree")
    parser.add_argument("--now", help="with --judging: a git revision measured instead of the working tree")
    parser.add_argument("--rounds", type=int, default=3, help="with --judging: child processes per tree")
    parser.add_argument("--call-names", type=int, default=0,
                        help="with --judging: nodes named in each call (drawn once); 0: all of them")
    parser.add_argument("--per-state-too", action="store_true",
                        help="with --judging: the working tree also with every state judged by fit_node")
    parser.add_argument("--per-state", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="results folder")
    parser.add_argument("--judging-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    return parser.parse_args()


async def main(args: argparse.Namespace) -> None:
    if args.judging_child:
        if args.per_state:  # what the columns buy: every state judged one by one, as before them
            from gpuagent.hints import fitcolumns

            fitcolumns.handles = lambda request: False
        result = await judging_child(int(args.nodes), float(args.busy), args.calls, args.bodies,
                                     args.call_names)
        print(json.dumps(result))
        return
    results_dir = args.out
    try:  # made before measuring: a fresh clone has no results folder
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"bench_extender: cannot make the results folder {results_dir}: {exc}") from None
    if args.judging:
        out = results_dir / f"judging_{time.strftime('%Y%m%dT%H%M%S')}.json"
        out.write_text(json.dumps(judging(args), indent=2) + "\n")
        print(f"written to {out}")
        return
    bodies = args.bodies
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    results["agent"] = await bench_score(args.score_calls)
    print(json.dumps(results["agent"]), flush=True)
    results["extender"] = []
    for count in (int(n) for n in args.nodes.split(",")):
        result = await bench_nodes(count, bodies, args.calls)
        results["extender"].append(result)
        print(json.dumps(result), flush=True)
    out = results_dir / f"extender_{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    options = arguments()
    options.bodies = real_hints() if not options.judging else None  # poll_once runs an event loop of its own
    asyncio.run(main(options))
