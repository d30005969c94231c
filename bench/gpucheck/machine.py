"""What this machine has: a GPU and its driver, nvidia-smi, PyTorch with CUDA, cgroups, CPUs, the agent's
imports. Each probe runs in a subprocess with a timeout, so a missing or broken piece is a fact in the
report ("needs torch"), never a crash of the check."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())  # the checkout

_TORCH = ("import torch; ok = torch.cuda.is_available(); "
          "print(torch.__version__, ok, torch.cuda.get_device_name(0) if ok else '')")
_NVML = ("import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
         "print(n.nvmlDeviceGetCount(), '|', n.nvmlSystemGetDriverVersion(), '|', n.nvmlDeviceGetName(h))")


def _python(code: str, timeout: float = 60.0) -> tuple[bool, str]:
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:g} s"
    text = (done.stdout if done.returncode == 0 else done.stderr).strip()
    return done.returncode == 0, text.splitlines()[-1] if text else ""


def detect() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": platform.python_version(), "kernel": platform.release(),
        "cpus": len(os.sched_getaffinity(0)), "root": os.geteuid() == 0,
        "nvidia_smi": shutil.which("nvidia-smi"),
    }
    ok, text = _python(_NVML)
    if ok:
        count, driver, name = (part.strip() for part in text.split("|"))
        facts.update(gpu=True, gpus=int(count), driver=driver, gpu_name=name)
    else:
        facts.update(gpu=False, gpu_reason=text or "NVML did not initialise")
    ok, text = _python(_TORCH, timeout=120.0)
    parts = text.split(" ", 2) if ok else []
    facts["torch"] = parts[0] if ok and len(parts) >= 2 and parts[1] == "True" else None
    if not facts["torch"]:
        facts["torch_reason"] = text if not ok else "CUDA not available to PyTorch"
    ok, text = _python("import gpuagent.agent")
    facts["agent_imports"] = None if ok else text
    ok, text = _python("import jsonschema, gpuagent.devices.sim")
    facts["simulator"] = None if ok else text
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        from cgroups import cgroups_unavailable

        facts["cgroups"] = cgroups_unavailable()
    except ImportError as exc:
        facts["cgroups"] = f"tests/cgroups.py does not import: {exc}"
    return facts


def missing(facts: dict[str, Any], needs: tuple[str, ...]) -> str:
    """Why an item with ``needs`` cannot run here, or ""."""
    for need in needs:
        if need == "torch" and not facts.get("torch"):
            return f"needs torch ({facts.get('torch_reason', '')})"
        if need == "nvidia-smi" and not facts.get("nvidia_smi"):
            return "needs nvidia-smi"
        if need == "cgroups" and facts.get("cgroups"):
            return f"needs cgroups ({facts['cgroups']})"
        if need == "two CPUs" and facts.get("cpus", 0) < 2:
            return "needs two CPUs (tenants on one, the agent on another)"
        if need == "simulator" and facts.get("simulator"):
            return f"needs the simulator's packages ({facts['simulator']})"
    if facts.get("agent_imports"):
        return f"the agent does not import: {facts['agent_imports']}"
    return ""
