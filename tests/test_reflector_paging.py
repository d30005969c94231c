"""Lists in pages: the fake API server's ``limit``/``continue`` as the real one serves them, and the cluster
view reading every node's state page by page (issue 31: at 100,000 nodes one answer was 0.7-0.9 GB).

What is held: a paged list is consistent at its first page's version whatever is written between pages, and
the watch from that version brings those writes; a continue that expired mid-list (compaction) makes the
view list again from the first page; ``resourceVersion=0`` is served whole (the watch cache ignores
``limit``), which is why the view's paged lists ask for none; an unreadable object in a page is its node's
problem alone; the view keeps a bounded number of bytes per node, alike nodes sharing one decoded state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fake_apiserver import STATES_PATH, FakeApiServer, ServedList, eventually
from test_extender import all_free, all_held

from gpuagent.hints.cluster_view import ClusterView
from gpuagent.hints.published import Generation, project, state_object
from gpuagent.kubeapi import ApiConnection

FAST = {"relist_backoff": 0.02, "max_backoff": 0.1}


def state(node: str, *, held: bool = False, sequence: int = 1) -> dict[str, Any]:
    hints = all_held(node) if held else all_free(node)
    return state_object(node, project(hints, None), Generation(1, sequence), time.time())


def sequence_of(view: ClusterView, node: str) -> int | None:
    seen = view._seen.get(node)
    return seen[0].sequence if seen is not None else None


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


async def get_list(api: FakeApiServer, **params: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {api.token}"}) as session, \
            session.get(api.url + STATES_PATH, params=params) as response:
        return response.status, await response.json()


def names(answer: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in answer["items"]]


@contextlib.asynccontextmanager
async def paged_view(api: FakeApiServer, page_size: int) -> AsyncIterator[ClusterView]:
    made = ClusterView(connection=ApiConnection(config=api.kubeconfig()), sync_timeout=10.0, **FAST)
    made.page_size = page_size
    stop = asyncio.Event()
    task = asyncio.create_task(made.run(stop))
    try:
        yield made
    finally:
        stop.set()
        await task
        await made.close()


# --- the fake API server pages as the real one does ---------------------------------------------------------


async def test_a_paged_list_is_consistent_at_its_first_pages_version(api: FakeApiServer) -> None:
    for i in range(5):
        api.put_state(state(f"n{i}"))
    status, whole = await get_list(api, resourceVersion="0", limit="2")
    assert status == 200 and len(whole["items"]) == 5 and "continue" not in whole["metadata"]  # watch cache
    status, first = await get_list(api, limit="2")
    version = first["metadata"]["resourceVersion"]
    assert status == 200 and names(first) == ["n0", "n1"] and first["metadata"]["remainingItemCount"] == 3
    api.put_state(state("n0", held=True, sequence=2))  # written between the pages
    api.delete_state("n3")
    api.put_state(state("n9"))
    status, second = await get_list(api, limit="2", **{"continue": first["metadata"]["continue"]})
    assert status == 200 and names(second) == ["n2", "n3"]  # n3 as it was at the first page's version
    status, third = await get_list(api, limit="2", **{"continue": second["metadata"]["continue"]})
    assert status == 200 and names(third) == ["n4"] and "continue" not in third["metadata"]  # no n9 yet
    assert {page["metadata"]["resourceVersion"] for page in (second, third)} == {version}
    status, now = await get_list(api, limit="10")
    assert names(now) == ["n0", "n1", "n2", "n4", "n9"] and now["items"][0]["agent"]["sequence"] == 2
    assert int(now["metadata"]["resourceVersion"]) > int(version)
    status, refused = await get_list(api, limit="2", resourceVersion=version,
                                     **{"continue": first["metadata"]["continue"]})
    assert status == 400 and "continue" in refused["message"]
    api.expire_watch()  # compaction: the first page's version is gone
    status, expired = await get_list(api, limit="2", **{"continue": first["metadata"]["continue"]})
    assert status == 410 and expired["reason"] == "Expired"
    assert [(p.items, p.continued) for p in api.list_pages[:4]] == [(5, False), (2, True), (2, True),
                                                                     (1, False)]


# --- the view reads page by page ----------------------------------------------------------------------------


async def test_the_view_reads_every_page_and_the_watch_brings_what_was_written_between_them(
        api: FakeApiServer) -> None:
    for i in range(10):
        api.put_state(state(f"n{i}"))
    writes_done = []

    def write_after_the_first_page(served: ServedList) -> None:
        if not writes_done:
            writes_done.append(served.resource_version)
            api.put_state(state("n0", held=True, sequence=2))  # already read
            api.put_state(state("n9", held=True, sequence=2))  # not read yet: the list has its older state
            api.delete_state("n5")
            api.put_state(state("n10"))

    api.after_page = write_after_the_first_page
    async with paged_view(api, page_size=3) as view:
        await eventually(lambda: view.synced, 10.0)
        lists = [r.query for r in api.lists]
        assert len(lists) == 4 and all(q["limit"] == "3" and "resourceVersion" not in q for q in lists)
        assert ["continue" in q for q in lists] == [False, True, True, True]
        assert view.pages == 4
        await eventually(lambda: api.watches, 10.0)
        assert api.watches[0].query["resourceVersion"] == writes_done[0]  # from the list's version
        await eventually(lambda: sequence_of(view, "n9") == 2 and view.get("n5") is None
                         and view.get("n10") is not None and sequence_of(view, "n0") == 2, 10.0)
        assert view.get("n9").hints.free_gpu_count == 0 and len(view) == 10
        assert view.status == (True, "") and len(api.lists) == 4  # the watch, not another list


async def test_a_continue_that_expires_mid_list_lists_again_from_the_first_page(api: FakeApiServer) -> None:
    for i in range(7):
        api.put_state(state(f"n{i}"))
    expired = []

    def compact_after_the_first_page(served: ServedList) -> None:
        if not expired:
            expired.append(served)
            api.expire_watch()

    api.after_page = compact_after_the_first_page
    async with paged_view(api, page_size=3) as view:
        await eventually(lambda: view.synced, 10.0)
        queries = [r.query for r in api.lists]
        assert ["continue" in q for q in queries] == [False, True, False, True, True]  # the 2nd page: 410
        assert len(view) == 7 and view.status == (True, "") and view.pages == 4
        assert [p.items for p in api.list_pages] == [3, 3, 3, 1]  # the 410 made no answer


async def test_a_page_that_fails_during_a_relist_keeps_the_view_until_a_list_completes(
        api: FakeApiServer) -> None:
    """A list is applied whole: a re-list (after the watch's 410) whose second page fails drops no node, and
    the next list starts again from the first page."""
    for i in range(7):
        api.put_state(state(f"n{i}"))
    async with paged_view(api, page_size=3) as view:
        await eventually(lambda: view.synced and api.watches, 10.0)
        forgotten: list[str] = []
        forget = view._forget
        view._forget = lambda node: (forgotten.append(node), forget(node))  # type: ignore[method-assign]
        failed: list[ServedList] = []

        def fail_the_next_page(served: ServedList) -> None:
            if not failed:
                failed.append(served)
                api.fail_next(500)

        api.after_page = fail_the_next_page
        listed = len(api.lists)
        api.expire_watch()  # the watch gets 410: list again
        await eventually(lambda: len(api.list_pages) >= 4 + 3 and view.status == (True, ""), 10.0)
        again = [r.query for r in api.lists[listed:]]
        assert ["continue" in q for q in again[:3]] == [False, True, False]  # the 500, then from the start
        assert forgotten == [] and len(view) == 7


async def test_an_unreadable_object_in_a_page_is_its_nodes_problem_alone(api: FakeApiServer) -> None:
    for i in range(6):
        api.put_state(state(f"n{i}"))
    deep: Any = []
    for _ in range(40):
        deep = [deep]
    hostile = state("n4")
    hostile["hints"]["x"] = deep  # past the 32 levels of an object, inside the list's page
    api.put_state(hostile)
    async with paged_view(api, page_size=4) as view:
        await eventually(lambda: view.synced, 10.0)
        assert view.pages == 2 and view.bad_objects == 1
        assert view.unresolvable().keys() == {"n4"} and "cannot be read" in view.unresolvable()["n4"]
        assert all(view.get(f"n{i}").hints is not None for i in range(6) if i != 4)


# --- memory ---------------------------------------------------------------------------------------------------

NODES = 2000
BYTES_PER_NODE = 600  # measured 415 (docs/scheduling.md, "The cluster view" has them at scale)


def test_the_view_keeps_a_bounded_number_of_bytes_per_node_in_alike_states() -> None:
    """Nodes of two states: what the view keeps is a node's entry, generation and name, and one decoded copy
    of each state; the list's answer and each object's own decoded copy are gone once it is read."""
    items = []
    for i in range(NODES):
        obj = state(f"node-{i:05d}", held=bool(i % 2))
        obj["metadata"]["resourceVersion"] = str(1000 + i)
        items.append(obj)
    page = json.dumps({"metadata": {"resourceVersion": "5000"}, "items": items}).encode()
    del items
    view = ClusterView()
    gc.collect()
    tracemalloc.start()
    try:
        decode, _, _ = view._decode_page(page)
        view._replace(decode())
        del decode, page
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(view) == NODES and len(view._shared) == 2
    assert view.get("node-00000").hints is view.get("node-00002").hints
    assert kept / NODES < BYTES_PER_NODE, f"{kept / NODES:.0f} bytes per node"


def test_a_states_repeated_strings_are_one_object_each_and_its_hints_are_unchanged() -> None:
    """msgspec gives each string its own copy: an 8-GPU node's NVLink peers repeated its GPUs' UUIDs 56
    times, 5.7 of its 14.8 KB; the view keeps one of each, and the hints compare equal to those decoded."""
    from test_extender import gpu, node_hints

    from gpuagent.hints.published import decode_state

    gpus = tuple(gpu(i, tenants=2) for i in range(4))
    uuids = [g.uuid for g in gpus]
    hints = node_hints("n1", tuple(dataclasses.replace(g, nvlink_peers=tuple(u for u in uuids if u != g.uuid))
                                   for g in gpus))
    raw = json.dumps(state_object("n1", project(hints, None), Generation(1, 1), time.time())).encode()
    view = ClusterView()
    decode, _, _ = view._decode_page(b'{"metadata":{"resourceVersion":"7"},"items":[%s]}' % raw)
    view._replace(decode())
    kept = view.get("n1").hints
    assert kept == decode_state(raw).hints and hash(kept) == hash(decode_state(raw).hints)
    first, second = kept.gpus[0], kept.gpus[1]
    assert second.nvlink_peers[0] is first.uuid and first.nvlink_peers[0] is second.uuid
    assert first.model is second.model and first.tenants[0].kind is second.tenants[1].kind
