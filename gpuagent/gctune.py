"""The garbage collector set for a long-lived process holding many objects: the agent and the extender.

CPython collects the youngest generation every 700 allocations, and its full passes walk every tracked
object. A process that keeps a large, long-lived state (the agent's snapshot and caches; the extender's view
of thousands of nodes) and makes tens of thousands of short-lived objects per poll or per scheduler call
pays for collections that find nothing: ``tune`` freezes what exists (``gc.freeze``: kept out of every later
collection) and collects the generations less often. Cycles are still collected.
"""

from __future__ import annotations

import gc


def tune(young_objects: int, *older: int) -> None:
    """Freeze what is alive now; collect the youngest generation every ``young_objects`` allocations, and
    the older ones after ``older`` collections of the one below (default: CPython's)."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(young_objects, *(older or thresholds[1:]))
