"""The items of ``real_gpu.py all``, registered in the order they run: cheap and independent first, the
long shares runs last but one, accounting from the first shares run; the plant experiment and the latency
item only when ``--only`` names them (``all``'s 8 minutes on a GPU are full). What each needs per backend: an
item without a ``sim`` entry needs a GPU."""

from __future__ import annotations

from gpucheck.items import accounting, cost, crash, ladder, latency, plant, probe, shares, truth
from gpucheck.registry import ITEMS, Item, fixed

SIM = ("cgroups", "two CPUs", "simulator")  # CPU tenants on one CPU, the agent on another

ITEMS.add(Item("probe", "Per-call NVML costs, and cheaper calls for the same figures", probe.run,
               needs={"nvml": ("cgroups",)}, budget_s=fixed(25)))
ITEMS.add(Item("truth", "Truth of the figures against nvidia-smi", truth.run,
               needs={"nvml": ("nvidia-smi", "cgroups")}, budget_s=fixed(22)))
ITEMS.add(Item("cost", "Cost: CPU, RSS, poll and NVML time, enforcement off and on", cost.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=fixed(60, quick=50)))
ITEMS.add(Item("ladder", "Memory ladder: TERM, KILL, memory freed, neighbour untouched", ladder.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=fixed(30, sim=25, quick=20)))
ITEMS.add(Item("crash", "Crash safety: kill -9 while frozen, the restarted agent thaws", crash.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=fixed(30, quick=25)))
ITEMS.add(Item("shares", "Shares: 70/30, 90/10, 50/30/20 of identical tenants", shares.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=shares.budget))
ITEMS.add(Item("accounting", "Accounting: energy against the counter, busy against the shares",
               accounting.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=accounting.budget))
ITEMS.add(Item("plant", "Plant: the GPU under the freezer, open loop (solo, together, duty cycles, rotation, "
                        "drain)", plant.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=fixed(420, sim=150, quick=75),
               on_request=True))
ITEMS.add(Item("latency", "Latency: a request-driven service beside a trainer, alone, unenforced, in the "
                          "latency class (and the rotation)", latency.run,
               needs={"nvml": ("torch", "cgroups"), "sim": SIM}, budget_s=latency.budget, on_request=True))
