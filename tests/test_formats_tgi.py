"""TGI /generate responses with details."""

from __future__ import annotations

import pytest

from prl.formats.registry import detect_file
from prl.formats.tgi import Tgi
from tests.formats_helpers import C1, C2, FIXTURES, L1, P1, heads, lines_of, parse_file, reason_of, reasons, samples


def test_detected():
    assert detect_file("t", lines_of(FIXTURES / "tgi/tgi.jsonl")).name == "tgi"


def test_details_prefill_top_tokens_and_best_of():
    items = parse_file("tgi", "tgi/tgi.jsonl")
    main, best_of, plain = samples(items)
    assert main.request_id == best_of.request_id == "sha256:277b7fbb5333ec62c524d2ff1543550b"
    assert (main.choice_index, main.finish_reason) == (0, "stop")  # eos_token
    assert main.prompt_token_ids.to_pylist() == P1
    assert main.completion_token_ids.to_pylist() == C1
    assert main.completion_logprobs.to_pylist() == L1
    ids, lps = heads(main)
    assert ids == [[i, 300 + k] for k, i in enumerate(C1)]
    assert lps == [[lp, lp - 1.0] for lp in L1]
    assert main.completion_text == "The answer is 4."
    # best_of sequence: choice 1, its own finish reason, the main prompt (its prefill is empty)
    assert (best_of.choice_index, best_of.finish_reason) == (1, "length")
    assert best_of.prompt_token_ids.to_pylist() == P1
    assert best_of.completion_token_ids.to_pylist() == C2 and heads(best_of) == (None, None)
    # stop_sequence → stop; no prefill → empty prompt (ingest quarantines it unless an envelope fills it)
    assert plain.finish_reason == "stop" and len(plain.prompt_token_ids) == 0
    assert plain.completion_logprobs.to_pylist() == [-0.5, -0.25]
    assert reasons(items) == [(3, "no_token_ids")]


def _record(**details):
    base = {"finish_reason": "length", "generated_tokens": 1, "seed": None, "prefill": [], "tokens": []}
    return {"generated_text": "x", "details": {**base, **details}}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (_record(tokens=[{"id": 1.5, "text": "a", "logprob": -1.0, "special": False}]), "bad_token_id"),
        (_record(tokens=[{"text": "a", "logprob": -1.0, "special": False}]), "no_token_ids"),
        (_record(tokens=[{"id": 3, "text": "a", "logprob": "x", "special": False}]), "bad_logprob"),
        (_record(tokens=[None]), "bad_logprob"),
        (_record(tokens="nope"), "bad_logprob"),
        (_record(finish_reason="exploded", tokens=[{"id": 3, "logprob": -1.0}]), "bad_finish_reason"),
        (
            _record(tokens=[{"id": 3, "logprob": -1.0}], top_tokens=[[{"id": 3, "logprob": -1.0}], []]),
            "topk_length_mismatch",
        ),
        ({"generated_text": "x", "details": "nope"}, "bad_shape"),
        ({"generated_text": "x"}, "no_token_ids"),
    ],
)
def test_bad_shapes(record, reason):
    assert reason_of(Tgi(), record) == reason


def test_seq2seq_record_is_encoder_decoder():
    assert reasons(parse_file("tgi", "tgi/t5_seq2seq.jsonl")) == [(1, "encoder_decoder")]


def test_openai_route_with_empty_id_is_no_token_ids(store):
    from prl.ingestion.traces import ingest

    result = ingest([str(FIXTURES / "tgi/openai_completion.jsonl")], store, max_quarantine_rate=None)
    assert result.quarantined == {"no_token_ids": 1}  # not missing_request_id: there is nothing to fix but IDs


def test_completion_text_never_holds_the_prompt():
    import json

    from prl.formats.base import ParseOptions
    from prl.formats.tgi import Tgi

    record = json.loads((FIXTURES / "tgi/tgi.jsonl").read_text().splitlines()[0])
    record["generated_text"] = "What is 2+2?" + record["generated_text"]  # return_full_text: true
    record["details"]["best_of_sequences"] = []
    (main,) = Tgi().parse(record, ParseOptions())
    assert main.completion_text == "The answer is 4."
