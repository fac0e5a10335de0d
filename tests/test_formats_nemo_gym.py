"""NeMo Gym rollouts and Responses objects, from NeMo Gym's own recorded files (tests/fixtures/nemo_gym/README.md)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from prl.formats.registry import detect_file
from prl.ingestion.traces import ingest
from tests.formats_helpers import FIXTURES, lines_of, parse_file, reasons, samples
from tests.records import vllm_chat, vllm_completion


def _item(fixture: str, position: int) -> dict:
    record = json.loads((FIXTURES / "nemo_gym" / fixture).read_text().splitlines()[0])
    response = record.get("response", record)
    return response["output"][position]


def test_detected():
    for fixture in ("rollouts.jsonl", "response.jsonl"):
        assert detect_file(fixture, lines_of(FIXTURES / "nemo_gym" / fixture)).name == "nemo_gym"


def test_rollout_is_one_sample_with_its_tokens():
    (s,) = samples(parse_file("nemo_gym", "nemo_gym/rollouts.jsonl"))
    item = _item("rollouts.jsonl", 1)
    assert s.request_id == "resp_071791a86d9d4180a2d514b9d6606a3e/0"
    assert (s.session_id, s.turn, s.finish_reason, s.rewards) == (
        "resp_071791a86d9d4180a2d514b9d6606a3e",
        0,
        "stop",
        {"reward": 0.0},
    )
    assert (len(s.prompt_token_ids), len(s.completion_token_ids)) == (109, 785)
    assert s.prompt_token_ids.to_pylist() == item["prompt_token_ids"]
    assert s.prompt_token_ids.to_pylist()[:5] == [151644, 872, 198, 2610, 525]  # <|im_start|>user\n…
    assert s.completion_token_ids.to_pylist() == item["generation_token_ids"]
    assert s.completion_logprobs.to_pylist() == item["generation_log_probs"]
    assert s.created_at_us == 1775583409000000
    assert s.completion_text is not None and s.completion_text.startswith("\n\n```cpp\n#include <iostream>")
    assert json.loads(s.messages or "null")[0]["role"] == "user"


def test_response_calls_are_turns_of_one_session_in_output_order():
    first, second = samples(parse_file("nemo_gym", "nemo_gym/response.jsonl"))
    call0, call1 = _item("response.jsonl", 3), _item("response.jsonl", 7)
    assert [(s.request_id, s.session_id, s.turn, s.finish_reason) for s in (first, second)] == [
        ("resp_38e93155c5544510af97737022148055/0", "resp_38e93155c5544510af97737022148055", 0, "tool_calls"),
        ("resp_38e93155c5544510af97737022148055/1", "resp_38e93155c5544510af97737022148055", 1, "stop"),
    ]
    assert (len(first.prompt_token_ids), len(first.completion_token_ids)) == (3088, 495)
    assert (len(second.prompt_token_ids), len(second.completion_token_ids)) == (3637, 207)
    assert second.completion_token_ids.to_pylist() == call1["generation_token_ids"]
    assert first.completion_logprobs.to_pylist() == call0["generation_log_probs"]
    assert first.rewards is None and first.model == "Qwen/Qwen3-0.6B"


def test_text_only_rollout_is_no_token_ids():
    assert reasons(parse_file("nemo_gym", "nemo_gym/text_only.jsonl")) == [(1, "no_token_ids")]


def test_empty_token_lists_are_no_token_ids():
    record = json.loads((FIXTURES / "nemo_gym/rollouts.jsonl").read_text())
    for item in record["response"]["output"]:
        item.update(prompt_token_ids=[], generation_token_ids=[], generation_log_probs=[])
    from prl.formats.base import ParseOptions, Quarantined
    from prl.formats.nemo_gym import NemoGym

    try:
        NemoGym().parse(record, ParseOptions())
    except Quarantined as q:
        assert q.reason == "no_token_ids"
    else:
        raise AssertionError("expected no_token_ids")


def test_ingest_writes_samples_and_the_rollout_reward(store, tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(
        (FIXTURES / "nemo_gym/rollouts.jsonl").read_bytes()
        + (FIXTURES / "nemo_gym/text_only.jsonl").read_bytes()
        + (FIXTURES / "nemo_gym/response.jsonl").read_bytes()
    )
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (3, {"no_token_ids": 1})
    traces = pl.read_delta(store.table_uri("traces")).sort("source_line", "turn")
    assert traces["sample_id"].to_list() == [
        "resp_071791a86d9d4180a2d514b9d6606a3e/0#0",
        "resp_38e93155c5544510af97737022148055/0#0",
        "resp_38e93155c5544510af97737022148055/1#0",
    ]
    lps = traces["completion_logprobs"].to_list()[0]
    expected = np.asarray(_item("rollouts.jsonl", 1)["generation_log_probs"], dtype=np.float32)
    assert np.array_equal(np.asarray(lps, dtype=np.float32), expected)
    rewards = pl.read_delta(store.table_uri("rewards"))
    assert rewards.select("sample_id", "name", "value", "source_line").rows() == [
        ("resp_071791a86d9d4180a2d514b9d6606a3e/0#0", "reward", 0.0, 1)
    ]
    assert ingest([str(path)], store).files[0].status == "unchanged"
    assert pl.read_delta(store.table_uri("rewards")).height == 1


def test_a_proxy_log_mixing_endpoints_reads_each_record_by_its_format(store, tmp_path):
    path = tmp_path / "proxy.jsonl"
    lines = [
        json.dumps(vllm_chat("chat-1", [1, 2], [([3], [-0.5])])),
        json.dumps(vllm_completion("cmpl-1", [1, 2], [4, 5], [-0.25, -0.5])),
        (FIXTURES / "nemo_gym/rollouts.jsonl").read_text().strip(),
        json.dumps(vllm_chat("chat-2", [1, 2], [([6], [-1.0])])),
    ]
    path.write_text("\n".join(lines) + "\n")
    result = ingest([str(path)], store)
    (report,) = result.files
    assert (report.format, report.formats) == ("mixed", {"openai_chat": 2, "openai_completions": 1, "nemo_gym": 1})
    traces = pl.read_delta(store.table_uri("traces")).sort("source_line")
    assert traces.select("source_line", "source_format").rows() == [
        (1, "openai_chat"),
        (2, "openai_completions"),
        (3, "nemo_gym"),
        (4, "openai_chat"),
    ]


def test_bad_reward_is_quarantined_in_the_rewards_table_and_the_sample_lands(store, tmp_path):
    record = json.loads((FIXTURES / "nemo_gym/rollouts.jsonl").read_text())
    record["reward"] = "high"
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert (result.samples, result.quarantined) == (1, {"bad_value": 1})
    q = pl.read_delta(store.table_uri("quarantine")).row(0, named=True)
    assert (q["table"], q["reason"], q["sample_id"]) == (
        "rewards",
        "bad_value",
        "resp_071791a86d9d4180a2d514b9d6606a3e/0#0",
    )
