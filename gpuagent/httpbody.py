"""Request bodies read within bounds, for every HTTP server of the project (the agent's API, the extender).

A body is untrusted input of any size and shape, so reading one is bounded four ways before any handler
looks at it, and each bound refused is a ``BodyError`` whose status and message name the limit:

- the bytes on the wire (``max_wire_bytes``: the compressed size when the client sent
  ``Content-Encoding: gzip`` or ``deflate``, which aiohttp inflates as the bytes arrive): 413;
- the bytes after inflation (``max_bytes``), counted as aiohttp hands them over and never buffered past the
  cap, so a few hundred KB of gzip cannot become hundreds of MB in memory: 413;
- the time the whole body may take to arrive (``timeout_seconds``): 408, so a client sending a byte a
  second cannot hold a handler and its buffer;
- the JSON's shape, checked on the bytes before parsing (``json_shape``): nested deeper than
  ``max_depth`` (400) or holding more than ``max_items`` values is a 400 (or 413), never a RecursionError
  and never a parse whose objects outgrow memory. The check is a linear scan done by ``re`` and
  ``bytes.translate`` in C; for valid JSON it is exact.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from aiohttp import web

MAX_JSON_DEPTH = 400

# Every byte but a quote or a bracket: deleted before the depth is counted.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class BodyError(Exception):
    """A body refused: answered with ``status`` and ``message``, ``field`` naming what was wrong."""

    def __init__(self, status: int, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The bounds on one request body; see the module docstring."""

    max_bytes: int
    max_wire_bytes: int | None = None  # default: max_bytes
    timeout_seconds: float = 10.0
    max_depth: int = MAX_JSON_DEPTH
    max_items: int | None = None  # default: max_bytes // 8

    @property
    def wire_cap(self) -> int:
        return self.max_wire_bytes if self.max_wire_bytes is not None else self.max_bytes

    @property
    def item_cap(self) -> int:
        return self.max_items if self.max_items is not None else max(1024, self.max_bytes // 8)


async def read_body(request: web.BaseRequest, limits: BodyLimits) -> bytes:
    """The whole (inflated) body, or ``BodyError``; the buffer never grows past ``limits.max_bytes``
    plus one chunk."""
    wire_cap = limits.wire_cap
    if request.content_length is not None and request.content_length > wire_cap:
        raise BodyError(413, f"the body is {request.content_length} bytes, over the limit of {wire_cap}")
    content = request.content
    body = bytearray()
    try:
        async with asyncio.timeout(limits.timeout_seconds):
            while chunk := await content.readany():
                body += chunk
                if len(body) > limits.max_bytes:
                    raise BodyError(413, f"the body is over the limit of {limits.max_bytes} bytes"
                                    + (" once inflated" if request.headers.get("Content-Encoding") else ""))
                wire = content.total_compressed_bytes
                if wire is not None and wire > wire_cap:
                    raise BodyError(413, f"the compressed body is over the limit of {wire_cap} bytes")
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {limits.timeout_seconds:g} s") from None
    except (BodyError, web.HTTPException):
        raise
    except Exception as exc:  # aiohttp's payload errors: bad gzip, a chunked encoding cut short
        raise BodyError(400, f"the body cannot be read: {type(exc).__name__}: {exc}"[:300]) from None
    return bytes(body)


def json_shape(raw: bytes) -> tuple[int, int]:
    """(nesting depth, an upper bound on the values) of the JSON in ``raw``, without parsing it.

    Brackets inside strings do not count: escaped backslashes, then escaped quotes are dropped, so every
    quote left delimits a string; everything but quotes and brackets is dropped; adjacent quotes are dropped
    (an empty string, or the end of one string and the start of the next with no bracket between: either
    way no bracket outside a string goes); what is left between the remaining quote pairs is inside strings.
    All of it is ``bytes`` methods, in C. Exact for valid JSON; for invalid JSON the parser has the last
    word. Values are over-counted (commas and colons inside strings count too)."""
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[0::2])
    depth = max(accumulate(map(_STEP.__getitem__, kept)), default=0)
    opened = raw.count(b"[") + raw.count(b"{")
    return depth, raw.count(b",") + raw.count(b":") + opened + 1


def parse_json(raw: bytes, limits: BodyLimits) -> Any:
    """``raw`` as JSON (UTF-8), its shape checked first; ``BodyError`` 400 (or 413 for too many values)."""
    depth, items = json_shape(raw)
    if depth > limits.max_depth:
        raise BodyError(400, f"the JSON is nested {depth} levels deep, over the limit of {limits.max_depth}")
    if items > limits.item_cap:
        raise BodyError(413, f"the JSON holds more than {limits.item_cap} values")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(400, f"the body is not UTF-8: {exc}"[:300]) from None
    try:
        return json.loads(text)
    except RecursionError:  # not reached after the depth check; kept so no input can make a 5xx
        raise BodyError(400, f"the JSON is nested over the limit of {limits.max_depth} levels") from None
    except ValueError as exc:
        raise BodyError(400, f"the body is not JSON: {exc}"[:300]) from None


async def read_json(request: web.BaseRequest, limits: BodyLimits) -> Any:
    """``read_body`` then ``parse_json``."""
    return parse_json(await read_body(request, limits), limits)
