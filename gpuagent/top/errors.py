"""The one error type of ``gpuagent top``: a message fit to print as one line, and exit 2."""

from __future__ import annotations


class TopError(Exception):
    """A bad argument, an agents file that does not read, or an agent or Prometheus that cannot be used at
    start (a wrong URL). ``str()`` is the whole line for the user, naming the argument or URL at fault."""
