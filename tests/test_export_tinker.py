"""Tinker Datum export: exact JSON shape and alignment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from prl.errors import UsageError
from prl.export.tinker import export_tinker
from prl.loaders import Rows, tinker_arrays
from prl.shards.build import build_shards
from tests.shards_fixtures import make_store, random_store, reward, trace


def f32(v):
    """float32 values are written in their shortest float32 form, which reads back as that float32."""
    return float(repr(np.float32(v)).removeprefix("np.float32(").removesuffix(")"))


def test_exact_datum(tmp_path):
    traces = [
        trace(
            "a:0",
            "g",
            [1, 2],
            [10, 11, 12],
            completion_logprobs=[-0.5, None, -1.5],
            completion_mask=[True, True, False],
        ),
        trace("b:0", "g", [3], [20]),
    ]
    store = make_store(str(tmp_path / "s"), traces, [reward("a:0", 1.0), reward("b:0", 0.0)])
    res = build_shards(store, str(tmp_path / "out"))
    out = str(tmp_path / "d.jsonl")
    result = export_tinker(res.set_dir, out)
    assert (result.rows, result.skipped) == (2, 0)
    records = [json.loads(line) for line in Path(out).read_text().splitlines()]
    assert {r["sample_id"]: r["group_id"] for r in records} == {"a:0": "g", "b:0": "g"}
    assert {r["set_id"] for r in records} == {res.set_id}
    lines = {tuple(r["datum"]["loss_fn_inputs"]["target_tokens"]["data"]): r["datum"] for r in records}
    a = lines[(2, 10, 11, 12)]
    assert a == {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 10, 11]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": [2, 10, 11, 12], "dtype": "int64", "shape": [4]},
            "logprobs": {"data": [0.0, f32(-0.5), 0.0, f32(-1.5)], "dtype": "float32", "shape": [4]},
            # advantage 0.5 on the first completion token; null logprob → 0; masked-out token → 0
            "advantages": {"data": [0.0, 0.5, 0.0, 0.0], "dtype": "float32", "shape": [4]},
        },
    }
    b = lines[(20,)]
    assert b["model_input"]["chunks"][0]["tokens"] == [3]
    assert b["loss_fn_inputs"]["logprobs"]["data"] == [f32(-0.1)]
    assert b["loss_fn_inputs"]["advantages"]["data"] == [-0.5]


def test_prompt_len_zero_and_short_rows():
    batch = pa.table(
        {
            "sample_id": ["a", "b"],
            "group_id": ["g", "g"],
            "policy_version": pa.array([None, None], pa.string()),
            "input_ids": pa.array([[7, 8, 9], [5]], pa.list_(pa.int32())),
            "prompt_len": pa.array([0, 0], pa.int32()),
            "loss_mask": pa.array([[True, True, True], [True]], pa.list_(pa.bool_())),
            "behavior_logprobs": pa.array([[-1.0, -2.0, -3.0], [-1.0]], pa.list_(pa.float32())),
            "token_advantages": pa.array([[1.0, 2.0, 3.0], [1.0]], pa.list_(pa.float32())),
            "reward": [1.0, 1.0],
            "advantage": [1.0, 1.0],
            "group_size": pa.array([2, 2], pa.int32()),
        }
    )
    arrays = tinker_arrays(Rows.from_arrow(batch))
    assert arrays.j_off_N1.tolist() == [0, 2, 2]
    assert arrays.logprobs_J.tolist() == [-2.0, -3.0] and arrays.advantages_J.tolist() == [2.0, 3.0]
    assert not arrays.has_datum(1)


def test_matches_loop_on_random_set(tmp_path):
    res = build_shards(random_store(str(tmp_path / "s"), 8, 3), str(tmp_path / "out"))
    out = str(tmp_path / "d.jsonl")
    export_tinker(res.set_dir, out)
    shard_rows = []
    import pyarrow.parquet as pq

    for s in res.shards:
        shard_rows += pq.read_table(os.path.join(res.set_dir, s["file"])).to_pylist()
    lines = [json.loads(line)["datum"] for line in Path(out).read_text().splitlines()]
    assert len(lines) == len(shard_rows) == 24
    for row, datum in zip(shard_rows, lines, strict=True):
        toks, p = row["input_ids"], row["prompt_len"]
        lp = [0.0] * (len(toks) - 1)
        ad = [0.0] * (len(toks) - 1)
        for c, (lq, a) in enumerate(zip(row["behavior_logprobs"], row["token_advantages"], strict=True)):
            lp[p + c - 1], ad[p + c - 1] = lq, a
        assert datum["model_input"]["chunks"][0]["tokens"] == toks[:-1]
        assert datum["loss_fn_inputs"]["target_tokens"]["data"] == toks[1:]
        got_lp = np.asarray(datum["loss_fn_inputs"]["logprobs"]["data"], dtype=np.float32)
        got_ad = np.asarray(datum["loss_fn_inputs"]["advantages"]["data"], dtype=np.float32)
        assert got_lp.tolist() == np.asarray(lp, dtype=np.float32).tolist()
        assert got_ad.tolist() == np.asarray(ad, dtype=np.float32).tolist()


def test_tampered_shard_and_missing_manifest(tmp_path):
    res = build_shards(random_store(str(tmp_path / "s"), 2, 2), str(tmp_path / "out"))
    with pytest.raises(UsageError, match="not a shard set"):
        export_tinker(str(tmp_path), str(tmp_path / "x.jsonl"))
    path = os.path.join(res.set_dir, res.shards[0]["file"])
    with open(path, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(UsageError, match="sha256"):
        export_tinker(res.set_dir, str(tmp_path / "x.jsonl"))
    assert not os.path.exists(tmp_path / "x.jsonl")


def test_mask_input_and_sdk_round_trip(tmp_path):
    """Every exported line reads back into the Tinker SDK's own types, equal to the adapter's datums."""
    tinker = pytest.importorskip("tinker")
    from prl.loaders import ShardLoader, to_tinker

    res = build_shards(random_store(str(tmp_path / "s"), 6, 2), str(tmp_path / "out"))
    out = str(tmp_path / "d.jsonl")
    result = export_tinker(str(tmp_path / "out"), out, with_mask=True)  # OUT: every current set
    assert (result.rows, result.sets) == (12, 1)
    records = {json.loads(line)["sample_id"]: json.loads(line) for line in Path(out).read_text().splitlines()}
    rows = next(iter(ShardLoader(res.set_dir, batch_rows=100, layout="rows", shuffle=False)))
    for sid, datum in zip(rows.sample_id_N.tolist(), to_tinker(rows, with_mask=True), strict=True):
        line = records[sid]["datum"]
        back = tinker.types.ModelInput.model_validate(line["model_input"])
        assert back.to_ints() == datum.model_input.to_ints()
        for key, tensor in line["loss_fn_inputs"].items():
            sdk = tinker.types.TensorData(data=tensor["data"], dtype=tensor["dtype"], shape=tensor["shape"])
            assert sdk.to_numpy().tolist() == datum.loss_fn_inputs[key].to_numpy().tolist()
        assert set(line["loss_fn_inputs"]) == {"target_tokens", "logprobs", "advantages", "mask"}
