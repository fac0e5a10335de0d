"""The plan's key helpers: run numbers of sorted keys, and drop reasons as one byte per sample."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from prl.numerics.advantages import dense_index
from prl.shards.options import ShardOptions
from prl.shards.plan import DROP_REASONS, _aligned, _runs, drop_reasons


def test_runs_number_sorted_keys_as_dense_index_does():
    keys = pl.Series([None, None, "a", "a", "b", "c", "c", "c"], dtype=pl.String)
    gidx, n = _runs(keys)
    assert gidx.tolist() == [0, 0, 1, 1, 2, 3, 3, 3]
    assert n == 4
    expected, expected_n = dense_index(keys.to_arrow())
    assert gidx.tolist() == expected.tolist() and n == expected_n


def test_runs_of_one_key():
    gidx, n = _runs(pl.Series(["x"]))
    assert gidx.tolist() == [0] and n == 1


def test_aligned_takes_each_trace_rows_side_row_and_null_elsewhere():
    ids = pa.array(["b", None, "a", "z", "b"], pa.large_string())
    side = pl.DataFrame({"sample_id": [None, "a", "b"], "v": [9.0, 1.0, 2.0]})
    (v,) = _aligned(ids, side)
    assert v.to_list() == [2.0, None, 1.0, None, 2.0]
    (empty,) = _aligned(ids, side.clear())
    assert empty.to_list() == [None] * 5 and empty.dtype == pl.Float64


def test_drop_reasons_are_codes_of_the_first_failed_filter():
    frame = pl.DataFrame(
        {
            "sample_id": ["a", "a", "b", "c"],
            "finish_reason": ["stop", "stop", "abort", "stop"],
            "completion_len": [3, 3, 3, 3],
            "prompt_len": [1, 1, 1, 1],
            "mask_len": [3, 3, 3, 2],
            "verdict": ["ok", "ok", "ok", "ok"],
            "_score_missing": [False, False, False, False],
            "score": [1.0, 1.0, 1.0, 1.0],
        }
    )
    drop = frame.select(drop_reasons(ShardOptions(), with_ref=False).alias("drop"))["drop"]
    assert drop.dtype == pl.UInt8
    names = [None if c is None else DROP_REASONS[c] for c in drop.to_list()]
    assert names == ["duplicate_sample_id", "duplicate_sample_id", "finish_reason", "mask_length_mismatch"]
    ok = frame.slice(3, 1).with_columns(pl.lit(3).alias("mask_len"))
    assert ok.select(drop_reasons(ShardOptions(), with_ref=False))[:, 0].to_list() == [None]
