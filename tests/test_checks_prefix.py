"""prefix and template checks on planted multi-turn cases, with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import json

from prl.checks import check_tokens
from tests.checks_helpers import EOS, THINK, chat_prompt, enc, make_store, row, tokenizer_dir

SYSTEM = "You are helpful."
P0 = chat_prompt("What is 2+2?", SYSTEM)
C0 = [*enc("The answer is 4, because two plus two makes four."), EOS]
NEXT_USER = enc("<｜User｜>And 3+3?<｜Assistant｜></think>")
C1 = [*enc("6."), EOS]


def turn(sample_id, session, n, prompt, completion, **kw):
    return row(sample_id, prompt, completion, session_id=session, turn=n, **kw)


def run(tmp_path, rows, **kwargs):
    store = make_store(tmp_path, rows)
    result = check_tokens(store, tokenizer_dir(), **kwargs)
    got = {r["sample_id"]: r for r in store.read("checks").to_pylist()}
    return result, got


def brief(r):
    return r["verdict"], r["reasons"], r["first_divergence"], r["prefix_status"]


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_clean_realign_and_fork(tmp_path):
    forked_history = [*enc("The answer is four, because two plus two makes four."), EOS]
    rows = [
        turn("clean0", "s-clean", 0, P0, C0),
        turn("clean1", "s-clean", 1, P0 + C0 + NEXT_USER, C1),
        turn(
            "clean2",
            "s-clean",
            2,
            P0 + C0 + NEXT_USER + C1 + enc("<｜User｜>Thanks<｜Assistant｜></think>"),
            C1,
        ),
        turn("re0", "s-re", 0, P0, C0),
        # the previous completion's EOS was re-rendered away: only its last token differs
        turn("re1", "s-re", 1, P0 + C0[:-1] + NEXT_USER, C1),
        turn("fork0", "s-fork", 0, P0, C0),
        # the history holds a different answer text: divergence in the middle of the previous completion
        turn("fork1", "s-fork", 1, P0 + forked_history + NEXT_USER, C1),
        row("single", P0, C0),
    ]
    result, got = run(tmp_path, rows)
    assert brief(got["clean0"]) == ("ok", [], None, None)
    assert brief(got["clean1"]) == ("ok", [], None, "CLEAN")
    assert brief(got["clean2"]) == ("ok", [], None, "CLEAN")
    assert brief(got["re1"]) == ("note", ["prefix_realign"], len(P0) + len(C0) - 1, "REALIGN")
    fork_at = len(P0) + common(C0, forked_history)
    assert 0 < common(C0, forked_history) < len(C0) - 4
    assert brief(got["fork1"]) == ("note", ["prefix_fork"], fork_at, "FORK")
    assert brief(got["single"]) == ("ok", [], None, None)
    assert result.prefix == {"CLEAN": 2, "REALIGN": 1, "FORK": 1}
    detail = json.loads(got["fork1"]["detail"])
    assert detail["evidence"]["previous_sample_id"] == "fork0"


def test_tool_call_json_reserialized_in_history_is_a_fork(tmp_path):
    call = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    sampled = [*enc(call.format('{"city":"Paris","unit":"C"}')), EOS]
    rerendered = [*enc(call.format('{"city": "Paris", "unit": "C"}')), EOS]
    output = enc("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>21C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")
    rows = [
        turn("t0", "s", 0, P0, sampled, finish_reason="tool_calls"),
        turn("t1", "s", 1, P0 + rerendered + output, C1),
    ]
    _, got = run(tmp_path, rows)
    k = common(sampled, rerendered)
    assert 0 < k < len(sampled) - 4
    assert brief(got["t1"]) == ("note", ["prefix_fork"], len(P0) + k, "FORK")
    assert brief(got["t0"]) == ("ok", [], None, None)


def test_best_of_n_previous_choices_and_order_across_batches(tmp_path):
    other = [*enc("It is 4."), EOS]
    rows = [
        # later turn first in the table, previous turn with two choices in a later batch
        turn("b1", "s", 1, P0 + C0 + NEXT_USER, C1),
        turn("b0x", "s", 0, P0, other),
        turn("b0", "s", 0, P0, C0),
    ]
    store = make_store(tmp_path, rows)
    check_tokens(store, tokenizer_dir(), batch_size=1)
    got = {r["sample_id"]: r for r in store.read("checks").to_pylist()}
    assert brief(got["b1"]) == ("ok", [], None, "CLEAN")


def test_new_turn_of_an_already_checked_session(tmp_path):
    store = make_store(tmp_path, [turn("a0", "s", 0, P0, C0)])
    check_tokens(store, tokenizer_dir())
    from tests.checks_helpers import TRACES_SCHEMA_TABLE

    store.commit("traces", TRACES_SCHEMA_TABLE([turn("a1", "s", 1, P0 + C0[:2], C1)]).to_batches())
    result = check_tokens(store, tokenizer_dir())
    got = {r["sample_id"]: r for r in store.read("checks").to_pylist()}
    assert result.checked == 1 and result.skipped_existing == 1
    assert brief(got["a1"]) == ("note", ["prefix_fork"], len(P0) + 2, "FORK")


KEEP_THINK = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}"
    "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<｜Assistant｜>"
    "{% if keep and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
    "{% else %}</think>{% endif %}"
    "{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜></think>{% endif %}"
)


def template(keep: bool) -> str:
    return ("{% set keep = " + ("true" if keep else "false") + " %}") + KEEP_THINK


def test_template_that_strips_earlier_think_blocks_is_drift(tmp_path):
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two."},
        {"role": "user", "content": "And 3+3?"},
    ]
    before = f"<｜begin▁of▁sentence｜>{SYSTEM}<｜User｜>What is 2+2?<｜Assistant｜>"
    sent = enc(before + "<think>Two plus two.</think>4.<｜end▁of▁sentence｜><｜User｜>And 3+3?<｜Assistant｜></think>")
    rows = [row("think", sent, C1, messages=json.dumps(messages))]
    keep_file = tmp_path / "keep.jinja"
    keep_file.write_text(template(True))
    strip_file = tmp_path / "strip.jinja"
    strip_file.write_text(template(False))

    result, got = run(tmp_path / "a", rows, chat_template=str(keep_file))
    assert result.template is True
    assert brief(got["think"]) == ("ok", [], None, None)

    result, got = run(tmp_path / "b", rows, chat_template=str(strip_file))
    at = len(enc(before))
    assert sent[at] == THINK
    assert brief(got["think"]) == ("drift", ["template_prompt"], at, None)
    ev = result.worst[0].detail["evidence"]
    assert ev["ids"][at - ev["window_start"]] == [THINK, "<think>"]
    assert ev["rendered"][at - ev["window_start"]] == [128822, "</think>"]


def test_unrenderable_messages_are_a_warning(tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text(template(True))
    rows = [row("bad", P0, C0, messages="{not json"), row("none", P0, C0)]
    _result, got = run(tmp_path / "s", rows, chat_template=str(tpl))
    assert brief(got["bad"]) == ("warn", ["template_error"], None, None)
    assert json.loads(got["bad"]["detail"])["template_error"].startswith("JSONDecodeError")
    assert brief(got["none"]) == ("ok", [], None, None)


def test_packaged_templates_catch_stripped_reasoning_and_reserialized_tool_calls(tmp_path):
    from prl.checks import CheckTokenizer

    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Use the tool.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "21C"},
        {"role": "assistant", "content": "It is 21C.", "reasoning_content": "Report it."},
        {"role": "user", "content": "Thanks!"},
    ]
    keep = CheckTokenizer.load(tokenizer_dir(), "deepseek_v4_keep_think")
    sent = enc(keep.render(messages))  # what a token-in/token-out agent sent: reasoning kept
    rows = [row("m", sent, C1, messages=json.dumps(messages))]
    _, got = run(tmp_path / "keep", rows, chat_template="deepseek_v4_keep_think")
    assert brief(got["m"]) == ("ok", [], None, None)
    _, got = run(tmp_path / "strip", rows, chat_template="deepseek_v4")
    at = len(enc(f"<｜begin▁of▁sentence｜>{SYSTEM}<｜User｜>Weather in Paris?<｜Assistant｜>"))
    assert sent[at] == THINK
    assert brief(got["m"]) == ("drift", ["template_prompt"], at, None)

    # the agent sent compact tool-call JSON; the template re-serializes the arguments with spaces
    compact = keep.render(messages).replace('{"city": "Paris"}', '{"city":"Paris"}')
    assert compact != keep.render(messages)
    sent_compact = enc(compact)
    _, got = run(
        tmp_path / "json",
        [row("j", sent_compact, C1, messages=json.dumps(messages))],
        chat_template="deepseek_v4_keep_think",
    )
    k = common(sent_compact, enc(keep.render(messages)))
    assert brief(got["j"]) == ("drift", ["template_prompt"], k, None)
    assert raw_piece(sent_compact[k]) != raw_piece(enc(keep.render(messages))[k])


def raw_piece(token_id):
    from tests.checks_helpers import raw_tokenizer

    return raw_tokenizer().decode([token_id])


def test_common_prefix_lengths_match_pair_by_pair_in_any_step_size():
    import numpy as np

    from prl.checks.arrays import Ragged
    from prl.checks.prefix import common_prefix_lengths
    from prl.trajectory import common_prefix

    prompts = [[5, 6, 7, 8], [5, 6], [], [1, 2, 3, 4, 5, 6]]
    values = np.array([t for p in prompts for t in p], dtype=np.int64)
    offsets = np.cumsum([0, *map(len, prompts)]).astype(np.int64)
    rag = Ragged(values, offsets, np.ones(len(prompts), bool))
    seqs = [np.array(s, dtype=np.int32) for s in ([5, 6, 9], [5, 6, 7, 8, 9], [5, 6, 7], [3], [1, 2, 3, 4, 5, 6])]
    rows = np.array([0, 0, 1, 2, 3])
    lens = np.array([len(s) for s in seqs])
    expected = [2, 4, 2, 0, 6]
    assert [common_prefix(s, rag.row(r)) for s, r in zip(seqs, rows, strict=True)] == expected
    for budget in (1, 3, 1 << 22):
        assert common_prefix_lengths(seqs, lens, rag, rows, budget).tolist() == expected
