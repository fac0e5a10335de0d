"""The plan's key helpers: run numbers of sorted keys, the shuffled layout of whole groups, and drop reasons as
one byte per sample."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.numerics.advantages import dense_index
from prl.shards.options import ShardOptions
from prl.shards.plan import DROP_REASONS, _aligned, _order, _runs, drop_reasons


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


def _order_by_sorting(keep: pl.DataFrame, options: ShardOptions) -> tuple[list[int], list[int]]:
    """What :func:`prl.shards.plan._order` gives, the long way: a stable sort of the rows by their group's
    shuffled rank, and the shards as dense numbers of each row's token window."""
    keys = (
        keep.select("group_id", "sample_id", (pl.col("prompt_len") + pl.col("completion_len")).alias("_tokens"))
        .with_row_index("_k")
        .sort("group_id", "sample_id")
    )
    gidx, num_g = dense_index(keys["group_id"].to_arrow())
    perm_G = np.random.default_rng(options.seed).permutation(num_g)
    rank_G = np.empty(num_g, dtype=np.int64)
    rank_G[perm_G] = np.arange(num_g)
    tokens_G = np.bincount(gidx, weights=keys["_tokens"].to_numpy(), minlength=num_g)
    start_by_rank = np.concatenate(([0.0], np.cumsum(tokens_G[perm_G])[:-1]))
    window_G = (start_by_rank // options.target_tokens).astype(np.int64)[rank_G]
    order = np.lexsort((np.arange(len(gidx)), rank_G[gidx]))
    _, shard = np.unique(window_G[gidx][order], return_inverse=True)
    return keys["_k"].to_numpy()[order].tolist(), shard.tolist()


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["g0", "g1", "g2", "g3", "g4", "g5"])),
            st.integers(0, 40),
            st.integers(0, 60),
        ),
        min_size=1,
        max_size=60,
    ),
    seed=st.integers(0, 2**32 - 1),
    target=st.integers(1, 200),
)
def test_order_lays_out_shuffled_whole_groups_as_sorting_by_rank_does(rows, seed, target):
    keep = pl.DataFrame(
        {
            "group_id": [g for g, _, _ in rows],
            "sample_id": [f"s{i:03d}" for i in range(len(rows))][::-1],  # sample order differs from row order
            "prompt_len": [p for _, p, _ in rows],
            "completion_len": [c for _, _, c in rows],
        },
        schema={"group_id": pl.String, "sample_id": pl.String, "prompt_len": pl.Int64, "completion_len": pl.Int64},
    )
    options = ShardOptions(seed=seed, target_tokens=target)
    index_K, shard_K = _order(keep, options)
    assert shard_K.dtype == np.int32
    assert (index_K.tolist(), shard_K.tolist()) == _order_by_sorting(keep, options)


def test_order_of_three_groups():
    keep = pl.DataFrame(
        {
            "group_id": ["b", "a", "b", "c", "a"],
            "sample_id": ["s4", "s3", "s2", "s1", "s0"],
            "prompt_len": [1, 1, 1, 1, 1],
            "completion_len": [1, 1, 1, 1, 1],
        }
    )
    options = ShardOptions(seed=0, target_tokens=4)
    perm = np.random.default_rng(0).permutation(3).tolist()  # the group (a, b, c → 0, 1, 2) at each rank
    rows_of = {0: [4, 1], 1: [2, 0], 2: [3]}  # each group's rows in sample order
    index_K, shard_K = _order(keep, options)
    assert index_K.tolist() == [row for g in perm for row in rows_of[g]]
    tokens_by_rank = [2 * len(rows_of[g]) for g in perm]
    starts = np.concatenate(([0], np.cumsum(tokens_by_rank)[:-1]))
    windows = [int(w) for w in starts // 4]
    dense = {w: i for i, w in enumerate(sorted(set(windows)))}
    assert shard_K.tolist() == [dense[windows[r]] for r, g in enumerate(perm) for _ in rows_of[g]]
