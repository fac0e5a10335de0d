"""check-tokens verdicts do not depend on how rows are batched, overlapped or cached: a store of GRPO groups
sharing prompts, a shared system prompt, duplicated samples, drifting and cut completions, special tokens, bad
IDs and logprobs, and multi-turn trajectories, checked in one batch, in batches of a few rows (round trips in
flight across batches) and row by row through the per-batch checker, with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from prl.checks import CheckTokenizer, check_tokens
from prl.checks.batch import COLUMNS
from prl.checks.history import trajectory_index
from prl.checks.options import CheckOptions
from prl.checks.run import BatchChecker
from tests.checks_helpers import BOS, EOS, chat_prompt, enc, make_store, row, tokenizer_dir

SYSTEM = "You are a careful assistant."
NEXT_USER = enc("<｜User｜>And then?<｜Assistant｜></think>")


def _rows() -> list[dict]:
    clean = [*enc("Sure: the answer is 4."), EOS]
    split = [*enc("Sure:\n"), *enc("Hel"), *enc("lo"), *enc(" world!"), EOS]
    cut = [*enc("Here: "), *enc("😀")[:1]]
    special = [*enc("Sure"), BOS, *enc(" done."), EOS]
    no_stop = enc("Sure, no stop token.")
    prompts = [chat_prompt(f"Question {g}: what is 2+2?", SYSTEM) for g in range(3)]
    prompts[2] = chat_prompt("Hel", SYSTEM)[:-2] + enc("lo") + chat_prompt("", SYSTEM)[-2:]  # a split prompt
    rows = []
    for g, prompt in enumerate(prompts):  # GRPO groups: four samples share each prompt
        for k, completion in enumerate((clean, split, cut, special if g else no_stop)):
            finish = "length" if completion is cut else "stop"
            rows.append(row(f"g{g}-{k}", prompt, completion, finish_reason=finish, group_id=f"g{g}"))
    rows.append(row("dup-a", prompts[0], split))
    rows.append(row("dup-b", prompts[0], split))
    rows.append(row("oov", prompts[1], [*clean[:-1], 10**7, EOS]))
    rows.append(row("positive", prompts[1], clean, logprobs=[0.5] * len(clean)))
    p0, c0 = prompts[0], clean
    forked = [*enc("Certainly, the answer is 4 and not 5."), EOS]
    for s, history in (("clean", c0), ("re", c0[:-1]), ("fork", forked)):
        rows.append(row(f"{s}0", p0, c0, session_id=f"s-{s}", turn=0))
        rows.append(row(f"{s}1", p0 + history + NEXT_USER, split if s == "clean" else c0, session_id=f"s-{s}", turn=1))
    return [rows[i * 7 % len(rows)] for i in range(len(rows))]  # groups and turns spread over batches


def _table(store) -> list[dict]:
    checks = store.read("checks").drop_columns(["checked_at"])
    return checks.sort_by("sample_id").to_pylist()


def _brief(rows: list[dict]) -> dict[str, tuple]:
    return {r["sample_id"]: (r["verdict"], r["reasons"], r["first_divergence"], r["prefix_status"]) for r in rows}


EXPECTED = {
    "clean0": ("ok", [], None, None),
    "clean1": ("note", ["roundtrip_completion"], 2, "CLEAN"),
    "dup-a": ("note", ["roundtrip_completion"], 2, None),
    "dup-b": ("note", ["roundtrip_completion"], 2, None),
    "fork0": ("ok", [], None, None),
    "fork1": ("note", ["prefix_fork"], 21, "FORK"),
    "g0-0": ("ok", [], None, None),
    "g0-1": ("note", ["roundtrip_completion"], 2, None),
    "g0-2": ("note", ["roundtrip_partial_char"], 3, None),
    "g0-3": ("note", ["special_no_stop"], 5, None),
    "g1-0": ("ok", [], None, None),
    "g1-1": ("note", ["roundtrip_completion"], 2, None),
    "g1-2": ("note", ["roundtrip_partial_char"], 3, None),
    "g1-3": ("note", ["special_mid_completion"], 1, None),
    "g2-0": ("drift", ["roundtrip_prompt"], 8, None),
    "g2-1": ("drift", ["roundtrip_prompt"], 8, None),
    "g2-2": ("drift", ["roundtrip_prompt"], 8, None),
    "g2-3": ("drift", ["roundtrip_prompt", "special_mid_completion"], 8, None),
    "oov": ("invalid", ["vocab_completion"], 8, None),
    "positive": ("invalid", ["logprob_positive"], 0, None),
    "re0": ("ok", [], None, None),
    "re1": ("note", ["prefix_realign"], 29, "REALIGN"),
}
"""(verdict, reasons, first_divergence, prefix_status) per sample."""


def test_verdicts_are_the_same_in_one_batch_in_small_batches_and_row_by_row(tmp_path):
    rows = _rows()
    whole = make_store(tmp_path / "whole", rows)
    once = check_tokens(whole, tokenizer_dir())
    expected = _table(whole)
    assert _brief(expected) == EXPECTED
    small = make_store(tmp_path / "small", rows)
    result = check_tokens(small, tokenizer_dir(), batch_size=3)
    assert _table(small) == expected
    in_vocab = [r for r in rows if r["sample_id"] != "oov"]
    assert result.tokens == once.tokens == sum(len(r["prompt_token_ids"] + r["completion_token_ids"]) for r in in_vocab)
    # each distinct segment went through the tokenizer once, however the rows were batched
    assert result.tokens_roundtripped == once.tokens_roundtripped == 72
    # row by row through the checker other engines run, with a segment cache of two entries
    tok = CheckTokenizer.load(tokenizer_dir())
    opts = CheckOptions()
    fingerprint = tok.fingerprint(opts.to_dict())
    version = whole.version("traces")
    assert version is not None
    checker = BatchChecker(whole, tok, opts, fingerprint, version, trajectory_index(whole, version))
    checker.roundtrip.max_entries = 2
    traces = whole.read("traces", columns=COLUMNS, version=version)
    one_by_one = []
    for rb in traces.to_batches(max_chunksize=1):
        checker.remember(rb)
        out, _, _ = checker.finish(checker.start(rb))
        one_by_one.append(out)
    checker.close()
    table = pa.Table.from_batches(one_by_one).drop_columns(["checked_at"])
    table = table.take(pc.sort_indices(table, [("sample_id", "ascending")]))
    assert table.to_pylist() == expected
