"""Side tables have two roads: columnar for the common shapes, row by row for everything else (the reference).
On any file, JSONL, CSV or Parquet, rewards or reference logprobs, both give the same table and quarantine."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.event_ids import ref_id, ref_ids
from prl.ingestion import side_tables
from prl.ingestion.ref_columnar import ref_block
from prl.ingestion.rewards_columnar import reward_block
from prl.ingestion.side_tables import ingest_side_table
from prl.store.tables import Store

NOW = 1_764_460_800_000
KEYS = st.sampled_from([("sample_id", "a#0"), ("sample_id", "b#1"), ("request", ("r1", 0)), ("request", ("r2", 3))])
REWARD_VALUES = st.one_of(st.integers(-5, 5), st.floats(-10, 10, allow_nan=False, width=32))
LOGPROBS = st.one_of(
    st.floats(-30, 0, allow_nan=False, width=32),
    st.integers(-3, 0),
    st.sampled_from([0.5, -1e300, None]),  # positive, past float32, null: quarantined or kept as the reader says
)


def _key(draw: st.DrawFn, by_request: bool) -> dict:
    kind, key = draw(KEYS)
    if by_request:
        request, choice = key if kind == "request" else (f"q-{key[0]}", int(key[-1]))
        return {"request_id": request, "choice_index": choice}
    return {"sample_id": key if kind == "sample_id" else f"{key[0]}#{key[1]}"}


@st.composite
def reward_rows(draw: st.DrawFn, by_request: bool, shape: str, stamped: bool) -> dict:
    row = _key(draw, by_request)
    value = draw(REWARD_VALUES)
    if shape == "long":
        row.update(name=draw(st.sampled_from(["reward", "format"])), value=value)
    else:
        row["reward"] = value
    if stamped:
        row["created_at"] = draw(st.integers(1_700_000_000, 1_800_000_000))
    return row


@st.composite
def ref_rows(draw: st.DrawFn, by_request: bool, clean: bool) -> dict:
    row = _key(draw, by_request)
    values = st.floats(-30, 0, allow_nan=False, width=32) if clean else LOGPROBS
    row.update(ref_model=draw(st.sampled_from(["ref-a", "ref-b"])), ref_logprobs=draw(st.lists(values, max_size=6)))
    return row


@st.composite
def files(draw: st.DrawFn) -> tuple[str, str, list[dict]]:
    kind = draw(st.sampled_from(["rewards", "ref"]))
    fmt = draw(st.sampled_from(["jsonl", "csv", "parquet"] if kind == "rewards" else ["jsonl", "parquet"]))
    by_request = draw(st.booleans())
    if kind == "rewards":
        rows = st.one_of(reward_rows(by_request, "long", True), reward_rows(by_request, "long", False))
        if draw(st.booleans()):  # one shape for the file: every block can go columnar
            rows = reward_rows(by_request, draw(st.sampled_from(["long", "one"])), draw(st.booleans()))
    else:
        rows = ref_rows(by_request, draw(st.booleans()))
    return kind, fmt, draw(st.lists(rows, min_size=1, max_size=12))


def _write(path: Path, fmt: str, rows: list[dict]) -> None:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    keys = dict.fromkeys(key for row in rows for key in row)  # every key of any row: a missing one is null
    table = pa.Table.from_pydict({key: [row.get(key) for row in rows] for key in keys})
    if fmt == "csv":
        pacsv.write_csv(table, str(path))
    else:
        pq.write_table(table, str(path))


def _ingest(path: Path, kind: str, store: Path, inputs: list[dict]) -> tuple[list[dict], dict[str, int], int]:
    result = ingest_side_table([str(path)], Store(str(store)), kind=kind)
    table = Store(str(store)).read("rewards" if kind == "rewards" else "ref_logprobs")
    rows = table.drop_columns(["ingested_at"]).sort_by("source_line").to_pylist()
    for row in rows:  # an event without a time gets the ingest time: the same for both roads, not the same instant
        if kind == "rewards" and inputs[row["source_line"] - 1].get("created_at") is None:
            row["created_at"] = None
    return rows, result.quarantined, result.rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files())
def test_columnar_road_equals_the_row_road(monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, list[dict]]) -> None:
    kind, fmt, rows = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"side.{fmt}"
        _write(path, fmt, rows)
        fast = _ingest(path, kind, Path(tmp) / "fast", rows)
        with monkeypatch.context() as m:
            m.setattr(side_tables, "_columnar", lambda run, table, first_line: None)
            slow = _ingest(path, kind, Path(tmp) / "slow", rows)
    assert fast == slow


def test_the_common_shapes_take_the_columnar_road() -> None:
    rewards = b'{"request_id": "r", "choice_index": 2, "name": "reward", "value": 1}\n' * 2
    batch, lines = reward_block(rewards, 5, "u", NOW)  # type: ignore[misc]
    assert (batch.column("sample_id").to_pylist(), lines.tolist()) == (["r#2", "r#2"], [5, 6])
    ref = b'{"request_id": "r", "choice_index": 0, "ref_model": "m", "ref_logprobs": [-0.5, -1, 0]}\n'
    out = ref_block(ref, 3, "u", NOW)
    assert out is not None
    assert out.select(["sample_id", "ref_model", "ref_logprobs", "source_line"]).to_pylist() == [
        {"sample_id": "r#0", "ref_model": "m", "ref_logprobs": [-0.5, -1.0, 0.0], "source_line": 3}
    ]


@pytest.mark.parametrize(
    "block",
    [
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": [0.5]}\n',
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": [null]}\n',
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": [null, 0.0]}\n',  # Arrow reads it into a bad list
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": [-1.0]}\n{"sample_id": "b", "ref_model": "m", '
        b'"ref_logprobs": [null, -2.0, 0.0]}\n',
        b'{"sample_id": "a", "ref_model": "", "ref_logprobs": [-1]}\n',
        b'{"sample_id": "a", "model": "m", "logprobs": [-1]}\n',
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": [-1e400]}\n',
        b'{"sample_id": "a", "ref_model": "m", "ref_logprobs": null}\n',
        b'{"request_id": "r", "choice_index": "0", "ref_model": "m", "ref_logprobs": [-1]}\n',
    ],
)
def test_other_ref_rows_take_the_row_road(block: bytes) -> None:
    assert ref_block(block, 1, "u", NOW) is None


def test_a_list_that_starts_with_null_is_quarantined_not_an_arrow_error(tmp_path: Path) -> None:
    """Arrow's JSON reader builds an invalid list array of ``[null, 0.0]`` (offsets past its values); the block
    goes the row road, which keeps the good row and quarantines the other with its reason."""
    path = tmp_path / "ref.jsonl"
    path.write_bytes(
        b'{"sample_id": "a#1", "ref_model": "m", "ref_logprobs": [null, 0.0]}\n'
        b'{"sample_id": "a#0", "ref_model": "m", "ref_logprobs": [-1.0, 0.0]}\n'
    )
    result = ingest_side_table([str(path)], Store(str(tmp_path / "store")), kind="ref")
    assert (result.rows, result.quarantined) == (1, {"bad_logprob": 1})
    stored = Store(str(tmp_path / "store")).read("ref_logprobs").select(["sample_id", "ref_logprobs"]).to_pylist()
    assert stored == [{"sample_id": "a#0", "ref_logprobs": [-1.0, 0.0]}]


@pytest.mark.parametrize(("kind", "fmt"), [("rewards", "jsonl"), ("rewards", "csv"), ("rewards", "parquet"),
                                           ("ref", "jsonl"), ("ref", "parquet")])  # fmt: skip
def test_common_files_never_take_the_row_road(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str, fmt: str
) -> None:
    def refused(*args: object) -> None:
        raise AssertionError("the row road was taken")

    monkeypatch.setattr(side_tables, "_row_batches", refused)
    if kind == "rewards":
        rows = [
            {"request_id": f"r{i // 8}", "choice_index": i % 8, "name": "reward", "value": i % 2} for i in range(40)
        ]
    else:
        rows = [{"sample_id": f"s{i}", "ref_model": "m", "ref_logprobs": [-0.25 * i, -1.0]} for i in range(40)]
    path = tmp_path / f"side.{fmt}"
    _write(path, fmt, rows)
    result = ingest_side_table([str(path)], Store(str(tmp_path / "store")), kind=kind)
    assert (result.rows, result.quarantined) == (40, {})


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.floats(-1e6, 0, allow_nan=False, width=32), max_size=5), min_size=1, max_size=8),
    st.integers(0, 3),
    st.sampled_from([pa.float32(), pa.float64()]),
)
def test_ref_ids_over_columns_equal_one_row_at_a_time(rows: list[list[float]], cut: int, value_type) -> None:
    array = pa.array(rows, pa.list_(value_type)).slice(min(cut, len(rows) - 1))
    sample_ids = [f"s{i}" for i in range(len(array))]
    models = ["m", "ref-b"] * len(array)
    expected = [
        ref_id(sid, model, np.array(row.as_py(), np.float64))
        for sid, model, row in zip(sample_ids, models, array, strict=False)
    ]
    assert ref_ids(sample_ids, models[: len(array)], array).to_pylist() == expected
