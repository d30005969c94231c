"""Latency: a request-driven service beside a trainer, unenforced and under the latency class (issue 29).

A service (``serve``: requests at Poisson times from a seeded stream, 2-12 bf16 products of 8192^2 each,
then a synchronisation; 20 % of the device alone) and a PyTorch-style ``trainer`` (about 100 ms of products
queued at once an iteration, then one synchronisation) share GPU 0, in pods of their own. Runs, one after
the other, the tenants kept running between them:

- **alone**: the trainer frozen by hand: the service's own latency, and its load (its work per second);
- **unenforced**: both free, no agent: the GPU time-slices them;
- **latency class**: a fresh enforcing agent, the service's ``policies`` rule ``gpu_share: 30`` and
  ``latency_sensitive: true``, the trainer's ``gpu_share: 70``: the service is never frozen while under its
  share and its requests preempt the trainer (docs/isolation.md, the latency class);
- **rotation** (not in a quick run): the same shares without the class, to show what the class changes.

Each run settles first (a backlog of requests from the run before is served) and is measured over a window:
every request that *arrived* in it, its latency from arrival to completion (p50 / p99 / p99.9); one not
answered when the run ends counts with what it has waited (the service's schedule says when it arrived).
The work: the service's products completed in the window times one product's time alone, and the
trainer's iterations completed in it against its rate alone (measured first, the service frozen): each as
a part of the device, their sum the throughput kept, and each one's share of the work.

Bars (the issue's goals): under the class, the p99 at most 1.5 times the p99 unenforced, and the shares of
the work within 5 points of what is owed: the service, under its share, what it asked in the window (its
requests' products that arrived in it, capped at its share), the trainer the rest of the work done. The
agent must have put the service in the class, and nothing may be left frozen after its SIGTERM. Recorded:
the rest, the agent's freezes and the time the service was frozen.

On the simulator the same runs with CPU tenants in real cgroups on one CPU: the service's products are
1.6 ms of its CPU (``cpu-serve``), the trainer a burner; the agent reads the simulated NVML and the real
``cpu.stat``. On a GPU about 5 minutes (``--only latency``: not part of ``all``, whose 8 minutes are full);
on the simulator about 80 s, about 30 s quick.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from gpucheck.agents import get_json, parse_metrics, value
from gpucheck.context import Context
from gpucheck.plantstats import done_between
from gpucheck.registry import ItemResult
from gpucheck.tenants import Tenant, read_serve, requests, wait_counting

SERVICE_SHARE, TRAINER_SHARE = 30, 70
LOAD = 0.2  # of the device alone: the service well under its share, as the class is meant for
P99_BAR = 1.5  # the class's p99 against the p99 unenforced (the goal)
SHARE_BAR = 0.05
SEED = 29


@dataclass(frozen=True)
class Lengths:
    settle: float  # seconds before a run's window (an agent's first polls, a backlog served)
    measured: float  # the window of the alone, unenforced and class runs
    rotation: float  # the rotation run's window (0: not run)
    solo: float  # the trainer's rate alone
    drain: float  # at most this long after a window, for its requests to be answered


def lengths(ctx: Context) -> Lengths:
    if ctx.sim:
        return Lengths(2.0, 6.0, 0.0, 1.5, 2.0) if ctx.quick else Lengths(3.0, 15.0, 15.0, 3.0, 3.0)
    return Lengths(3.0, 10.0, 0.0, 2.0, 3.0) if ctx.quick else Lengths(5.0, 60.0, 30.0, 4.0, 5.0)


START_S = {True: 20.0, False: 60.0}  # tenants' start (a GPU: CUDA, timing a product) and the idle check
AGENT_S = 15.0  # an agent's start, its first decisions and its stop (slower on a loaded machine)
DECIDE_S = 30.0  # at most this long for an agent to decide for both pods (it reads NVML's processes first)


def budget(ctx: Context) -> float:
    n = lengths(ctx)
    runs = 3 * (n.settle + n.measured + n.drain) + (n.settle + n.rotation + n.drain if n.rotation else 0.0)
    agents = 2 if n.rotation else 1
    return START_S[ctx.sim] + n.solo + 1.0 + runs + agents * AGENT_S + 10.0


def percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank below); None when there are none."""
    return ordered[int(q * (len(ordered) - 1))] if ordered else None


def service_requests(service: Tenant, until: float) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    """The service's schedule and its requests that arrived before ``until``: (arrival, products)."""
    schedule = read_serve(service.counter)
    if schedule is None:
        raise RuntimeError(f"the service wrote no schedule ({service.said()})")
    out = []
    for offset, kernels in requests(schedule["seed"], schedule["rate"], schedule["low"], schedule["high"]):
        if schedule["t0"] + offset >= until:
            break
        out.append((schedule["t0"] + offset, kernels))
    return schedule, out


def measure(run: dict[str, Any], schedule: dict[str, Any], arrivals: list[tuple[float, int]],
            answered: list[float], trainer_done: list[float], trainer_solo: float) -> dict[str, Any]:
    """One run's figures from the traces: requests arrived in its window (FIFO: the i-th answer is the i-th
    arrival), their latencies (one unanswered at ``run["ended"]`` counts what it waited), the work of each."""
    w0, w1 = run["window"]
    latencies, unanswered, kernels_done, kernels_asked = [], 0, 0, 0
    for i, (arrival, kernels) in enumerate(arrivals):
        done = answered[i] if i < len(answered) else None
        if w0 <= arrival < w1:
            kernels_asked += kernels
            if done is None:
                unanswered += 1
            latencies.append((done if done is not None else run["ended"]) - arrival)
        if done is not None and w0 < done <= w1:
            kernels_done += kernels
    seconds = w1 - w0
    asked, service = (k * schedule["kernel_s"] / seconds for k in (kernels_asked, kernels_done))
    trainer = done_between(trainer_done, w0, w1) / trainer_solo / seconds if trainer_solo else 0.0
    latencies.sort()
    total = service + trainer
    ms = [None if p is None else round(p * 1000, 1)
          for p in (percentile(latencies, q) for q in (0.5, 0.99, 0.999))]
    return {"run": run["name"], "requests": len(latencies), "unanswered": unanswered, "p50_ms": ms[0],
            "p99_ms": ms[1], "p999_ms": ms[2], "service_asked": round(asked, 3),
            "service_work": round(service, 3),
            "trainer_work": round(trainer, 3), "throughput_kept": round(total, 3),
            "shares": [round(service / total, 3), round(trainer / total, 3)] if total else None,
            "seconds": round(seconds, 1), **{k: v for k, v in run.items() if k not in ("name", "window")}}


def wait_answered(service: Tenant, until: float, deadline: float) -> None:
    """Until every request that arrived before ``until`` is answered (FIFO: one that arrived after it was),
    or ``deadline``."""
    while time.monotonic() < deadline:
        done = service.enqueued()
        if done and done[-1] >= until:
            return
        time.sleep(0.1)


def solo_rate(tenant: Tenant, seconds: float) -> float:
    """Iterations a second ``tenant`` completed over the next ``seconds``, by its own completion times (on a
    GPU when the GPU finished each: the windows of the runs count them the same way)."""
    w0 = time.monotonic()
    time.sleep(seconds)
    w1 = time.monotonic()
    time.sleep(0.3)  # the tenants flush their traces every 0.1 s
    return done_between(sorted(tenant.times()), w0, w1) / (w1 - w0)


def wait_deciding(runner: Any, uids: set[str], timeout: float) -> None:
    """Until the agent's enforcement names both pods (it has read them and decided)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        enforcement = get_json(runner, "/v1/state").get("enforcement") or {}
        if uids <= {s.get("pod") for s in enforcement.get("shares", ())}:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the agent did not decide for both pods within {timeout:g} s")


def one_run(ctx: Context, name: str, service: Tenant, trainer: Tenant, n: Lengths, measured: float, *,
            trainer_on: bool = True, latency_class: bool | None = None) -> dict[str, Any]:
    """A run: the trainer frozen or free by hand, or an enforcing agent (``latency_class`` True or False)."""
    trainer.freeze(not trainer_on)
    runner, record = None, {"name": name}
    if latency_class is not None:
        rule: dict[str, Any] = {"match_pod": service.uid, "gpu_share": SERVICE_SHARE}
        if latency_class:
            rule["latency_sensitive"] = True
        batch = {"match_pod": trainer.uid, "gpu_share": TRAINER_SHARE}
        settings: dict[str, Any] = {"mode": "enforce", "policies": [rule, batch]}
        if ctx.sim:
            settings["poll_interval"] = 0.5  # as the shares item: CPU tenants, a faster loop
        runner = ctx.start_agent(f"latency-{name}", [service, trainer], **settings)
    try:
        if runner is not None:
            wait_deciding(runner, {service.uid, trainer.uid}, DECIDE_S)
            before = parse_metrics(runner.metrics())
        time.sleep(n.settle)
        w0 = time.monotonic()
        time.sleep(measured)
        w1 = time.monotonic()
        wait_answered(service, w1, w1 + n.drain)
        record.update(window=(w0, w1), ended=time.monotonic())
        if runner is not None:
            after = parse_metrics(runner.metrics())
            state = get_json(runner, "/v1/state")
            limits = [entry for entry in (state.get("enforcement") or {}).get("limits", ())
                      if isinstance(entry, dict) and service.uid in (entry.get("name"), entry.get("owner"))]
            enforcement = state.get("enforcement") or {}
            record.update(
                in_class=bool(limits) and all(entry.get("latency_sensitive") is True for entry in limits),
                ticks=enforcement.get("latency_ticks"), tick_s=enforcement.get("tick_seconds"),
                freezes=_delta(before, after, "gpuagent_enforcement_actions_total", action="freeze",
                               outcome="done"),
                service_frozen_s=_delta(before, after, "gpuagent_pod_gpu_throttled_seconds_total",
                                        pod=service.uid),
                trainer_frozen_s=_delta(before, after, "gpuagent_pod_gpu_throttled_seconds_total",
                                        pod=trainer.uid))
    finally:
        if runner is not None:
            ctx.stop_agent(runner)
            record["left_frozen"] = [t.name for t in (service, trainer) if t.frozen()]
    return record


def _delta(before: Any, after: Any, name: str, **labels: str) -> float | None:
    a, b = value(before, name, **labels), value(after, name, **labels)
    return None if a is None or b is None else round(b - a, 2)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | requests (unanswered) | p50 / p99 / p99.9 ms | service asked | service work | "
             "trainer work | shares of the work | throughput kept | agent's freezes | service frozen s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        shares = "/".join(f"{s:.3f}" for s in r["shares"]) if r["shares"] else ""
        lines.append(f"| {r['run']} | {r['requests']} ({r['unanswered']}) | {r['p50_ms']} / {r['p99_ms']} / "
                     f"{r['p999_ms']} | {r['service_asked']:.3f} | {r['service_work']:.3f} | "
                     f"{r['trainer_work']:.3f} | {shares} | "
                     f"{r['throughput_kept']:.3f} | {r.get('freezes', '')} | "
                     f"{r.get('service_frozen_s', '')} |")
    return "\n".join(lines)


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    n = lengths(ctx)
    service = ctx.start_tenant("cpu-serve" if ctx.sim else "serve", "service", seed=SEED, load=LOAD)
    trainer = ctx.start_tenant("cpu" if ctx.sim else "trainer", "trainer")
    wait_counting([service, trainer], timeout=max(10.0, min(120.0, ctx.left())))
    idle = ctx.quiet([service, trainer])
    service.freeze(True)  # the trainer's rate alone: the unit of its work
    try:
        time.sleep(0.3 if ctx.sim else 1.0)  # the service's queue drains
        trainer_solo = solo_rate(trainer, n.solo)
    finally:
        service.freeze(False)
    plan = [("alone", {"trainer_on": False}, n.measured), ("unenforced", {}, n.measured),
            ("latency class", {"latency_class": True}, n.measured)]
    if n.rotation:
        plan.append(("rotation", {"latency_class": False}, n.rotation))
    runs, skipped = [], []
    for name, options, measured in plan:
        if ctx.left() < n.settle + measured + n.drain + (AGENT_S if "latency_class" in options else 0.0):
            skipped.append(name)
            continue
        runs.append(one_run(ctx, name, service, trainer, n, measured, **options))
    with contextlib.suppress(OSError):
        trainer.freeze(False)
    time.sleep(0.3)  # the tenants flush their traces every 0.1 s
    schedule, arrivals = service_requests(service, max(r["ended"] for r in runs) if runs else 0.0)
    answered, trainer_done = list(service.times()), sorted(trainer.times())
    rows = [measure(r, schedule, arrivals, answered, trainer_done, trainer_solo) for r in runs]
    by = {r["run"]: r for r in rows}
    result.figures = {"rows": rows, "schedule": schedule, "trainer_solo_per_s": round(trainer_solo, 2),
                      "shares": {"service": SERVICE_SHARE, "trainer": TRAINER_SHARE}, "load": LOAD,
                      "idle": idle, "not_run_for_lack_of_time": skipped,
                      "said": {"service": service.said(), "trainer": trainer.said()}}
    result.text = table(rows)
    result.check("the device otherwise idle before the runs", idle,
                 None if ctx.sim else bool(idle.get("idle")),
                 bar="" if ctx.sim else "no other process on the GPU; < 5 % busy")
    if "latency class" not in by or "unenforced" not in by or "alone" not in by:
        result.status, result.reason = "fail", f"runs not done for lack of time: {', '.join(skipped)}"
        return result
    alone, free, cls = by["alone"], by["unenforced"], by["latency class"]
    result.check("latency class: the agent put the service in it (/v1/state limits)", cls["in_class"],
                 cls["in_class"] is True, bar="latency_sensitive")
    result.check("latency class: how the agent read a request's end (/v1/state)", cls.get("ticks"), None,
                 note=f"the scheduler's tick {cls.get('tick_s')} s; calibrated: at the tick, else still time")
    ratio = cls["p99_ms"] / free["p99_ms"] if cls["p99_ms"] and free["p99_ms"] else None
    result.check("p99 under the latency class against the p99 unenforced", round(ratio, 2) if ratio else None,
                 ratio is not None and ratio <= P99_BAR, bar=f"<= {P99_BAR}",
                 note=f"{cls['p99_ms']} against {free['p99_ms']} ms; alone {alone['p99_ms']} ms")
    # under its share the service is owed what it asked in the window, the trainer the rest of the work done
    owed = min(cls["service_asked"], SERVICE_SHARE / 100) / cls["throughput_kept"] if cls["throughput_kept"] \
        else 0.0
    expected = [round(owed, 3), round(1 - owed, 3)]
    error = max(abs(s - e) for s, e in zip(cls["shares"] or [0.0, 0.0], expected, strict=True))
    result.check("latency class: shares of the work (service, trainer)", cls["shares"], error <= SHARE_BAR,
                 bar="each within 5 points", expected=expected,
                 note=f"off by {error * 100:.1f} points; the service asked {cls['service_asked']:.3f} of the "
                      f"device in the window (alone {alone['service_asked']:.3f})")
    for row in rows:
        result.check(f"{row['run']}: p50 / p99 / p99.9 ms ({row['requests']} requests)",
                     [row["p50_ms"], row["p99_ms"], row["p999_ms"]], None)
        if row["run"] != "alone":
            result.check(f"{row['run']}: throughput kept (service + trainer, of the device alone)",
                         row["throughput_kept"], None)
        if "left_frozen" in row:
            result.check(f"{row['run']}: nothing left frozen after SIGTERM", row["left_frozen"],
                         not row["left_frozen"], bar="no cgroup frozen")
    return result.settle()
