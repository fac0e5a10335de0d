"""vLLM /inference/v1/generate responses and RequestOutput dumps."""

from __future__ import annotations

import pytest

from prl.formats.registry import detect_file
from prl.formats.vllm_generate import VllmGenerate, VllmRequestOutput
from tests.formats_helpers import (
    C1,
    C2,
    FIXTURES,
    L1,
    P1,
    P2,
    heads,
    lines_of,
    parse_file,
    reason_of,
    reasons,
    samples,
)


def test_detects_both_files():
    assert detect_file("g", lines_of(FIXTURES / "vllm_generate/generate.jsonl")).name == "vllm_generate"
    path = FIXTURES / "vllm_generate/request_output.jsonl"
    assert detect_file("r", lines_of(path)).name == "vllm_request_output"


def test_generate_content_logprobs_with_k_plus_one_head():
    items = parse_file("vllm_generate", "vllm_generate/generate.jsonl")
    s = samples(items)[0]
    assert (s.request_id, s.choice_index, s.finish_reason) == ("gen-1", 0, "stop")
    assert s.prompt_token_ids.to_pylist() == P1
    assert s.completion_token_ids.to_pylist() == C1
    assert s.completion_logprobs.to_pylist() == L1
    ids, lps = heads(s)
    # position 3: sampled 223 ranked third; the head keeps the top 2 only, best first
    assert ids == [[671, 200], [3287, 201], [344, 202], [100, 101], [22, 204], [16, 205], [1, 206]]
    assert lps[3] == [-0.5, -1.0]
    assert lps[0] == [-0.5, -3.5]


def test_generate_int_token_ids_two_choices_and_floor():
    items = [s for s in samples(parse_file("vllm_generate", "vllm_generate/generate.jsonl"))]
    gen2 = [s for s in items if s.request_id == "gen-2"]
    assert [(s.choice_index, s.finish_reason) for s in gen2] == [(0, "length"), (1, "stop")]
    assert gen2[0].completion_token_ids.to_pylist() == [51119]
    assert heads(gen2[0]) == ([[51119]], [[-0.25]])
    assert gen2[1].completion_token_ids.to_pylist() == C2
    assert gen2[1].completion_logprobs.to_pylist() == [-0.25, -9999.0]  # ingest turns the floor into null
    assert heads(gen2[1]) == (None, None)  # only empty top_logprobs lists
    assert gen2[0].model == "deepseek-v4" and gen2[0].created_at_us == 1767225600000000
    assert len(gen2[0].prompt_token_ids) == 0  # the request side (token_ids) carries the prompt


def test_generate_dict_logprobs_look_up_the_sampled_id():
    s = next(s for s in samples(parse_file("vllm_generate", "vllm_generate/generate.jsonl")) if s.request_id == "gen-3")
    assert s.prompt_token_ids.to_pylist() == P2
    assert s.completion_logprobs.to_pylist() == [-0.5, -3.0]
    assert heads(s) == ([[51119, 60000], [2, 3]], [[-0.5, -1.25], [-0.5, -1.0]])


def test_request_output_dump():
    items = parse_file("vllm_request_output", "vllm_generate/request_output.jsonl")
    assert reasons(items) == []
    first, second, third = samples(items)
    assert (first.request_id, first.choice_index, first.finish_reason) == ("0", 0, "stop")
    assert first.completion_token_ids.to_pylist() == C1 and first.completion_logprobs.to_pylist() == L1
    assert first.completion_text == "The answer is 4."
    assert first.created_at_us == 1767225600500000
    # logprobs=1 and every sampled token ranked first: a head of one
    assert heads(first)[0] == [[i] for i in C1]
    # one-entry dicts whose sampled token ranked 2nd: logprobs=0 was asked, no head
    assert (second.choice_index, second.finish_reason, heads(second)) == (1, "length", (None, None))
    assert second.completion_logprobs.to_pylist() == [-0.75, -0.25]
    # no request_id: derived from the token IDs, stable
    assert third.request_id == "sha256:931ae508eea762915a3e5a2710d053b9"
    assert third.completion_logprobs.to_pylist() == [-0.5, -0.5]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (
            {"request_id": "x", "choices": [{"index": 0, "token_ids": [1, 2], "finish_reason": "stop"}]},
            "no_logprobs",
        ),
        (
            {
                "request_id": "x",
                "choices": [{"index": 0, "token_ids": [1.5], "finish_reason": "stop", "logprobs": []}],
            },
            "bad_token_id",
        ),
        (
            {
                "request_id": "x",
                "choices": [{"index": 0, "token_ids": [1], "finish_reason": "weird", "logprobs": [{"1": -0.1}]}],
            },
            "bad_finish_reason",
        ),
        (
            {
                "request_id": "x",
                "choices": [{"index": 0, "token_ids": [1, 2], "finish_reason": "stop", "logprobs": [{"1": -0.1}]}],
            },
            "length_mismatch",
        ),
        (
            {
                "request_id": "x",
                "choices": [{"index": 0, "token_ids": [1], "finish_reason": "stop", "logprobs": [{"abc": -0.1}]}],
            },
            "bad_token_id",
        ),
        (
            {
                "request_id": "x",
                "choices": [
                    {
                        "index": 0,
                        "token_ids": [1],
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": "token_id:1", "logprob": "x"}]},
                    }
                ],
            },
            "bad_logprob",
        ),
        ({"request_id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}, "no_token_ids"),
        ({"request_id": 1.5, "choices": []}, "missing_request_id"),
        ({"request_id": "x", "choices": "nope"}, "bad_shape"),
        ({"request_id": "x", "choices": ["nope"]}, "bad_shape"),
    ],
)
def test_generate_bad_shapes(record, reason):
    assert reason_of(VllmGenerate(), record) == reason


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"prompt_token_ids": "abc", "outputs": []}, "bad_token_id"),
        (
            {
                "prompt_token_ids": [1],
                "outputs": [{"token_ids": [2], "finish_reason": None, "logprobs": [{"2": -1.0}]}],
            },
            "missing_finish_reason",
        ),
        (
            {
                "prompt_token_ids": [1],
                "outputs": [{"token_ids": [2], "finish_reason": "stop", "logprobs": [{"2": "high"}]}],
            },
            "bad_logprob",
        ),
        (
            {
                "prompt_token_ids": [1],
                "outputs": [{"token_ids": [2], "finish_reason": "stop", "logprobs": None}],
            },
            "no_logprobs",
        ),
    ],
)
def test_request_output_bad_shapes(record, reason):
    assert reason_of(VllmRequestOutput(), record) == reason
