"""Run the registered items under their budgets and an overall deadline, clean up on every way out, and
write the report.

The plan (each item, its budget or why it cannot run here) is printed first. An item runs only if its budget
fits in the time left; while it runs, a timer interrupts it at its budget (capped by the deadline) and an
error in it is its own result, never the end of the others. SIGTERM and SIGINT end the running item the
same way and skip the rest. Whatever happens, the context stops every agent and tenant and removes the
cgroups (thawed first) before the report is written; what could not be cleaned is in the report.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import signal
import sys
import tarfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpucheck import report
from gpucheck.context import Context
from gpucheck.machine import detect, missing
from gpucheck.registry import ERROR, ITEMS, SKIPPED, Item, ItemResult

GRACE_S = 10.0  # past its budget an item is interrupted (it should end itself at its budget)


class Interrupted(BaseException):
    """The running item's time ran out, or SIGTERM/SIGINT came (BaseException: items catch Exception)."""


@contextlib.contextmanager
def alarm(seconds: float, why: str) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise Interrupted(why)

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pack(workdir: Path) -> Path:
    """The work directory as one archive beside the report (a lent machine sends back a few files only)."""
    archive = workdir.with_name("work.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(workdir, arcname="work")
    shutil.rmtree(workdir, ignore_errors=True)
    return archive


def choose_backend(requested: str, facts: dict[str, Any]) -> str:
    if requested == "auto":
        return "nvml" if facts.get("gpu") else "sim"
    return requested


def run_all(args: Any) -> int:
    unknown = sorted(set(args.only or ()) - set(ITEMS.names()))
    if unknown:
        print(f"gpu-check: no item named {', '.join(map(repr, unknown))} (items: {', '.join(ITEMS.names())})",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started_wall = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.monotonic()
    deadline = began + args.deadline
    facts = detect()
    backend = choose_backend(args.backend, facts)
    out = Path(args.out).resolve()
    workdir = out / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    selected = [item for item in ITEMS if item.name in args.only] if args.only else \
        [item for item in ITEMS if not item.on_request]
    options = {"share_configs": args.share_configs, "share_kinds": args.share_kinds, "runs": args.runs,
               "share_seconds": args.share_seconds, "planned": [i.name for i in selected]}
    ctx = Context(backend=backend, quick=args.quick, workdir=workdir, facts=facts, options=options)
    results: dict[str, tuple[Item, ItemResult, float]] = {}
    plan = []
    for item in selected:
        if backend not in item.needs or (backend == "nvml" and not facts.get("gpu")):
            why = "needs GPU"
        else:
            why = missing(facts, item.needs[backend])
        plan.append((item, why, item.budget_s(ctx) * args.budget_scale))
    print(f"gpu-check: backend {backend}" + (f" ({facts.get('gpus')} x {facts.get('gpu_name')}, driver "
          f"{facts.get('driver')})" if backend == "nvml" else f" (GPU: {facts.get('gpu_reason', 'none')})")
          + f"; deadline {args.deadline:g} s; report in {out}", flush=True)
    for item, why, budget in plan:
        print(f"  {item.name:11} {why or f'{budget:5.0f} s'}", flush=True)
    total = sum(b for _, why, b in plan if not why)
    print(f"  {'total':11} {total:5.0f} s" + ("  (over the deadline: the last items may not fit)"
                                              if total > args.deadline else ""), flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")

    handlers = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    stopped = ""
    leftovers: list[str] = []
    try:
        for item, why, budget in plan:
            if stopped:
                results[item.name] = (item, ItemResult(status=SKIPPED, reason=stopped), budget)
                continue
            if why:
                results[item.name] = (item, ItemResult(status=SKIPPED, reason=why), budget)
                continue
            left = deadline - time.monotonic()
            if left < min(budget, 20.0):
                reason = f"not run: {left:.0f} s left of the deadline, its budget is {budget:.0f} s"
                results[item.name] = (item, ItemResult(status=SKIPPED, reason=reason), budget)
                continue
            allowed = min(budget, left)
            print(f"[{time.monotonic() - began:5.0f} s] {item.name}: up to {allowed:.0f} s", flush=True)
            ctx.item_deadline = time.monotonic() + allowed
            item_began = time.monotonic()
            try:
                with alarm(allowed + GRACE_S, f"ran past its {allowed:.0f} s"):
                    result = item.run(ctx)
            except Interrupted as exc:
                result = ItemResult(status=ERROR, reason=str(exc))
                if str(exc).startswith("stopped by signal"):
                    stopped = str(exc)
            except Exception as exc:
                (workdir / f"{item.name}.traceback").write_text(traceback.format_exc())
                result = ItemResult(status=ERROR, reason=f"{exc!r} (traceback: work/{item.name}.traceback)")
            result.seconds = time.monotonic() - item_began
            results[item.name] = (item, result, budget)
            leftovers += ctx.after_item()
            print(f"[{time.monotonic() - began:5.0f} s] {item.name}: {result.status}"
                  + (f" ({result.reason})" if result.reason else ""), flush=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        problems = leftovers + ctx.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    document = {
        "started_at": started_wall, "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "backend": backend, "quick": args.quick, "deadline_s": args.deadline,
        "elapsed_s": round(time.monotonic() - began, 1), "machine": facts,
        "summary": dict(Counter(r.status if r.status != SKIPPED or not r.reason.startswith("needs")
                                else r.reason.split(" (")[0] for _, r, _ in results.values())),
        "items": [{"name": i.name, "title": i.title, "budget_s": b, **r.as_json()}
                  for i, r, b in results.values()],
        "probe": ctx.records.get("probe"),
        "cleanup": "; ".join(problems),
    }
    md, js = report.write(out, document)
    archive = pack(workdir)
    print(md.read_text(), flush=True)
    print(f"gpu-check: wrote {md}, {js} and {archive} (agents' logs, configs, the probe's JSON)", flush=True)
    failed = [r for _, r, _ in results.values() if r.status in ("fail", ERROR)]
    return 1 if failed or problems else 0
