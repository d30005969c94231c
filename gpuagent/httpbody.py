"""Request bodies read within bounds, for every HTTP server of the project (the agent's API, the extender).

A body is untrusted input of any size and shape, so reading one is bounded four ways before any handler
looks at it (and, across requests, by the listener's one budget for bodies in flight, reserved before the
handler runs: ``gpuagent.httpguard``), and each bound refused is a ``BodyError`` whose status and message
name the limit:

- the bytes on the wire (``max_wire_bytes``: the compressed size when the client sent
  ``Content-Encoding: gzip`` or ``deflate``): 413;
- the bytes after inflation (``max_bytes``): the body is inflated here, a chunk at a time as it arrives,
  and the inflation stops at the cap, so a few hundred KB of gzip cannot become hundreds of MB in memory
  nor seconds of CPU: 413 (the listeners turn aiohttp's own inflation off, ``gpuagent.httpguard``; any other
  encoding is a 415);
- the time the whole body may take to arrive (``timeout_seconds``): 408, so a client sending a byte a
  second cannot hold a handler and its buffer;
- the JSON's shape, checked on the bytes before parsing (``json_items``, ``json_depth``): nested deeper than
  ``max_depth`` (400) or holding more than ``max_items`` values is a 400 (or 413), never a RecursionError
  and never a parse whose objects outgrow memory. The check is a linear scan done by ``re`` and
  ``bytes.translate`` in C; for valid JSON it is exact.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from aiohttp import web

from gpuagent.httperrors import json_error

MAX_JSON_DEPTH = 400
INFLATE_STEP = 256 * 1024

# Every byte but a quote or a bracket: deleted before the depth is counted.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_SLICE = 1 << 16


class BodyError(Exception):
    """A body refused: answered with ``status`` and ``message``, ``field`` naming what was wrong."""

    def __init__(self, status: int, message: str, field: str = "body", *, unread: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.unread = unread  # the rest of the body was not read: the connection must not be reused


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The bounds on one request body; see the module docstring."""

    max_bytes: int
    max_wire_bytes: int | None = None  # default: max_bytes
    timeout_seconds: float = 10.0
    max_depth: int = MAX_JSON_DEPTH
    max_items: int | None = None  # default: max_bytes // 16 (a Node object is ~30 bytes a value)

    @property
    def wire_cap(self) -> int:
        return self.max_wire_bytes if self.max_wire_bytes is not None else self.max_bytes

    @property
    def item_cap(self) -> int:
        return self.max_items if self.max_items is not None else max(1024, self.max_bytes // 16)


async def read_body(request: web.BaseRequest, limits: BodyLimits) -> bytes:
    """The whole body, inflated, or ``BodyError``; the buffer never grows past ``limits.max_bytes`` plus
    one chunk, and the inflation stops there."""
    wire_cap = limits.wire_cap
    if request.content_length is not None and request.content_length > wire_cap:
        raise BodyError(413, f"the body is {request.content_length} bytes, over the limit of {wire_cap}",
                        unread=True)
    content = request.content
    inflater = _inflater(request)
    body = bytearray()
    wire = 0
    try:
        async with asyncio.timeout(limits.timeout_seconds):
            while chunk := await content.readany():
                wire = _aiohttp_inflated(content) or wire + len(chunk)
                if wire > wire_cap:
                    raise BodyError(413, f"the body is over the limit of {wire_cap} bytes on the wire",
                                    unread=True)
                if inflater is None:
                    body += chunk
                else:
                    await _inflate(inflater, chunk, body, limits.max_bytes + 1)
                if len(body) > limits.max_bytes:
                    inflated = inflater is not None or _aiohttp_inflated(content) is not None
                    raise BodyError(413, f"the body is over the limit of {limits.max_bytes} bytes"
                                    + (" once inflated" if inflated else ""), unread=True)
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {limits.timeout_seconds:g} s",
                        unread=True) from None
    except (BodyError, web.HTTPException):
        raise
    except Exception as exc:  # a bad gzip stream, a chunked encoding cut short
        raise BodyError(400, f"the body cannot be read: {type(exc).__name__}: {exc}"[:300],
                        unread=True) from None
    if inflater is not None and not inflater.eof:
        raise BodyError(400, "the compressed body is cut short")
    return bytes(body)


def _inflater(request: web.BaseRequest) -> Any:
    """A zlib decompressor for the body's Content-Encoding; None for none, or when aiohttp inflates."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity") or _aiohttp_inflated(request.content) is not None:
        return None  # aiohttp inflates on a server without the guard's options (set from its first byte)
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise BodyError(415, f"Content-Encoding {encoding[:40]!r} is not supported (gzip or deflate)",
                    "Content-Encoding", unread=True)


def _aiohttp_inflated(content: Any) -> int | None:
    """The compressed bytes aiohttp has read when it inflates the body itself; None when it does not."""
    return getattr(content, "total_compressed_bytes", None)


async def _inflate(inflater: Any, chunk: bytes, body: bytearray, cap: int) -> None:
    """Inflate ``chunk`` onto ``body``, never past ``cap`` bytes in all, ``INFLATE_STEP`` bytes at a time
    with the loop served between steps."""
    data = chunk
    while data and len(body) < cap:
        body += inflater.decompress(data, min(INFLATE_STEP, cap - len(body)))
        data = inflater.unconsumed_tail
        if data:
            await asyncio.sleep(0)


def error_response(err: BodyError) -> web.Response:
    """``err`` as a JSON error; with ``Connection: close`` when the body was not all read (the guard,
    ``gpuagent.httpguard``, then drops the rest unread rather than let aiohttp inflate it)."""
    response = json_error(err.status, err.message, err.field)
    if err.unread:
        response.force_close()
    return response


def json_items(raw: bytes) -> int:
    """An upper bound on the values in the JSON ``raw`` (commas and colons inside strings count too)."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1


def json_depth(raw: bytes, stop_above: int | None = None) -> int:
    """The nesting depth of the JSON in ``raw``, without parsing it; past ``stop_above`` the scan stops
    and says ``stop_above + 1``.

    Brackets inside strings do not count: escaped backslashes, then escaped quotes are dropped, so every
    quote left delimits a string; everything but quotes and brackets is dropped; adjacent quotes are dropped
    (an empty string, or the end of one string and the start of the next with no bracket between: either
    way no bracket outside a string goes); what is left between the remaining quote pairs is inside strings.
    All of it is ``bytes`` methods and iterators, in C, a slice at a time. Exact for valid JSON; for invalid
    JSON the parser has the last word."""
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in kept:
        kept = b"".join(kept.split(b'"')[0::2])
    depth = level = 0
    for start in range(0, len(kept), _SLICE):
        levels = list(accumulate(map(_STEP.__getitem__, kept[start:start + _SLICE]), initial=level))
        depth = max(depth, max(levels))
        level = levels[-1]
        if stop_above is not None and depth > stop_above:
            return stop_above + 1
    return depth


def parse_json(raw: bytes, limits: BodyLimits) -> Any:
    """``raw`` as JSON (UTF-8), its shape checked first; ``BodyError`` 400 (or 413 for too many values)."""
    too_deep = BodyError(400, f"the JSON is nested deeper than the limit of {limits.max_depth} levels")
    if json_items(raw) > limits.item_cap:
        # Too many values: refused unscanned, unless its start alone is too deep (the more telling error).
        if json_depth(raw[:_SLICE], stop_above=limits.max_depth) > limits.max_depth:
            raise too_deep
        raise BodyError(413, f"the JSON holds more than {limits.item_cap} values")
    if json_depth(raw, stop_above=limits.max_depth) > limits.max_depth:
        raise too_deep
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
