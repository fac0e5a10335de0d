"""The plan's side reads: the latest row per sample they keep (:func:`prl.shards.scan.last_of_runs`), and the
sample ids of a frontier's source they keep rows of (:func:`prl.shards.scan.source_sample_ids`)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from prl.shards.scan import last_of_runs


def test_the_last_row_of_each_run_in_key_order_wins_and_ties_keep_their_order():
    rows = pa.table(
        {
            "sample_id": ["b", "a", "b", "a", "c", "b"],
            "at": [2, 1, 2, 3, 0, 1],
            "value": [10, 11, 12, 13, 14, 15],
        }
    )
    latest = last_of_runs(rows, ["sample_id", "at"], ["sample_id"], ["sample_id", "value"])
    # a: at 3 (13); b: rows 0 and 2 tie on at 2, the later one (12) wins; c: its one row
    assert latest.to_dict(as_series=False) == {"sample_id": ["a", "b", "c"], "value": [13, 12, 14]}


def test_runs_of_several_columns_nulls_first_across_chunks():
    first = pa.table({"sample_id": ["s", "s"], "name": ["x", "y"], "at": [1, None], "value": [1.0, 2.0]})
    second = pa.table({"sample_id": ["s", "t"], "name": ["x", "x"], "at": [None, 5], "value": [3.0, 4.0]})
    rows = pa.concat_tables([first, second])
    latest = last_of_runs(rows, ["sample_id", "name", "at"], ["sample_id", "name"], ["sample_id", "name", "value"])
    # s/x: the null time sorts first, so the row at 1 is the latest
    expected = {"sample_id": ["s", "s", "t"], "name": ["x", "y", "x"], "value": [1.0, 2.0, 4.0]}
    assert latest.to_dict(as_series=False) == expected


def test_no_rows_keep_the_columns_asked_for():
    rows = pa.table(
        {"sample_id": pa.array([], pa.string()), "at": pa.array([], pa.int64()), "value": pa.array([], pa.float64())}
    )
    latest = last_of_runs(rows, ["sample_id", "at"], ["sample_id"], ["sample_id", "value"])
    assert latest.schema == pl.Schema({"sample_id": pl.String, "value": pl.Float64}) and latest.height == 0


def test_rewards_widen_to_one_row_per_sample_null_where_a_sample_has_no_such_name(tmp_path):
    from prl.schema import REWARDS
    from prl.shards.scan import latest_rewards
    from prl.store.tables import Store
    from tests.shards_fixtures import reward, table

    store = Store(str(tmp_path / "store"))
    events = [
        reward("a", 1.0, at=0, line=0),
        reward("a", 2.0, at=1, line=1),  # later: wins
        reward("a", float("nan"), name="format", at=0, line=2),
        reward("b", 0.5, name="format", at=0, line=3),
        reward("c", 3.0, at=0, line=4),
        reward("c", 4.0, at=0, line=5),  # ties on the time: the later source line wins
    ]
    store.commit("rewards", table(REWARDS, events).to_batches())
    wide = latest_rewards(store, store.versions()["rewards"], ["reward", "format"]).sort("sample_id")
    assert wide.columns == ["sample_id", "r::reward", "r::format"]
    assert wide["sample_id"].to_list() == ["a", "b", "c"]
    assert wide["r::reward"].to_list() == [2.0, None, 4.0]
    formats = wide["r::format"].to_list()
    assert formats[1:] == [0.5, None] and formats[0] != formats[0]  # NaN stays NaN, not null


def test_verdicts_keep_the_prefix_status_only_when_asked(tmp_path):
    from prl.schema import CHECKS
    from prl.shards.scan import latest_verdicts
    from prl.store.tables import Store
    from tests.shards_fixtures import table, verdict

    store = Store(str(tmp_path / "store"))
    checks = [verdict("a", "warn", at=0), {**verdict("a", "ok", at=1), "prefix_status": "CLEAN"}, verdict("b", "drift")]
    store.commit("checks", table(CHECKS, checks).to_batches())
    version = store.versions()["checks"]
    both = latest_verdicts(store, version, None).sort("sample_id")
    assert both.to_dict(as_series=False) == {
        "sample_id": ["a", "b"],
        "verdict": ["ok", "drift"],
        "prefix_status": ["CLEAN", None],
    }
    assert latest_verdicts(store, version, None, prefix=False).sort("sample_id").to_dict(as_series=False) == {
        "sample_id": ["a", "b"],
        "verdict": ["ok", "drift"],
    }
    assert latest_verdicts(store, None, None, prefix=False).columns == ["sample_id", "verdict"]


def test_batches_become_one_frame_of_one_chunk_per_column():
    from prl.shards.scan import one_chunk

    def batch(ids: list[str], path: str, spans: list) -> pa.Table:
        n = len(ids)
        return pa.table(
            {
                "sample_id": ids,
                "_file": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([path])),
                "len": pa.array(range(n), pa.int64()),
                "spans": pa.array(spans, pa.list_(pa.struct([("version", pa.string()), ("start", pa.int32())]))),
            }
        )

    frames = [batch(["a", "b"], "f1", [None, [{"version": "v", "start": 1}]]), batch(["c"], "f2", [[]])]
    out = one_chunk(frames)
    assert frames == []
    assert out.columns == ["sample_id", "_file", "len", "spans"]
    assert isinstance(out.schema["_file"], pl.Categorical)
    assert [out.schema[c] for c in ("sample_id", "len", "spans")] == [
        pl.String,
        pl.Int64,
        pl.List(pl.Struct({"version": pl.String, "start": pl.Int32})),
    ]
    assert out.with_columns(pl.col("_file").cast(pl.String)).to_dict(as_series=False) == {
        "sample_id": ["a", "b", "c"],
        "_file": ["f1", "f1", "f2"],
        "len": [0, 1, 0],
        "spans": [None, [{"version": "v", "start": 1}], []],
    }
    assert all(out.get_column(c).n_chunks() == 1 for c in out.columns)


def test_a_sources_sample_ids_are_distinct_and_follow_each_parts_filter(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from prl.shards.frontier import TraceSource
    from prl.shards.scan import source_sample_ids
    from prl.store.tables import scan_options

    parts = []
    for name, ids, flt in [
        ("one", ["b", "a", "b", None], None),  # no filter: the null id is kept
        ("two", ["c", "a", "d", None], pc.field("sample_id") != "d"),
        ("backlog", ["e", "f", "g"], pc.field("sample_id").isin(["f", "x"])),  # a backlog part's filter
    ]:
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(pa.table({"sample_id": pa.array(ids, pa.string()), "n": list(range(len(ids)))}), path)
        parts.append((ds.dataset(path), flt))
    ids = source_sample_ids(TraceSource(parts, whole=False), scan_options(False))
    # "d" fails its part's filter (and so does its null: a comparison with null is null); of the backlog, "f"
    values = ids.to_pylist()
    assert ids.type == pa.large_string() and len(values) == 5
    assert sorted(v for v in values if v is not None) == ["a", "b", "c", "f"] and values.count(None) == 1
    empty = source_sample_ids(TraceSource([], whole=False), scan_options(False))
    assert empty.type == pa.large_string() and len(empty) == 0
