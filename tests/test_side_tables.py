"""prl ingest --kind rewards / ref: shapes, supersession order, bad rows, idempotence."""

from __future__ import annotations

import math
from datetime import UTC

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prl.formats.base import Quarantined
from prl.ingestion.side_tables import ingest_side_table, reward_events


def test_reward_shapes_exact(store, write_trace):
    path = write_trace(
        "r.jsonl",
        [
            {"sample_id": "a#0", "name": "correct", "value": 1, "created_at": "2026-11-01T00:00:00Z"},
            {"request_id": "b", "choice_index": 2, "reward": 0.25, "created_at": 1790000000},
            {"sample_id": "c#0", "rewards": {"correct": 0, "format": 0.5}, "created_at": 1790000000123},
        ],
    )
    result = ingest_side_table([str(path)], store, kind="rewards")
    assert (result.rows, result.quarantined) == (4, {})
    df = pl.read_delta(store.table_uri("rewards")).sort("sample_id", "name")
    assert df.select("sample_id", "name", "value").rows() == [
        ("a#0", "correct", 1.0),
        ("b#2", "reward", 0.25),
        ("c#0", "correct", 0.0),
        ("c#0", "format", 0.5),
    ]
    assert [t.timestamp() for t in df["created_at"].to_list()] == [
        1793491200.0,
        1790000000.0,
        1790000000.123,
        1790000000.123,
    ]
    assert df["source_line"].to_list() == [1, 2, 3, 3]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"name": "x", "value": 1.0}, "missing_key"),
        ({"request_id": "r", "choice_index": 1.5, "reward": 1.0}, "missing_key"),
        ({"sample_id": "s#0", "reward": None}, "missing_value"),
        ({"sample_id": "s#0", "reward": "high"}, "bad_value"),
        ({"sample_id": "s#0", "reward": True}, "bad_value"),
        ({"sample_id": "s#0", "reward": float("nan")}, "nonfinite_reward"),
        ({"sample_id": "s#0", "rewards": {"a": float("inf")}}, "nonfinite_reward"),
        ({"sample_id": "s#0"}, "missing_value"),
        ({"sample_id": "s#0", "rewards": {}}, "missing_value"),
        ({"sample_id": "s#0", "reward": 1.0, "created_at": "yesterday"}, "bad_timestamp"),
        ({"sample_id": "s#0", "reward": 1.0, "created_at": [2026]}, "bad_timestamp"),
    ],
)
def test_bad_reward_rows_quarantined(store, write_trace, row, reason):
    path = write_trace("bad.jsonl", [{"sample_id": "ok#0", "reward": 1.0}, row])
    result = ingest_side_table([str(path)], store, kind="rewards")
    assert (result.rows, result.quarantined) == (1, {reason: 1})
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert (q["table"], q["reason"], q["source_line"]) == ("rewards", reason, 2)


def test_csv_and_parquet_rewards(store, tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_text(
        "sample_id,name,value,created_at\nx#0,correct,1,2026-01-01T00:00:00Z\ny#0,correct,,2026-01-01T00:00:00Z\n"
    )
    parquet = tmp_path / "r.parquet"
    pq.write_table(pa.table({"request_id": ["z"], "choice_index": [0], "reward": [0.5]}), parquet)
    result = ingest_side_table([str(csv), str(parquet)], store, kind="rewards")
    assert (result.rows, result.quarantined) == (2, {"missing_value": 1})
    df = pl.read_delta(store.table_uri("rewards")).sort("sample_id")
    assert df.select("sample_id", "name", "value").rows() == [("x#0", "correct", 1.0), ("z#0", "reward", 0.5)]
    # the CSV reader types created_at as a timestamp: it is kept, not replaced by the ingest time
    assert df["created_at"][0].timestamp() == 1767225600.0


def test_rerun_and_grown_file(store, write_trace):
    path = write_trace("r.jsonl", [{"sample_id": "a#0", "reward": 1.0}])
    assert ingest_side_table([str(path)], store, kind="rewards").rows == 1
    again = ingest_side_table([str(path)], store, kind="rewards")
    assert (again.rows, again.unchanged_files) == (0, 1)
    before = path.stat().st_size
    with open(path, "a") as fh:
        fh.write('{"sample_id": "a#0", "reward": 0.0, "created_at": 1800000000}\n')
    grown = ingest_side_table([str(path)], store, kind="rewards")  # read on from where the first run stopped
    assert (grown.rows, grown.already_present) == (1, 0)
    assert (grown.resumed_from, grown.bytes_read) == ({str(path): before}, path.stat().st_size - before)
    assert sorted(pl.read_delta(store.table_uri("rewards"))["value"].to_list()) == [0.0, 1.0]


def test_ref_logprobs(store, write_trace):
    path = write_trace(
        "ref.jsonl",
        [
            {"sample_id": "a#0", "ref_model": "base", "ref_logprobs": [-0.5, -1.25]},
            {"sample_id": "b#0", "ref_model": "base", "ref_logprobs": [-0.5, 0.5]},
            {"sample_id": "c#0", "ref_model": "base", "ref_logprobs": [-0.5, None]},
            {"sample_id": "d#0", "ref_logprobs": [-0.5]},
            '{"sample_id": "e#0", "ref_model": "base", "ref_logprobs": [NaN]}',
        ],
    )
    result = ingest_side_table([str(path)], store, kind="ref")
    assert result.rows == 1
    assert result.quarantined == {"positive_logprob": 1, "bad_logprob": 1, "missing_value": 1, "nonfinite_logprob": 1}
    row = pl.read_delta(store.table_uri("ref_logprobs")).row(0, named=True)
    assert (row["sample_id"], row["ref_model"], row["ref_logprobs"]) == ("a#0", "base", [-0.5, -1.25])


@pytest.mark.parametrize("with_good_rows", [False, True])
def test_a_ref_logprob_beyond_float32_is_out_of_range_not_minus_infinity(store, write_trace, with_good_rows):
    """Stored as float32, -1e300 would become -inf without a word; on the columnar road (a file of one shape) and
    on the per-row road alike it is quarantined."""
    good = [{"sample_id": f"g{i}#0", "ref_model": "base", "ref_logprobs": [-0.5, -1e38]} for i in range(3)]
    bad = {"sample_id": "b#0", "ref_model": "base", "ref_logprobs": [-0.5, -1e300]}
    path = write_trace("ref.jsonl", [*good, bad] if with_good_rows else [bad])
    result = ingest_side_table([str(path)], store, kind="ref")
    assert (result.rows, result.quarantined) == (3 if with_good_rows else 0, {"out_of_range": 1})
    if with_good_rows:
        stored = pl.read_delta(store.table_uri("ref_logprobs"))["ref_logprobs"].to_list()
        assert stored == [[-0.5, pytest.approx(-1e38, rel=1e-7)]] * 3


@given(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4), st.lists(st.integers(), max_size=2)
    )
)
def test_reward_value_parser_total(value):
    try:
        events = reward_events({"sample_id": "s#0", "reward": value}, 0)
    except Quarantined as q:
        assert q.reason in {"missing_value", "bad_value", "nonfinite_reward"}
        return
    assert len(events) == 1 and math.isfinite(events[0]["value"])


def test_typed_timestamps_are_read_not_replaced():
    from datetime import datetime

    from prl.formats.fields import timestamp_ms

    assert timestamp_ms(datetime(2026, 1, 1)) == 1767225600000  # naive: UTC
    assert timestamp_ms(datetime(2026, 1, 1, tzinfo=UTC)) == 1767225600000
