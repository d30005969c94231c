"""``NodeHints`` to JSON and back: ``/v1/hints`` writes it, the extender reads it into the same model.

Decoding is strict about what it knows and lenient about what it does not: a field of the wrong type, or a
required field missing, raises ``ValueError`` naming its path (``gpus[2].memory_free_bytes``); keys it does
not know are ignored, so an older extender reads a newer agent's hints.

Hints come from other nodes, so what they hold is bounded too (:func:`check_limits`): every
number in a physical range (a ratio in 0..1, memory under an exabyte, a count under a million), every
string and list capped. The one table serves three readers: both decoders of hints (``/v1/hints`` here, the
``GPUNodeState`` in ``hints.published``) check decoded hints against it, the CRD's schema is generated from
it (:func:`hints_schema`, so the API server refuses what the extender would), and the fuzz tests draw their
cases from that schema.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from gpuagent.boundedjson import Unreadable
from gpuagent.snapshot.hints import NodeHints
from gpuagent.snapshot.views import to_jsonable

Decoder = Callable[[object, str], Any]


def hints_to_jsonable(hints: NodeHints) -> dict[str, Any]:
    """The hints as plain JSON types (the ``/v1/hints`` body)."""
    return to_jsonable(hints)  # type: ignore[no-any-return]


def hints_from_jsonable(data: object) -> NodeHints:
    """``NodeHints`` from a ``/v1/hints`` body; raises ``ValueError`` naming the bad field (types only: a
    reader of another node's hints checks them with :func:`check_limits` too)."""
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


# --- limits: one table for the decoders, the CRD's schema and the fuzzing -----------------------------------

MAX_GPUS = 64  # the largest nodes have 16
MAX_STRING = 512  # the longest honest string is a tenant's name: namespace/pod, 317 characters
MAX_ITEMS = {"gpus": MAX_GPUS, "nvlink_peers": MAX_GPUS, "mig_instances": 64, "free_mig_profiles": 64,
             "idle_instances": 64, "tenants": 1024, "links": 1024, "pods": 4096}
MAX_COUNT = 2**20  # indices, instance ids, counts, replicas


def _range(name: str) -> tuple[int, int]:
    """The physical range of a numeric field, by its name's unit."""
    if name.endswith("_ratio"):
        return 0, 1
    if name.endswith(("_bytes", "_bytes_per_second", "_bits_per_second")):
        return 0, 2**60  # an exabyte
    if name.endswith("_unix"):
        return 0, 2**34  # until the year 2514
    if name.endswith("_seconds"):
        return 0, 10**9
    if name.endswith("_gpus"):
        return 0, MAX_GPUS
    return 0, MAX_COUNT


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """What one field may hold: a range for a number, a length for a string or a list."""

    low: int = 0
    high: int = 0
    length: int = 0


def _limit(name: str, hint: Any) -> Limit:
    if hint in (int, float):
        low, high = _range(name)
        return Limit(low, high)
    if hint is str:
        return Limit(length=MAX_STRING)
    if typing.get_origin(hint) is tuple:
        return Limit(length=MAX_ITEMS.get(name, 1024))
    return Limit()


def _walk(cls: type) -> dict[str, tuple[Any, bool, bool]]:
    """``cls``'s fields: name -> (type without ``| None``, whether ``None`` is allowed, whether required)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, bool, bool]] = {}
    for f in dataclasses.fields(cls):
        kind, nullable = _inner(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (kind, nullable, required)
    return out


def _inner(hint: Any) -> tuple[Any, bool]:
    """(the type, whether ``None`` is allowed)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return hint, False


@functools.cache
def _limits_type() -> tuple[Any, type[Exception]]:
    """msgspec types mirroring the hints' dataclasses, with the limits as constraints (msgspec comes with
    lightkube; imported only here, on first use)."""
    import msgspec

    def constrained(name: str, kind: Any) -> Any:
        limit = _limit(name, kind)
        if kind in (int, float):
            return Annotated[kind, msgspec.Meta(ge=limit.low, le=limit.high)]
        if kind is str:
            return Annotated[str, msgspec.Meta(max_length=limit.length)]
        if typing.get_origin(kind) is tuple:
            element = constrained(name, _inner(typing.get_args(kind)[0])[0])
            return Annotated[tuple[element, ...], msgspec.Meta(max_length=limit.length)]  # type: ignore[valid-type]
        if dataclasses.is_dataclass(kind):
            return struct(kind)  # type: ignore[arg-type]
        return kind

    @functools.cache
    def struct(cls: type) -> Any:
        return msgspec.defstruct(f"Limits{cls.__name__}", [
            (name, constrained(name, kind) | None if nullable else constrained(name, kind))
            for name, (kind, nullable, _required) in _walk(cls).items()
        ])

    return struct(NodeHints), msgspec.ValidationError


def check_limits(hints: NodeHints, what: str = "hints") -> None:
    """Refuse hints with a number out of its physical range, or a string or list over its cap: one C-speed
    pass of msgspec over the decoded objects. Raises :class:`~gpuagent.boundedjson.Unreadable` naming the
    field (``$.gpus[0].schedulable_share_ratio``)."""
    import msgspec

    limits, error = _limits_type()
    try:
        msgspec.convert(hints, limits, from_attributes=True)
    except error as exc:
        raise Unreadable(f"{what}: {exc}") from None


def hints_schema() -> dict[str, Any]:
    """The OpenAPI v3 schema of published hints, structural (every field typed and bounded, nothing kept
    that it does not name): the CRD's ``hints``, so the API server refuses and prunes what the extender
    would."""
    return _schema(NodeHints)


def _schema(cls: type) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, (kind, nullable, is_required) in _walk(cls).items():
        prop = _type_schema(name, kind)
        if nullable:
            prop["nullable"] = True
        properties[name] = prop
        if is_required:
            required.append(name)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    return out


def _type_schema(name: str, kind: Any) -> dict[str, Any]:
    limit = _limit(name, kind)
    if kind is bool:
        return {"type": "boolean"}
    if kind is int:
        return {"type": "integer", "minimum": limit.low, "maximum": limit.high,
                **({"format": "int64"} if limit.high >= 2**31 else {})}
    if kind is float:
        return {"type": "number", "minimum": limit.low, "maximum": limit.high}
    if kind is str:
        return {"type": "string", "maxLength": limit.length}
    if typing.get_origin(kind) is tuple:
        element = _inner(typing.get_args(kind)[0])[0]
        return {"type": "array", "maxItems": limit.length, "items": _type_schema(name, element)}
    if dataclasses.is_dataclass(kind):
        return _schema(kind)  # type: ignore[arg-type]
    raise TypeError(f"no schema for {kind!r}")
