"""Scenario files of the simulated NVML: YAML in, frozen dataclasses out.

Validation runs in two passes, JSON Schema (``schema.json``, ``additionalProperties: false`` everywhere,
so a typo is an error, not a silently ignored key) and then the semantic checks a schema cannot express
(GPU indices, MIG profiles of the GPU's model, PID uniqueness, curve ranges). Every message names the
path inside the file: ``demo.yaml: processes[3].gpu: GPU index 9 does not exist (scenario has 8 GPUs)``.
All errors found are reported, one per line; :attr:`ScenarioError.errors` holds them as (path, message).

The format, in brief (``examples/scenarios/`` has complete files)::

    hostname: gpu-node-1               # optional, the node's name (a sim-only extension)
    driver: {version: "550.90.07", cuda_version: 12040}
    gpus:
      - model: H100-SXM5-80GB          # models.py: H100-SXM5-80GB, A100-SXM4-40GB, A100-SXM4-80GB, L4, T4,
        count: 2                       #   RTX-4090-Laptop; count expands to identical GPUs
      - model: A100-SXM4-40GB
        mig: {instances: [{profile: 3g.20gb, id: 1}, {profile: 1g.5gb}]}   # id: the GPU-instance ID
    processes:
      - name: train                    # pid omitted: a fake PID >= 4200000; given: a real PID
        gpu: 0
        memory: 20Gi                   # bytes, "512Mi", "80GB", or a curve of those
        sm_util: {sine: {min: 20, max: 90, period: 60}}
      - {name: infer, gpu: 2, mig_instance: 1, sm_util: 40, start: 10, stop: 100}
    faults:
      - xid: {gpu: 0, at: 30, code: 79}
      - gpu_lost: {gpu: 0, at: 31}
    pods:                              # read by `gpuagent demo` only (gpuagent/demo/), not by the simulator
      - namespace: ml
        name: train-0
        owner: {kind: StatefulSet, name: train}   # Deployment, StatefulSet, Job, CronJob; omitted: bare
        annotations: {gpuagent.io/gpu-share: "50"}
        containers:
          - name: main
            processes: [train]         # processes by name: they run in this container's cgroup
            devices: [{gpu: 0}]        # allocated: a GPU, {gpu: 1, replica: 0}, {gpu: 2, mig_instance: 1}

Defaults when a GPU curve is omitted: utilization = min(100, sum of its processes' ``sm_util``); power
between the model's idle power and its limit by utilization; temperature from power; memory utilization
from the processes' ``mem_util`` (default half their ``sm_util``). A process's ``memory`` defaults to
300 MiB (a CUDA context), ``sm_util`` to 0, ``type`` to compute. ``mig_instance`` names the GPU-instance
ID (as ``nvidia-smi`` shows "GI ID"); instances without an ``id`` get the profile's first free placement.

MPS: a process of ``type: mps_server`` is the MPS server (named ``nvidia-cuda-mps-server``, on the compute
list); ``type: mps_client`` is a client, listed only by ``nvmlDeviceGetMPSComputeRunningProcesses_v3``,
with ``mps: {active_thread_percentage: 30, pinned_memory_limit: 8Gi}`` as its environment's limits (the
simulator holds its SM use and memory to them). ``environ:`` is a made-up PID's simulated environment;
a real PID's limits are its own environment. ``driver.mps_utilization: server`` puts the clients'
per-process utilization on the server's PID instead of theirs.

The package, one job a module: ``spec.py`` the model (the frozen specs the simulator runs from);
``load.py`` text to a validated mapping to a :class:`Scenario`; ``messages.py`` JSON Schema errors in
words; ``build.py`` the semantic checks and the building, one module per section (``gpus.py`` with
``mig_layout.py``, ``processes.py`` with ``mps.py``, ``faults.py``, ``pods.py``), curves in
``curve_nodes.py``, and what they share in ``checks.py`` (the problems found, pynvml's names) and
``values.py`` (sizes, values shown).
"""

from gpuagent.devices.sim.scenario.load import (
    SCHEMA_PATH,
    ScenarioError,
    load_scenario,
    parse_scenario,
    schema,
)
from gpuagent.devices.sim.scenario.spec import (
    DEFAULT_CUDA_VERSION,
    DEFAULT_DRIVER_VERSION,
    DEFAULT_PROCESS_MEMORY,
    FAKE_PID_BASE,
    MPS_LIMIT_VARIABLES,
    MPS_SERVER_NAME,
    DriverSpec,
    EccFault,
    Fault,
    GpuLost,
    GpuSpec,
    HangFault,
    InitFailure,
    MigInstanceSpec,
    MpsSpec,
    NvlinkDownFault,
    PcieReplayFault,
    ProcessSpec,
    RowRemapFailure,
    Scenario,
    XidFault,
    stable_digest,
)
from gpuagent.devices.sim.scenario.values import parse_size

__all__ = [
    "DEFAULT_CUDA_VERSION",
    "DEFAULT_DRIVER_VERSION",
    "DEFAULT_PROCESS_MEMORY",
    "FAKE_PID_BASE",
    "MPS_LIMIT_VARIABLES",
    "MPS_SERVER_NAME",
    "SCHEMA_PATH",
    "DriverSpec",
    "EccFault",
    "Fault",
    "GpuLost",
    "GpuSpec",
    "HangFault",
    "InitFailure",
    "MigInstanceSpec",
    "MpsSpec",
    "NvlinkDownFault",
    "PcieReplayFault",
    "ProcessSpec",
    "RowRemapFailure",
    "Scenario",
    "ScenarioError",
    "XidFault",
    "load_scenario",
    "parse_scenario",
    "parse_size",
    "schema",
    "stable_digest",
]
