"""The bounded JSON reader: size, depth on the bytes, finite numbers; every refusal one ValueError naming it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuagent.boundedjson import Bounds, Unreadable, check, depth, in_range, loads


def test_depth_is_counted_on_the_bytes_ignoring_brackets_inside_strings() -> None:
    assert depth(b"{}", 10) == 1
    assert depth(b'{"a": [1, {"b": "]]]]{{{"}], "c": []}', 10) == 3
    assert depth(b'"[[[[["', 2) == 0
    assert depth(b'{"a": "\\"[[["}', 2) == 1
    assert depth(b"1", 0) == 0


def test_a_document_nested_past_the_bound_is_refused_before_any_parser() -> None:
    deep = b'{"hints": {"x": ' + b"[" * 1200 + b"]" * 1200 + b"}}"
    with pytest.raises(Unreadable, match="nested deeper than 32 levels"):
        loads(deep, what="GPUNodeState node-7")
    with pytest.raises(Unreadable, match="node-7: nested deeper"):
        check(b"[" * 100_000 + b"]" * 100_000, what="node-7")


def test_unbalanced_brackets_are_left_to_the_parser_to_name() -> None:
    with pytest.raises(Unreadable, match="not JSON"):
        loads(b"[[[}")


def test_size_is_capped() -> None:
    with pytest.raises(Unreadable, match="over the limit of 10"):
        loads(b"[1, 2, 3, 4, 5, 6]", Bounds(max_bytes=10))


@pytest.mark.parametrize("text", [b"NaN", b"[Infinity]", b'{"a": -Infinity}', b"1e999", b"[-1e400]"])
def test_numbers_that_are_not_finite_are_refused(text: bytes) -> None:
    with pytest.raises(Unreadable):
        loads(text)


def test_integers_are_bounded_in_digits() -> None:
    assert loads(b"18446744073709551615") == 2**64 - 1
    with pytest.raises(Unreadable, match="400 digits"):
        loads(b"9" * 400)


def test_not_json_and_bad_utf8_are_one_error() -> None:
    for text in (b"", b"{", b"\xff\xfe", b"{'a': 1}"):
        with pytest.raises(Unreadable, match="not JSON"):
            loads(text, what="body")


def test_in_range_names_the_path() -> None:
    assert in_range(0.5, 0, 1, "x") == 0.5
    for bad in (1e308, float("nan"), float("inf"), -1, True, "1", 10**400, None):
        with pytest.raises(Unreadable, match=r"^hints\.ratio: expected a number from 0 to 1"):
            in_range(bad, 0, 1, "hints.ratio")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=30,
)


def _nesting(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_nesting(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_json_value_reads_back_as_it_was_and_its_depth_is_exact(value: object) -> None:
    text = json.dumps(value)
    assert depth(text, 64) == _nesting(value)
    assert loads(text, Bounds(max_depth=64)) == value
