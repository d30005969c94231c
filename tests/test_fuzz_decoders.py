"""Fuzzing every decoder of outside objects: a verdict or a per-node reason, never an exception.

The decoders: ``hints.published.decode_state``/``identify``/``decode_list`` (GPUNodeStates from the API
server), ``hints.agents._decode`` (an agent's ``/v1/hints``), and the cluster view's watch (``_apply``: the
reflector's envelope, then the view). Cases come from three places:

- the CRD's own schema (``from_crd_schema``, lists cut to a few items to keep examples small): every
  object the API server would accept must decode, so the schema and the decoder agree. It reads the
  structural subset a CRD allows (objects with properties, arrays, bounded numbers and strings, nullable):
  hypothesis-jsonschema 0.23.1 fails on objects with hypothesis 6.170 (``'many' object has no attribute
  'more'``), and it needs OpenAPI's ``nullable`` rewritten anyway;
- an honest object with one value anywhere replaced by arbitrary JSON (deep nesting, huge and
  non-finite numbers, long strings, wrong types);
- arbitrary bytes.

Each must give a decoded state or a ``ValueError`` (the view: the node unresolvable with a reason), in
bounded time; and a hostile object of the largest size accepted is decoded in bounded memory.
"""

from __future__ import annotations

import contextlib
import json
import time
import tracemalloc
from datetime import timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender import all_held
from test_hostile_objects import Wall, body, event, raw_of, view_of

from gpuagent import boundedjson
from gpuagent.hints import agents
from gpuagent.hints.published import OBJECT_BOUNDS, crd_manifest, decode_list, decode_state, identify
from gpuagent.reflector import _Failure

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])
PER_CASE_SECONDS = 1.0  # far above a decode's 50 us: a case near it is a pathology, not a loaded machine


def from_crd_schema(schema: dict[str, Any], max_items: int = 2) -> st.SearchStrategy[Any]:
    """Values valid under a structural OpenAPI schema, lists cut to ``max_items``: required properties
    always, the others sometimes; numbers across their whole range, edges included."""
    kind = schema.get("type")
    if kind == "object":
        props = {k: from_crd_schema(v, max_items) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries({k: v for k, v in props.items() if k in required},
                                     optional={k: v for k, v in props.items() if k not in required})
    if kind == "array":
        size = min(schema.get("maxItems", max_items), max_items)
        strategy = st.lists(from_crd_schema(schema["items"], max_items), max_size=size)
    elif kind == "integer":
        low, high = schema["minimum"], schema["maximum"]
        strategy = st.integers(low, high) | st.sampled_from([low, high])
    elif kind == "number":
        low, high = schema["minimum"], schema["maximum"]
        strategy = st.floats(low, high, allow_nan=False) | st.integers(low, high) | st.sampled_from([low, high])
    elif kind == "string" and schema.get("format") == "date-time":
        strategy = st.datetimes(timezones=st.just(timezone.utc)).map(
            lambda d: f"{d.year:04d}-" + d.strftime("%m-%dT%H:%M:%S.%fZ"))
    elif kind == "string":
        strategy = st.text(max_size=min(schema.get("maxLength", 24), 24))
    elif kind == "boolean":
        strategy = st.booleans()
    else:
        raise AssertionError(f"not a structural schema: {schema}")
    return strategy | st.none() if schema.get("nullable") else strategy


CRD_SCHEMA = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
CRD_OBJECTS = from_crd_schema({**CRD_SCHEMA, "properties": {
    k: v for k, v in CRD_SCHEMA["properties"].items() if k != "metadata"}})

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
RAW_NUMBERS = st.sampled_from([b"1e999", b"-1e999", b"NaN", b"Infinity", b"9" * 400, b"-0", b"1e-400"])


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += paths(item, (*prefix, index))
    return out


def replaced(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(obj))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


HONEST = body("n1", all_held("n1"))
HONEST_PATHS = paths(HONEST)


def decoded_or_refused(raw: bytes) -> str:
    """'ok' or 'refused'; anything else raised fails the test. Also times the case and ``identify``."""
    started = time.perf_counter()
    try:
        decode_state(raw)
        outcome = "ok"
    except ValueError:
        outcome = "refused"
        identify(raw)  # never raises: a refused object is still named where it can be
    assert time.perf_counter() - started < PER_CASE_SECONDS
    return outcome


@FUZZ
@given(CRD_OBJECTS)
def test_every_object_the_crd_accepts_decodes(obj: dict[str, Any]) -> None:
    obj["metadata"] = {"name": "fuzzed"}
    assert decoded_or_refused(json.dumps(obj).encode()) == "ok", obj


@FUZZ
@given(st.sampled_from(HONEST_PATHS), JSON_VALUES)
def test_an_honest_object_with_any_value_replaced_decodes_or_is_refused(path: tuple[Any, ...],
                                                                         value: Any) -> None:
    decoded_or_refused(raw_of(replaced(HONEST, path, value)))


@FUZZ
@given(st.sampled_from(HONEST_PATHS), RAW_NUMBERS, st.integers(min_value=0, max_value=3000))
def test_non_finite_huge_and_deep_values_anywhere_are_refused_not_raised(path: tuple[Any, ...],
                                                                         number: bytes, depth: int) -> None:
    marker = "MARKER-VALUE"
    text = raw_of(replaced(HONEST, path, marker))
    decoded_or_refused(text.replace(b'"%s"' % marker.encode(), number, 1))
    nested = b"[" * depth + number + b"]" * depth
    decoded_or_refused(text.replace(b'"%s"' % marker.encode(), nested, 1))


@FUZZ
@given(st.binary(max_size=2000) | st.text(max_size=500).map(str.encode))
def test_arbitrary_bytes_are_refused_by_every_decoder(data: bytes) -> None:
    decoded_or_refused(data)
    for decode in (decode_list, agents._decode):
        with contextlib.suppress(ValueError):
            decode(data)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(HONEST_PATHS), JSON_VALUES), min_size=1, max_size=5))
def test_the_watch_gives_each_node_a_verdict_or_a_reason(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    view = view_of([raw_of(body("honest"))], Wall())
    for rv, (path, value) in enumerate(changes, start=10):
        obj = replaced(body("fuzzed", all_held("fuzzed"), rv=rv), path, value)
        # the envelope itself broken (the object replaced by a non-object) is the reflector's protocol
        # failure, retried by its loop; nothing else may come out
        with contextlib.suppress(_Failure):
            view._apply(event("MODIFIED", raw_of(obj)))
    entry = view.get("fuzzed")
    assert entry is None or entry.hints is not None or entry.unreadable
    assert view.get("honest").hints is not None and view.get("honest").answered_at is not None


def test_a_hostile_object_of_the_largest_size_is_read_in_bounded_memory_and_time() -> None:
    base = raw_of(HONEST)[:-1] + b',"x":'
    size = OBJECT_BOUNDS.max_bytes - len(base) - 16  # the largest object accepted, all of it hostile
    shapes = {
        "deep": base + b"[" * (size // 2) + b"]" * (size // 2) + b"}",
        "wide": base + b"[" + b"[]," * (size // 3 - 2) + b"[]]}",
        "strings": base + b'"' + b'\\"[' * (size // 3 - 2) + b'"}',
        "ints": base + b"[" + b"1," * (size // 2 - 2) + b"1]}",
        "open": base + b"{" * size,
    }
    decode_state(raw_of(HONEST))  # the decoders built (first use), outside what is measured
    for shape, raw in shapes.items():
        assert len(raw) <= OBJECT_BOUNDS.max_bytes, shape
        started = time.process_time()
        outcome = decoded_or_refused(raw)  # decode_state, and identify when refused
        seconds = time.process_time() - started
        assert outcome == ("refused" if shape in ("deep", "open") else "ok"), shape
        assert seconds < 0.25, (shape, seconds)  # about 10 ms on the development machine
        tracemalloc.start()
        decoded_or_refused(raw)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 * OBJECT_BOUNDS.max_bytes, (shape, peak)  # a few copies of the text, no blow-up


def nesting(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet='[]{}"\\ab\n', max_size=12)


@FUZZ
@given(st.recursive(st.none() | TRICKY_TEXT | st.integers(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
                    max_leaves=30))
def test_the_depth_counted_on_the_bytes_is_the_parser_s(value: Any) -> None:
    """The fast count (escapes, quotes and brackets by C-speed passes) against the nesting itself, with
    strings full of brackets, quotes and backslashes, compact and indented."""
    for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
        assert boundedjson.depth(text, 64) == nesting(value), text
