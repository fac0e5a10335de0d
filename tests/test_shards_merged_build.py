"""build-shards with ``merge_turns = true``: merged rows from the store's trajectories, the manifest's saving, and
the Tinker export of merged rows against tinker-cookbook's trajectory_to_data on the same turns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prl.cli import app
from prl.errors import UsageError
from prl.export.tinker import export_tinker
from prl.loaders import ShardLoader, pad
from prl.shards.build import build_shards
from prl.shards.options import ShardOptions
from tests.shard_safety import unsafe_values
from tests.shards_fixtures import make_store, ref, reward, trace, verdict
from tests.test_shards_merge import reference_trajectory_to_data

P0, A0, O1, A1, O2, A2 = [1, 2, 3], [10, 11, 12], [4, 5], [13, 14], [6], [15, 16, 17]
Q0, B0, R1, B1 = [7, 8], [20, 21], [9], [22, 23]


def turns():
    """Agent a: three CLEAN turns; agent b (same session): two CLEAN turns, interleaved by line; a sessionless one."""
    a = [(P0, A0), (P0 + A0 + O1, A1), (P0 + A0 + O1 + A1 + O2, A2)]
    b = [(Q0, B0), (Q0 + B0 + R1, B1)]
    rows, status = [], {}
    order = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
    for line, (agent, i) in enumerate(order):
        prompt, completion = (a if agent == "a" else b)[i]
        sid = f"{agent}{i}"
        rows.append(trace(sid, f"g-{sid}", prompt, completion, session_id="s", agent_id=agent, source_line=line))
        status[sid] = "CLEAN" if i else None
    rows.append(trace("solo", "g-solo", [30, 31], [32]))
    return rows, status


def store_with(tmp_path):
    rows, status = turns()
    checks = [{**verdict(r["sample_id"]), "prefix_status": status.get(r["sample_id"])} for r in rows]
    rewards = [reward(r["sample_id"], v) for r, v in zip(rows, [0.0, 0.5, 0.0, 1.0, 1.0, 0.25], strict=True)]
    return make_store(str(tmp_path / "store"), rows, rewards, checks)


def shipped(res):
    manifest = json.loads(Path(res.manifest_path).read_text())
    table = pq.ParquetFile(os.path.join(res.set_dir, manifest["shards"][0]["file"])).read()
    return manifest, {r["sample_id"]: r for r in table.to_pylist()}


def test_merged_rows_from_a_store(tmp_path):
    store = store_with(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="none")
    res = build_shards(store, str(tmp_path / "out"), options=options)
    manifest, rows = shipped(res)
    assert sorted(rows) == ["a0", "b0", "solo"]
    a = rows["a0"]
    assert a["input_ids"] == P0 + A0 + O1 + A1 + O2 + A2 and a["prompt_len"] == 3
    assert a["loss_mask"] == [True] * 3 + [False] * 2 + [True] * 2 + [False] + [True] * 3
    lp = [float(np.float32(-0.1 * (i + 1))) for i in range(3)]
    assert a["behavior_logprobs"] == [*lp, None, None, *lp[:2], None, *lp]
    assert a["reward"] == 1.0  # the last turn's
    b = rows["b0"]
    assert b["input_ids"] == Q0 + B0 + R1 + B1 and b["reward"] == 1.0
    # one group of two units (a's and b's first prompts differ: their own groups), singleton advantage 0
    assert {r["advantage"] for r in rows.values()} == {0.0}
    merged = manifest["statistics"]["merged_turns"]
    unmerged = sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in turns()[0])
    merged_tokens = len(a["input_ids"]) + len(b["input_ids"]) + 3
    assert merged == {
        "turns": 6,
        "rows": 3,
        "tokens": merged_tokens,
        "tokens_unmerged": unmerged,
        "saving": 1.0 - merged_tokens / unmerged,
    }
    assert manifest["totals"]["rows"] == 3 and res.rows == 3


def test_tinker_export_of_merged_rows_is_trajectory_to_data(tmp_path):
    store = store_with(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="batch")
    res = build_shards(store, str(tmp_path / "out"), options=options)
    _, rows = shipped(res)
    out = str(tmp_path / "datums.jsonl")
    export_tinker(res.set_dir, out)
    lines = [json.loads(x) for x in Path(out).read_text().splitlines()]
    datums = {line["sample_id"]: line["datum"] for line in lines}
    assert sorted(datums) == sorted(rows)
    a = rows["a0"]
    transitions = [
        (P0, A0, [-0.1, -0.2, -0.3]),
        (P0 + A0 + O1, A1, [-0.1, -0.2]),
        (P0 + A0 + O1 + A1 + O2, A2, [-0.1, -0.2, -0.3]),
    ]
    advantage = float(np.float32(a["advantage"]))
    ((inputs, targets, lps, advs),) = reference_trajectory_to_data(
        [(o, ac, [float(np.float32(x)) for x in lp]) for o, ac, lp in transitions], advantage
    )
    d = datums["a0"]
    assert d["model_input"]["chunks"][0]["tokens"] == inputs
    assert d["loss_fn_inputs"]["target_tokens"]["data"] == targets
    assert d["loss_fn_inputs"]["logprobs"]["data"] == pytest.approx(lps, abs=1e-7)
    assert d["loss_fn_inputs"]["advantages"]["data"] == pytest.approx(advs, abs=1e-7)


def test_without_merge_turns_every_turn_is_a_row(tmp_path):
    store = store_with(tmp_path)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(singleton_baseline="none"))
    manifest, rows = shipped(res)
    assert len(rows) == 6 and "merged_turns" not in manifest["statistics"]


def test_dry_run_reports_the_planned_merged_rows(tmp_path):
    store = store_with(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="none")
    planned = build_shards(store, str(tmp_path / "out"), options=options, dry_run=True)
    built = build_shards(store, str(tmp_path / "out"), options=options)
    assert (planned.rows, planned.tokens) == (built.rows, built.tokens) == (3, 14 + 7 + 3)


def sampled_turns():
    """One agent: four CLEAN turns at temperature 0.7, 0.7, 1.0, 1.0, versions step-8, step-9 (its second half
    sampled by step-10 weights, as its spans say), step-10, step-10; the last turn's second token has a null
    logprob and the first turn's reference logprob a NaN."""
    hist, rows = [1, 2], []
    completions = [[10, 11], [12, 13], [14], [15, 16]]
    temps = [0.7, 0.7, 1.0, 1.0]
    versions = ["step-8", "step-9", "step-10", "step-10"]
    spans = [None, [{"version": "step-9", "start": 0, "end": 1}, {"version": "step-10", "start": 1, "end": 2}]]
    spans += [None, None]
    for i, completion in enumerate(completions):
        extra = {"temperature": temps[i], "policy_version": versions[i], "policy_version_spans": spans[i]}
        lps = [-0.1 * (j + 1) for j in range(len(completion))]
        if i == 3:
            lps[1] = None
        row = trace(f"t{i}", f"g{i}", list(hist), completion, session_id="s", agent_id="a", turn=i, **extra)
        rows.append({**row, "completion_logprobs": lps, "logprobs_mode": "raw_logprobs"})
        hist += [*completion, 5 + i]
    return rows


def test_merged_rows_from_a_store_carry_sampling_columns_and_keep_values_safe(tmp_path):
    rows = sampled_turns()
    checks = [{**verdict(r["sample_id"]), "prefix_status": "CLEAN" if i else None} for i, r in enumerate(rows)]
    refs = [ref(r["sample_id"], [-0.1 * (j + 1) for j in range(len(r["completion_token_ids"]))]) for r in rows]
    refs[0]["ref_logprobs"] = [float("nan"), -0.2]
    rewards = [reward(r["sample_id"], v) for r, v in zip(rows, [0.0, 1.0, 0.0, 0.5], strict=True)]
    store = make_store(str(tmp_path / "store"), rows, rewards, checks, refs)
    options = ShardOptions(merge_turns=True, singleton_baseline="none", kl="column", current_version="step-11")
    res = build_shards(store, str(tmp_path / "out"), options=options)
    manifest, got = shipped(res)
    assert sorted(got) == ["t0", "t2"]  # the temperature changes at t2: a row of its own
    first, second = got["t0"], got["t2"]
    assert first["input_ids"] == [1, 2, 10, 11, 5, 12, 13] and first["temperature"] == pytest.approx(0.7)
    assert (first["policy_version"], first["policy_step"], first["staleness"]) == ("step-8", 8, 3)
    assert first["policy_version_spans"] == [
        {"version": "step-8", "start": 0, "end": 2},
        {"version": "step-9", "start": 3, "end": 4},
        {"version": "step-10", "start": 4, "end": 5},
    ]
    assert first["logprobs_mode"] == "raw_logprobs" and first["reward"] == 1.0
    # t0's first reference logprob is NaN: out of the loss mask, its KL null
    assert first["loss_mask"] == [False, True, False, True, True]
    assert first["kl"][0] is None and first["kl"][1] == 0.0
    assert second["input_ids"] == [1, 2, 10, 11, 5, 12, 13, 6, 14, 7, 15, 16] and second["prompt_len"] == 8
    assert (second["policy_version"], second["staleness"], second["policy_version_spans"]) == ("step-10", 1, None)
    assert second["loss_mask"] == [True, False, True, False]  # t3's null logprob leaves the mask
    assert manifest["statistics"]["unsafe_masked"] == {"tokens": 2, "samples": 2}
    assert manifest["statistics"]["merged_turns"]["rows"] == 2
    for part in Path(res.set_dir).glob("part-*.parquet"):
        assert unsafe_values(part) == []


def test_loaders_read_merged_sets(tmp_path):
    store = store_with(tmp_path)
    res = build_shards(store, str(tmp_path / "out"), options=ShardOptions(merge_turns=True))
    _, rows = shipped(res)
    (batch,) = list(ShardLoader(str(tmp_path / "out"), batch_rows=8, layout="rows", shuffle=False))
    assert sorted(batch.sample_id_N.tolist()) == ["a0", "b0", "solo"]
    for i, sid in enumerate(batch.sample_id_N.tolist()):
        row = rows[sid]
        c0, c1 = batch.comp_off_N1[i], batch.comp_off_N1[i + 1]
        s0, s1 = batch.seq_off_N1[i], batch.seq_off_N1[i + 1]
        assert batch.input_ids_T[s0:s1].tolist() == row["input_ids"]
        assert batch.loss_mask_C[c0:c1].tolist() == row["loss_mask"]
        assert batch.behavior_logprobs_C[c0:c1].tolist() == pytest.approx([v or 0.0 for v in row["behavior_logprobs"]])
        assert batch.token_advantages_C[c0:c1].tolist() == pytest.approx(row["token_advantages"])
    assert batch.unsafe_positions == 0
    padded = pad(batch)
    a = batch.sample_id_N.tolist().index("a0")
    assert padded.loss_mask_BL[a].tolist() == [False] * 3 + rows["a0"]["loss_mask"]


def test_merge_options_are_checked():
    with pytest.raises(UsageError, match="merge_reward"):
        ShardOptions(merge_reward="max")
    with pytest.raises(UsageError, match="merge_turns"):
        ShardOptions.from_mapping({"merge_turns": "often"})
    assert ShardOptions.from_mapping({"merge_turns": True, "merge_reward": "mean"}).merge_reward == "mean"


def test_packing_keeps_a_units_turns_in_one_shard_and_counts_merged_tokens(tmp_path):
    store = store_with(tmp_path)
    options = ShardOptions(merge_turns=True, singleton_baseline="none", target_tokens=18)
    res = build_shards(store, str(tmp_path / "out"), options=options)
    manifest = json.loads(Path(res.manifest_path).read_text())
    per_shard = [
        (pq.read_table(os.path.join(res.set_dir, e["file"])).column("sample_id").to_pylist(), e["tokens"])
        for e in manifest["shards"]
    ]
    # seed 0 orders the groups solo (3 merged tokens), a0 (14), b0 (7): b0's group starts at token 17, inside the
    # first window of 18; counted one row per turn, a's 32 tokens would have pushed it into a second shard
    assert per_shard == [(["solo", "a0", "b0"], 24)]
    options = ShardOptions(merge_turns=True, singleton_baseline="none", target_tokens=16)
    res = build_shards(store, str(tmp_path / "out16"), options=options)
    manifest = json.loads(Path(res.manifest_path).read_text())
    assert [(e["rows"], e["tokens"]) for e in manifest["shards"]] == [(2, 17), (1, 7)]


def test_the_command_line_reports_the_saving(tmp_path):
    store = store_with(tmp_path)
    out = str(tmp_path / "out")
    argv = ["build-shards", "--store", store.uri, "--out", out, "--set", "merge_turns=true"]
    result = CliRunner().invoke(app, [*argv, "--set", "singleton_baseline=none"], terminal_width=200)
    assert result.exit_code == 0, result.output
    unmerged = sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in turns()[0])
    saving = f"{1 - 24 / unmerged:.0%}"
    assert f"merged turns: 6 turns as 3 rows, 24 tokens instead of {unmerged} one row per turn ({saving} fewer" in (
        " ".join(result.output.split())
    )
