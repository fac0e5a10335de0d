"""roundtrip and vocab checks on planted cases, with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prl.checks import CheckTokenizer, check_tokens
from prl.checks.arrays import Ragged
from prl.checks.roundtrip import RoundTripper
from tests.checks_helpers import EOS, chat_prompt, enc, make_store, row, tokenizer_dir


def verdicts(store):
    return {r["sample_id"]: r for r in store.read("checks").to_pylist()}


@lru_cache(maxsize=1)
def loaded() -> CheckTokenizer:
    return CheckTokenizer.load(tokenizer_dir())


@pytest.fixture(scope="module")
def tok() -> CheckTokenizer:
    return loaded()


def test_non_canonical_split_of_a_completion_is_a_note_at_its_position(tmp_path):
    """Sampled IDs whose text re-encodes otherwise are what was sampled: a note, not drift."""
    prompt = chat_prompt("Greet the world")
    hello = enc("Hello")
    hel, lo = enc("Hel"), enc("lo")
    assert hello == [19923] and hel == [14505] and lo == [4979]
    assert enc("Sure:\nHello world!") == enc("Sure:\n") + hello + enc(" world!")
    completion = enc("Sure:\n") + hel + lo + enc(" world!") + [EOS]
    store = make_store(tmp_path, [row("split", prompt, completion), row("clean", prompt, [*enc("Hello world!"), EOS])])
    result = check_tokens(store, tokenizer_dir())
    got = verdicts(store)
    pos = len(enc("Sure:\n"))
    assert got["split"]["verdict"] == "note"
    assert got["split"]["reasons"] == ["roundtrip_completion"]
    assert got["split"]["first_divergence"] == pos
    assert got["clean"]["verdict"] == "ok" and got["clean"]["reasons"] == []
    assert result.verdicts == {"ok": 1, "note": 1, "warn": 0, "drift": 0, "invalid": 0}
    assert result.drift_rate == 0.0
    ev = result.worst[0].detail["evidence"]
    assert ev["where"] == "completion"
    start = ev["window_start"]
    assert [p for p in ev["ids"]][pos - start] == [14505, "Hel"]
    assert ev["reencoded"][pos - start] == [19923, "Hello"]


def test_non_canonical_split_in_prompt_is_reported_as_prompt(tmp_path):
    user = enc("<｜begin▁of▁sentence｜>sys<｜User｜>")
    prompt = user + enc("Hel") + enc("lo") + enc("<｜Assistant｜></think>")
    store = make_store(tmp_path, [row("p", prompt, [*enc("Hi."), EOS])])
    check_tokens(store, tokenizer_dir())
    got = verdicts(store)["p"]
    assert (got["verdict"], got["reasons"], got["first_divergence"]) == (
        "drift",
        ["roundtrip_prompt"],
        len(user),
    )


def test_prompt_and_completion_merging_at_the_boundary_is_its_own_note(tmp_path):
    """A text completion: "." ends the prompt, "skin" starts the sample; the whole re-encodes as ".s" + "kin" while
    the prompt alone round-trips."""
    bos = enc("<｜begin▁of▁sentence｜>")
    prompt = bos + enc("Protect your face.")
    assert enc("Protect your face.")[-1] == 16 and enc("skin") == [96861] and enc(".skin") == [2349, 8705]
    completion = [*enc("skin"), *enc(" care"), EOS]
    alone = bos + enc("Hel") + enc("lo") + enc(".")
    store = make_store(
        tmp_path,
        [
            row("boundary", prompt, completion),
            row("prompt", alone, completion),
        ],
    )
    result = check_tokens(store, tokenizer_dir())
    got = verdicts(store)
    assert (got["boundary"]["verdict"], got["boundary"]["reasons"], got["boundary"]["first_divergence"]) == (
        "note",
        ["roundtrip_boundary"],
        len(prompt) - 1,
    )
    assert (got["prompt"]["verdict"], got["prompt"]["reasons"], got["prompt"]["first_divergence"]) == (
        "drift",
        ["roundtrip_prompt"],
        len(bos),
    )
    assert result.reasons == {"roundtrip_boundary": 1, "roundtrip_prompt": 1}


def test_completion_cut_mid_character_is_only_a_note(tmp_path):
    prompt = chat_prompt("An emoji please")
    smile = enc("😀")
    assert len(smile) == 2  # the emoji's bytes span two tokens
    completion = enc("Here: ") + smile[:1]
    store = make_store(tmp_path, [row("cut", prompt, completion, finish_reason="length")])
    check_tokens(store, tokenizer_dir())
    got = verdicts(store)["cut"]
    assert (got["verdict"], got["reasons"], got["first_divergence"]) == (
        "note",
        ["roundtrip_partial_char"],
        len(completion) - 1,
    )


def test_id_out_of_vocabulary_is_invalid_and_not_decoded(tmp_path):
    prompt = chat_prompt("Hi")
    store = make_store(
        tmp_path,
        [row("oov", prompt, [*enc("Hello"), 129280, EOS]), row("ok", prompt, [*enc("Hello"), EOS])],
    )
    check_tokens(store, tokenizer_dir())
    got = verdicts(store)
    assert (got["oov"]["verdict"], got["oov"]["reasons"], got["oov"]["first_divergence"]) == (
        "invalid",
        ["vocab_completion"],
        1,
    )
    assert got["ok"]["verdict"] == "ok"


def test_shared_history_is_round_tripped_once(tok):
    system = enc("<｜begin▁of▁sentence｜>" + "You are a careful assistant. " * 50)
    turns = list(system)
    rows = []
    for i in range(6):
        turns = turns + enc(f"<｜User｜>question {i}?<｜Assistant｜></think>") + enc(f"answer {i}.") + [EOS]
        rows.append(np.array(turns, dtype=np.int64))
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in rows])))
    seq = Ragged(np.concatenate(rows), offsets, np.ones(len(rows), bool))
    rt = RoundTripper(tok)
    assert rt.check_sequences(seq, np.ones(len(rows), bool)) == {}
    assert rt.stats.tokens == sum(len(r) for r in rows)
    # every turn adds two new segments (question, answer); the long system prompt is encoded once
    assert rt.stats.segments_encoded == 1 + 2 * 6
    new_text = sum(len(enc(f"question {i}?")) + len(enc(f"answer {i}.")) for i in range(6))
    assert rt.stats.tokens_encoded == len(system) - 1 + new_text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=200))
def test_canonical_tokens_of_any_text_round_trip(text):
    tok = loaded()
    ids = enc(text)
    seq = Ragged(np.array(ids, dtype=np.int64), np.array([0, len(ids)]), np.ones(1, bool))
    assert RoundTripper(tok).check_sequences(seq, np.ones(1, bool)) == {}


def test_failures_of_one_batch_are_located_each_in_its_own_segment(tok):
    """Several failing segments checked in one call: each row's first failure, at its own position, a cut
    character at a segment's end told apart from a split, the same failure answered from the cache."""
    user = enc("<｜User｜>")
    split = enc("Sure:\n") + enc("Hel") + enc("lo") + enc(" world!")
    cut = enc("Here: ") + enc("😀")[:1]
    rows = [
        np.array([*user, *split, EOS], dtype=np.int64),
        np.array([*enc("Hello world!"), EOS], dtype=np.int64),
        np.array([*user, *cut], dtype=np.int64),
        np.array([*cut, EOS, *split], dtype=np.int64),
    ]
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in rows])))
    seq = Ragged(np.concatenate(rows), offsets, np.ones(len(rows), bool))
    rt = RoundTripper(tok)
    got = rt.check_sequences(seq, np.ones(len(rows), bool))
    assert sorted(got) == [0, 2, 3]
    at_split = len(enc("Sure:\n"))
    assert got[0][:2] == (len(user) + at_split, int(offsets[0]) + len(user))
    assert (got[0][2].at, got[0][2].partial_tail) == (at_split, False)
    assert got[0][2].reencoded[at_split - got[0][2].window_start] == enc("Hello")[0]
    assert got[2][:2] == (len(user) + len(cut) - 1, int(offsets[2]) + len(user))
    assert (got[2][2].at, got[2][2].partial_tail) == (len(cut) - 1, True)
    assert got[3][:2] == (len(cut) - 1, int(offsets[3]))
    assert got[3][2] is got[2][2]
    assert rt.stats.segments_encoded == 3
