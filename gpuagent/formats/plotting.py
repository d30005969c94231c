"""Whether the commands' HTML pages can be drawn: matplotlib is an extra (``report``), imported by the plots
only; ``--format html`` checks for it first, so a missing extra is one line naming the install command, before
any query is sent."""

from __future__ import annotations

import importlib

from gpuagent.prom.errors import ReportError

PLOTTING_EXTRA = "report"  # pyproject's extra that brings matplotlib


def require_plotting() -> None:
    """Import matplotlib, which only ``--format html`` draws with; without it (the ``report`` extra not
    installed) a :class:`ReportError` naming the install command. Any other missing module is a broken
    install, raised as it is."""
    try:
        importlib.import_module("matplotlib")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        raise ReportError(f"--format html draws its plots with matplotlib, which is not installed; it comes "
                          f"with the '{PLOTTING_EXTRA}' extra: pip install 'gpuagent[{PLOTTING_EXTRA}]' (or "
                          f"pick --format table, csv or json)") from None
