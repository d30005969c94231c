"""What a renderer remembers of the snapshot it last rendered, without keeping that snapshot alive.

The guard, the health renderer and the GPU labels each serve again what they made of the snapshot they
last saw while it is still the latest. Holding that snapshot itself kept a whole poll's objects alive until
the next scrape (at 250 pods some 10,000 of them), whose freeing the next scrape then paid for: with a weak
reference the poller frees each snapshot as it publishes the next, as it does with no exporter at all.
Where a snapshot takes no weak reference (``NodeSnapshot`` has the slot from Python 3.11), a strong one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from gpuagent.snapshot.node import NodeSnapshot

Held = Callable[[], NodeSnapshot | None]


def hold(snapshot: NodeSnapshot) -> Held:
    """A callable giving ``snapshot`` back while something else keeps it alive, else None."""
    try:
        return weakref.ref(snapshot)
    except TypeError:  # no __weakref__ slot (Python 3.10)
        return lambda: snapshot


def nothing() -> None:
    """What a renderer holds before its first snapshot."""
    return None
