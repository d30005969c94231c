"""One ``/metrics`` response: the body in the format asked for, gzipped when accepted, cached per snapshot.

Every family keeps its encoded bytes (``exposition``), so a plain body is one join of them. The families the
guard serves again until the next poll (``Family.stable``) come first in a scrape; only the tail after them
(the agent's health, with its clock-dependent age, and the collectors' success and duration) changes between
two polls. So for gzip the body's stable head is deflated once per snapshot and format: the response is the
gzip header, the head's deflate blocks (ended by a sync flush, so they end on a byte boundary), the tail
deflated afresh (a fresh compressor never refers back into the head), and the trailer with the CRC-32 of the
whole. One valid gzip member, whatever the client.
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuagent.export.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    EOF,
    OPENMETRICS,
    TEXT,
    Lines,
    encode_family,
    wants_openmetrics,
)
from gpuagent.export.families import Family

GZIP_LEVEL = 1  # 3x faster than zlib's default 6 on our text, for ~20 % more bytes (26 KiB vs 21 KiB)
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, unknown OS


@dataclass(frozen=True, slots=True)
class Response:
    body: bytes
    content_type: str
    gzipped: bool


@dataclass(slots=True)
class _Head:
    """The stable head of one format's body, for the families it was joined from."""

    families: tuple[Family, ...]
    text: bytes
    deflated: bytes | None = None  # raw deflate, sync-flushed; made at the first gzip scrape
    crc: int = 0


class SnapshotRegistry(CollectorRegistry):
    """The agent's registry: client_python's, plus the cached gzip heads of the last scrape in each format.

    ``families`` is what ``collect`` yields, as a list: the snapshot collector's own list when it is the one
    collector (``scrape`` needs no generator per family)."""

    def __init__(self) -> None:
        # Without describe() names, only support_collectors_without_names lets ?name[]= filtering reach it.
        super().__init__(support_collectors_without_names=True)
        self.heads: dict[str, _Head] = {}
        self.heads_lock = threading.Lock()

    def families(self) -> list[Metric]:
        collectors = list(self._collector_to_names)
        if len(collectors) == 1 and hasattr(collectors[0], "families"):
            return collectors[0].families()  # type: ignore[no-any-return]
        return list(self.collect())


def scrape(registry: Collector, accept: str | None, accept_encoding: str | None) -> Response:
    """The ``/metrics`` response for these request headers."""
    kind = OPENMETRICS if wants_openmetrics(accept) else TEXT
    content_type = CONTENT_TYPE_OPENMETRICS if kind == OPENMETRICS else CONTENT_TYPE_TEXT
    metrics = registry.families() if isinstance(registry, SnapshotRegistry) else list(registry.collect())
    fmt = Lines()
    parts = [encode_family(kind, m, fmt) for m in metrics]
    if kind == OPENMETRICS:
        parts.append(EOF)
    if "gzip" not in (accept_encoding or ""):
        return Response(b"".join(parts), content_type, gzipped=False)
    stable = 0
    while stable < len(metrics) and getattr(metrics[stable], "stable", False):
        stable += 1
    head = _head(registry, kind, metrics[:stable], parts[:stable])  # type: ignore[arg-type]
    return Response(_gzip(head, b"".join(parts[stable:])), content_type, gzipped=True)


def _head(registry: Collector, kind: str, families: list[Family], parts: list[bytes]) -> _Head:
    heads = registry.heads if isinstance(registry, SnapshotRegistry) else None
    if heads is not None:
        head = heads.get(kind)
        if head is not None and len(head.families) == len(families) and all(
            a is b for a, b in zip(head.families, families, strict=True)
        ):
            return head
    head = _Head(tuple(families), b"".join(parts))
    if isinstance(registry, SnapshotRegistry):
        with registry.heads_lock:
            registry.heads[kind] = head
    return head


def _gzip(head: _Head, tail: bytes) -> bytes:
    if head.deflated is None:  # racing scrapes may both compute it: same bytes
        deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        head.crc = zlib.crc32(head.text)
        head.deflated = deflate.compress(head.text) + deflate.flush(zlib.Z_SYNC_FLUSH)
    deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    rest = deflate.compress(tail) + deflate.flush(zlib.Z_FINISH)
    size = (len(head.text) + len(tail)) & 0xFFFFFFFF
    trailer = struct.pack("<II", zlib.crc32(tail, head.crc), size)
    return b"".join((_GZIP_HEADER, head.deflated, rest, trailer))
