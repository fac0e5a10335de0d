"""Envelopes: OpenAI/vLLM batch output, proxy captures, LiteLLM logging payloads."""

from __future__ import annotations

import pytest

from prl.formats.base import ParseOptions
from prl.formats.registry import by_name, detect_file
from tests.formats_helpers import C2, FIXTURES, P2, lines_of, parse_file, reason_of, reasons, samples


@pytest.mark.parametrize("name", ["openai_batch", "proxy_capture", "litellm_log"])
def test_detected(name):
    assert detect_file(name, lines_of(FIXTURES / f"envelopes/{name}.jsonl")).name == name


def test_batch_output():
    items = parse_file("openai_batch", "envelopes/openai_batch.jsonl")
    (s,) = samples(items)
    assert (s.request_id, s.finish_reason) == ("chatcmpl-b1", "stop")
    assert s.prompt_token_ids.to_pylist() == P2 and s.completion_token_ids.to_pylist() == C2
    assert reasons(items) == [(2, "upstream_error"), (3, "upstream_error")]


def test_proxy_capture_fills_request_side():
    items = parse_file("proxy_capture", "envelopes/proxy_capture.jsonl")
    chat, generate = samples(items)
    assert chat.request_id == "chatcmpl-p1"
    assert chat.messages == '[{"role":"user","content":"Capital of France?"}]'
    assert (chat.session_id, chat.temperature, chat.top_p, chat.top_k) == ("s-1", 0.7, 0.95, -1)
    assert chat.created_at_us == 1767225600000000  # the chat body's own "created" wins over the envelope
    # tokens-in/out: the prompt comes from the request's token_ids, the session from "user"
    assert generate.request_id == "gen-p2"
    assert generate.prompt_token_ids.to_pylist() == P2
    assert (generate.session_id, generate.temperature, generate.top_p) == ("u-7", 1.0, None)
    assert generate.created_at_us == 1767225600123000
    assert reasons(items) == [(3, "upstream_error")]


CHAT_BODY = {
    "id": "chatcmpl-h1",
    "object": "chat.completion",
    "model": "tiny-llama-v7",
    "prompt_token_ids": [0, 5],
    "choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}],
}


@pytest.mark.parametrize(
    ("record", "options", "version"),
    [
        # a routing proxy's header on the request, in any case, as a dict or [name, value] pairs
        ({"request": {"headers": {"X-Policy-Version": "step-40"}, "body": {}}}, ParseOptions(), "step-40"),
        ({"request": {"headers": [["x-weight-version", 41]], "body": {}}}, ParseOptions(), "41"),
        ({"headers": {"x-policy-version": "v3"}, "request": {}}, ParseOptions(), "v3"),
        # no header: --policy-version fills in
        ({"request": {}}, ParseOptions(policy_version="cli"), "cli"),
        # the header beats --policy-version
        ({"request": {"headers": {"x-policy-version": "hdr"}, "body": {}}}, ParseOptions(policy_version="cli"), "hdr"),
        # no header, an empty one, a boolean: none named
        ({"request": {"headers": {"x-policy-version": ""}, "body": {}}}, ParseOptions(), None),
        ({"request": {"headers": {"x-policy-version": True}, "body": {}}}, ParseOptions(), None),
        ({"request": {"headers": {"x-other": "v9"}, "body": {}}}, ParseOptions(), None),
    ],
)
def test_proxy_header_names_the_policy_version(record, options, version):
    record = {**record, "response": {"status_code": 200, "headers": {}, "body": CHAT_BODY}}
    (s,) = by_name("proxy_capture").parse(record, options)
    assert (s.request_id, s.model, s.policy_version) == ("chatcmpl-h1", "tiny-llama-v7", version)


def test_a_version_in_the_response_beats_the_proxy_header():
    body = {**CHAT_BODY, "metadata": {"weight_version": "resp-7"}}
    record = {
        "request": {"headers": {"x-policy-version": "hdr"}, "body": {}},
        "response": {"status_code": 200, "body": body},
    }
    (s,) = by_name("proxy_capture").parse(record, ParseOptions(policy_version="cli"))
    assert s.policy_version == "resp-7"
    response_side = {
        "request": {},
        "response": {"status_code": 200, "headers": {"X-Weight-Version": "r8"}, "body": CHAT_BODY},
    }
    (s,) = by_name("proxy_capture").parse(response_side, ParseOptions())
    assert s.policy_version == "r8"


def test_litellm_payload():
    items = parse_file("litellm_log", "envelopes/litellm_log.jsonl")
    (s,) = samples(items)
    assert (s.request_id, s.session_id, s.temperature, s.top_p) == ("chatcmpl-l1", "ls-1", 0.6, 1.0)
    assert s.messages == '[{"role":"user","content":"Capital of France?"}]'
    assert reasons(items) == [(2, "upstream_error")]


def test_streamed_body_in_a_proxy_capture():
    body = (
        'data: {"id":"c9","object":"chat.completion.chunk","prompt_token_ids":[1,2],"choices":[{"index":0,'
        '"delta":{"content":"a"},"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-0.5}]},'
        '"finish_reason":"stop"}]}\n\ndata: [DONE]\n'
    )
    record = {
        "request": {"messages": [{"role": "user", "content": "q"}], "temperature": 0.2},
        "response": body,
    }
    (s,) = by_name("proxy_capture").parse(record, ParseOptions())
    assert (s.request_id, s.completion_token_ids.to_pylist(), s.temperature) == ("c9", [5], 0.2)


@pytest.mark.parametrize(
    ("fmt", "record", "reason"),
    [
        (
            by_name("openai_batch"),
            {"custom_id": "a", "response": {"status_code": 200, "body": {"foo": 1}}},
            "unknown_format",
        ),
        (by_name("openai_batch"), {"custom_id": "a", "response": "nope"}, "bad_shape"),
        (by_name("openai_batch"), {"custom_id": "a", "response": {"status_code": 200, "body": [1, 2]}}, "bad_shape"),
        (
            by_name("proxy_capture"),
            {"request": {}, "response": {"status_code": 200, "body": "plain text"}},
            "no_token_ids",
        ),
        (by_name("proxy_capture"), {"request": {"prompt_token_ids": [1.5]}, "response": {}}, "bad_token_id"),
        (
            by_name("proxy_capture"),
            {"request": {}, "response": {"custom_id": "x", "response": {"status_code": 200, "body": {}}}},
            "unknown_format",
        ),
        (by_name("litellm_log"), {"response": "just text", "model_parameters": {}}, "no_token_ids"),
        (
            by_name("litellm_log"),
            {
                "response": {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                },
                "model_parameters": {},
            },
            "no_token_ids",
        ),
    ],
)
def test_bad_shapes(fmt, record, reason):
    assert reason_of(fmt, record) == reason


def test_older_run_batch_layout_holds_the_completion_itself():
    from prl.formats.base import ParseOptions
    from prl.formats.registry import by_name
    from tests.records import vllm_chat

    completion = vllm_chat("chatcmpl-old", P2, [(C2, [-0.5, -0.25])])
    record = {"id": "vllm-1", "custom_id": "request-1", "response": completion, "error": None}
    (s,) = by_name("openai_batch").parse(record, ParseOptions())
    assert (s.request_id, s.completion_token_ids.to_pylist()) == ("chatcmpl-old", C2)
    assert s.completion_logprobs.to_pylist() == [-0.5, -0.25]
