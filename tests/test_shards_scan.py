"""The latest row per sample the plan's side reads keep (:func:`prl.shards.scan.last_of_runs`)."""

from __future__ import annotations

import polars as pl

from prl.shards.scan import last_of_runs


def test_the_last_row_of_each_run_in_key_order_wins_and_ties_keep_their_order():
    rows = pl.DataFrame(
        {
            "sample_id": ["b", "a", "b", "a", "c", "b"],
            "at": [2, 1, 2, 3, 0, 1],
            "value": [10, 11, 12, 13, 14, 15],
        }
    )
    latest = last_of_runs(rows, ["sample_id", "at"], ["sample_id"], ["sample_id", "value"])
    # a: at 3 (13); b: rows 0 and 2 tie on at 2, the later one (12) wins; c: its one row
    assert latest.to_dict(as_series=False) == {"sample_id": ["a", "b", "c"], "value": [13, 12, 14]}


def test_runs_of_several_columns_and_keys_given_as_expressions():
    rows = pl.DataFrame(
        {
            "sample_id": ["s", "s", "s", "t"],
            "name": ["x", "y", "x", "x"],
            "verdict": ["warn", "ok", "ok", "ok"],
            "value": [1.0, 2.0, 3.0, 4.0],
        }
    )
    severity = pl.col("verdict").replace_strict({"ok": 0, "warn": 1}, return_dtype=pl.Int8)
    by = [pl.col("sample_id"), pl.col("name"), severity]
    latest = last_of_runs(rows, by, ["sample_id", "name"], ["sample_id", "name", "value"])
    assert latest.to_dict(as_series=False) == {
        "sample_id": ["s", "s", "t"],
        "name": ["x", "y", "x"],
        "value": [1.0, 2.0, 4.0],
    }


def test_no_rows_keep_the_columns_asked_for():
    rows = pl.DataFrame(schema={"sample_id": pl.String, "at": pl.Int64, "value": pl.Float64})
    latest = last_of_runs(rows, ["sample_id", "at"], ["sample_id"], ["sample_id", "value"])
    assert latest.schema == pl.Schema({"sample_id": pl.String, "value": pl.Float64}) and latest.height == 0
