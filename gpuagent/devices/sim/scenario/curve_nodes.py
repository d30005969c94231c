"""A curve as a scenario writes it (a number, a size, or ``sine``/``points``/``steps``/``follow_cpu``)
turned into a :mod:`~gpuagent.devices.sim.curves` curve, checked against the range its quantity allows.

The schema checks each form's keys and types; what it cannot check is here: exactly one form, ``repeat``
and ``period`` only on points or steps, a sine's min under its max, times that increase, and the values'
range (0-100 for a utilization, bytes for a memory curve). ``follow_cpu`` is allowed only where the caller
says (a process's ``sm_util``).
"""

from __future__ import annotations

from typing import Any

from gpuagent.devices.sim.curves import Constant, FollowCpu, Points, Sine
from gpuagent.devices.sim.scenario.checks import Problems
from gpuagent.devices.sim.scenario.values import parse_size


def read_curve(problems: Problems, node: Any, path: str, *, size: bool = False, lo: float | None = None,
               hi: float | None = None, follow: bool = False) -> Any:
    """The curve at ``path``, or None after reporting what is wrong with it. ``size``: values are sizes
    (``"4Gi"``); ``lo``/``hi``: the range the values must lie in; ``follow``: ``follow_cpu`` is allowed."""
    if isinstance(node, (int, float, str)):
        c: Any = Constant(float(parse_size(node)) if size else float(node))
    else:
        kinds = [k for k in ("sine", "points", "steps", "follow_cpu") if k in node]
        if len(kinds) != 1:
            what = "give exactly one of sine, points, steps" + (", follow_cpu" if follow else "")
            problems.error(path, f"{what}; got {', '.join(kinds) if kinds else 'none'}")
            return None
        kind = kinds[0]
        if ("repeat" in node or "period" in node) and kind not in ("points", "steps"):
            problems.error(path, f"repeat and period go with points or steps, not {kind}")
            return None
        if kind == "follow_cpu":
            f = node["follow_cpu"] or {}
            return FollowCpu(
                scale=float(f.get("scale", 1.0)), queue_seconds=float(f.get("queue_seconds", 0.2))
            )
        if kind == "sine":
            s = node["sine"]
            conv = parse_size if size else float
            c = Sine(
                float(conv(s["min"])), float(conv(s["max"])), float(s["period"]), float(s.get("phase", 0))
            )
            if c.min > c.max:
                problems.error(f"{path}.sine", f"min ({s['min']}) is above max ({s['max']})")
                return None
        else:
            pts = tuple(
                (float(t), float(parse_size(v)) if size else float(v)) for t, v in node[kind]
            )
            for i in range(1, len(pts)):
                if pts[i][0] <= pts[i - 1][0]:
                    problems.error(f"{path}.{kind}[{i}]",
                                   f"times must increase: {pts[i][0]:g} after {pts[i - 1][0]:g}")
                    return None
            repeat = bool(node.get("repeat", False))
            period = node.get("period")
            if repeat and period is None and pts[-1][0] <= 0:
                problems.error(path, "repeat needs a period, or a last point after time 0")
                return None
            c = Points(pts, steps=kind == "steps", repeat=repeat,
                       period=float(period) if period is not None else None)
    low, high = c.bounds()
    if (lo is not None and low < lo) or (hi is not None and high > hi):
        unit = " bytes" if size else ""
        rng = f"{lo:g}..{hi:g}" if lo is not None and hi is not None else (
            f">= {lo:g}" if lo is not None else f"<= {hi:g}")
        problems.error(path, f"values must lie in {rng}{unit}, got {low:g}..{high:g}")
        return None
    return c
