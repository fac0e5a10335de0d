"""Text-only OpenAI records are quarantined, never retokenized."""

from __future__ import annotations

import json

from prl.formats.openai_text import OpenAIText
from prl.formats.registry import detect_file, detect_record
from tests.formats_helpers import FIXTURES, lines_of, parse_file, reasons


def test_responses_and_messages_records():
    assert detect_file("t", lines_of(FIXTURES / "openai_text/openai_text.jsonl")).name == "openai_text"
    items = parse_file("openai_text", "openai_text/openai_text.jsonl")
    assert reasons(items) == [(1, "no_token_ids"), (2, "no_token_ids")]


def test_text_only_chat_is_no_token_ids_either_way():
    (line,) = (FIXTURES / "openai_text/chat_text_only.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert OpenAIText().detect(record)
    assert reasons(parse_file("openai_text", "openai_text/chat_text_only.jsonl")) == [(1, "no_token_ids")]
    assert reasons(parse_file("openai_chat", "openai_text/chat_text_only.jsonl")) == [(1, "no_token_ids")]


def test_records_with_ids_are_not_text_only():
    with_ids = {"object": "chat.completion", "prompt_token_ids": [1], "choices": []}
    assert not OpenAIText().detect(with_ids)
    assert detect_record({"messages": [], "prompt_ids": [1], "response_ids": [2]}).name == "verl"
