"""The cluster view's bookkeeping for the extender's fast path, read without an API server: the oldest
heartbeat kept as writes arrive (``hints.ages``: ``ClusterView.expiry`` without a pass over the nodes) and
the nodes' states by name (``ClusterView.states_by_node``), through lists, writes, refusals and deletions."""

from __future__ import annotations

import json
import math
import random
from typing import Any

from test_extender import all_free, all_held

from gpuagent.hints.ages import BUCKET_SECONDS, AgeBuckets
from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.published import Generation, state_object

MAX_AGE = 900.0


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def obj(node: str, heartbeat: float, *, held: bool = False, sequence: int = 1, rv: int = 1) -> bytes:
    hints = all_held(node) if held else all_free(node)
    made = state_object(node, hints, Generation(1, sequence), heartbeat)
    made["metadata"]["resourceVersion"] = str(rv)
    return json.dumps(made).encode()


def listed(view: ClusterView, objects: list[bytes]) -> None:
    page = b'{"metadata":{"resourceVersion":"1"},"items":[' + b",".join(objects) + b"]}"
    decode, _, _ = view._decode_page(page)
    view._replace(decode())


def exact_expiry(view: ClusterView) -> float:
    """What ``expiry`` was before: a pass over every node for the oldest heartbeat."""
    return min((e.answered_at for e in view.entries() if e.answered_at is not None), default=math.inf) + MAX_AGE


def test_age_buckets_name_the_first_bucket_that_holds_a_node() -> None:
    ages = AgeBuckets()
    assert ages.oldest() == math.inf
    for at in (10.2, 12.7, 10.9):
        ages.add(at)
    assert ages.oldest() == 10.0 and len(ages) == 3
    ages.remove(10.2)
    assert ages.oldest() == 10.0  # 10.9 is still in that bucket
    ages.remove(10.9)
    assert ages.oldest() == 12.0
    ages.add(3.5)
    assert ages.oldest() == 3.0
    ages.remove(3.5)
    ages.remove(12.7)
    assert ages.oldest() == math.inf and len(ages) == 0
    ages.add(float("nan"))  # an unreadable time: the oldest there can be, so nothing is held on it
    assert ages.oldest() == -math.inf


def test_the_views_expiry_follows_writes_refusals_and_deletions() -> None:
    """After every change the expiry is at most one bucket before the oldest heartbeat's (the exact pass
    it replaced), never after it: an answer is never held past a state's age."""
    clock = Clock()
    view = ClusterView(monotonic=clock, wall_clock=clock)
    rng = random.Random(5)
    listed(view, [obj(f"n{i}", clock.now - rng.uniform(0, 800)) for i in range(40)])

    def holds() -> None:
        exact = exact_expiry(view)
        assert exact - BUCKET_SECONDS < view.expiry(MAX_AGE) <= exact or exact == view.expiry(MAX_AGE)

    holds()
    oldest = min(view.entries(), key=lambda e: e.answered_at or 0).node
    for sequence in range(2, 30):  # the oldest node writes again, then others, some in a state of their own
        clock.now += rng.uniform(0, 5)
        node = oldest if sequence == 2 else f"n{rng.randrange(40)}"
        view._put(view._decode_object(obj(node, clock.now - rng.uniform(0, 50), held=sequence % 3 == 0,
                                          sequence=sequence, rv=sequence)))
        holds()
    assert view.get(oldest).answered_at > clock.now - 200
    view._put(view._decode_object(b'{"metadata":{"name":"n7","resourceVersion":"99"},"spec":7}'))
    assert view.get("n7").answered_at is None  # refused: unresolvable, not counted among the ages
    holds()
    for node in ("n3", "n7", "n11"):
        view._forget(node)
        holds()
    assert len(view._ages) == sum(1 for e in view.entries() if e.answered_at is not None) == 37


def test_states_by_node_holds_each_judgeable_node_in_its_state() -> None:
    """The extender's common call reads a name's state and its key per kind from this one mapping: it holds
    every node that can be judged, in the state its entry has, and no refused or deleted node."""
    clock = Clock()
    view = ClusterView(monotonic=clock, wall_clock=clock)
    listed(view, [obj(f"n{i}", clock.now, held=i % 2 == 1) for i in range(6)])
    view._put(view._decode_object(obj("n0", clock.now, held=True, sequence=2, rv=2)))
    view._put(view._decode_object(b'{"metadata":{"name":"n1","resourceVersion":"3"},"spec":7}'))
    view._forget("n2")
    states: Any = view.states_by_node()
    assert sorted(states) == ["n0", "n3", "n4", "n5"]
    for node, state in states.items():
        entry = view.get(node)
        assert state.hints is entry.hints and state.key is entry.key and state.keys is entry.keys
        assert (state.shared, state.exclusive, state.mig) == tuple(entry.keys)
    assert states["n0"] is states["n3"]  # held alike: one state
