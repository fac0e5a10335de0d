"""Formats found in the wild that hold no trainable token IDs, or only part of them: each record is recognised
and quarantined with its own reason, never a whole file refused (exit 2).

Fixtures: tests/fixtures/ollama, tests/fixtures/verifiers_eval, tests/fixtures/together (provenance in each
folder's README.md).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from prl.errors import ExitCode
from prl.formats.registry import detect_file
from prl.ingestion.traces import ingest
from tests.formats_helpers import FIXTURES, lines_of, parse_file, reasons


def _quarantine(store) -> list[tuple[int, str]]:
    rows = pl.read_delta(store.table_uri("quarantine")).sort("source_line")
    return list(zip(rows["source_line"].to_list(), rows["reason"].to_list(), strict=True))


# --- Ollama ---------------------------------------------------------------------------------------------------


def test_ollama_generate_response_is_recognised_and_has_no_sampled_ids():
    assert detect_file("o", lines_of(FIXTURES / "ollama/generate.jsonl")).name == "ollama"
    items = parse_file("ollama", "ollama/generate.jsonl")
    assert reasons(items) == [(1, "no_token_ids")]
    assert "tokenized again" in items[0][1].message


def test_ollama_context_is_not_what_was_sampled():
    """The recorded stream sampled 64 tokens (eval_count) and streamed 64 pieces, yet its context holds 63 after
    the 51 prompt tokens: context is made from text after the fact."""
    lines = [json.loads(line) for line in (FIXTURES / "ollama/generate_stream.ndjson").read_text().splitlines()]
    last = lines[-1]
    assert (len(lines), last["eval_count"], last["prompt_eval_count"], len(last["context"])) == (64, 64, 51, 114)


def test_ollama_ndjson_stream_is_one_record(store):
    path = FIXTURES / "ollama/generate_stream.ndjson"
    assert detect_file("o", lines_of(path)).name == "ollama"
    result = ingest([str(path)], store)
    assert (result.records, result.samples, result.quarantined) == (1, 0, {"no_token_ids": 1})
    assert result.exit_code == ExitCode.DATA_PROBLEMS
    assert _quarantine(store) == [(1, "no_token_ids")]


def test_ollama_stream_cut_at_the_end_waits_and_one_cut_midway_is_truncated(store, tmp_path):
    lines = (FIXTURES / "ollama/generate_stream.ndjson").read_bytes().splitlines(keepends=True)
    growing = tmp_path / "growing.ndjson"
    growing.write_bytes(b"".join(lines[:40]))
    first = ingest([str(growing)], store)
    assert (first.records, first.files[0].held_back_bytes) == (0, growing.stat().st_size)
    with open(growing, "ab") as fh:
        fh.write(b"".join(lines[40:]))
    assert ingest([str(growing)], store).quarantined == {"no_token_ids": 1}
    cut = tmp_path / "cut.ndjson"
    cut.write_bytes(b"".join(lines[:10]) + (FIXTURES / "ollama/generate.jsonl").read_bytes())
    result = ingest([str(cut)], store, max_quarantine_rate=None)
    assert result.quarantined == {"truncated_stream": 1, "no_token_ids": 1}


# --- verifiers vf-eval results ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["tool_test_results.jsonl", "math_python_results.jsonl"])
def test_vf_eval_results_are_one_no_token_ids_row_per_record(store, fixture):
    path = FIXTURES / "verifiers_eval" / fixture
    assert detect_file("v", lines_of(path)).name == "verifiers_eval"
    result = ingest([str(path)], store)
    assert (result.records, result.samples, result.quarantined) == (2, 0, {"no_token_ids": 2})
    assert result.exit_code == ExitCode.DATA_PROBLEMS  # a data problem, not a refused file
    assert _quarantine(store) == [(1, "no_token_ids"), (2, "no_token_ids")]
    assert reasons(parse_file("verifiers_eval", f"verifiers_eval/{fixture}")) == [
        (1, "no_token_ids"),
        (2, "no_token_ids"),
    ]


# --- a chat completion with logprobs.token_ids (Together) -------------------------------------------------------


def test_together_completion_ids_without_prompt_ids_say_no_prompt_ids(store):
    result = ingest([str(FIXTURES / "together/chat_logprobs.jsonl")], store, max_quarantine_rate=None)
    assert result.quarantined == {"no_token_ids": 1, "no_prompt_ids": 1}
    assert _quarantine(store) == [(1, "no_token_ids"), (2, "no_prompt_ids")]
    message = pl.read_delta(store.table_uri("quarantine")).sort("source_line")["message"][1]
    assert "completion's 10 token IDs" in message


def test_together_token_ids_are_read_before_the_prompt_is_missed(tmp_path, store):
    record = json.loads((FIXTURES / "together/chat_logprobs.jsonl").read_text().splitlines()[1])
    short = json.loads(json.dumps(record))
    short["choices"][0]["logprobs"]["token_ids"] = short["choices"][0]["logprobs"]["token_ids"][:-1]
    floats = json.loads(json.dumps(record))
    floats["choices"][0]["logprobs"]["token_ids"][0] = 1.5
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (short, floats)))
    result = ingest([str(path)], store, max_quarantine_rate=None)
    assert _quarantine(store) == [(1, "length_mismatch"), (2, "no_token_ids")]  # a float is no token ID
    assert result.quarantined == {"length_mismatch": 1, "no_token_ids": 1}
    message = pl.read_delta(store.table_uri("quarantine")).sort("source_line")["message"][1]
    assert "bad_token_id" in message


# --- text-only SSE capture -------------------------------------------------------------------------------------

_CHUNKS = [
    {"delta": {"role": "assistant", "content": ""}, "finish_reason": None},
    {"delta": {"content": "Hello"}, "finish_reason": None},
    {"delta": {}, "finish_reason": "stop"},
]


def _chunk(choice: dict, with_id: bool) -> dict:
    head = {"id": "chatcmpl-abc"} if with_id else {}
    return {**head, "object": "chat.completion.chunk", "created": 1700000000, "model": "m", "choices": [choice]}


@pytest.mark.parametrize("with_id", [True, False])
def test_text_only_sse_capture_says_no_token_ids_like_its_non_streamed_twin(tmp_path, store, with_id):
    stream = tmp_path / "s.sse"
    body = "".join(f"data: {json.dumps(_chunk({'index': 0, **c}, with_id))}\n\n" for c in _CHUNKS)
    stream.write_text(body + "data: [DONE]\n\n")
    twin = tmp_path / "t.jsonl"
    head = {"id": "chatcmpl-abc"} if with_id else {}
    message = {"role": "assistant", "content": "Hello"}
    twin.write_text(
        json.dumps(
            {**head, "object": "chat.completion", "created": 1700000000, "model": "m"}
            | {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        )
        + "\n"
    )
    streamed = ingest([str(stream)], store, max_quarantine_rate=None)
    whole = ingest([str(twin)], store, max_quarantine_rate=None)
    assert streamed.quarantined == whole.quarantined == {"no_token_ids": 1}


# --- records of no known format --------------------------------------------------------------------------------


def test_a_file_of_unknown_records_is_one_unknown_format_row_per_record(tmp_path, store):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"hello": "world"}\n[1, 2]\n{"a": {"b": "token_id:5"}}\n')
    result = ingest([str(path)], store)
    assert (result.records, result.quarantined) == (3, {"unknown_format": 3})
    assert result.exit_code == ExitCode.DATA_PROBLEMS
    assert _quarantine(store) == [(1, "unknown_format"), (2, "unknown_format"), (3, "unknown_format")]


def test_a_file_that_is_not_json_lines_is_still_refused(tmp_path, store):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\nnot json at all\n")
    result = ingest([str(path)], store)
    assert result.exit_code == ExitCode.USAGE
    assert "no known format matches" in (result.files[0].error or "")


def test_fixture_folders_keep_their_provenance():
    for folder in ("ollama", "verifiers_eval", "together"):
        assert (FIXTURES / folder / "README.md").is_file(), folder


# --- TGI /generate_stream --------------------------------------------------------------------------------------

TGI_IDS = [13, 32072, 30499, 32611, 32246, 30329, 30449, 32126, 32001, 30412]
TGI_IDS += [29973, 13, 33676, 32709, 32119, 13, 35072, 30329, 32001, 30267]


def test_tgi_stream_is_detected_and_read_as_its_unstreamed_twin():
    path = FIXTURES / "tgi_stream/generate_stream.sse"
    assert detect_file("s", lines_of(path)).name == "tgi_stream"
    from prl.formats.base import ParseOptions
    from prl.formats.tgi import Tgi
    from prl.formats.tgi_stream import TgiStream

    (line, stream), *rest = [(r.line, r.obj) for r in TgiStream().frame(lines_of(path))]
    assert (line, rest) == (1, [])
    (sample,) = TgiStream().parse(stream, ParseOptions(finish_reason="length"))
    assert sample.completion_token_ids.to_pylist() == TGI_IDS
    assert sample.completion_logprobs.to_pylist()[:3] == [-0.5283203, -2.4394531, -0.54785156]
    assert sample.completion_logprobs.to_pylist()[-1] == -0.34350586
    assert sample.prompt_token_ids.to_pylist() == []
    assert sample.completion_text == "\n日本で一番高い山はなんですか?\nベストアンサー\n富士山です。"
    events = stream["_tgi_events"]
    twin = {"generated_text": events[-1]["generated_text"], "details": {"tokens": [e["token"] for e in events]}}
    (unstreamed,) = Tgi().parse(twin, ParseOptions(finish_reason="length"))
    assert unstreamed.request_id == sample.request_id
    assert unstreamed.completion_logprobs.to_pylist() == sample.completion_logprobs.to_pylist()


def test_tgi_stream_ingests_like_tgi_generate_without_prefill(store):
    """The stream has no prompt IDs (no prefill), like /generate without decoder_input_details; without
    details it has no finish reason either."""
    path = str(FIXTURES / "tgi_stream/generate_stream.sse")
    result = ingest([path], store, max_quarantine_rate=None)
    assert (result.records, result.quarantined) == (1, {"missing_finish_reason": 1})
    again = ingest([path], store.uri + "2", finish_reason="length", max_quarantine_rate=None)
    assert (again.records, again.quarantined) == (1, {"no_prompt_ids": 1})


def test_tgi_stream_details_heads_and_cuts(tmp_path):
    from prl.formats.base import ParseOptions, Quarantined
    from prl.formats.tgi_stream import TgiStream

    lines = (FIXTURES / "tgi_stream/generate_stream.sse").read_text().splitlines()
    events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    for event in events:
        token = event["token"]
        event["top_tokens"] = [token, {"id": 7, "text": "x", "logprob": token["logprob"] - 1.0, "special": False}]
    events[-1]["details"] = {"finish_reason": "eos_token", "generated_tokens": 20, "seed": 42, "input_length": 9}
    text = "event:response\n" + "".join(f"data:{json.dumps(e, ensure_ascii=False)}\n\n" for e in events)
    framed = list(TgiStream().frame(enumerate(text.encode().splitlines(), 1)))
    assert [r.line for r in framed] == [2]
    (sample,) = TgiStream().parse(framed[0].obj, ParseOptions())
    assert sample.finish_reason == "stop"
    assert sample.topk_ids.to_pylist()[0] == [13, 7]
    cut = "".join(f"data:{json.dumps(e)}\n" for e in events[:5]) + '{"hello": 1}\n'
    records = list(TgiStream().frame(enumerate(cut.encode().splitlines(), 1)))
    assert [(r.line, r.unfinished) for r in records] == [(1, None), (6, None)]
    with pytest.raises(Quarantined) as info:
        TgiStream().parse(records[0].obj, ParseOptions())
    assert info.value.reason == "truncated_stream"
    open_end = list(TgiStream().frame(enumerate(cut.encode().splitlines()[:5], 1)))
    assert open_end[0].unfinished == sum(len(line) + 1 for line in cut.encode().splitlines()[:5])
