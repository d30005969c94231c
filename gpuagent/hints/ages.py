"""The oldest state of the cluster view, kept as writes arrive: ``AgeBuckets``.

An answer of the extender holds until the first state it read ages out (``ClusterView.expiry``), and a call
takes its fast path only while no state has. The view changes with every write (at 100,000 nodes, hundreds
a second), so the oldest heartbeat was found by a pass over every node each time the view had changed
since the last call: at 100,000 nodes a few milliseconds of every call under a steady trickle of writes.
Here the nodes are counted in buckets of ``BUCKET_SECONDS`` of their last heartbeat (on the view's
monotonic clock): a write moves its node from one bucket to another, and the oldest is the first bucket
that holds a node, found among the buckets alone (a few hundred: heartbeats come every few minutes). The
answer is the start of that bucket, at most ``BUCKET_SECONDS`` earlier than the oldest heartbeat: an answer
is worked out again that much sooner, never held past a state's age. Nothing per node is kept here.
"""

from __future__ import annotations

import math

BUCKET_SECONDS = 1.0


def _bucket(answered_at: float) -> float:
    """The bucket of a heartbeat: its start; an unreadable time (NaN) counts as the oldest there can be."""
    start = answered_at // BUCKET_SECONDS * BUCKET_SECONDS
    return start if start == start else -math.inf


class AgeBuckets:
    """Nodes counted by the bucket of their heartbeat's time; see the module docstring."""

    def __init__(self) -> None:
        self._counts: dict[float, int] = {}
        self._oldest: float | None = None  # the first bucket holding a node, while known

    def add(self, answered_at: float) -> None:
        bucket = _bucket(answered_at)
        self._counts[bucket] = self._counts.get(bucket, 0) + 1
        if self._oldest is not None and bucket < self._oldest:
            self._oldest = bucket

    def remove(self, answered_at: float) -> None:
        """One node whose heartbeat was ``answered_at`` (as given to ``add``) leaves its bucket."""
        bucket = _bucket(answered_at)
        left = self._counts[bucket] - 1
        if left:
            self._counts[bucket] = left
            return
        del self._counts[bucket]
        if bucket == self._oldest:
            self._oldest = None  # found again when asked, among the buckets

    def oldest(self) -> float:
        """The start of the oldest heartbeat's bucket; infinity with no node."""
        if self._oldest is None:
            self._oldest = min(self._counts, default=math.inf)
        return self._oldest

    def clear(self) -> None:
        self._counts.clear()
        self._oldest = None

    def __len__(self) -> int:
        return sum(self._counts.values())
