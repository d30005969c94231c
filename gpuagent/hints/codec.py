"""``NodeHints`` to JSON and back: ``/v1/hints`` writes it, the extender reads it into the same model.

Decoding is strict about what it knows and lenient about what it does not: a field of the wrong type, or a
required field missing, raises ``ValueError`` naming its path (``gpus[2].memory_free_bytes``); keys it does
not know are ignored, so an older extender reads a newer agent's hints.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from gpuagent.snapshot import NodeHints, to_jsonable

Decoder = Callable[[object, str], Any]


def hints_to_jsonable(hints: NodeHints) -> dict[str, Any]:
    """The hints as plain JSON types (the ``/v1/hints`` body)."""
    return to_jsonable(hints)  # type: ignore[no-any-return]


def hints_from_jsonable(data: object) -> NodeHints:
    """``NodeHints`` from a ``/v1/hints`` body; raises ``ValueError`` naming the bad field."""
    return _NODE(data, "")  # type: ignore[no-any-return]


def _name(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _fail(path: str, expected: str, value: object) -> ValueError:
    if value is None:
        shown = "null"
    elif isinstance(value, (str, int, float, bool)):
        shown = repr(value)
    else:
        shown = type(value).__name__
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ValueError(f"{path or 'hints'}: expected {expected}, got {shown}")


def _int(value: object, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _fail(path, "an integer", value)


def _float(value: object, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise _fail(path, "a finite number", value)


def _str(value: object, path: str) -> str:
    if isinstance(value, str):
        return value
    raise _fail(path, "a string", value)


def _bool(value: object, path: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _fail(path, "true or false", value)


def _optional(inner: Decoder) -> Decoder:
    def decode(value: object, path: str) -> Any:
        return None if value is None else inner(value, path)

    return decode


def _tuple_of(inner: Decoder) -> Decoder:
    def decode(value: object, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _fail(path, "a list", value)
        return tuple(inner(item, f"{path}[{i}]") for i, item in enumerate(value))

    return decode


_SCALARS: dict[Any, Decoder] = {int: _int, float: _float, str: _str, bool: _bool}


def _decoder_for(hint: Any) -> Decoder:
    """A decoder for one field's type: scalars, ``X | None``, ``tuple[X, ...]``, nested dataclasses."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _optional(_decoder_for(rest[0]))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple_of(_decoder_for(args[0]))
    if dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)  # type: ignore[arg-type]
    raise TypeError(f"no JSON decoder for {hint!r}")


def _dataclass_decoder(cls: type) -> Decoder:
    hints = typing.get_type_hints(cls)
    fields = [
        (f.name, _decoder_for(hints[f.name]),
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    ]

    def decode(value: object, path: str) -> Any:
        if not isinstance(value, Mapping):
            raise _fail(path, "an object", value)
        kwargs: dict[str, Any] = {}
        for name, decoder, required in fields:
            where = _name(path, name)
            if name in value:
                kwargs[name] = decoder(value[name], where)
            elif required:
                raise ValueError(f"{where}: missing")
        return cls(**kwargs)

    return decode


_NODE = _dataclass_decoder(NodeHints)  # built once: decoding then only walks the data
