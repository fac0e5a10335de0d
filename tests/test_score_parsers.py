"""Parsing vLLM's ``prompt_logprobs`` and SGLang's ``input_token_logprobs`` answers (recorded shapes in
tests/fixtures/score/), and the validation every answer passes before it is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.formats.base import Quarantined
from prl.score import sglang, vllm
from prl.score.base import ScoreRequest, answer_empty, completion_logprobs
from prl.score.http import public_url

FIXTURES = Path(__file__).parent / "fixtures" / "score"
SAMPLE = ScoreRequest("s", np.array([128000, 791, 6864, 315], np.int32), np.array([9822, 374], np.int32))


def _load(name: str):
    return json.loads((FIXTURES / name).read_text())


def _reason(outcome) -> str | None:
    return outcome.reason if isinstance(outcome, Quarantined) else None


def test_vllm_recorded_answer():
    got = vllm.parse(_load("vllm_completions_prompt_logprobs.json"), SAMPLE)
    assert got.dtype == np.float32 and got.tolist() == [-1.25, -0.125]


def test_vllm_floor_is_quarantined():
    got = vllm.parse(_load("vllm_completions_floor.json"), SAMPLE)
    assert _reason(got) == "nonfinite_logprob" and "position 0" in got.message


def test_vllm_answer_for_other_tokens_is_misaligned():
    other = ScoreRequest("s", SAMPLE.prompt_ids, np.array([9822, 375], np.int32))
    got = vllm.parse(_load("vllm_completions_prompt_logprobs.json"), other)
    assert _reason(got) == "misaligned" and "position 1" in got.message


def test_vllm_answer_of_other_length():
    shorter = ScoreRequest("s", SAMPLE.prompt_ids[:3], SAMPLE.completion_ids)
    assert _reason(vllm.parse(_load("vllm_completions_prompt_logprobs.json"), shorter)) == "length_mismatch"


@pytest.mark.parametrize(
    "answer",
    [{}, {"choices": []}, {"choices": [{"index": 0}]}, {"choices": [{"prompt_logprobs": "x"}]}, [1], None],
)
def test_vllm_bad_shapes(answer):
    assert _reason(vllm.parse(answer, SAMPLE)) == "bad_response"


def test_vllm_entry_that_is_not_a_dict():
    answer = _load("vllm_completions_prompt_logprobs.json")
    answer["choices"][0]["prompt_logprobs"][5] = None
    assert _reason(vllm.parse(answer, SAMPLE)) == "bad_response"


def test_vllm_payload_sends_token_ids_only():
    body = vllm.payload(SAMPLE, "served")
    assert body == {
        "prompt": [128000, 791, 6864, 315, 9822, 374],
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
        "model": "served",
    }
    assert "model" not in vllm.payload(SAMPLE)


def test_sglang_recorded_answers():
    assert sglang.parse(_load("sglang_generate_input_token_logprobs.json"), SAMPLE).tolist() == [-1.25, -0.125]
    assert sglang.parse(_load("sglang_generate_batch.json"), SAMPLE).tolist() == [-1.25, -0.125]


def test_sglang_misaligned_and_short():
    answer = _load("sglang_generate_input_token_logprobs.json")
    answer["meta_info"]["input_token_logprobs"][1][1] = 9
    assert _reason(sglang.parse(answer, SAMPLE)) == "misaligned"
    answer["meta_info"]["input_token_logprobs"].pop()
    assert _reason(sglang.parse(answer, SAMPLE)) == "length_mismatch"


@pytest.mark.parametrize("answer", [{}, {"meta_info": {}}, {"meta_info": {"input_token_logprobs": [[0.1]]}}])
def test_sglang_bad_shapes(answer):
    if answer.get("meta_info", {}).get("input_token_logprobs"):
        answer["meta_info"]["input_token_logprobs"] = [[-0.5], [-0.5]]
    assert _reason(sglang.parse(answer, SAMPLE)) == "bad_response"


def test_sglang_null_logprob_is_nonfinite():
    answer = _load("sglang_generate_input_token_logprobs.json")
    answer["meta_info"]["input_token_logprobs"][0][0] = None
    assert _reason(sglang.parse(answer, SAMPLE)) == "nonfinite_logprob"


def test_sglang_payload():
    assert sglang.payload(SAMPLE) == {
        "input_ids": [128000, 791, 6864, 315, 9822, 374],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 4,
        "top_logprobs_num": 0,
    }


def test_endpoint_urls():
    assert vllm.endpoint_url("http://h:8000") == "http://h:8000/v1/completions"
    assert vllm.endpoint_url("http://h:8000/v1/") == "http://h:8000/v1/completions"
    assert vllm.endpoint_url("http://h/v1/completions") == "http://h/v1/completions"
    assert sglang.endpoint_url("http://h:30000/") == "http://h:30000/generate"
    assert public_url("https://user:secret@h:1/v1?key=abc#x") == "https://h:1/v1"


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([-0.5], "length_mismatch"),
        ([-0.5, float("nan")], "nonfinite_logprob"),
        ([float("-inf"), -0.5], "nonfinite_logprob"),
        ([None, -0.5], "nonfinite_logprob"),
        ([-9999.0, -0.5], "nonfinite_logprob"),
        ([-0.5, 0.25], "positive_logprob"),
        ([-0.5, 0.0], None),
    ],
)
def test_validation(values, reason):
    assert _reason(completion_logprobs(values, SAMPLE)) == reason


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=20),
    st.lists(st.tuples(st.integers(0, 5000), st.floats(-50, 0, width=32)), max_size=20),
    st.booleans(),
)
def test_parsers_round_trip_their_shapes(prompt, completion, as_sglang):
    request = ScoreRequest("s", np.array(prompt, np.int32), np.array([t for t, _ in completion], np.int32))
    values = [v for _, v in completion]
    if as_sglang:
        answer = {"meta_info": {"input_token_logprobs": [[v, t, None] for t, v in completion]}}
        got = sglang.parse(answer, request)
    else:
        entries = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in prompt[1:]]
        entries += [{str(t): {"logprob": v, "rank": 1, "decoded_token": "x"}} for t, v in completion]
        got = vllm.parse({"choices": [{"index": 0, "prompt_logprobs": entries}]}, request)
    assert isinstance(got, np.ndarray) and got.tolist() == np.array(values, np.float32).tolist()


def test_empty_prompts_and_completions_need_no_model():
    def refuse(todo):
        raise AssertionError(f"asked the model for {todo}")

    ids = np.array([7], np.int32)
    empty = np.zeros(0, np.int32)
    got = answer_empty([ScoreRequest("a", empty, ids), ScoreRequest("b", ids, empty)], refuse)
    assert _reason(got[0]) == "empty_prompt" and got[1].shape == (0,)
    sent = answer_empty(
        [ScoreRequest("c", ids, ids), ScoreRequest("d", empty, empty)], lambda todo: [todo[0].sample_id]
    )
    assert sent[0] == "c" and sent[1].shape == (0,)
