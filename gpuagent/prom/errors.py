"""The one error type of the commands that read Prometheus (``report``, ``recommend``, ``top``'s cluster
view): a message fit to print as is, and exit 2."""

from __future__ import annotations


class ReportError(Exception):
    """Bad arguments, a bad price file, or a Prometheus that cannot be reached or refuses a query.

    ``str()`` is the whole message for the user (it names the argument, file key or URL at fault)."""
