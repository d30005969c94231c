"""Crash safety: ``kill -9`` of the enforcing agent while a tenant is frozen; the restarted agent thaws it
and the tenant resumes.

Two tenants at 90/10 under ``mode: enforce`` until the journal names the throttled one; then the agent is
killed (no chance to thaw) and that tenant's cgroup is frozen by hand, so the crash came mid-freeze for
certain; its iterations must stop. A new agent (``mode: off``, same journal) must thaw it within 10 s of
starting, its iterations must grow again, and the journal must be empty.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpucheck.agents import share_policies
from gpucheck.context import Context
from gpucheck.registry import ItemResult
from gpucheck.tenants import GPU_KINDS, SIM_KINDS


def journal_entries(path: Path) -> list[object]:
    try:
        return list(json.loads(path.read_text() or "{}").get("entries") or [])
    except (OSError, ValueError):
        return []


def run(ctx: Context) -> ItemResult:
    result = ItemResult()
    big, small = ctx.tenants((SIM_KINDS if ctx.sim else GPU_KINDS)[0], 2)
    journal = ctx.workdir / "journal-crash.json"
    settings = {"mode": "enforce", "journal_path": str(journal),
                "policies": share_policies([big, small], [90, 10])}
    if ctx.sim:
        settings["poll_interval"] = 0.5
    first = ctx.start_agent("crash-1", [big, small], **settings)
    deadline = time.monotonic() + 30
    while not journal_entries(journal):
        if time.monotonic() > deadline:
            ctx.stop_agent(first)
            result.check("the agent started throttling", False, False, bar="a journal entry within 30 s")
            return result.settle()
        time.sleep(0.05)
    time.sleep(1.0)
    first.proc.kill()  # kill -9: no chance to thaw
    first.proc.wait(timeout=10)
    ctx.stop_agent(first)
    small.freeze(True)
    named = any(path in journal.read_text() for path in small.process.cgroup_paths.values())
    result.check("the throttled tenant's cgroup is in the journal", named, named, bar="named")
    before = small.count()
    time.sleep(2.0)
    stalled = small.count() - before
    result.check("while frozen its iterations stop", stalled, stalled == 0, bar="0 in 2 s")
    started = time.monotonic()
    second = ctx.start_agent("crash-2", [big, small], ready=False, **{**settings, "mode": "off"})
    try:
        while small.frozen() and time.monotonic() - started < 15:
            time.sleep(0.02)
        thawed_after = time.monotonic() - started
        thawed = not small.frozen()
        result.check("the restarted agent thaws it", round(thawed_after, 2), thawed and thawed_after <= 10,
                     bar="within 10 s of starting (interpreter and imports included)")
        before = small.count()
        time.sleep(3.0)
        resumed = small.count() - before
        result.check("the tenant resumes", resumed, resumed > 0, bar="iterations grow again")
        second.wait_ready(timeout=30)
    finally:
        ctx.stop_agent(second)
    left = journal_entries(journal)
    result.check("the journal is empty afterwards", len(left), not left, bar="no entries")
    return result.settle()
