"""Shards written a row group at a time (:mod:`prl.shards.rowgroups`): row groups of whole groups, each in the
token window of its first token, and a set whose shards are cut into many row groups holding the very rows and
values of one written a row group per shard (plain rows with KL, and merged turns)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from prl.shards import rowgroups
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from prl.shards.rowgroups import row_groups
from prl.shards.verify import verify_shards
from prl.shards.writer import FLOAT_LEAVES
from tests.shards_fixtures import random_store, varied_store
from tests.test_shards_merged_build import store_with


def test_groups_go_to_the_window_of_their_first_token():
    # rows start at tokens 0, 3, 6, 11, 13, 15; groups a (0), b (6), c (11), d (15); windows of 8: 0, 0, 1, 1
    ids = pl.Series(["a", "a", "b", "c", "c", "d"])
    assert row_groups(ids, np.array([3, 3, 5, 2, 2, 9]), 8) == [(0, 3), (3, 6)]
    assert row_groups(ids, np.array([3, 3, 5, 2, 2, 9]), 100) == [(0, 6)]
    assert row_groups(ids, np.array([3, 3, 5, 2, 2, 9]), 1) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert row_groups(pl.Series([None, None, "x"], dtype=pl.String), np.array([5, 5, 5]), 5) == [(0, 2), (2, 3)]
    assert row_groups(pl.Series([], dtype=pl.String), np.array([], dtype=np.int64), 5) == []


@given(
    st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c"]), st.lists(st.integers(0, 40), min_size=1, max_size=4)),
        max_size=30,
    ),
    st.integers(1, 200),
)
def test_row_groups_cover_every_row_in_order_and_keep_groups_whole(groups, limit):
    # a group is a run of equal ids (nulls equal): the same id may come back later as another group
    ids = [gid for gid, rows in groups for _ in rows]
    tokens = np.array([t for _, rows in groups for t in rows], dtype=np.int64)
    cuts = row_groups(pl.Series(ids, dtype=pl.String), tokens, limit)
    edges = [0, *[r1 for _, r1 in cuts]] if cuts else [0]
    assert [r0 for r0, _ in cuts] == edges[:-1] and edges[-1] == len(ids)
    starts = np.concatenate(([0], np.cumsum(tokens)[:-1])) if len(ids) else tokens
    firsts = [r for r in range(len(ids)) if r == 0 or ids[r] != ids[r - 1]]
    windows = []
    for r0, r1 in cuts:
        assert r0 < r1 and r0 in firsts  # a cut falls between groups
        inside = [r for r in firsts if r0 <= r < r1]
        assert len({int(starts[r]) // limit for r in inside}) == 1  # one window per row group
        windows.append(int(starts[r0]) // limit)
    assert windows == sorted(set(windows))  # and a new row group for each new window


def _shards(res) -> tuple[dict, list[pq.ParquetFile]]:
    manifest = json.loads(Path(res.manifest_path).read_text())
    return manifest, [pq.ParquetFile(os.path.join(res.set_dir, s["file"])) for s in manifest["shards"]]


def _same_set_in_row_groups(tmp_path, monkeypatch, store, options: ShardOptions, limit: int) -> int:
    """Build ``store`` into one OUT as it is and into another with row groups of ``limit`` tokens; check that the
    two hold the same rows and values shard for shard, that the small row groups keep groups whole, and that both
    verify; returns the row groups of the second."""
    whole = build_shards(store, str(tmp_path / "whole"), options=options)
    monkeypatch.setattr(rowgroups, "ROW_GROUP_TOKENS", limit)
    cut = build_shards(store, str(tmp_path / "cut"), options=options)
    monkeypatch.undo()
    assert cut.set_id != whole.set_id  # the row-group size is in the set id
    (m_whole, f_whole), (m_cut, f_cut) = _shards(whole), _shards(cut)
    assert [f.metadata.num_row_groups for f in f_whole] == [1] * len(f_whole)
    assert len(f_cut) == len(f_whole)
    for a, b in zip(f_whole, f_cut, strict=True):
        assert b.read().equals(a.read())
        seen: set[str] = set()
        for g in range(b.metadata.num_row_groups):
            group = b.metadata.row_group(g)
            for i in range(group.num_columns):  # every row group encoded as the first
                column = group.column(i)
                assert column.compression == "ZSTD", column.path_in_schema
                if column.path_in_schema in FLOAT_LEAVES and column.num_values:
                    assert "BYTE_STREAM_SPLIT" in column.encodings, column.path_in_schema
            groups = set(b.read_row_group(g, columns=["group_id"]).column("group_id").to_pylist())
            assert not groups & seen  # a group is in one row group
            seen |= groups
    for key in ("totals", "drops", "statistics", "samples"):
        if key == "samples":
            assert m_cut[key]["sha256"] == m_whole[key]["sha256"]
        else:
            assert m_cut[key] == m_whole[key], key
    assert [s["rows"] for s in m_cut["shards"]] == [s["rows"] for s in m_whole["shards"]]
    assert verify_shards(str(tmp_path / "cut")).ok and verify_shards(str(tmp_path / "whole")).ok
    return sum(f.metadata.num_row_groups for f in f_cut)


def test_a_set_cut_into_row_groups_holds_the_same_rows_and_values(tmp_path, monkeypatch):
    store = random_store(str(tmp_path / "store"), 40, 4, with_ref=True)
    options = ShardOptions(target_tokens=400, kl="advantages", kl_coef=0.1, seed=3)
    groups = _same_set_in_row_groups(tmp_path, monkeypatch, store, options, 60)
    assert groups > 12  # about seven row groups of 60 tokens per shard of 400 (one per group at least)


def test_heads_masks_and_null_logprobs_cut_into_row_groups_are_the_same(tmp_path, monkeypatch):
    store = varied_store(str(tmp_path / "store"))  # heads of width 3 or 4, some masks, null logprobs and refs
    options = ShardOptions(
        target_tokens=120, kl="advantages", kl_coef=0.1, missing_ref="drop", topk="auto", drop_constant_groups=False
    )
    assert _same_set_in_row_groups(tmp_path, monkeypatch, store, options, 25) > 6


def test_merged_rows_cut_into_row_groups_are_the_same_rows(tmp_path, monkeypatch):
    store = store_with(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="none")
    assert (
        _same_set_in_row_groups(tmp_path, monkeypatch, store, options, 1) == 3
    )  # one per merged group: agents a and b, and the solo turn
