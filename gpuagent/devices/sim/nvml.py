"""``SimulatedNvml``: a drop-in test double of the ``pynvml`` module, driven by a scenario.

Fidelity to pynvml is the point: the agent's backend runs the same code on this object as on the real
module. So:

- every function the backend uses is a method with pynvml's name and positional signature, returning
  pynvml's types (its ctypes structs, ``str`` for strings, lists where pynvml returns lists, "friendly
  objects" for process lists; ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint`` as pynvml does);
- every other attribute comes from the real ``pynvml`` through ``__getattr__``: constants, struct classes,
  the ``NVMLError`` classes (``except nvml.NVMLError_GpuIsLost`` works the same on both); a pynvml
  *function* this class does not implement raises ``NVML_ERROR_FUNCTION_NOT_FOUND`` when called, like a
  symbol missing from an old driver;
- errors are ``pynvml.NVMLError(code)`` (pynvml picks the subclass); calls before ``nvmlInit`` raise
  UNINITIALIZED; ``nvmlInit``/``nvmlShutdown`` are reference counted;
- device handles (MIG ones too) and event sets are real ``c_nvmlDevice_t``/``c_nvmlEventSet_t`` pointers
  to small buffers the simulator owns, and each call returns a fresh pointer object, as pynvml does (so
  ``h1 == h2`` is False for two lookups of one GPU, exactly like on a real driver; compare addresses with
  ``ctypes.cast(h, c_void_p).value``). ``nvmlEventSetWait`` returns a real ``c_nvmlEventData_t`` whose
  ``device`` is such a handle; GPM samples are real ``c_nvmlGpmSample_t`` pointers.

Scenario time ``t`` is ``clock() - t0`` with ``t0`` taken at construction; tests pass a fake clock.
Thread-safe: one lock guards the shared state and is never held while a call blocks (a hang, an event
wait, injected latency).

Sim-only extensions (not in pynvml; keep them few): ``hostname`` (the scenario's node name),
``scenario``, ``process_name(pid)`` (the scenario's name of a process), ``process_environ(pid)`` (a made-up
PID's environment, as ``/proc/PID/environ`` would hold it), ``release_hangs()`` (wake every
call blocked by a ``hang`` fault now) and ``call_counts()`` (calls per function name, for tests that check
the backend's call discipline).
"""

from __future__ import annotations

from gpuagent.devices.sim.core import NO_INSTANCE, SimCore
from gpuagent.devices.sim.device_info import DeviceInfoCalls
from gpuagent.devices.sim.events import EventCalls
from gpuagent.devices.sim.gpm_calls import GpmCalls
from gpuagent.devices.sim.mig_calls import MigCalls
from gpuagent.devices.sim.processes import ProcessCalls
from gpuagent.devices.sim.telemetry import TelemetryCalls

__all__ = ["NO_INSTANCE", "SimulatedNvml"]


class SimulatedNvml(
    DeviceInfoCalls, MigCalls, TelemetryCalls, ProcessCalls, GpmCalls, EventCalls, SimCore
):
    """The simulated ``pynvml`` module of one scenario. See the module docstring.

    Its calls come in groups, one module each (``device_info``, ``mig_calls``, ``telemetry``,
    ``processes``, ``gpm_calls``, ``events``) on the shared state and plumbing of ``core``.
    """
