"""JSON from outside the process, read once at the edge through bounds: size, depth, finite numbers.

Everything another party writes (another node's GPUNodeState, an agent's ``/v1/hints``, a Node annotation, a
Lease's slots, an agent's ``/v1/state`` read by ``gpuagent top``) is JSON that can be made to knock a parser
over: Python's and msgspec's decoders recurse, so ~1,000 nested brackets raise ``RecursionError`` (which is
not a ``ValueError`` and escapes every ``except ValueError``); ``json.loads`` takes ``NaN``, ``Infinity`` and
``1e999`` (an infinity) and a 4,000-digit integer, and a later ``round()`` or ``int()`` of them raises
``OverflowError``. So the bytes are checked before any parser sees them:

- the size, against a cap the caller names (``Bounds.max_bytes``);
- the nesting depth, on the bytes themselves (:func:`check_depth`): strings are cut out (escapes first, then
  everything but quotes and brackets, then bracket-free strings as ``""`` pairs: three C-speed passes, a
  few microseconds for a 10 KB object), then the innermost bracket pairs are removed pass by pass, so a
  document ``d`` levels deep costs ``d`` passes and a hostile one at most ``max_depth + 1`` before it is
  refused; a bracket left open counts as a level (a parser recurses into it before it finds no end);
- numbers, as they are parsed (:func:`loads`): ``NaN`` and ``Infinity`` literals refused, a float that
  overflows to infinity refused, an integer of more than ``max_int_digits`` digits refused.

Every refusal is one :class:`Unreadable` (a ``ValueError``) whose text says what was wrong, so the caller
makes it that one object's or that one request's problem. Ranges of particular fields (a ratio in 0..1, a
memory size below an exabyte) are the decoder's to check with :func:`in_range` after this. This module
imports nothing of gpuagent's: every layer may use it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any


class Unreadable(ValueError):
    """JSON refused before or while parsing; the text names what was wrong (size, depth, a number)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The limits one kind of document is read under."""

    max_bytes: int = 1 << 20
    max_depth: int = 32
    max_int_digits: int = 20  # 2**64 has 20 digits: any counter, epoch in nanoseconds or byte count fits


DEFAULT = Bounds()
Text = bytes | bytearray | memoryview | str

_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
# Both kinds of bracket as one: the same depth for JSON, and for crossed brackets ("[}") no less than what a
# parser recurses into before it finds them crossed. One kind makes a pass one C-speed ``bytes.replace``.
_ONE_KIND = bytes.maketrans(b"[]{}", b"()()")


def _as_bytes(data: Text) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    return bytes(data)


def check_size(data: Text, bounds: Bounds = DEFAULT, what: str = "document") -> None:
    size = len(data) if not isinstance(data, str) else len(data.encode("utf-8", "surrogatepass"))
    if size > bounds.max_bytes:
        raise Unreadable(f"{what}: {size} bytes, over the limit of {bounds.max_bytes}")


def depth(data: Text, limit: int) -> int | None:
    """The nesting depth of a JSON text, counted on its bytes; ``None`` once it passes ``limit`` (the count
    stops there). Brackets that do not pair up stop the count at the depth reached: the parser names that."""
    brackets = _outside_strings(_as_bytes(data))
    level = 0
    while brackets:
        if level > limit or b"(" * (limit - level + 1) in brackets:  # a run of openers is nested: refused
            return None
        shorter = brackets.replace(b"()", b"")  # one scan, no rescan of what it joins: one level
        if len(shorter) == len(brackets):  # unbalanced: not JSON, but a parser recurses into every
            level += brackets.count(b"(")  # bracket left open before it says so
            break
        brackets = shorter
        level += 1
    return level if level <= limit else None


def _outside_strings(text: bytes) -> bytes:
    """The brackets of ``text`` outside JSON strings, in order, as ``(`` and ``)``. Escapes go first (so
    ``\\"`` is no quote); then all but quotes and brackets; then every ``""`` pair, which holds no bracket
    whether it encloses a string or the space between two (removing two quotes changes no later quote's
    parity); what is left, if any quote is, alternates outside and inside at each quote."""
    if b"\\" in text:  # in a string every backslash starts an escape: pairs first, then escaped quotes
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = text.translate(_ONE_KIND, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' not in structure:
        return structure
    return b"".join(structure.split(b'"')[::2])


# A string, or a run of openers, or a run of closers (a run is one step however deep it goes).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+', re.DOTALL)


def shallow(data: Text, max_depth: int) -> bytes:
    """``data`` with every array or object that opens deeper than ``max_depth`` cut to ``[]``: a text a
    recursive parser can read, to salvage what identifies a refused document (a name, a resourceVersion, a
    watch event's type). The cut leaves it one level deeper than ``max_depth``, so it is still refused under
    that bound: never a way to accept it. Linear, a Python step per string and run of brackets: for the
    refused only.
    """
    text = _as_bytes(data)
    out: list[bytes] = []
    kept = 0  # text[kept:] is still to be copied
    level = 0
    cut_at = -1  # the level of the value being cut out, -1 when none
    for token in _TOKEN.finditer(text):
        start, end = token.span()
        mark = text[start]
        if mark == 0x22:  # a string: brackets inside it are no structure
            continue
        run = end - start
        if mark in b"[{":
            if cut_at < 0 and level + run > max_depth:
                at = start + max(0, max_depth - level)  # the opener that goes past max_depth
                out.append(text[kept:at])
                out.append(b"[]")
                cut_at, kept = max(level + 1, max_depth + 1), len(text)
            level += run
        else:
            if cut_at >= 0 and level - run < cut_at:  # the i-th closer of the run closes level - i
                kept = start + (level - cut_at) + 1
                cut_at = -1
            level -= run
    out.append(text[kept:])
    return b"".join(out)


def check_depth(data: Text, bounds: Bounds = DEFAULT, what: str = "document") -> None:
    """Refuse a text nested deeper than ``bounds.max_depth`` before any recursive parser reads it."""
    if depth(data, bounds.max_depth) is None:
        raise Unreadable(f"{what}: nested deeper than {bounds.max_depth} levels")


def check(data: Text, bounds: Bounds = DEFAULT, what: str = "document") -> None:
    """Size and depth: what must hold before a parser of our choosing (msgspec) reads the bytes."""
    check_size(data, bounds, what)
    check_depth(data, bounds, what)


def loads(data: Text, bounds: Bounds = DEFAULT, what: str = "document") -> Any:
    """Parse a JSON text under ``bounds``: size and depth first, then numbers as they are read. Every failure,
    the parser's own included, is one :class:`Unreadable` naming ``what``."""
    check(data, bounds, what)

    def constant(name: str) -> Any:
        raise Unreadable(f"{what}: {name} is not a number JSON allows")

    def real(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise Unreadable(f"{what}: the number {text[:40]} is out of range")
        return value

    def integer(text: str) -> int:
        if len(text.lstrip("-")) > bounds.max_int_digits:
            raise Unreadable(f"{what}: an integer of {len(text.lstrip('-'))} digits "
                             f"(at most {bounds.max_int_digits})")
        return int(text)

    try:
        return json.loads(data, parse_constant=constant, parse_float=real, parse_int=integer)
    except Unreadable:
        raise
    except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise Unreadable(f"{what}: not JSON ({exc})") from None


def in_range(value: object, low: float, high: float, path: str) -> float:
    """A finite number in ``[low, high]`` (not a boolean), or :class:`Unreadable` naming ``path``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and low <= value <= high:  # NaN compares false; a huge int compares without overflowing
        return value
    small = isinstance(value, (float, str)) or (type(value) is int and value.bit_length() < 128)
    shown = repr(value)[:40] if small else type(value).__name__
    raise Unreadable(f"{path}: expected a number from {low:g} to {high:g}, got {shown}")
