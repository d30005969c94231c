"""The per-poll work made linear in the pods of a node (``bench/bench_scale.py``) decides what it decided before.

Each faster path is checked against the code it replaced, kept here as the reference, on random inputs:
the share controller's allowances and excesses (once pairwise over a GPU's tenants, quadratic), and the
memos that spare re-parsing every pod's annotations on every poll.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuagent import quantities
from gpuagent.quantities import PolicyValueError, parse_memory, parse_share

# -- remembered limit values ------------------------------------------------------------------------------


@given(st.text(max_size=70))
def test_a_remembered_parse_answers_as_a_fresh_one(text: str) -> None:
    for remembered, fresh in ((parse_share, quantities._parse_share), (parse_memory, quantities._parse_memory)):
        try:
            expected: object = fresh(text)
        except PolicyValueError as error:
            expected = ("error", error.message)
        for _ in range(2):  # the second time from the memo (or raised again)
            try:
                got: object = remembered(text)
            except PolicyValueError as error:
                got = ("error", error.message)
            assert got == expected


def test_only_short_texts_that_parse_are_remembered() -> None:
    quantities._remembered_share.cache_clear()
    assert parse_share("30%") == pytest.approx(0.3)
    padded = "30%" + " " * 100  # parses (spaces are stripped) but is longer than any value needs
    assert parse_share(padded) == pytest.approx(0.3)
    with pytest.raises(PolicyValueError):
        parse_share("30 percent")
    assert quantities._remembered_share.cache_info().currsize == 1
    for n in range(3 * quantities._REMEMBERED):
        parse_memory(f"{n + 1}Mi")
    assert quantities._remembered_memory.cache_info().currsize == quantities._REMEMBERED
