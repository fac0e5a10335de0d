"""Fixed-k heads: truncation, padding, widths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.numerics.heads import PAD_ID, PAD_LOGPROB, fixed_k, min_head_width

IDS = pa.list_(pa.list_(pa.int32()))
LPS = pa.list_(pa.list_(pa.float32()))


def test_truncate_and_pad():
    ids = pa.array([[[5, 6, 7], [8, 9]], None, [[1, 2, 3, 4]]], IDS)
    out = fixed_k(ids, 3, PAD_ID)
    assert out.to_pylist() == [[[5, 6, 7], [8, 9, -1]], None, [[1, 2, 3]]]
    lps = pa.array([[[-0.1, -2.0], [-0.5]]], LPS)
    got = fixed_k(lps, 2, PAD_LOGPROB).to_pylist()
    assert got[0][0] == [np.float32(-0.1), -2.0] and got[0][1][1] == float("-inf")


def test_widths():
    ids = pa.array([[[5, 6, 7], [8, 9]], None, [], [[1, 2, 3, 4]]], IDS)
    w = min_head_width(ids)
    assert w.tolist() == [2, -1, np.iinfo(np.int64).max, 4]


def test_sliced_input():
    ids = pa.array([[[1, 2]], [[3, 4, 5]], [[6]]], IDS).slice(1, 2)
    assert fixed_k(ids, 2, PAD_ID).to_pylist() == [[[3, 4]], [[6, -1]]]
    assert min_head_width(ids).tolist() == [3, 1]


def test_empty():
    assert len(fixed_k(pa.array([], IDS), 2, PAD_ID)) == 0
    assert min_head_width(pa.array([], IDS)).shape == (0,)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.lists(st.lists(st.integers(0, 100), max_size=6), max_size=5)), max_size=6),
    st.integers(1, 5),
)
def test_matches_loop(rows, k):
    arr = pa.array(rows, IDS)
    expected = [None if r is None else [(p[:k] + [PAD_ID] * max(0, k - len(p))) for p in r] for r in rows]
    assert fixed_k(arr, k, PAD_ID).to_pylist() == expected
    widths = min_head_width(arr).tolist()
    for r, w in zip(rows, widths, strict=True):
        if r is None:
            assert w == -1
        elif r:
            assert w == min(len(p) for p in r)
