"""ShipRows: each part reads back exactly its own shipped rows' plan values and spill places."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from prl.shards.scores import Scores
from prl.shards.shiprows import ShipRows, located, part_meta, part_scores
from prl.shards.spill import ScanSpill

TRACES = pa.schema(
    [
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("completion_token_ids", pa.list_(pa.int32())),
        pa.field("completion_logprobs", pa.list_(pa.float32())),
        pa.field("completion_mask", pa.list_(pa.bool_())),
    ]
)


def spills(tmp_path) -> tuple[ScanSpill, ScanSpill]:
    traces = ScanSpill(str(tmp_path / "traces.arrow"))
    rows = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "completion_logprobs": [-1.0], "completion_mask": None},
        {"prompt_token_ids": [4], "completion_token_ids": [5, 6], "completion_logprobs": [-1.0, -2.0],
         "completion_mask": [True, False]},
        {"prompt_token_ids": [7, 8, 9], "completion_token_ids": [10], "completion_logprobs": [-3.0],
         "completion_mask": None},
    ]  # fmt: skip
    traces.write(pa.RecordBatch.from_pylist(rows, schema=TRACES), np.array([0, 1, 2]))
    traces.close()
    ref = ScanSpill(str(tmp_path / "ref.arrow"))
    ref_rows = [{"ref_logprobs": [-0.5, -0.25]}, {"ref_logprobs": [-0.75]}]
    ref_schema = pa.schema([pa.field("ref_logprobs", pa.list_(pa.float32()))])
    ref.write(pa.RecordBatch.from_pylist(ref_rows, schema=ref_schema), np.array([0, 1]))
    ref.close()
    return traces, ref


def test_each_part_reads_its_rows_values_and_places(tmp_path):
    traces, ref = spills(tmp_path)
    ship = pl.DataFrame(
        {
            "row": [2, 0, 1],
            "sample_id": ["s2", "s0", "s1"],
            "group_id": ["g1", "g0", "g0"],
            "policy_version": ["step-3", None, "step-1"],
            "staleness": [0, None, 2],
            "temperature": pl.Series([1.0, 0.5, 1.0], dtype=pl.Float32),
            "has_mask": [False, False, True],
            "ref_row": [1, 0, 0],
            "score": [1.0, 0.0, 2.0],
        }
    )
    scores = Scores(np.array([1.0, 0.5]), np.array([0.25, -0.25]), np.array([1, 2], dtype=np.int32), 0.125, 1, 0)
    units_N = np.array([0, 1, 1])  # scores per unit
    rows = ShipRows.write(str(tmp_path / "ship.arrow"), ship, np.array([0, 1, 3]), traces, ref, scores, units_N)
    first, second = rows.read(0), rows.read(1)
    unit_scores, units = part_scores(second, 0.125)
    assert units.tolist() == [0, 0]  # from 0 in each part
    assert (unit_scores.reward_N.tolist(), unit_scores.advantage_N.tolist()) == ([0.5], [-0.25])
    assert unit_scores.group_size_N.tolist() == [2] and unit_scores.group_size_N.dtype == np.int32
    assert unit_scores.mean_d == 0.125
    assert part_scores(first, 0.125)[0].reward_N.tolist() == [1.0]
    assert first.num_rows == 1 and second.num_rows == 2
    assert part_meta(second).to_dicts() == [
        {"sample_id": "s0", "group_id": "g0", "policy_version": None, "staleness": None, "temperature": 0.5},
        {"sample_id": "s1", "group_id": "g0", "policy_version": "step-1", "staleness": 2, "temperature": 1.0},
    ]
    assert part_meta(first).schema == pl.Schema(
        {"sample_id": pl.String, "group_id": pl.String, "policy_version": pl.String, "staleness": pl.Int64,
         "temperature": pl.Float32}
    )  # fmt: skip
    assert second.column("has_mask").to_pylist() == [False, True]
    assert second.column("unit").to_pylist() == [1, 1]
    t = {k: v.tolist() for k, v in located(second, "t.").items()}
    assert t == {
        "spill_row": [0, 1],
        "prompt_token_ids:start": [0, 2],
        "prompt_token_ids:len": [2, 1],
        "completion_token_ids:start": [0, 1],
        "completion_token_ids:len": [1, 2],
        "completion_logprobs:start": [0, 1],
        "completion_logprobs:len": [1, 2],
        "completion_mask:start": [0, 0],
        "completion_mask:len": [0, 2],
        "completion_mask:valid": [False, True],
    }
    r = {k: v.tolist() for k, v in located(first, "r.").items()}
    assert r == {"spill_row": [1], "ref_logprobs:start": [2], "ref_logprobs:len": [1]}
    traces.forget_rows()
    flat = traces.flat_at(located(second, "t."), [("prompt_token_ids", "completion_token_ids"), "completion_mask"])
    assert flat[("prompt_token_ids", "completion_token_ids")].values_T.tolist() == [1, 2, 3, 4, 5, 6]
    assert flat["completion_mask"].to_arrow(pa.bool_()).to_pylist() == [None, [True, False]]
    assert ref.flat_at(located(first, "r."), ["ref_logprobs"])["ref_logprobs"].values_T.tolist() == [-0.75]


def test_without_units_or_ref_the_file_has_neither(tmp_path):
    traces, _ = spills(tmp_path)
    ship = pl.DataFrame({"row": [1, 2], "sample_id": ["s1", "s2"], "group_id": ["g0", "g0"], "has_mask": [True, False]})
    scores = Scores(np.array([1.0, 2.0]), np.array([-0.5, 0.5]), np.array([2, 2], dtype=np.int32), 0.0, 0, 0)
    batch = ShipRows.write(str(tmp_path / "ship.arrow"), ship, np.array([0, 2]), traces, None, scores).read(0)
    assert [n for n in batch.schema.names if not n.startswith("t.")] == [
        "sample_id",
        "group_id",
        "has_mask",
        "s.reward",
        "s.advantage",
        "s.group_size",
    ]
    row_scores, units = part_scores(batch, 0.0)
    assert units is None and row_scores.advantage_N.tolist() == [-0.5, 0.5]


def test_empty_parts_are_empty_batches_of_the_same_columns(tmp_path):
    traces, _ = spills(tmp_path)
    ship = pl.DataFrame({"row": [0, 2, 1], "sample_id": ["s0", "s2", "s1"], "has_mask": [False, False, True]})
    scores = Scores(
        np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.0, 1.0]), np.array([3, 3, 3], dtype=np.int32), 0.0, 0, 0
    )
    rows = ShipRows.write(str(tmp_path / "ship.arrow"), ship, np.array([0, 0, 1, 1, 3]), traces, None, scores)
    batches = [rows.read(s) for s in range(4)]
    assert [b.num_rows for b in batches] == [0, 1, 0, 2]
    assert all(b.schema == batches[1].schema for b in batches)
    assert [b.column("sample_id").to_pylist() for b in batches] == [[], ["s0"], [], ["s2", "s1"]]
    empty_scores, units = part_scores(batches[0], 0.0)
    assert units is None and empty_scores.reward_N.tolist() == []
    assert part_meta(batches[2]).height == 0
