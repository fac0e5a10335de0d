"""prl ingest of vLLM and SGLang traces: exact token IDs and logprobs read back, idempotence, ledger."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import polars as pl
import pytest

from prl.errors import ExitCode
from prl.ingestion.traces import ingest
from tests.delta_log import commit_infos
from tests.records import sglang_generate, vllm_chat, vllm_completion


def traces(store) -> pl.DataFrame:
    return pl.read_delta(store.table_uri("traces")).sort("sample_id")


def quarantine(store) -> pl.DataFrame:
    return pl.read_delta(store.table_uri("quarantine")).sort("source_line", "reason")


def test_vllm_chat_ids_logprobs_and_heads_exact(store, write_trace):
    heads = [[[(12, -0.25), (13, -1.75)], [(1, -0.0625), (2, -3.5)]]]
    path = write_trace(
        "chat.jsonl",
        [vllm_chat("chatcmpl-a", [0, 128803, 19923, 128804], [([12, 1], [-0.25, -0.0625])], heads=heads)],
    )
    result = ingest([str(path)], store)
    assert result.exit_code == ExitCode.OK
    assert (result.samples, result.prompt_tokens, result.completion_tokens) == (1, 4, 2)
    row = traces(store).row(0, named=True)
    assert row["sample_id"] == "chatcmpl-a#0"
    assert row["request_id"] == "chatcmpl-a"
    assert row["prompt_token_ids"] == [0, 128803, 19923, 128804]
    assert row["completion_token_ids"] == [12, 1]
    assert row["completion_logprobs"] == [-0.25, -0.0625]
    assert row["topk_ids"] == [[12, 13], [1, 2]]
    assert row["topk_logprobs"] == [[-0.25, -1.75], [-0.0625, -3.5]]
    assert row["finish_reason"] == "stop"
    assert row["model"] == "deepseek-v4"
    assert row["source_format"] == "openai_chat"
    assert row["source_line"] == 1
    assert row["source_uri"] == str(path)
    assert row["created_at"].timestamp() == 1764460800


def test_token_id_strings_only_and_vllm_floor_becomes_null(store, write_trace):
    record = vllm_chat("c1", [5, 6], [([7, 8, 1], [-1.5, -9999.0, -0.5])], with_token_ids=False)
    result = ingest([str(write_trace("chat.jsonl", [record]))], store)
    assert result.samples == 1
    row = traces(store).row(0, named=True)
    assert row["completion_token_ids"] == [7, 8, 1]
    assert row["completion_logprobs"] == [-1.5, None, -0.5]
    assert row["topk_ids"] is None


def test_n_choices_share_prompt_and_group(store, write_trace):
    record = vllm_chat("g", [3, 4, 5], [([10, 1], [-0.5, -0.25]), ([11, 1], [-1.0, -0.5]), ([12], [-2.0])])
    ingest([str(write_trace("n.jsonl", [record]))], store)
    df = traces(store)
    assert df["sample_id"].to_list() == ["g#0", "g#1", "g#2"]
    assert df["group_id"].n_unique() == 1
    assert df["prompt_token_ids"].to_list() == [[3, 4, 5]] * 3
    assert df["choice_index"].to_list() == [0, 1, 2]


def test_group_field_and_policy_version_flag(store, write_trace):
    records = [
        vllm_chat("a", [1], [([2], [-1.0])], metadata={"task": "math", "weight_version": "step-9"}),
        vllm_chat("b", [3], [([4], [-1.0])], metadata={"task": "math"}),
    ]
    records.append(vllm_chat("c", [5], [([6], [-1.0])]))  # no task: its group is unknown
    result = ingest(
        [str(write_trace("m.jsonl", records))],
        store,
        group_field="task",
        policy_version="step-3",
        max_quarantine_rate=None,
    )
    assert result.quarantined == {"missing_group_field": 1}
    df = traces(store)
    assert df["group_id"].to_list() == ["math", "math"]
    assert df["policy_version"].to_list() == ["step-9", "step-3"]


def test_vllm_completions_k_plus_one_heads(store, write_trace):
    # position 0: sampled 7 inside the top-2; position 1: sampled 9 outside, vLLM adds it as a third entry
    heads = [
        {"token_id:7": -0.5, "token_id:3": -1.5},
        {"token_id:9": -4.0, "token_id:4": -0.25, "token_id:5": -2.0},
    ]
    record = vllm_completion("cmpl-1", [1, 2], [7, 9], [-0.5, -4.0], heads)
    result = ingest([str(write_trace("c.jsonl.gz", [record], "gzip"))], store)
    assert result.files[0].format == "openai_completions"
    row = traces(store).row(0, named=True)
    assert row["completion_token_ids"] == [7, 9]
    assert row["topk_ids"] == [[7, 3], [4, 5]]
    assert row["topk_logprobs"] == [[-0.5, -1.5], [-0.25, -2.0]]
    assert row["finish_reason"] == "length"


def test_sglang_generate_triples_versions_and_spans(store, write_trace):
    records = [
        sglang_generate(
            "rid-1",
            [0, 5, 6],
            [40, 41, 1],
            [-0.5, -1.25, -0.125],
            heads=[[(-0.5, 40), (-1.0, 3)], [(-1.0, 8), (-1.25, 41)], [(-0.125, 1), (-3.0, 2)]],
        ),
        sglang_generate("rid-2", [0, 5], [40, 1], [-0.5, -0.25], weight_version=None, weight_versions=["11", "12"]),
    ]
    result = ingest([str(write_trace("s.jsonl.zst", records, "zstd"))], store)
    assert result.files[0].format == "sglang_generate"
    df = traces(store)
    first, second = df.row(0, named=True), df.row(1, named=True)
    assert first["sample_id"] == "rid-1#0"
    assert first["prompt_token_ids"] == [0, 5, 6]
    assert first["completion_token_ids"] == [40, 41, 1]
    assert first["completion_logprobs"] == [-0.5, -1.25, -0.125]
    assert first["topk_ids"] == [[40, 3], [8, 41], [1, 2]]
    assert first["policy_version"] == "7"
    assert second["policy_version"] == "12"
    assert second["policy_version_spans"] == [
        {"version": "11", "start": 0, "end": 1},
        {"version": "12", "start": 1, "end": 2},
    ]


def test_rerun_adds_nothing_and_changed_file_adds_only_new(store, write_trace):
    path = write_trace("r.jsonl", [vllm_chat(f"r{i}", [i + 1], [([i + 2], [-1.0])]) for i in range(3)])
    first = ingest([str(path)], store)
    version = store.version("traces")
    again = ingest([str(path)], store)
    assert (first.samples, again.samples) == (3, 0)
    assert again.files[0].status == "unchanged"
    assert store.version("traces") == version
    # the file grows: it is read on from where the last run stopped, and only the new record is added
    size = os.path.getsize(path)
    with open(path, "a") as fh:
        fh.write(json.dumps(vllm_chat("r3", [9], [([9], [-1.0])])) + "\n")
    os.utime(path, ns=(1, 2))
    grown = ingest([str(path)], store)
    assert (grown.samples, grown.already_present) == (1, 0)
    assert (grown.files[0].resumed_from, grown.bytes_read) == (size, os.path.getsize(path) - size)
    assert traces(store)["sample_id"].to_list() == ["r0#0", "r1#0", "r2#0", "r3#0"]


def test_commit_metadata_is_a_ledger(store, write_trace):
    path = write_trace("l.jsonl", [vllm_chat("l", [1], [([2], [-1.0])])])
    ingest([str(path)], store)
    info = commit_infos(store, "traces", limit=1)[0]
    (entry,) = info["prl.sources"]
    assert entry["uri"] == str(path)
    assert entry["size"] == os.path.getsize(path)
    assert entry["sha256"] == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    assert entry["records"] == 1 and entry["samples"] == 1


def test_dry_run_writes_nothing(store, write_trace):
    path = write_trace("d.jsonl", [vllm_chat("d", [1], [([2], [-1.0])]), "{not json"])
    result = ingest([str(path)], store, dry_run=True)
    assert (result.samples, result.quarantined) == (1, {"malformed_json": 1})
    assert store.version("traces") is None and store.version("quarantine") is None


def test_large_values_stay_exact(store, write_trace):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 129280, 3000).tolist()
    lps = (-rng.exponential(1.0, 3000)).astype(np.float32).astype(float).tolist()
    prompt = rng.integers(0, 129280, 5000).tolist()
    ingest([str(write_trace("big.jsonl", [vllm_chat("big", prompt, [(ids, lps)])]))], store)
    row = traces(store).row(0, named=True)
    assert row["prompt_token_ids"] == prompt
    assert row["completion_token_ids"] == ids
    assert row["completion_logprobs"] == lps
    assert all(math.isfinite(x) for x in row["completion_logprobs"])


def test_records_of_no_known_format_are_quarantined_one_by_one(store, write_trace):
    """A JSON-lines file none of whose records is of a known format is read record by record: each is one
    quarantine row (unknown_format), the file is consumed, and records of a known format appended later land."""
    good = write_trace("good.jsonl", [vllm_chat("ok", [1], [([2], [-1.0])])])
    odd = write_trace("odd.jsonl", [{"hello": "world"}, {"hello": "again"}])
    result = ingest([str(good), str(odd)], store)
    assert result.exit_code == ExitCode.DATA_PROBLEMS  # 2 of 3 records quarantined, over the 5 % default
    assert [f.status for f in result.files] == ["ingested", "ingested"]
    assert (result.samples, result.quarantined) == (1, {"unknown_format": 2})
    rows = quarantine(store).sort("source_line")
    assert rows["source_line"].to_list() == [1, 2] and set(rows["reason"]) == {"unknown_format"}
    assert traces(store)["sample_id"].to_list() == ["ok#0"]
    with open(odd, "a") as fh:
        fh.write(json.dumps(vllm_chat("later", [1], [([2], [-1.0])])) + "\n")
    again = ingest([str(odd)], store)
    assert (again.samples, again.quarantined) == (1, {})


def test_forced_format(store, write_trace):
    path = write_trace("f.jsonl", [vllm_chat("f", [1], [([2], [-1.0])])])
    result = ingest([str(path)], store, format="openai_chat")
    assert result.samples == 1
    with pytest.raises(Exception, match="unknown format 'nope'"):
        ingest([str(path)], store, format="nope")
