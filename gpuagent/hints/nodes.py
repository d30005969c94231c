"""The nodes the extender knows, and so may fetch hints for: the agents file's and the API server's list.

A scheduler call names its candidate nodes, and anyone who can reach the extender can make one, so a name in
``NodeNames`` is untrusted: fetching ``http://{name}:9402/v1/hints`` for any name sent would let a caller
make the extender connect anywhere its URL template resolves, and fill its cache with made-up nodes. So the
extender fetches only the nodes it knows. ``KnownNodes`` holds them: the agents file's nodes (fixed) and the
names of the API server's last node list. ``NodeLister`` keeps the latter current: it lists Nodes every
``interval`` seconds (metadata only, in pages of ``PAGE``, from the API server's watch cache: RBAC ``list``
on ``nodes``); a list that fails keeps the names of the last one that worked and is logged once per change.
A name the extender does not know is answered "unknown node" without any request
(``gpuagent.hints.extender``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from gpuagent.kubeapi import ApiConnection

log = logging.getLogger(__name__)

NODES_PATH = "api/v1/nodes"
PAGE = 500
# Names and nothing else of each Node (the API server's PartialObjectMetadataList); a plain NodeList where a
# server does not offer it (the names are read the same way).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
LIST_INTERVAL_SECONDS = 30.0


class KnownNodes:
    """``node in known``: whether the extender may fetch ``node``'s hints."""

    def __init__(self, fixed: Iterable[str] = ()) -> None:
        self._fixed = frozenset(fixed)
        self._listed: frozenset[str] = frozenset()
        self.listed = False  # a node list has been read at least once

    def __contains__(self, node: object) -> bool:
        return node in self._fixed or node in self._listed

    def __len__(self) -> int:
        return len(self._fixed | self._listed)

    def replace_listed(self, names: Iterable[str]) -> None:
        self._listed = frozenset(names)
        self.listed = True


class NodeListError(Exception):
    """A node list that could not be read (the API server's words, or what was wrong with the answer)."""


class NodeLister:
    """Refreshes ``known``'s listed names from the API server every ``interval`` seconds."""

    def __init__(
        self, connection: ApiConnection, known: KnownNodes, *, interval: float = LIST_INTERVAL_SECONDS,
        timeout: float = 10.0,
    ) -> None:
        self._connection = connection
        self._known = known
        self._interval = interval
        self._timeout = timeout
        self._failing: str | None = None

    async def list_once(self) -> int:
        """One full list (every page); the number of nodes. Raises ``NodeListError``."""
        names: list[str] = []
        token = ""
        while True:
            query = {"limit": PAGE, **({"continue": token} if token else {"resourceVersion": "0"})}
            try:
                status, body, message = await self._connection.get_json(
                    f"{NODES_PATH}?{urlencode(query)}", timeout=self._timeout,
                    headers={"Accept": METADATA_ONLY},
                )
            except Exception as exc:  # DNS, refused, TLS, timeout, a bad kubeconfig: all the same to us
                raise NodeListError(f"{type(exc).__name__}: {exc}"[:300]) from None
            if status != 200:
                raise NodeListError(f"HTTP {status}: {message}"[:300])
            page, token = _page(body)
            names += page
            if not token:
                break
        self._known.replace_listed(names)
        return len(names)

    async def run(self, stop: asyncio.Event) -> None:
        """List now and every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                count = await self.list_once()
            except NodeListError as err:
                if self._failing != str(err):
                    log.warning("cannot list the cluster's nodes (%s); nodes it does not know are filtered "
                                "as unknown until a list succeeds", err)
                self._failing = str(err)
            except Exception:  # a bug must not end the listing
                log.exception("listing the cluster's nodes failed")
            else:
                if self._failing is not None or not self._known.listed:
                    log.info("the cluster's node list has %d nodes", count)
                self._failing = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)


def _page(body: Any) -> tuple[list[str], str]:
    """(the node names, the continue token) of one NodeList (or PartialObjectMetadataList) page."""
    if not isinstance(body, Mapping) or not isinstance(body.get("items"), list):
        raise NodeListError("the answer is not a list of nodes")
    names = []
    for item in body["items"]:
        meta = item.get("metadata") if isinstance(item, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    meta = body.get("metadata")
    token = meta.get("continue") if isinstance(meta, Mapping) else None
    return names, token if isinstance(token, str) else ""
