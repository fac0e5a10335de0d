"""A shard's merged rows (prl.shards.merge_assemble) against values worked out by hand from the turns."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from prl.schema import SHARD
from prl.shards.merge_assemble import KlSettings, UnitScores, assemble_merged

F32 = pa.list_(pa.float32())


def turns_table(with_heads: bool = False) -> pa.Table:
    """Unit 0: three CLEAN turns (the second with a tool token masked inside its completion); unit 1: one turn."""
    cols = {
        "sample_id": ["t0", "t1", "t2", "u0"],
        "group_id": ["g0", "g1", "g2", "h0"],
        "policy_version": ["3", "4", "4", "2"],
        "staleness": [2, 1, None, 3],
        "prompt_token_ids": [[1, 2], [1, 2, 10, 11, 5], [1, 2, 10, 11, 5, 12, 13, 6, 7], [9]],
        "completion_token_ids": [[10, 11], [12, 13], [14], [20, 21]],
        "completion_logprobs": [[-0.5, -0.25], [-1.0, -2.0], [-0.125], [-0.75, -1.5]],
        "completion_mask": [None, [True, False], None, None],
        "ref_logprobs": [[-0.5, -0.5], [-1.0, -1.0], [-0.25], [-0.75, -1.0]],
    }
    types = {
        "staleness": pa.int64(),
        "prompt_token_ids": pa.list_(pa.int32()),
        "completion_token_ids": pa.list_(pa.int32()),
        "completion_logprobs": F32,
        "completion_mask": pa.list_(pa.bool_()),
        "ref_logprobs": F32,
    }
    if with_heads:
        cols["topk_ids"] = [[[10, 3], [11, 3]], [[12, 3], [13, 3]], [[14]], None]
        cols["topk_logprobs"] = [[[-0.5, -1.0], [-0.25, -2.0]], [[-1.0, -1.5], [-2.0, -2.5]], [[-0.125]], None]
        types["topk_ids"] = pa.list_(pa.list_(pa.int32()))
        types["topk_logprobs"] = pa.list_(F32)
    return pa.table({name: pa.array(values, types.get(name)) for name, values in cols.items()})


SCORES = UnitScores(np.array([1.0, 0.0]), np.array([0.5, -0.5]), np.array([2, 2], dtype=np.int32), mean_d=0.1)


def test_merged_rows_carry_exactly_their_turns_tokens_masks_and_logprobs():
    merged = assemble_merged(turns_table(), np.array([0, 0, 0, 1]), SCORES, KlSettings("column", 0.0, "k1"))
    table, rows = merged.table, merged.rows
    assert table.schema == SHARD
    got = table.to_pylist()
    assert [r["sample_id"] for r in got] == ["t0", "u0"]
    first = got[0]
    assert first["input_ids"] == [1, 2, 10, 11, 5, 12, 13, 6, 7, 14] and first["prompt_len"] == 2
    assert first["loss_mask"] == [True, True, False, True, False, False, False, True]
    assert first["behavior_logprobs"] == [-0.5, -0.25, None, -1.0, -2.0, None, None, -0.125]
    assert first["ref_logprobs"] == [-0.5, -0.5, None, -1.0, -1.0, None, None, -0.25]
    # k1 = d on sampled tokens inside the loss mask; null on the tool token and between completions
    assert first["kl"] == [0.0, 0.25, None, 0.0, None, None, None, 0.125]
    assert first["token_advantages"] == [0.5, 0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5]
    assert (first["reward"], first["advantage"], first["group_size"]) == (1.0, 0.5, 2)
    assert (first["group_id"], first["policy_version"], first["staleness"]) == ("g0", "3", 2)
    assert first["topk_ids"] is None
    second = got[1]
    assert second["input_ids"] == [9, 20, 21] and second["loss_mask"] == [True, True]
    assert second["token_advantages"] == [-0.5, -0.5] and second["staleness"] == 3
    assert (rows.merged_tokens, rows.unmerged_tokens) == (13, 4 + 7 + 10 + 3)


def test_kl_into_the_advantages_and_heads_padded_to_k():
    table = assemble_merged(
        turns_table(with_heads=True), np.array([0, 0, 0, 1]), SCORES, KlSettings("advantages", 0.5, "k1"), k=2
    ).table
    first = table.to_pylist()[0]
    d = [0.0, 0.25, None, 0.0, None, None, None, 0.125]
    want = [0.5 + 0.5 * (0.1 - x) if x is not None else 0.0 for x in d]
    assert first["token_advantages"] == pytest.approx(want, abs=1e-7)
    pad = [-1, -1]  # positions between completions are padded like any position narrower than k
    assert first["topk_ids"] == [[10, 3], [11, 3], pad, [12, 3], [13, 3], pad, pad, [14, -1]]
    assert first["topk_logprobs"][7] == [-0.125, -math.inf]
    assert table.to_pylist()[1]["topk_ids"] == [pad, pad]


def test_a_unit_whose_tokens_do_not_extend_is_split():
    t = turns_table()
    prompts = t["prompt_token_ids"].to_pylist()
    prompts[2] = [1, 2, 99, 11, 5, 12, 13, 6, 7]  # the first answer was edited in the history
    t = t.set_column(4, "prompt_token_ids", pa.array(prompts, pa.list_(pa.int32())))
    merged = assemble_merged(t, np.array([0, 0, 0, 1]), SCORES, KlSettings())
    table, rows = merged.table, merged.rows
    assert table.column("sample_id").to_pylist() == ["t0", "t2", "u0"]
    assert table.column("advantage").to_pylist() == [0.5, 0.5, -0.5]
    assert rows.status_N == [None, "CLEAN", "FORK", None]
    assert table.column("kl").null_count == 3


def with_sampling(t: pa.Table, temperature: list[float | None]) -> pa.Table:
    """The turns with versions as steps, spans on the second turn and sampling settings."""
    spans = [None, [{"version": "step-3", "start": 0, "end": 1}, {"version": "step-4", "start": 1, "end": 2}]]
    extra = {
        "policy_version": pa.array(["step-3", "step-4", "step-4", "step-2"]),
        "policy_step": pa.array([3, 4, 4, 2], pa.int64()),
        "policy_version_spans": pa.array([*spans, None, None], SHARD.field("policy_version_spans").type),
        "temperature": pa.array(temperature, pa.float32()),
        "top_p": pa.array([1.0] * 4, pa.float32()),
        "top_k": pa.nulls(4, pa.int32()),
        "logprobs_mode": pa.array(["processed_logprobs"] * 4),
    }
    for name, values in extra.items():
        t = (
            t.set_column(t.schema.get_field_index(name), name, values)
            if name in t.column_names
            else t.append_column(name, values)
        )
    return t


def test_merged_rows_carry_the_version_spans_and_sampling_settings_of_their_turns():
    merged = assemble_merged(
        with_sampling(turns_table(), [0.5, 0.5, 0.5, 1.0]), np.array([0, 0, 0, 1]), SCORES, KlSettings()
    )
    first, second = merged.table.to_pylist()
    # the oldest turn (largest staleness: t0, stale 2) names the version; spans over the region's sampled tokens
    assert (first["policy_version"], first["policy_step"], first["staleness"]) == ("step-3", 3, 2)
    assert first["policy_version_spans"] == [
        {"version": "step-3", "start": 0, "end": 2},
        {"version": "step-3", "start": 3, "end": 4},
        {"version": "step-4", "start": 4, "end": 5},
        {"version": "step-4", "start": 7, "end": 8},
    ]
    assert (first["temperature"], first["top_p"], first["top_k"], first["logprobs_mode"]) == (
        0.5,
        1.0,
        None,
        "processed_logprobs",
    )
    assert (second["policy_version"], second["policy_step"], second["policy_version_spans"]) == ("step-2", 2, None)
    assert second["temperature"] == 1.0


def test_a_change_of_sampling_settings_starts_a_row():
    merged = assemble_merged(
        with_sampling(turns_table(), [0.5, 0.5, 1.0, 1.0]), np.array([0, 0, 0, 1]), SCORES, KlSettings()
    )
    got = merged.table.select(["sample_id", "input_ids", "prompt_len", "temperature", "advantage"]).to_pylist()
    assert got == [
        {
            "sample_id": "t0",
            "input_ids": [1, 2, 10, 11, 5, 12, 13],
            "prompt_len": 2,
            "temperature": 0.5,
            "advantage": 0.5,
        },
        {
            "sample_id": "t2",
            "input_ids": [1, 2, 10, 11, 5, 12, 13, 6, 7, 14],
            "prompt_len": 9,
            "temperature": 1.0,
            "advantage": 0.5,
        },
        {"sample_id": "u0", "input_ids": [9, 20, 21], "prompt_len": 1, "temperature": 1.0, "advantage": -0.5},
    ]
    assert merged.rows.status_N == [None, "CLEAN", None, None]


def test_null_or_non_finite_logprobs_leave_the_loss_mask_and_are_counted():
    t = turns_table()
    lps = t["completion_logprobs"].to_pylist()
    lps[0] = [-0.5, float("nan")]
    lps[2] = [None]
    refs = t["ref_logprobs"].to_pylist()
    refs[1] = [-float("inf"), -1.0]
    t = t.set_column(t.schema.get_field_index("completion_logprobs"), "completion_logprobs", pa.array(lps, F32))
    t = t.set_column(t.schema.get_field_index("ref_logprobs"), "ref_logprobs", pa.array(refs, F32))
    merged = assemble_merged(t, np.array([0, 0, 0, 1]), SCORES, KlSettings("advantages", 0.5, "k1"))
    first = merged.table.to_pylist()[0]
    assert first["loss_mask"] == [True, False, False, False, False, False, False, False]
    assert first["kl"] == [0.0, None, None, None, None, None, None, None]
    assert first["token_advantages"] == pytest.approx([0.5 + 0.5 * 0.1, 0, 0, 0, 0, 0, 0, 0], abs=1e-7)
    assert (merged.unsafe_tokens, merged.unsafe_rows) == (3, 1)
    without_kl = assemble_merged(t, np.array([0, 0, 0, 1]), SCORES, KlSettings())
    assert without_kl.table.to_pylist()[0]["loss_mask"] == [True, False, False, True, False, False, False, False]
    assert (without_kl.unsafe_tokens, without_kl.unsafe_rows) == (2, 1)
