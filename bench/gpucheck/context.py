"""What the items share: the backend, the clock, the cgroup sandbox, the tenants, the agents, the records.

Everything started through the context (tenants in the sandbox's cgroups, agent processes) is stopped by
``close()``, which the runner calls on every way out (an item's failure, its time running out, the overall
deadline, SIGTERM or SIGINT): agents get SIGTERM (they thaw what they froze), then SIGKILL; the sandbox thaws
every cgroup it made, kills and reaps every tenant and removes the cgroups.

An honest harness: only the tenants an item asked for compute while it runs. ``tenants()`` freezes the shared
tenants it did not hand out; between items every shared tenant is frozen and every other one stopped; and
``quiet()``, before a share, plant or MPS run, stops every tenant but the run's own and checks that nothing
else uses the device (on a GPU, NVML's process lists; ``gpucheck.idle``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from gpucheck.agents import agent_config
from gpucheck.idle import check_idle
from gpucheck.tenants import Tenant, argv, counter_path, wait_counting


class Context:
    def __init__(self, *, backend: str, quick: bool, workdir: Path, facts: dict[str, Any],
                 options: dict[str, Any] | None = None) -> None:
        self.backend = backend  # "nvml": a real GPU; "sim": the simulator
        self.quick = quick
        self.options = options or {}  # the command line's item options (share configs, runs, ...)
        self.workdir = workdir
        self.facts = facts
        self.records: dict[str, Any] = {}  # what one item leaves for another (the probe's costs, a run)
        self.item_deadline = float("inf")  # monotonic time the running item must end by
        self._sandbox: Any = None
        self._sandbox_cm: Any = None
        self._pool: dict[tuple[str, str], Tenant] = {}
        self._others: list[Tenant] = []  # tenants started outside the pool (a hog, a light tenant)
        self._agents: list[Any] = []
        self.burn_cpu: int | None = None  # the simulator's tenants share this CPU; the rest run elsewhere
        self._affinity: set[int] | None = None

    @property
    def sim(self) -> bool:
        return self.backend == "sim"

    def left(self) -> float:
        """Seconds the running item has left."""
        return self.item_deadline - time.monotonic()

    # -- tenants ---------------------------------------------------------------------------------------

    def sandbox(self) -> Any:
        if self._sandbox is None:
            from cgroups import CgroupSandbox

            self._sandbox_cm = CgroupSandbox.open()
            self._sandbox = self._sandbox_cm.__enter__()
            if self.sim:
                self._pin()
        return self._sandbox

    def _pin(self) -> None:
        """On the simulator the tenants contend for one CPU and the agents and this process use the others
        (as the enforcement end-to-end tests do): the least busy CPU now, so that another program pinned
        to one (a test's burner) does not take the tenants' time."""
        import psutil

        cpus = os.sched_getaffinity(0)
        busy = psutil.cpu_percent(interval=0.5, percpu=True)
        self.burn_cpu = min(sorted(cpus), key=lambda cpu: busy[cpu] if cpu < len(busy) else 100.0)
        if len(cpus) > 1:
            self._affinity = set(cpus)
            os.sched_setaffinity(0, cpus - {self.burn_cpu})

    @staticmethod
    def _weigh(sandbox: Any) -> None:
        """On the simulator the tenants' CPU is their GPU: the sandbox gets the most CPU weight there is
        (v1 ``cpu.shares``, v2 ``cpu.weight`` where the controller is enabled), so on a shared machine other
        programs on that CPU take a few percent of it, not most (they compete as one entity of weight 1024
        each). Among themselves the tenants still weigh the same."""
        for hierarchy in sandbox.hierarchies:
            if hierarchy.version == 1 and "cpu" not in hierarchy.controllers:
                continue
            top = hierarchy.directory(sandbox.cgroup_path(hierarchy, ""))
            for name, value in (("cpu.shares", "262144"), ("cpu.weight", "10000")):
                with contextlib.suppress(OSError):
                    if (top / name).exists():
                        (top / name).write_text(value)

    def tenants(self, kind: str, count: int) -> list[Tenant]:
        """``count`` running tenants of ``kind``, shared between items (started on first use, restarted if
        one died); each thawed before it is handed out, every other shared tenant frozen."""
        names = [f"{kind}-{chr(ord('a') + i)}" for i in range(count)]
        for name in names:
            tenant = self._pool.get((kind, name))
            if tenant is None or not tenant.alive():
                self._pool[(kind, name)] = self.start_tenant(kind, name, pooled=True)
        chosen = [self._pool[(kind, n)] for n in names]
        for tenant in self._pool.values():
            if tenant not in chosen:
                with contextlib.suppress(OSError):
                    tenant.freeze(True)
        for tenant in chosen:
            with contextlib.suppress(OSError):
                tenant.freeze(False)
        wait_counting(chosen, timeout=max(10.0, min(120.0, self.left())))
        return chosen

    def live_tenants(self) -> list[Tenant]:
        """Every tenant started through the context that is still running (frozen or not)."""
        return [t for t in [*self._pool.values(), *self._others] if t.alive()]

    def stop_tenant(self, tenant: Tenant) -> None:
        """Thaw (a frozen v1 task ignores SIGKILL), kill and reap ``tenant``; its cgroup stays until close."""
        with contextlib.suppress(OSError):
            tenant.freeze(False)
        tenant.process.kill()
        for key, pooled in list(self._pool.items()):
            if pooled is tenant:
                del self._pool[key]
        if tenant in self._others:
            self._others.remove(tenant)

    def quiet(self, keep: list[Tenant]) -> dict[str, Any]:
        """Before a share, plant or MPS run: stop every tenant but ``keep``, then check the device is
        otherwise idle (``gpucheck.idle.check_idle``; ``keep`` frozen for the look, thawed after). The
        figures go in the run's report."""
        stopped = []
        for tenant in [*self._pool.values(), *self._others]:
            if tenant not in keep:
                stopped.append(tenant.name)
                self.stop_tenant(tenant)
        return {"stopped": stopped, **check_idle(self, keep)}

    def start_tenant(self, kind: str, name: str, *, pooled: bool = False, **options: Any) -> Tenant:
        """A new tenant of its own pod, in a kubelet-shaped cgroup of the sandbox; one not ``pooled`` (not
        shared) is stopped when the item ends."""
        from cgroups import kubelet_container_path, new_container_id, new_pod_uid

        sandbox = self.sandbox()
        uid = new_pod_uid()
        path = kubelet_container_path("systemd", "burstable", uid, "containerd", new_container_id())
        counter = counter_path(self.workdir, name)
        command = argv(kind, counter, cpu=self.burn_cpu if self.sim else None, **options)
        tenant = Tenant(name, kind, uid, sandbox.spawn(path, argv=command), counter)
        if self.sim:
            self._weigh(sandbox)
        if not pooled:
            self._others.append(tenant)
        return tenant

    # -- agents ----------------------------------------------------------------------------------------

    def start_agent(self, name: str, tenants: list[Tenant], *, memory: dict[str, str] | None = None,
                    ready: bool = True, **settings: Any) -> Any:
        """A real ``gpuagent run`` process with ``settings`` over the check's base config; stopped by
        ``stop_agent`` or at ``close``."""
        from agent_runner import AgentRunner

        config = agent_config(self.backend, self.workdir, name, tenants, memory=memory, **settings)
        runner = AgentRunner(name, config, self.workdir)
        self._agents.append(runner)
        if ready:
            runner.wait_ready(timeout=60)
        return runner

    def stop_agent(self, runner: Any) -> None:
        runner.stop()
        if runner in self._agents:
            self._agents.remove(runner)

    def after_item(self) -> list[str]:
        """Between items: stop any agent an item left running (it thaws what it froze on SIGTERM), stop the
        tenants that were the item's own and freeze the shared ones, so nothing computes into the next
        item (which thaws those it asks for)."""
        problems = []
        for runner in list(self._agents):
            try:
                self.stop_agent(runner)
            except Exception as exc:
                problems.append(f"agent {runner.name}: {exc!r}")
        for tenant in list(self._others):
            try:
                self.stop_tenant(tenant)
            except Exception as exc:
                problems.append(f"tenant {tenant.name}: {exc!r}")
        for tenant in self._pool.values():
            with contextlib.suppress(OSError):
                tenant.freeze(True)
        return problems

    # -- the end ---------------------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop every agent, then thaw, kill and remove every tenant and cgroup; what could not be."""
        problems: list[str] = []
        for runner in list(self._agents):
            try:
                runner.stop()
            except Exception as exc:  # go on: the sandbox must still be cleaned
                problems.append(f"agent {runner.name}: {exc!r}")
        self._agents.clear()
        if self._sandbox_cm is not None:
            try:
                self._sandbox_cm.__exit__(None, None, None)
            except Exception as exc:
                problems.append(f"sandbox: {exc!r}")
            problems += self._sandbox.leftovers()
            self._sandbox = self._sandbox_cm = None
        self._pool.clear()
        self._others.clear()
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
            self._affinity = None
        return problems
