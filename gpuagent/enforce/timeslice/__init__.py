"""Time-slice shares on one GPU: controllers decide each tenant's frozen fraction, a plan places the frozen
time within each period, and the cycler applies it by freezing cgroups.

- ``rotation.py``: :class:`RotationController`, the default (``share_scheme: rotation``): slots in proportion
  to the shares, exclusive, with a slow correction from NVML's per-process view;
- ``controller.py``: :class:`ShareController`, the PI on NVML's per-process view of ``share_scheme: duty``;
- ``plans.py``: :class:`RotationPlan` (exclusive slots) and :class:`DutyPlan` (overlapping thawed ends),
  both with a dithered period;
- ``cycler.py``: :class:`Cycler`, the event-loop task that applies a plan (:class:`DutyCycler` for duty);
- ``latency.py``: :class:`LatencyController`, a latency class beside the rotation (issue 29): a GPU's
  rotation is wrapped in one while a workload there is latency-sensitive (``enforce/policy.py``);
- ``preempt.py``: :class:`Preemption`, the latency class's preemption in the agent: a thread reading the
  latency workloads' ``cpu.stat``, the batch ones held frozen through the cycler.

Why the rotation, and the derivation of both controllers: docs/shares.md.
"""

from gpuagent.enforce.timeslice.controller import ShareController, Tenant
from gpuagent.enforce.timeslice.cycler import Cycler, DutyCycler
from gpuagent.enforce.timeslice.latency import LatencyController
from gpuagent.enforce.timeslice.plans import DutyPlan, Period, RotationPlan, desired, make_plan
from gpuagent.enforce.timeslice.preempt import Preemption
from gpuagent.enforce.timeslice.rotation import RotationController

__all__ = [
    "Cycler",
    "DutyCycler",
    "DutyPlan",
    "LatencyController",
    "Period",
    "Preemption",
    "RotationController",
    "RotationPlan",
    "ShareController",
    "Tenant",
    "desired",
    "make_plan",
]
